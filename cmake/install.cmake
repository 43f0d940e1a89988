# `cmake --install build --prefix P`: bin/vlm, the default model under share/vlm/models, the
# tuner's scripts under share/vlm/scripts (the installed binary finds them relative to itself)
# and their photos under share/vlm/images,
# the public headers, the static layers and a CMake package (find_package(vlm) → vlm::vlm).
# `cpack -G DEB` (in the build folder) makes a Debian package of the same tree, its dependencies
# found by dpkg-shlibdeps.
include(CMakePackageConfigHelpers)

# vlm::vlm: every layer, so that a program links the engine and the server by one name.
add_library(vlm_library INTERFACE)
set_target_properties(vlm_library PROPERTIES EXPORT_NAME vlm)
target_link_libraries(vlm_library INTERFACE vlm_engine vlm_server vlm_hub)
target_compile_features(vlm_library INTERFACE cxx_std_20)  # include/vlm uses <span>

set(VLM_LAYERS vlm_core vlm_io vlm_hub vlm_jinja vlm_tokenizer vlm_structured vlm_vision vlm_ops
  vlm_kv vlm_model vlm_sched vlm_engine vlm_server)
if(VLM_HAVE_CUDA)
  list(APPEND VLM_LAYERS vlm_cuda)
endif()
install(TARGETS vlm RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ${VLM_LAYERS} vlm_library EXPORT vlmTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}/vlm)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/vlm DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/models/tiny-qwen35
  DESTINATION ${CMAKE_INSTALL_DATADIR}/vlm/models)
# `vlm tune`: the tuner, the load generator it drives, their Python requirements and the photos
# their synthetic images are cut from (with their licences).
install(PROGRAMS ${PROJECT_SOURCE_DIR}/scripts/tune_serve.py
  ${PROJECT_SOURCE_DIR}/scripts/bench_serve.py DESTINATION ${CMAKE_INSTALL_DATADIR}/vlm/scripts)
install(FILES ${PROJECT_SOURCE_DIR}/scripts/requirements-bench.txt
  DESTINATION ${CMAKE_INSTALL_DATADIR}/vlm/scripts)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/tests/data/images/
  DESTINATION ${CMAKE_INSTALL_DATADIR}/vlm/images)
install(EXPORT vlmTargets NAMESPACE vlm:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vlm)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/vlmConfig.cmake.in
  ${PROJECT_BINARY_DIR}/vlmConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vlm)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/vlmConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/vlmConfig.cmake ${PROJECT_BINARY_DIR}/vlmConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/vlm)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME vlm)
set(CPACK_PACKAGE_VENDOR "vlm")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
  "Runs and serves Qwen vision-language models on the CPU (OpenAI-compatible server)")
set(CPACK_PACKAGE_CONTACT "vlm maintainers <vlm@localhost>")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)  # Depends: from the binary's shared libraries
include(CPack)

# Runs CMD (a ;-list) and passes only when it exits with EXPECT_RC and its output matches EXPECT:
# a test binary that must fail cleanly (an exit code, never a signal) with a given message.
#   cmake -DCMD="prog;arg" -DEXPECT_RC=1 -DEXPECT=regex -P expect_exit.cmake
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "expected exit code ${EXPECT_RC}, got '${rc}'\n${out}")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the output does not match '${EXPECT}':\n${out}")
endif()
message("exit code ${rc}, output matches '${EXPECT}'")

#!/usr/bin/env bash
# Builds what scripts/cuda_device_check.sh runs: the CUDA test binaries and vlm (a build folder
# configured with CUDA, BUILD_DIR, default build), gathered with the shared libraries they load
# (all but glibc's; cuBLAS, opened when the GPU is first used, is the GPU machine's own) into
# build/device/, so that the folder also runs on another machine with an NVIDIA GPU and its
# driver (the test data is read from the repository). Then:
#   bash scripts/cuda_device_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
cmake --build "$BUILD" --target cuda_ops_test cuda_model_test vlm
D=$BUILD/device
rm -rf "$D"
mkdir -p "$D/bin" "$D/lib"
cp "$BUILD/tests/cuda_ops_test" "$BUILD/tests/cuda_model_test" "$BUILD/tools/cli/vlm" "$D/bin/"
# Every shared library the binaries load but glibc's own (and cuBLAS, were it linked).
for b in "$D"/bin/*; do ldd "$b"; done | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread)\.so|/ld-linux|libcublas' |
  xargs -r cp -L -t "$D/lib"
# Symbols are not needed to run them, and a small folder is quicker to copy.
strip --strip-unneeded "$D"/bin/* "$D"/lib/* 2>/dev/null || true
du -sh "$D"

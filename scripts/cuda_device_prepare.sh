#!/usr/bin/env bash
# Prepares the device check (scripts/cuda_device_check.sh) here, where the Debian packages are:
# builds the CUDA test binaries and vlm, and gathers them with the shared libraries the device
# image may lack into build/device/ (the test data travels with the working tree). Then:
#   run(command="bash scripts/cuda_device_check.sh", carry=["build/device"], timeout_s=590)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
cmake --build "$BUILD" --target cuda_ops_test cuda_model_test vlm
D=$BUILD/device
rm -rf "$D"
mkdir -p "$D/bin" "$D/lib"
cp "$BUILD/tests/cuda_ops_test" "$BUILD/tests/cuda_model_test" "$BUILD/tools/cli/vlm" "$D/bin/"
# Every shared library the binaries load but glibc's own and cuBLAS (the device has its own).
for b in "$D"/bin/*; do ldd "$b"; done | awk '/=> \// {print $3}' | sort -u |
  grep -Ev '/(libc|libm|libdl|librt|libpthread)\.so|/ld-linux|libcublas' |
  xargs -r cp -L -t "$D/lib"
# Symbols are not needed there; the working tree that travels is capped at 64 MiB.
strip --strip-unneeded "$D"/bin/* "$D"/lib/* 2>/dev/null || true
du -sh "$D"

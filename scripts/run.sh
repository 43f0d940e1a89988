#!/usr/bin/env bash
# Sets up (dependencies + Release build) and runs `vlm run`.
#   scripts/run.sh                      # the shipped tiny model asked about examples/shapes.png
#   scripts/run.sh -m DIR -p "Hello"    # any Qwen3-VL or Qwen3.5 checkpoint directory; flags go to `vlm run`
# Without -m, `vlm run` uses models/tiny-qwen35: a tiny Qwen3.5 trained by
# scripts/train_tiny_vlm.py to answer questions about pictures and clips of coloured shapes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target vlm >/dev/null
[ $# -eq 0 ] && set -- --image examples/shapes.png -p "Describe the image." --greedy
exec "$BUILD_DIR/tools/cli/vlm" run "$@"

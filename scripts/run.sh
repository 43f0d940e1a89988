#!/usr/bin/env bash
# Sets up (dependencies + Release build) and runs `vlm run`.
#   scripts/run.sh                      # the bundled tiny model, a default prompt
#   scripts/run.sh -m DIR -p "Hello"    # any Qwen3-VL checkpoint directory; flags go to `vlm run`
# Until the trained tiny default model lands (issue 6), the bundled model is a random-weight
# Qwen3-VL with the real vocabulary: it exercises the whole text path but its words mean nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >/dev/null
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)" --target vlm >/dev/null
if [ $# -eq 0 ] || [[ " $* " != *" -m "* && " $* " != *" --model "* ]]; then
  # Assemble the bundled model directory: fixture weights + the real Qwen3 tokenizer from ../shared.
  model="$BUILD_DIR/default-model"
  mkdir -p "$model"
  for f in config.json generation_config.json model.safetensors; do
    ln -sf "$PWD/tests/model/fixtures/tiny-fullvocab-bf16/$f" "$model/$f"
  done
  ln -sf "$(cd ../shared/data/tokenizer && pwd)/tokenizer.json" "$model/tokenizer.json"
  [ $# -eq 0 ] && set -- --image ../shared/data/images/cat_chelsea.png -p "Describe this image." \
    -n 32 --greedy
  set -- -m "$model" "$@"
fi
exec "$BUILD_DIR/tools/cli/vlm" run "$@"

#!/usr/bin/env bash
# The CUDA backend's check, on a machine with an NVIDIA GPU, its driver and nvcc:
#   bash scripts/cuda_device_prepare.sh   # builds the binaries, gathers them into build/device
#   bash scripts/cuda_device_check.sh     # this script
# (build/device holds the binaries with the libraries they load, so it can also be copied to
# another machine with an NVIDIA GPU and its driver; VLM_DEVICE_DIR names it when elsewhere.)
# Runs the GPU tests (cuda_ops_test: every kernel against the CPU reference; cuda_model_test: the
# transformers fixtures on the GPU), then, unless VLM_SKIP_BENCH=1, the side-by-side benchmark
# (scripts/bench_cuda.py: vlm against transformers generate on a random Qwen3-VL-8B). Writes the
# logs, GoogleTest XML and benchmark JSON under $OUT (default /tmp/vlm-cuda-check) and prints a
# short table last. A pass is exit status 0; non-zero when a test fails, is skipped (the binary
# saw no GPU) or none ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vlm-cuda-check}
D=${VLM_DEVICE_DIR:-build/device}
mkdir -p "$OUT"
if [ ! -x "$D/bin/cuda_ops_test" ]; then
  echo "no $D/bin: run scripts/cuda_device_prepare.sh first (or set VLM_DEVICE_DIR)" >&2
  exit 2
fi
# The carried libraries first; cuBLAS from the toolkit, else from PyTorch's wheels.
LIBS="$PWD/$D/lib"
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
         "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null)"; do
  [ -n "$d" ] && [ -d "$d" ] && LIBS="$LIBS:$d"
done
export LD_LIBRARY_PATH="$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export VLM_FIXTURES_DIR="$PWD/tests/model/fixtures" VLM_REPO_DIR="$PWD" VLM_TESTDATA_DIR="$PWD/tests/data"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
  > "$OUT/gpu.csv" 2>&1 || echo "no nvidia-smi" > "$OUT/gpu.csv"

status=0
# Time limits that keep a hung binary from holding the check: 90 + 150 + 330 s at most.
for t in cuda_ops_test cuda_model_test; do
  limit=90
  [ "$t" = cuda_model_test ] && limit=150
  timeout "$limit" "$D/bin/$t" --gtest_output="xml:$OUT/$t.xml" > "$OUT/$t.log" 2>&1
  rc=$?
  echo "$t: exit $rc"
  grep -E "^\[  (FAILED|SKIPPED) |Failure|error" "$OUT/$t.log" | head -n 30
  # Skipped tests mean the binary saw no GPU: a failed check here.
  if [ "$rc" -ne 0 ] || grep -q "SKIPPED \]" "$OUT/$t.log"; then status=1; fi
done

if [ "${VLM_SKIP_BENCH:-0}" != 1 ]; then
  PYTHONUNBUFFERED=1 timeout 330 python3 scripts/bench_cuda.py --vlm "$D/bin/vlm" --out "$OUT" \
    2>&1 | tee "$OUT/bench.log" | tail -n 40
fi

echo
echo "| GPU | test binary | tests | failures | skipped |"
echo "|---|---|---|---|---|"
for t in cuda_ops_test cuda_model_test; do
  python3 - "$OUT/$t.xml" "$(tail -n 1 "$OUT/gpu.csv")" "$t" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
    t, f = int(root.get("tests", 0)), int(root.get("failures", 0))
    s = sum(c.get("result") == "skipped" for c in root.iter("testcase"))
except (OSError, ET.ParseError):
    t = f = s = "?"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {t} | {f} | {s} |")
PY
done
[ -f "$OUT/bench_table.md" ] && cat "$OUT/bench_table.md"
exit $status

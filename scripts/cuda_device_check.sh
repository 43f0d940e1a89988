#!/usr/bin/env bash
# The device check for the CUDA backend (issue 7), run through the `device` tool on a lent GPU.
# The device image has nvcc, CMake and ninja but not the CPU build's Debian packages, so the test
# binary is built here and carried (the CUDA runtime is linked into it statically):
#   here:   cmake --build build --target cuda_ops_test
#   device: run(command="bash scripts/cuda_device_check.sh", carry=["build/tests/cuda_ops_test"])
# Writes the GPU description, the test log and the GoogleTest XML under $OUT and prints a short
# table last. Exits non-zero when a test fails or none ran.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/vlm-cuda-check}
mkdir -p "$OUT"
BIN=${BIN:-build/tests/cuda_ops_test}
if [ ! -x "$BIN" ]; then
  echo "no $BIN: build it here (cmake --build build --target cuda_ops_test) and carry it" >&2
  exit 2
fi
# cuBLAS is linked dynamically: the toolkit's copy, else the one PyTorch's wheels bring.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib \
         "$(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null)"; do
  [ -n "$d" ] && [ -d "$d" ] && LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"
done
export LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader \
  > "$OUT/gpu.csv" 2>&1 || echo "no nvidia-smi" > "$OUT/gpu.csv"
"$BIN" --gtest_output="xml:$OUT/cuda_ops_test.xml" > "$OUT/cuda_ops_test.log" 2>&1
rc=$?
tail -n 40 "$OUT/cuda_ops_test.log"
echo
echo "| GPU | tests | failures | skipped | exit |"
echo "|---|---|---|---|---|"
python3 - "$OUT/cuda_ops_test.xml" "$(tail -n 1 "$OUT/gpu.csv")" "$rc" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    root = ET.parse(sys.argv[1]).getroot()
    t, f = int(root.get("tests", 0)), int(root.get("failures", 0))
    s = sum(c.get("result") == "skipped" for c in root.iter("testcase"))
except (OSError, ET.ParseError):
    t = f = s = "?"
print(f"| {sys.argv[2]} | {t} | {f} | {s} | {sys.argv[3]} |")
PY
# Skipped tests mean the binary saw no GPU: that is a failed check here.
if [ "$rc" -ne 0 ] || grep -q "SKIPPED \]" "$OUT/cuda_ops_test.log"; then exit 1; fi

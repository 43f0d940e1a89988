#!/usr/bin/env bash
# Builds a libFuzzer target (tests/fuzz) with clang-14, AddressSanitizer and UBSan in build-fuzz/,
# and runs it for SECONDS (default 600) from its seed corpus:
#   bash scripts/fuzz.sh http_request 600
# New inputs go to a temporary folder (the committed seeds stay as they are); a crash is written
# to build-fuzz/artifacts/ and makes the script fail. docs/fuzzing.md records the runs.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: scripts/fuzz.sh TARGET [SECONDS]   (targets: tests/fuzz/*_fuzz.cc)}
seconds=${2:-600}
bash scripts/install-deps.sh
missing=()
for p in clang-14 libclang-rt-14-dev; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
B=${FUZZ_BUILD_DIR:-build-fuzz}
CC=clang-14 CXX=clang++-14 cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVLM_FUZZ=ON -DVLM_CUDA=OFF -DVLM_BUILD_TESTS=OFF -DVLM_BUILD_TOOLS=OFF > /dev/null
cmake --build "$B" --target "${target}_fuzz"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$B/artifacts"
dict=()
[ -f "tests/fuzz/$target.dict" ] && dict=(-dict="tests/fuzz/$target.dict")
"$B/tests/fuzz/${target}_fuzz" -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
  -artifact_prefix="$B/artifacts/" "${dict[@]}" "$work" "tests/fuzz/corpus/$target"

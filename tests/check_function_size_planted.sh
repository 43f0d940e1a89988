#!/usr/bin/env bash
# Proves tests/check_function_size.sh can fail: in a small tree with its own
# compile_commands.json, functions of 40 lines pass; one of 200 lines in a source, one of 160 in
# a header that two sources include (named once) and a source that does not compile are each
# refused and named.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/a" "$work/tools/b" "$work/build"
# function NAME LINES: a function whose body has LINES statements.
function_of() {
  echo "int $1(int x) {"
  for ((i = 0; i < $2; ++i)); do echo "  x = x * 3 + $i;"; done
  echo "  return x;"
  echo "}"
}
{ function_of short_one 40; } >"$work/src/a/short.cc"
{ echo '#pragma once'; echo 'inline'; function_of shared_short 40; } >"$work/src/a/shared.h"
{ echo '#include "a/shared.h"'; function_of tool_main 40; } >"$work/tools/b/tool.cc"
db() {
  python3 - "$work" "$@" >"$work/build/compile_commands.json" <<'PY'
import json, sys
work, files = sys.argv[1], sys.argv[2:]
print(json.dumps([{"directory": work, "file": f,
                   "command": f"c++ -std=c++17 -I{work}/src -c {f} -o /dev/null"} for f in files]))
PY
}
db src/a/short.cc tools/b/tool.cc
bash "$repo/tests/check_function_size.sh" "$work/build" "$work" || {
  echo "functions of 40 lines were refused"
  exit 1
}
{ function_of long_one 200; } >>"$work/src/a/short.cc"
{ echo 'inline'; function_of shared_long 160; } >>"$work/src/a/shared.h"
{ echo '#include "a/shared.h"'; echo '#include "a/missing.h"'; } >"$work/src/a/broken.cc"
db src/a/short.cc tools/b/tool.cc src/a/broken.cc
set +e
out=$(bash "$repo/tests/check_function_size.sh" "$work/build" "$work")
rc=$?
set -e
echo "$out"
[ $rc -eq 1 ] || { echo "expected exit 1, got $rc"; exit 1; }
for want in "src/a/short.cc:[0-9]+: function 'long_one' is 20[0-9] lines" \
            "src/a/shared.h:[0-9]+: function 'shared_long' is 16[0-9] lines" \
            "clang cannot compile: src/a/broken.cc.*a/missing.h"; do
  grep -qE "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
[ "$(grep -c shared_long <<<"$out")" -eq 1 ] || { echo "the header's function is named more than once"; exit 1; }
if grep -qE "short_one|shared_short|tool_main" <<<"$out"; then
  echo "a function under the limit was refused"
  exit 1
fi
echo "the planted long functions and the broken source were all refused"

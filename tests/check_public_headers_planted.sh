#!/usr/bin/env bash
# check_public_headers.sh must fail on a copy of include/ with a header that needs an include it
# lacks, one that is not pedantic, and one that includes from src/.
# Usage: check_public_headers_planted.sh CXX
set -uo pipefail
cxx=$1
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/include/vlm"
cp "$here"/../include/vlm/*.h "$tmp/include/vlm/"
printf '#pragma once\nnamespace vlm { inline std::string missing_include() { return {}; } }\n' \
  > "$tmp/include/vlm/planted_missing.h"
printf '#pragma once\nnamespace vlm { struct Planted { int a[0]; }; }\n' \
  > "$tmp/include/vlm/planted_pedantic.h"
printf '#pragma once\n#include "engine/engine_impl.h"\n' > "$tmp/include/vlm/planted_internal.h"
out=$(bash "$here/check_public_headers.sh" "$cxx" "$tmp" 2>&1)
rc=$?
fail=0
[ $rc -ne 0 ] || { echo "the check passed a tree with planted bad headers"; fail=1; }
for want in "vlm/planted_missing.h does not compile" "vlm/planted_pedantic.h does not compile" \
            "vlm/planted_internal.h: includes \"engine/engine_impl.h\""; do
  grep -qF "$want" <<<"$out" || { echo "missing from the check's output: $want"; fail=1; }
done
if grep -qE "vlm/(engine|chat|request|server|status|tokenizer)\.h does not compile" <<<"$out"; then
  echo "a real header failed in the copy:"
  echo "$out"
  fail=1
fi
[ $fail -eq 0 ] && echo "ok: the check refuses each planted header"
exit $fail

#!/usr/bin/env bash
# The public API (include/vlm) stands alone: each header compiles on its own, as the first and
# only include of a translation unit, with -Wall -Wextra -Werror -pedantic and nothing but
# include/ on the include path; and it includes only the standard library and other vlm/ headers.
# Usage: check_public_headers.sh CXX [REPO_ROOT]
set -uo pipefail
cxx=$1
root="${2:-$(cd "$(dirname "$0")/.." && pwd)}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
n=0
for h in "$root"/include/vlm/*.h; do
  name=vlm/$(basename "$h")
  n=$((n + 1))
  while IFS= read -r inc; do
    echo "$name: includes \"$inc\" (a public header includes only <...> and \"vlm/...\")"
    status=1
  done < <(grep -oE '^#include "[^"]+"' "$h" | sed -E 's/#include "(.*)"/\1/' | grep -v '^vlm/')
  printf '#include "%s"\n' "$name" > "$tmp/tu.cc"
  if ! out=$("$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -pedantic \
               -I "$root/include" "$tmp/tu.cc" 2>&1); then
    echo "$name does not compile on its own:"
    echo "$out" | head -20
    status=1
  fi
done
if [ "$n" -eq 0 ]; then
  echo "no headers found under $root/include/vlm"
  exit 1
fi
[ $status -eq 0 ] && echo "ok: $n public headers compile alone with -Wall -Wextra -Werror -pedantic"
exit $status

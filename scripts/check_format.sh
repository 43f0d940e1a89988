#!/usr/bin/env bash
# The C++ sources follow .clang-format (Google style, 100 columns): fails naming every file whose
# formatting differs. `bash scripts/check_format.sh --fix` rewrites them instead.
set -uo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
if ! command -v "$CF" > /dev/null; then
  echo "clang-format not found (scripts/install-deps.sh installs it)" >&2
  exit 2
fi
# Tracked files and new ones not yet added (not the ignored build trees).
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- 'include/*.h' 'src/*.h' \
  'src/*.cc' 'src/*.cu' 'src/*.cuh' 'src/*.inc' 'tools/*.h' 'tools/*.cc' 'tests/*.h' 'tests/*.cc' \
  'examples/*.cc' 2>/dev/null)
if [ ${#files[@]} -eq 0 ]; then  # not a git checkout: the same files from the tree
  mapfile -t files < <(find include src tools tests examples -type f \( -name '*.h' -o -name '*.cc' \
    -o -name '*.cu' -o -name '*.cuh' -o -name '*.inc' \) | sort)
fi
if [ "${1:-}" = --fix ]; then
  "$CF" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$CF" --dry-run --Werror "$f" > /dev/null 2>&1; then
    echo "not formatted: $f"
    bad=$((bad + 1))
  fi
done
echo "$bad of ${#files[@]} files differ from .clang-format"
[ "$bad" -eq 0 ]

#!/usr/bin/env bash
# The size limit of the style guide made hard: no file in src/ or tools/ is longer than 1,500
# lines. Split a file that grows past it by concern (docs/architecture.md names the parts).
# Fails, naming each file and its length. Usage: check_file_size.sh [REPO_ROOT] (default: this
# repository; at the top of a git checkout the files git tracks there and the untracked ones it
# does not ignore, elsewhere every file).
set -uo pipefail
root="$(cd "${1:-$(dirname "$0")/..}" && pwd -P)"
limit=1500
# A checkout's own files (not those of a checkout the folder merely lies in).
if [ "$(git -C "$root" rev-parse --show-toplevel 2>/dev/null)" = "$root" ]; then
  mapfile -t files < <(cd "$root" && git ls-files --cached --others --exclude-standard -- src tools)
else
  mapfile -t files < <(cd "$root" && find src tools -type f 2>/dev/null)
fi
if [ ${#files[@]} -eq 0 ]; then
  echo "no files found under $root/src and $root/tools"
  exit 1
fi
status=0
checked=0
for f in "${files[@]}"; do
  [ -f "$root/$f" ] || continue  # deleted in the working tree
  checked=$((checked + 1))
  n=$(wc -l <"$root/$f")
  if [ "$n" -gt "$limit" ]; then
    echo "$f: $n lines, over the limit of $limit"
    status=1
  fi
done
[ $status -eq 0 ] && echo "$checked files in src/ and tools/, none over $limit lines"
exit $status

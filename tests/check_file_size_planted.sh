#!/usr/bin/env bash
# Proves tests/check_file_size.sh can fail: a tree with a file of 1,500 lines passes; one more
# line, or a file of 1,501 lines in tools/, fails and is named.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src/a" "$work/tools/b"
seq 1 1500 >"$work/src/a/long.cc"
echo 'int main() { return 0; }' >"$work/tools/b/short.cc"
bash "$repo/tests/check_file_size.sh" "$work" || {
  echo "a file of 1,500 lines was refused"
  exit 1
}
echo 1501 >>"$work/src/a/long.cc"
seq 1 1501 >"$work/tools/b/short.cc"
set +e
out=$(bash "$repo/tests/check_file_size.sh" "$work")
rc=$?
set -e
echo "$out"
[ $rc -eq 1 ] || { echo "expected exit 1, got $rc"; exit 1; }
for want in 'src/a/long.cc: 1501 lines' 'tools/b/short.cc: 1501 lines'; do
  grep -q "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
echo "the planted long files were both refused"

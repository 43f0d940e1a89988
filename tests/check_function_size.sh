#!/usr/bin/env bash
# The function limit of the style guide made hard: clang-tidy's readability-function-size (from
# Debian's clang-tidy) refuses any function in src/ or tools/ longer than 150 lines. Split one
# that grows past it into named stages. Checked: every C++ source of the build's
# compile_commands.json under src/ and tools/ with the headers it includes from there, and the
# CUDA sources (.cu) parsed for the host with the CUDA toolkit's headers (when one is installed;
# said when not). Fails, naming each function, its length and where it is, and on any compile
# error clang cannot get past (the known gaps of clang 14 beside GCC excepted, below).
# Usage: check_function_size.sh BUILD_DIR [REPO_ROOT]
set -uo pipefail
build="${1:?usage: check_function_size.sh BUILD_DIR [REPO_ROOT]}"
root="${2:-$(cd "$(dirname "$0")/.." && pwd)}"
build="$(cd "$build" && pwd)"
root="$(cd "$root" && pwd)"
limit=150
# Functions allowed past the limit: generated tables only, each with the reason. Format:
# "path/from/root:function"  # why
allowed=()
# Compile errors clang 14 gives where GCC (the build's compiler) accepts the code; the parse
# goes on past them, so the functions are still checked:
known_errors=(
  # x86 _Float16 arrives in clang 15 (GCC 12 has it with SSE2): matmul_kernel.inc's f16 vectors.
  '_Float16 is not supported on this target'
  # clang 14 does not know some of GCC's __builtin_cpu_supports names (avxvnni, avx512fp16, amx-*).
  'invalid cpu feature string for builtin'
  # CUDA 12+ dropped texture references that clang 14's CUDA wrapper headers still name.
  "no template named 'texture'"
)

tidy=$(command -v clang-tidy || command -v clang-tidy-14 || true)
if [ -z "$tidy" ]; then
  echo "clang-tidy is not installed (Debian: apt install clang-tidy; scripts/install-deps.sh does)"
  exit 1
fi
db="$build/compile_commands.json"
[ -f "$db" ] || { echo "no $db (configure with CMAKE_EXPORT_COMPILE_COMMANDS)"; exit 1; }
mapfile -t sources < <(python3 - "$db" "$root" <<'PY'
import json, os, sys
db, root = sys.argv[1], sys.argv[2]
seen = set()
for c in json.load(open(db)):
    f = os.path.normpath(os.path.join(c.get("directory", ""), c["file"]))
    rel = os.path.relpath(f, root)
    if rel.split(os.sep)[0] in ("src", "tools") and f.endswith(".cc") and f not in seen:
        seen.add(f)
        print(f)
PY
)
if [ ${#sources[@]} -eq 0 ]; then
  echo "no C++ sources of $root/src or $root/tools in $db"
  exit 1
fi
mapfile -t cuda_sources < <(cd "$root" && find src tools -name '*.cu' 2>/dev/null | sort)
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: $limit}]}"
# The headers of src/ and tools/ are checked too (the root's regex characters escaped).
root_re=$(printf '%s' "$root" | sed 's/[][\.*^$+?(){}|]/\\&/g')
filter="^$root_re/(src|tools)/"
jobs=$(nproc 2>/dev/null || echo 2)
# -w: the build's warnings (made errors by -Werror) are the compiler's business, not this check's.
# Each log ends with clang-tidy's exit status, read below.
printf '%s\n' "${sources[@]}" |
  xargs -P "$jobs" -I{} sh -c 'log="$6/$(echo "$5" | tr / _).log"
      "$1" -p "$2" --quiet --checks="-*,readability-function-size" --config="$3" \
        --header-filter="$4" --extra-arg=-w "$5" >"$log" 2>&1
      echo "check_function_size: $5 exit $?" >>"$log"' \
    _ "$tidy" "$build" "$config" "$filter" {} "$out" || {
  echo "running clang-tidy over the sources failed"
  exit 1
}
cuda_note=""
cuda_root=""
for c in "${CUDA_PATH:-}" /usr/local/cuda; do
  [ -n "$c" ] && [ -f "$c/include/cuda_runtime.h" ] && { cuda_root="$c"; break; }
done
if [ ${#cuda_sources[@]} -gt 0 ] && [ -n "$cuda_root" ]; then
  # clang 14's CUDA wrapper includes a header CUDA 12+ no longer ships: an empty one stands in.
  mkdir -p "$out/shim"
  : >"$out/shim/texture_fetch_functions.h"
  for f in "${cuda_sources[@]}"; do
    "$tidy" --quiet --checks="-*,readability-function-size" --config="$config" \
      --header-filter="$filter" "$root/$f" -- -x cuda --cuda-host-only -nocudalib \
      --cuda-path="$cuda_root" -std=c++17 -w -I"$root/include" -I"$root/src" -I"$out/shim" \
      >"$out/$(echo "$f" | tr / _).cu.log" 2>&1
    echo "check_function_size: $root/$f exit $?" >>"$out/$(echo "$f" | tr / _).cu.log"
  done
elif [ ${#cuda_sources[@]} -gt 0 ]; then
  cuda_note=" (${#cuda_sources[@]} CUDA sources not checked: no CUDA toolkit)"
fi
# Functions over the limit (a header's once, however many sources include it), then compile
# errors other than the known ones (the check cannot vouch for such a source).
python3 -c '
import glob, re, sys
root, limit, out = sys.argv[1], sys.argv[2], sys.argv[5]
allowed, known = set(sys.argv[3].split("\n")) - {""}, [k for k in sys.argv[4].split("\n") if k]
ansi = re.compile(r"\x1b\[[0-9;]*m")
warn = re.compile(r"^(.*?):(\d+):\d+: warning: function .(.+). exceeds recommended size")
note = re.compile(r"^(.*?):(\d+):\d+: note: (\d+) lines including")
err = re.compile(r"^(?:(.*?)(?::\d+:\d+)?: )?(?:fatal )?error: (.*)$")
status = re.compile(r"^check_function_size: (.*) exit (\d+)$")
rel = lambda f: f[len(root) + 1:] if f.startswith(root + "/") else f
found, errors = {}, set()
for log in sorted(glob.glob(out + "/*.log")):
    pending, had_error, exited = {}, False, None
    for line in open(log, errors="replace"):
        line = ansi.sub("", line.rstrip("\n"))
        if m := status.match(line):
            exited = (m[1], int(m[2]))
        elif m := warn.match(line):
            pending[(m[1], m[2])] = m[3]
        elif (m := note.match(line)) and (m[1], m[2]) in pending:
            name = pending.pop((m[1], m[2]))
            if rel(m[1]) + ":" + name not in allowed:
                found[(rel(m[1]), int(m[2]))] = (name, m[3])
        elif (m := err.match(line)) and "readability-function-size" not in line:
            had_error = True
            if not any(k in m[2] for k in known):
                errors.add("clang cannot compile: " + rel(line))
    # A run that ended without its status, or failed with no compile error to show for it (a
    # crash), checked nothing of that source.
    if exited is None:
        errors.add("clang-tidy did not finish: " + rel(log))
    elif exited[1] != 0 and not (exited[1] == 1 and had_error):
        errors.add(f"clang-tidy failed on {rel(exited[0])} (exit {exited[1]})")
for (f, pos), (name, n) in sorted(found.items()):
    print(f"{f}:{pos}: function {name!r} is {n} lines, over the limit of {limit}")
for e in sorted(errors):
    print(e)
' "$root" "$limit" "$(printf '%s\n' "${allowed[@]}")" "$(printf '%s\n' "${known_errors[@]}")" "$out" \
  >"$out/problems" || { echo "reading clang-tidy's output failed"; exit 1; }
mapfile -t problems <"$out/problems"
status=0
if [ ${#problems[@]} -gt 0 ]; then
  printf '%s\n' "${problems[@]}"
  status=1
fi
n=$((${#sources[@]} + ${#cuda_sources[@]}))
[ -n "$cuda_note" ] && n=${#sources[@]}
[ $status -eq 0 ] && echo "$n sources in src/ and tools/, no function over $limit lines$cuda_note"
exit $status

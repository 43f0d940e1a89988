#!/usr/bin/env bash
# The layering rule (docs/architecture.md, "The layers"): a folder of src/ includes only from the
# folders listed before it in that list (and from include/vlm); tools/ and examples/ include only
# include/vlm and their own files (tools/cli/engine_probes.cc alone excepted: the benchmark
# probes).
# Fails, naming each include that goes up (or into a folder the list does
# not know). Usage: check_layering.sh [REPO_ROOT] (default: this repository).
set -uo pipefail
root="${1:-$(cd "$(dirname "$0")/.." && pwd)}"
doc="$root/docs/architecture.md"
mapfile -t layers < <(sed -n '/^<!-- layers /,/^<!-- end layers -->/p' "$doc" |
                      grep -E '^[a-z_]+ ' | awk '{print $1}')
if [ ${#layers[@]} -lt 2 ]; then
  echo "no layer list found in $doc"
  exit 1
fi
declare -A rank
for i in "${!layers[@]}"; do rank[${layers[$i]}]=$i; done
status=0
# Every quoted include of a file under src/, tools/ or examples/: "folder/...".
while IFS= read -r hit; do
  file=${hit%%:*}
  rest=${hit#*:}
  line=${rest%%:*}
  inc=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"${rest#*:}")
  target=${inc%%/*}
  [ "$target" = "$inc" ] && continue  # "x.h": the folder's own file
  [ "$target" = vlm ] && continue     # the public API
  rel=${file#"$root"/}
  if [[ $rel == tools/* || $rel == examples/* ]]; then
    # The benchmark probes (tools/cli/engine_probes.h) time parts of a loaded engine alone: the one
    # tool source allowed to reach into it, so that the probes are no part of include/vlm.
    [ "$rel" = tools/cli/engine_probes.cc ] && continue
    if [ -n "${rank[$target]+x}" ]; then
      echo "$rel:$line: a tool includes the library's internals \"$inc\" (tools use include/vlm)"
      status=1
    fi
    continue
  fi
  src_layer=$(cut -d/ -f2 <<<"$rel")
  if [ -z "${rank[$src_layer]+x}" ]; then
    echo "$rel: src/$src_layer is not in the layer list of docs/architecture.md"
    status=1
    continue
  fi
  if [ -z "${rank[$target]+x}" ]; then
    echo "$rel:$line: includes \"$inc\", which is in no layer"
    status=1
  elif [ "${rank[$target]}" -gt "${rank[$src_layer]}" ]; then
    echo "$rel:$line: $src_layer includes \"$inc\" from $target, a layer above it"
    status=1
  fi
done < <(grep -rnE --include='*.h' --include='*.cc' --include='*.inc' --include='*.cu' \
           --include='*.cuh' '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$root/src" "$root/tools" \
           $([ -d "$root/examples" ] && echo "$root/examples"))
if [ $status -eq 0 ]; then
  echo "every include goes down the layers: ${layers[*]}"
fi
exit $status

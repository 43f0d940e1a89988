#!/usr/bin/env bash
# The CUDA backend is ops and kernels only: the orchestration it runs (batch building, block
# tables, slot mapping, image rows and DeepStack placement, chunked prefill, preemption) is the
# model's and the engine's, which run in CI on the CPU backend. Fails, naming the line, when a file
# of the CUDA backend (src/ops/cuda, src/kernels/cuda; or the files/folders given) includes the
# scheduler, the engine, the model or the KV manager, or builds block tables, slot mappings or
# image / DeepStack rows itself.
set -uo pipefail
cd "$(dirname "$0")/.."
paths=("$@")
[ ${#paths[@]} -eq 0 ] && paths=(src/ops/cuda src/kernels/cuda)
status=0
check() {  # what, extended regex
  local hits
  hits=$(grep -rnE --include='*.cc' --include='*.cu' --include='*.h' --include='*.cuh' \
         --include='*.txt' "$2" "${paths[@]}" 2>/dev/null)
  if [ -n "$hits" ]; then
    echo "the CUDA backend $1:"
    echo "$hits"
    status=1
  fi
}
check "includes a layer above the ops" '#include "(sched|engine|model|kv|server)/'
check "sees requests' chunks or image rows" '\b(SeqChunk|VisionRows|feature_row|RunnerRequest|Scheduler)\b'
check "builds a slot mapping" '\bslots?\[[^]]*\][[:space:]]*=[^=]'
check "builds block tables" '\b(block_)?tables?\[[^]]*\][[:space:]]*=[^=]|num_table_blocks'
check "places DeepStack or image rows" '\b(deepstack|vis_rows|vision_rows)'
if [ $status -eq 0 ]; then echo "the CUDA backend holds ops and kernels only (${paths[*]})"; fi
exit $status

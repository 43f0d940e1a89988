#!/usr/bin/env bash
# Proves tests/check_layering.sh can fail: on a copy of this repository's src/, tools/ and docs/,
# the copy passes as it is, then fails with an upward include planted in src/kv (to the model),
# another in src/sched (to the engine) and one in a tool (to an internal header), each named.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cp -r "$repo/src" "$repo/tools" "$repo/examples" "$repo/docs" "$work/"
bash "$repo/tests/check_layering.sh" "$work" >/dev/null || {
  echo "the unmodified copy fails the layering check"
  exit 1
}
echo '#include "model/text_decoder.h"' >>"$work/src/kv/kv_cache.h"
echo '#include "engine/engine_core.h"' >>"$work/src/sched/scheduler.h"
tool=$(find "$work/tools" -name '*.cc' | sort | head -n 1)
echo '#include "sched/scheduler.h"' >>"$tool"
echo '#include "engine/engine_impl.h"' >>"$work/examples/ask.cc"
set +e
out=$(bash "$repo/tests/check_layering.sh" "$work")
rc=$?
set -e
echo "$out"
[ $rc -eq 1 ] || { echo "expected exit 1, got $rc"; exit 1; }
for want in 'src/kv/kv_cache.h:[0-9]+: kv includes "model/text_decoder.h" from model' \
            'src/sched/scheduler.h:[0-9]+: sched includes "engine/engine_core.h" from engine' \
            'a tool includes the library.s internals "sched/scheduler.h"' \
            'examples/ask.cc:[0-9]+: a tool includes the library.s internals "engine/engine_impl.h"'; do
  grep -qE "$want" <<<"$out" || { echo "missing: $want"; exit 1; }
done
echo "the planted upward includes were all refused"

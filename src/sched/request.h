// One request as the scheduler sees it: token counts, a state and its blocks' content hashes (no
// token ids, no tensors). Following vLLM v1 (vllm/v1/request.py), the scheduler counts tokens, not
// phases: a request still needs `num_tokens - num_computed_tokens` tokens computed. While that is >
// 1 it is prefilling (a fresh prompt, a later chunk of one, or a recompute after preemption); when
// it is exactly 1 it is decoding (the last sampled token has no KV yet).
#pragma once

#include <cstdint>
#include <vector>

#include "kv/block_hash.h"

namespace vlm {

struct SchedRequest {
  enum class State {
    kWaiting,    // queued, never ran
    kRunning,    // in the running set; holds KV blocks
    kPreempted,  // back in the waiting queue (at the front), blocks freed, recomputes from 0
    kFinished,   // done or aborted; the scheduler has dropped it
  };

  int64_t id = 0;
  int64_t num_prompt_tokens = 0;
  int64_t num_tokens = 0;           // prompt + generated so far
  int64_t num_computed_tokens = 0;  // tokens whose KV is in the cache
  int64_t max_new_tokens = 0;       // the generation budget: tokens it may sample

  // The most num_tokens can grow to.
  int64_t num_tokens_limit() const { return num_prompt_tokens + max_new_tokens; }
  State state = State::kWaiting;
  int64_t arrival = 0;  // 0, 1, 2, ... in order of Scheduler::add

  // Prefix caching: the hashes of the full blocks of its tokens so far, in order (the engine
  // computes them from the token ids), and whether admission looks them up.
  std::vector<BlockHash> block_hashes;
  bool reads_prefix_cache = true;
  // Prompt tokens found in the prefix cache when first admitted (-1: not admitted yet).
  int64_t num_cached_tokens = -1;
  // A hybrid model's state slot while running (-1: none).
  int32_t state_slot = -1;
  // The snapshot it last saved past its prompt (-1: none), the token it was taken at, and the
  // snapshot's use stamp then: while no other request has touched it, its next one past the prompt
  // takes its place, so a running reply holds one snapshot, its latest.
  int32_t reply_snapshot = -1;
  int64_t reply_snapshot_end = -1, reply_snapshot_used = -1;

  // Speculative decoding: tokens proposed after its last one, which its next decode step
  // verifies (Scheduler::set_spec_tokens; 0 once that step is scheduled, or after a preemption).
  int64_t num_spec_tokens = 0;

  // Tokens still to compute before the next token can be sampled.
  int64_t num_remaining() const { return num_tokens - num_computed_tokens; }
  bool is_prefilling() const { return num_remaining() > 1; }
  bool is_decoding() const { return num_remaining() == 1; }
};

}  // namespace vlm

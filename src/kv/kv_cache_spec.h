// The KV cache as groups of layers, each with a spec (vLLM v1's KVCacheSpec / KVCacheGroupSpec):
// what one group keeps per token or per sequence, and so what a block of it costs. The model
// declares its groups (TextDecoder::cache_spec); the engine sizes the cache from them
// (plan_kv_blocks) and the KV-cache manager hands out their blocks.
//
// Two kinds: full attention, one group of paged K/V with a block table per sequence
// (KvCacheManager, block_pool.h); and, for a hybrid model (Qwen3.5), a group of fixed-size
// per-sequence state slots for its linear-attention (Gated DeltaNet) layers: the conv window and
// the recurrent state, the same bytes whatever the sequence's length. Each running sequence
// holds one slot (the scheduler hands them out); the prefix cache keeps snapshots of slots at
// block-aligned points, under the same memory budget (docs/architecture.md).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "core/tensor.h"
#include "vlm/status.h"

namespace vlm {

// Paged attention K/V: for each token of a sequence, one row of K and one of V per layer.
struct AttentionSpec {
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::kF32;  // the cache's element type (INT8 carries an f32 scale per KV head)

  // Bytes of one row (every KV head of one token, K or V), INT8 scales included.
  int64_t row_bytes() const {
    return n_kv_heads * head_dim * static_cast<int64_t>(dtype_size(dtype)) +
           (dtype == DType::kI8 ? n_kv_heads * 4 : 0);
  }
};

// Per-sequence state of a linear-attention layer: `floats` f32 values per layer and sequence.
struct StateSpec {
  int64_t floats = 0;
  int64_t bytes_per_seq(int64_t layers) const { return layers * floats * 4; }
};

enum class CacheKind : uint8_t {
  kFullAttention,  // paged K/V in blocks (AttentionSpec)
  kLinearState,    // a state slot per sequence (StateSpec)
};

struct KvCacheGroup {
  CacheKind kind = CacheKind::kFullAttention;
  std::vector<int64_t> layers;  // the decoder layers that keep their cache in this group
  AttentionSpec attention;      // kFullAttention
  StateSpec state;              // kLinearState

  // Bytes one block of `block_size` tokens takes over the group's layers, K and V (0 for a
  // state group, whose bytes go by sequences).
  int64_t block_bytes(int64_t block_size) const {
    if (kind != CacheKind::kFullAttention) return 0;
    return static_cast<int64_t>(layers.size()) * 2 * block_size * attention.row_bytes();
  }
};

struct KvCacheSpec {
  std::vector<KvCacheGroup> groups;
  int64_t block_size = 16;

  // Bytes of one block across every group.
  int64_t block_bytes() const;
  // Bytes of one sequence's state slot across the state group (0 without one).
  int64_t state_bytes_per_seq() const;
  // Checks the spec: at least one group, each with layers and a positive geometry, no layer in
  // two groups, exactly one full-attention group and at most one state group.
  Status validate() const;
  const KvCacheGroup& attention_group() const;  // after validate()
  const KvCacheGroup* state_group() const;      // null without one
};

// How many blocks the cache gets. In order: `num_blocks` when given (> 0); on a device, what
// `device_budget_bytes` holds (the share of device memory the options allow, less what the weights
// and scratch took), at most every sequence at full context; a `memory_bytes` budget (the CPU's
// --kv-cache-memory); else room for every sequence at full context, capped at 4 GiB but never
// below one sequence at full context. One block beyond them is scratch (its bytes count against a
// budget).
struct KvBlockPlan {
  int32_t num_blocks = 0;
  int64_t max_num_seqs = 1;
  int64_t blocks_per_seq = 1;  // a sequence at full context
  std::optional<int64_t> device_budget_bytes;
  double device_memory_utilization = 0;  // for the error message
  int64_t memory_bytes = 0;
  // Bytes each block takes elsewhere out of the same budget (a speculative draft model's KV
  // cache holds as many blocks of its own).
  int64_t extra_block_bytes = 0;
};
Result<int32_t> plan_kv_blocks(const KvCacheSpec& spec, const KvBlockPlan& plan);

}  // namespace vlm

#include "kv/kv_cache_spec.h"

#include <algorithm>
#include <limits>
#include <set>
#include <string>

namespace vlm {

int64_t KvCacheSpec::block_bytes() const {
  int64_t bytes = 0;
  for (const KvCacheGroup& g : groups) bytes += g.block_bytes(block_size);
  return bytes;
}

int64_t KvCacheSpec::state_bytes_per_seq() const {
  const KvCacheGroup* g = state_group();
  return g == nullptr ? 0 : g->state.bytes_per_seq(static_cast<int64_t>(g->layers.size()));
}

const KvCacheGroup* KvCacheSpec::state_group() const {
  for (const KvCacheGroup& g : groups) {
    if (g.kind == CacheKind::kLinearState) return &g;
  }
  return nullptr;
}

Status KvCacheSpec::validate() const {
  if (groups.empty()) return invalid_argument("the KV cache has no group of layers");
  if (block_size <= 0) return invalid_argument("block_size must be positive");
  std::set<int64_t> seen;
  int attention = 0, states = 0;
  for (const KvCacheGroup& g : groups) {
    if (g.layers.empty()) return invalid_argument("a KV cache group has no layers");
    for (int64_t l : g.layers) {
      if (l < 0 || !seen.insert(l).second) {
        return invalid_argument("layer " + std::to_string(l) +
                                " is negative or in two KV cache groups");
      }
    }
    if (g.kind == CacheKind::kFullAttention) {
      ++attention;
      if (g.attention.n_kv_heads <= 0 || g.attention.head_dim <= 0) {
        return invalid_argument("an attention cache group needs positive KV heads and head_dim");
      }
    } else if (++states > 1 || g.state.floats <= 0) {
      return invalid_argument("a KV cache has at most one state group, of positive size");
    }
  }
  if (attention != 1) {
    return invalid_argument("the KV cache needs exactly one full-attention group (it has " +
                            std::to_string(attention) + ")");
  }
  return ok_status();
}

const KvCacheGroup& KvCacheSpec::attention_group() const {
  return *std::find_if(groups.begin(), groups.end(),
                       [](const KvCacheGroup& g) { return g.kind == CacheKind::kFullAttention; });
}

Result<int32_t> plan_kv_blocks(const KvCacheSpec& spec, const KvBlockPlan& p) {
  VLM_RETURN_IF_ERROR(spec.validate());
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max() - 1;  // one more is scratch
  if (p.num_blocks > 0) return p.num_blocks;
  const int64_t per_block = spec.block_bytes() + p.extra_block_bytes;
  const int64_t every_seq = p.max_num_seqs * p.blocks_per_seq;
  if (p.device_budget_bytes) {
    // Every sequence at full context, within the share of device memory the options allow
    // (vLLM's gpu_memory_utilization): the KV cache takes what the weights and scratch leave.
    const int64_t fit = std::max<int64_t>(*p.device_budget_bytes, 0) / per_block - 1;
    const int64_t n = std::min<int64_t>({every_seq, fit, kMax});
    if (n <= 0) {
      return unavailable("no device memory is left for the KV cache under the memory utilization " +
                         std::to_string(p.device_memory_utilization));
    }
    return static_cast<int32_t>(n);
  }
  if (p.memory_bytes > 0) {
    const int64_t fit = p.memory_bytes / per_block - 1;
    if (fit < 1) {
      return invalid_argument("kv_cache_memory of " + std::to_string(p.memory_bytes) +
                              " bytes holds no KV block (one block of " +
                              std::to_string(spec.block_size) + " tokens takes " +
                              std::to_string(per_block) + " bytes, and one more is scratch)");
    }
    return static_cast<int32_t>(std::min<int64_t>(fit, kMax));
  }
  // Reserved, and resident only as blocks are first written.
  const int64_t capped =
      std::max(p.blocks_per_seq, std::min<int64_t>(every_seq, (int64_t{4} << 30) / per_block));
  return static_cast<int32_t>(std::clamp<int64_t>(capped, 1, kMax));
}

}  // namespace vlm

#include "kv/kv_cache.h"

namespace vlm {

Status KvCache::allocate(ops::Backend& be, const KvCacheGroup& group, int64_t num_blocks,
                         int64_t block_size) {
  if (group.kind != CacheKind::kFullAttention) {
    return invalid_argument("KvCache holds a full-attention group's K and V");
  }
  const int64_t layers = static_cast<int64_t>(group.layers.size());
  const int64_t n_kv_heads = group.attention.n_kv_heads, head_dim = group.attention.head_dim;
  const DType dtype = group.attention.dtype;
  if (layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || num_blocks <= 0 || block_size <= 0) {
    return invalid_argument("the KV cache needs positive layers, heads, blocks and block size");
  }
  if (!be.supports_kv_dtype(dtype)) {
    return invalid_argument(std::string("this backend's KV cache cannot hold ") +
                            dtype_name(dtype));
  }
  k_ = v_ = k_scale_ = v_scale_ = {};  // the old cache goes first
  num_blocks_ = block_size_ = row_ = n_kv_heads_ = 0;
  const int64_t rows = (num_blocks + 1) * block_size;
  const int64_t elems = layers * rows * n_kv_heads * head_dim;
  for (ops::Buffer* b : {&k_, &v_}) {
    auto m = be.alloc(elems, dtype, /*lazy=*/true);
    if (!m.ok()) {
      k_ = v_ = {};
      return m.status();
    }
    *b = std::move(m).value();
  }
  if (dtype == DType::kI8) {
    for (ops::Buffer* b : {&k_scale_, &v_scale_}) {
      auto m = be.alloc(layers * rows * n_kv_heads, DType::kF32, /*lazy=*/true);
      if (!m.ok()) {
        k_ = v_ = k_scale_ = v_scale_ = {};
        return m.status();
      }
      *b = std::move(m).value();
    }
  }
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  row_ = n_kv_heads * head_dim;
  n_kv_heads_ = n_kv_heads;
  dtype_ = dtype;
  return ok_status();
}

Status KvCache::allocate_states(ops::Backend& be, const KvCacheGroup& group, int64_t slots,
                                int64_t snapshots) {
  if (group.kind != CacheKind::kLinearState || group.layers.empty() || group.state.floats <= 0 ||
      slots <= 0 || snapshots < 0) {
    return invalid_argument("the state cache needs a state group with layers, and slots");
  }
  states_ = snaps_ = {};
  slots_ = snapshots_ = state_floats_ = state_layers_ = 0;
  const int64_t layers = static_cast<int64_t>(group.layers.size());
  VLM_ASSIGN_OR_RETURN(states_,
                       be.alloc(layers * slots * group.state.floats, DType::kF32, /*lazy=*/true));
  if (snapshots > 0) {
    VLM_ASSIGN_OR_RETURN(snaps_, be.alloc(layers * snapshots * group.state.floats, DType::kF32,
                                          /*lazy=*/true));
  }
  slots_ = slots;
  snapshots_ = snapshots;
  state_floats_ = group.state.floats;
  state_layers_ = layers;
  return ok_status();
}

Status KvCache::copy_state(ops::Backend& be, int64_t slot, int64_t snapshot, bool save) const {
  if (slot < 0 || slot >= slots_ || snapshot < 0 || snapshot >= snapshots_) {
    return internal_error("a state copy names a slot or snapshot outside the cache");
  }
  for (int64_t l = 0; l < state_layers_; ++l) {
    const ops::Buf s = states_.at((l * slots_ + slot) * state_floats_);
    const ops::Buf p = snaps_.at((l * snapshots_ + snapshot) * state_floats_);
    VLM_RETURN_IF_ERROR(copy_one(be, save ? p : s, save ? s : p));
  }
  return ok_status();
}

Status KvCache::copy_one(ops::Backend& be, ops::Buf to, ops::Buf from) const {
  return be.copy(to, from, static_cast<size_t>(state_floats_) * 4);
}

Status KvCache::save_state(ops::Backend& be, int64_t slot, int64_t snapshot) const {
  return copy_state(be, slot, snapshot, true);
}

Status KvCache::restore_state(ops::Backend& be, int64_t snapshot, int64_t slot) const {
  return copy_state(be, slot, snapshot, false);
}

Status KvCache::copy_slot(ops::Backend& be, int64_t from, int64_t to) const {
  if (from < 0 || from >= slots_ || to < 0 || to >= slots_) {
    return internal_error("a state copy names a slot outside the cache");
  }
  for (int64_t l = 0; l < state_layers_; ++l) {
    VLM_RETURN_IF_ERROR(copy_one(be, states_.at((l * slots_ + to) * state_floats_),
                                 states_.at((l * slots_ + from) * state_floats_)));
  }
  return ok_status();
}

ops::KvLayer KvCache::layer(int64_t l) const {
  ops::KvLayer c;
  c.k = k_.at(l * rows() * row_);
  c.v = v_.at(l * rows() * row_);
  if (dtype_ == DType::kI8) {
    c.k_scale = k_scale_.at(l * rows() * n_kv_heads_);
    c.v_scale = v_scale_.at(l * rows() * n_kv_heads_);
  }
  return c;
}

}  // namespace vlm

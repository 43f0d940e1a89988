// The paged KV cache's memory: K and V of every full-attention layer, [num_blocks + 1,
// block_size, row] each in the cache's type — the backend's activation type, or on the CPU BF16
// or INT8 (then with one f32 scale per row and KV head beside them) — and a hybrid model's state
// slots (its linear-attention layers' per-sequence state). Which block a sequence's positions use
// is KvCacheManager's (block_pool.h) decision, which slot the scheduler's; the block after the
// last is scratch, where a graph's padding rows write. On the CPU the memory is reserved, not
// touched: its pages become resident as blocks and slots are first written, so a cache sized for
// many long sequences costs only what is used.
#pragma once

#include <cstdint>

#include "kv/kv_cache_spec.h"
#include "ops/backend.h"
#include "vlm/status.h"

namespace vlm {

class KvCache {
 public:
  // The memory of a full-attention group (kv_cache_spec.h): its layers' K and V for `num_blocks`
  // blocks of `block_size` tokens. kUnavailable when the memory cannot be had (the old cache is
  // gone then too). The group's dtype must be one the backend's cache may hold
  // (Backend::supports_kv_dtype).
  Status allocate(ops::Backend& be, const KvCacheGroup& group, int64_t num_blocks,
                  int64_t block_size);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t row() const { return row_; }
  DType dtype() const { return dtype_; }
  int64_t capacity() const { return num_blocks_ * block_size_; }
  int64_t scratch_block() const { return num_blocks_; }
  // K and V of the attention group's l-th layer (its index in the group, not in the decoder):
  // [(num_blocks + 1) · block_size, row] each (and their scales).
  ops::KvLayer layer(int64_t l) const;

  // The memory of a state group (kv_cache_spec.h): `slots` slots and `snapshots` snapshots of
  // group.state.floats f32 values for each of its layers, reserved and zeroed (resident as first
  // written).
  Status allocate_states(ops::Backend& be, const KvCacheGroup& group, int64_t slots,
                         int64_t snapshots = 0);
  int64_t state_slots() const { return slots_; }
  int64_t state_snapshots() const { return snapshots_; }
  // Copies every layer's state of slot `slot` into snapshot `snapshot` (save) or back (restore).
  Status save_state(ops::Backend& be, int64_t slot, int64_t snapshot) const;
  Status restore_state(ops::Backend& be, int64_t snapshot, int64_t slot) const;
  // Copies every layer's state of slot `from` into slot `to`.
  Status copy_slot(ops::Backend& be, int64_t from, int64_t to) const;
  // Layer l of the state group's slots: [state_slots, state_floats] f32.
  ops::Buf states(int64_t l) const { return states_.at(l * slots_ * state_floats_); }

 private:
  int64_t rows() const { return (num_blocks_ + 1) * block_size_; }
  ops::Buffer k_, v_, k_scale_, v_scale_, states_, snaps_;
  int64_t slots_ = 0, snapshots_ = 0, state_floats_ = 0, state_layers_ = 0;
  Status copy_state(ops::Backend& be, int64_t slot, int64_t snapshot, bool save) const;
  Status copy_one(ops::Backend& be, ops::Buf to, ops::Buf from) const;  // one layer's state
  int64_t num_blocks_ = 0, block_size_ = 0, row_ = 0, n_kv_heads_ = 0;
  DType dtype_ = DType::kF32;
};

}  // namespace vlm

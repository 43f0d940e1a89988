// The paged KV cache's memory: K and V of every layer, [num_blocks + 1, block_size, row] each in
// the backend's activation type. Which block a sequence's positions use is KvCacheManager's
// (block_pool.h) decision; the block after the last is scratch, where a graph's padding rows
// write. On the CPU the memory is reserved, not touched: its pages become resident as blocks are
// first written, so a cache sized for many long sequences costs only what is used.
#pragma once

#include <cstdint>

#include "ops/backend.h"
#include "vlm/status.h"

namespace vlm {

class KvCache {
 public:
  // kUnavailable when the memory cannot be had (the old cache is gone then too).
  Status allocate(ops::Backend& be, int64_t layers, int64_t row, int64_t num_blocks,
                  int64_t block_size);
  // Bytes one block takes: every layer, K and V.
  static int64_t block_bytes(int64_t layers, int64_t row, int64_t block_size, DType t) {
    return layers * 2 * block_size * row * static_cast<int64_t>(dtype_size(t));
  }

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t row() const { return row_; }
  int64_t capacity() const { return num_blocks_ * block_size_; }
  int64_t scratch_block() const { return num_blocks_; }
  // Layer l's K (V): [(num_blocks + 1) · block_size, row].
  ops::Buf k_layer(int64_t l) const { return k_.at(l * per_layer()); }
  ops::Buf v_layer(int64_t l) const { return v_.at(l * per_layer()); }

 private:
  int64_t per_layer() const { return (num_blocks_ + 1) * block_size_ * row_; }
  ops::Buffer k_, v_;
  int64_t num_blocks_ = 0, block_size_ = 0, row_ = 0;
};

}  // namespace vlm

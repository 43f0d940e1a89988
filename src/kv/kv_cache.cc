#include "kv/kv_cache.h"

namespace vlm {

Status KvCache::allocate(ops::Backend& be, int64_t layers, int64_t row, int64_t num_blocks,
                         int64_t block_size) {
  if (layers <= 0 || row <= 0 || num_blocks <= 0 || block_size <= 0) {
    return invalid_argument("the KV cache needs positive layers, row, blocks and block size");
  }
  k_ = {};  // the old cache goes first
  v_ = {};
  num_blocks_ = block_size_ = row_ = 0;
  const int64_t elems = layers * (num_blocks + 1) * block_size * row;
  auto k = be.alloc(elems, be.act_dtype(), /*lazy=*/true);
  if (!k.ok()) return k.status();
  auto v = be.alloc(elems, be.act_dtype(), /*lazy=*/true);
  if (!v.ok()) return v.status();  // k's memory goes with it
  k_ = std::move(k).value();
  v_ = std::move(v).value();
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  row_ = row;
  return ok_status();
}

}  // namespace vlm

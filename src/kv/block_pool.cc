#include "kv/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace vlm {

BlockPool::BlockPool(int32_t num_blocks) : ref_(std::max(0, num_blocks), 0) {
  free_.reserve(ref_.size());
  // Pushed in reverse so that allocation hands out 0, 1, 2, ... first.
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

Status BlockPool::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n < 0) return invalid_argument("negative block count");
  if (n > num_free()) {
    return Status(StatusCode::kUnavailable, "KV cache: " + std::to_string(n) + " blocks needed, " +
                                                std::to_string(num_free()) + " free of " +
                                                std::to_string(num_blocks()));
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = free_.back();
    free_.pop_back();
    ref_[b] = 1;
    out->push_back(b);
  }
  return ok_status();
}

void BlockPool::retain(int32_t block) {
  VLM_CHECK(block >= 0 && block < num_blocks() && ref_[block] > 0, "retain of a free block");
  ++ref_[block];
}

void BlockPool::release(const std::vector<int32_t>& blocks) {
  for (int32_t b : blocks) {
    VLM_CHECK(b >= 0 && b < num_blocks() && ref_[b] > 0, "release of a free block");
    if (--ref_[b] == 0) free_.push_back(b);
  }
}

KvCacheManager::KvCacheManager(int32_t num_blocks, int32_t block_size)
    : pool_(num_blocks), block_size_(std::max(1, block_size)) {}

KvCacheManager::Seq* KvCacheManager::find(int64_t seq) {
  for (auto& s : seqs_) {
    if (s.id == seq) return &s;
  }
  return nullptr;
}

const KvCacheManager::Seq* KvCacheManager::find(int64_t seq) const {
  for (const auto& s : seqs_) {
    if (s.id == seq) return &s;
  }
  return nullptr;
}

bool KvCacheManager::can_reserve(int64_t seq, int64_t total_tokens) const {
  const Seq* s = find(seq);
  const int32_t have = s ? static_cast<int32_t>(s->blocks.size()) : 0;
  return blocks_for(total_tokens) - have <= pool_.num_free();
}

Status KvCacheManager::reserve(int64_t seq, int64_t total_tokens, int64_t token_limit) {
  Seq* s = find(seq);
  const int32_t have = s ? static_cast<int32_t>(s->blocks.size()) : 0;
  const int32_t need = blocks_for(total_tokens) - have;
  if (need > 0 && need > pool_.num_free()) {
    return pool_.allocate(need, nullptr);  // the pool's kUnavailable; nothing changes
  }
  if (s == nullptr) {
    seqs_.push_back({seq, {}});
    s = &seqs_.back();
    s->blocks.reserve(blocks_for(std::max(total_tokens, token_limit)));
  }
  // NOTE(vlm): blocks go straight into the table (no temporary): a decode step that crosses a
  // block boundary allocates no heap memory.
  return need > 0 ? pool_.allocate(need, &s->blocks) : ok_status();
}

void KvCacheManager::free(int64_t seq) {
  for (size_t i = 0; i < seqs_.size(); ++i) {
    if (seqs_[i].id == seq) {
      pool_.release(seqs_[i].blocks);
      seqs_[i] = std::move(seqs_.back());
      seqs_.pop_back();
      return;
    }
  }
}

const std::vector<int32_t>& KvCacheManager::block_table(int64_t seq) const {
  static const std::vector<int32_t> kEmpty;
  const Seq* s = find(seq);
  return s ? s->blocks : kEmpty;
}

}  // namespace vlm

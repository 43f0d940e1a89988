#include "kv/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace vlm {

BlockPool::BlockPool(int32_t num_blocks)
    : ref_(std::max(0, num_blocks), 0),
      prev_(ref_.size() + 1),
      next_(ref_.size() + 1),
      hashed_(ref_.size(), 0),
      hash_(ref_.size()) {
  const int32_t head = static_cast<int32_t>(ref_.size());
  prev_[head] = next_[head] = head;
  // In order, so that allocation hands out 0, 1, 2, ... first.
  for (int32_t b = 0; b < head; ++b) push_back(b);
  size_t slots = 2;
  while (slots < 2 * ref_.size()) slots *= 2;
  slots_.assign(slots, -1);
  mask_ = slots - 1;
}

void BlockPool::unlink(int32_t b) {
  next_[prev_[b]] = next_[b];
  prev_[next_[b]] = prev_[b];
  --num_free_;
}

void BlockPool::push_front(int32_t b) {
  const int32_t head = num_blocks();
  prev_[b] = head;
  next_[b] = next_[head];
  prev_[next_[head]] = b;
  next_[head] = b;
  ++num_free_;
}

void BlockPool::push_back(int32_t b) {
  const int32_t head = num_blocks();
  next_[b] = head;
  prev_[b] = prev_[head];
  next_[prev_[head]] = b;
  prev_[head] = b;
  ++num_free_;
}

Status BlockPool::allocate(int32_t n, std::vector<int32_t>* out) {
  if (n < 0) return invalid_argument("negative block count");
  if (n > num_free()) {
    return Status(StatusCode::kUnavailable, "KV cache: " + std::to_string(n) + " blocks needed, " +
                                                std::to_string(num_free()) + " free of " +
                                                std::to_string(num_blocks()));
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t b = next_[num_blocks()];
    unlink(b);
    if (hashed_[b]) {
      if (log_on_) {
        if (log_.empty() || log_.back().kind != KvCacheEvent::Kind::kRemoved) {
          log_.emplace_back().kind = KvCacheEvent::Kind::kRemoved;
        }
        log_.back().hashes.push_back(hash_[b]);
      }
      drop_hash(b);
      ++evictions_;
    }
    ref_[b] = 1;
    out->push_back(b);
  }
  return ok_status();
}

void BlockPool::touch(int32_t block) {
  VLM_CHECK(block >= 0 && block < num_blocks(), "touch of a block out of range");
  if (ref_[block]++ == 0) unlink(block);
}

void BlockPool::release(std::span<const int32_t> blocks) {
  for (size_t i = blocks.size(); i-- > 0;) {
    const int32_t b = blocks[i];
    VLM_CHECK(b >= 0 && b < num_blocks() && ref_[b] > 0, "release of a free block");
    if (--ref_[b] == 0) {
      if (hashed_[b]) {
        push_back(b);
      } else {
        push_front(b);
      }
    }
  }
}

int32_t BlockPool::lookup(const BlockHash& hash) const {
  for (size_t i = home(hash);; i = (i + 1) & mask_) {
    const int32_t b = slots_[i];
    if (b < 0) return -1;
    if (hash_[b] == hash) return b;
  }
}

bool BlockPool::cache(int32_t block, const BlockHash& hash) {
  VLM_CHECK(block >= 0 && block < num_blocks() && ref_[block] > 0, "cache of a free block");
  if (hashed_[block]) return false;
  size_t i = home(hash);
  for (; slots_[i] >= 0; i = (i + 1) & mask_) {
    if (hash_[slots_[i]] == hash) return false;
  }
  slots_[i] = block;
  hash_[block] = hash;
  hashed_[block] = 1;
  ++num_cached_;
  return true;
}

// NOTE: backward-shift deletion (no tombstones): the entries after the hole that may move into it
// (their home is not cyclically within (hole, j]) do, until an empty slot ends the run.
void BlockPool::drop_hash(int32_t b) {
  size_t hole = home(hash_[b]);
  while (slots_[hole] != b) hole = (hole + 1) & mask_;
  for (size_t j = (hole + 1) & mask_; slots_[j] >= 0; j = (j + 1) & mask_) {
    const size_t k = home(hash_[slots_[j]]);
    const bool stays = hole <= j ? (hole < k && k <= j) : (hole < k || k <= j);
    if (stays) continue;
    slots_[hole] = slots_[j];
    hole = j;
  }
  slots_[hole] = -1;
  hashed_[b] = 0;
  --num_cached_;
}

void BlockPool::reset_cache() {
  if (log_on_) log_.emplace_back().kind = KvCacheEvent::Kind::kCleared;
  std::fill(slots_.begin(), slots_.end(), -1);
  std::fill(hashed_.begin(), hashed_.end(), 0);
  num_cached_ = 0;
  // Free blocks that were cached keep their places in the list; they are plain free blocks now.
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

KvCacheManager::Seq& KvCacheManager::add_seq(int64_t seq, int64_t total_tokens,
                                             int64_t token_limit) {
  seqs_.push_back({seq, {}, 0});
  Seq& s = seqs_.back();
  s.blocks.reserve(blocks_for(std::max(total_tokens, token_limit)));
  return s;
}

Status KvCacheManager::reserve(int64_t seq, int64_t total_tokens, int64_t token_limit) {
  Seq* s = find(seq);
  const int32_t have = s ? static_cast<int32_t>(s->blocks.size()) : 0;
  const int32_t need = blocks_for(total_tokens) - have;
  if (need > 0 && need > pool_.num_free()) {
    return pool_.allocate(need, nullptr);  // the pool's kUnavailable; nothing changes
  }
  if (s == nullptr) s = &add_seq(seq, total_tokens, token_limit);
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

void KvCacheManager::trim(int64_t seq, int64_t total_tokens) {
  Seq* s = find(seq);
  if (s == nullptr) return;
  const size_t keep = static_cast<size_t>(std::max(blocks_for(total_tokens), s->num_hashed));
  if (s->blocks.size() <= keep) return;
  pool_.release(std::span<const int32_t>(s->blocks).subspan(keep));
  s->blocks.resize(keep);
}

const std::vector<int32_t>& KvCacheManager::block_table(int64_t seq) const {
  static const std::vector<int32_t> kEmpty;
  const Seq* s = find(seq);
  return s ? s->blocks : kEmpty;
}

int32_t KvCacheManager::cached_prefix(std::span<const BlockHash> hashes, int64_t max_tokens,
                                      std::vector<int32_t>* blocks) const {
  blocks->clear();
  const size_t most = static_cast<size_t>(std::max<int64_t>(max_tokens, 0) / block_size_);
  for (size_t i = 0; i < hashes.size() && i < most; ++i) {
    const int32_t b = pool_.lookup(hashes[i]);
    if (b < 0) break;
    blocks->push_back(b);
  }
  return static_cast<int32_t>(blocks->size());
}

bool KvCacheManager::can_reserve_prefix(std::span<const int32_t> hit, int64_t total_tokens) const {
  int32_t hit_free = 0;  // hits that are free blocks now: taking them leaves fewer free
  for (int32_t b : hit) hit_free += pool_.ref_count(b) == 0 ? 1 : 0;
  const int32_t need = std::max(0, blocks_for(total_tokens) - static_cast<int32_t>(hit.size()));
  return need <= pool_.num_free() - hit_free;
}

Status KvCacheManager::reserve_prefix(int64_t seq, std::span<const int32_t> hit,
                                      int64_t total_tokens, int64_t token_limit) {
  VLM_CHECK(find(seq) == nullptr, "reserve_prefix of a sequence that holds blocks");
  if (!can_reserve_prefix(hit, total_tokens)) {
    return Status(StatusCode::kUnavailable,
                  "KV cache: " + std::to_string(blocks_for(total_tokens)) + " blocks needed (" +
                      std::to_string(hit.size()) + " cached), " + std::to_string(pool_.num_free()) +
                      " free of " + std::to_string(pool_.num_blocks()));
  }
  Seq& s = add_seq(seq, total_tokens, token_limit);
  for (int32_t b : hit) {
    pool_.touch(b);
    s.blocks.push_back(b);
  }
  s.num_hashed = static_cast<int32_t>(hit.size());
  const int32_t need = blocks_for(total_tokens) - static_cast<int32_t>(hit.size());
  return need > 0 ? pool_.allocate(need, &s.blocks) : ok_status();
}

void KvCacheManager::cache_full_blocks(int64_t seq, std::span<const BlockHash> hashes,
                                       int64_t tokens) {
  Seq* s = find(seq);
  if (s == nullptr) return;
  const int32_t full = std::min<int32_t>({static_cast<int32_t>(tokens / block_size_),
                                          static_cast<int32_t>(hashes.size()),
                                          static_cast<int32_t>(s->blocks.size())});
  for (; s->num_hashed < full; ++s->num_hashed) {
    const int32_t k = s->num_hashed;
    std::vector<KvCacheEvent>* log = pool_.event_log();
    if (!pool_.cache(s->blocks[k], hashes[k]) || log == nullptr) continue;
    // A run of blocks keyed in order is one event, as long as nothing else came between.
    KvCacheEvent* e = log->empty() ? nullptr : &log->back();
    if (e == nullptr || e->kind != KvCacheEvent::Kind::kStored || e->seq != seq ||
        e->first_block + static_cast<int32_t>(e->hashes.size()) != k) {
      e = &log->emplace_back();
      e->kind = KvCacheEvent::Kind::kStored;
      e->seq = seq;
      e->first_block = k;
      if (k > 0) e->parent = hashes[k - 1];
    }
    e->hashes.push_back(hashes[k]);
  }
}

void KvCacheManager::take_events(std::vector<KvCacheEvent>* out) {
  out->clear();
  if (std::vector<KvCacheEvent>* log = pool_.event_log()) out->swap(*log);
}

}  // namespace vlm

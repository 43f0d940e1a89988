// Paged KV cache bookkeeping: a pool of fixed-size blocks with a free list and reference counts.
// Plain data, no tensors: the engine maps block ids to memory. (vLLM's BlockPool, without prefix
// caching yet.) Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "vlm/status.h"

namespace vlm {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_blocks() - num_free(); }

  // Takes n blocks (ref count 1 each) or, when fewer than n are free, none: kUnavailable.
  Status allocate(int32_t n, std::vector<int32_t>* out);
  // Adds a reference (a block shared by two sequences).
  void retain(int32_t block);
  // Drops one reference per block; a block returns to the free list at zero.
  void release(const std::vector<int32_t>& blocks);
  int32_t ref_count(int32_t block) const { return ref_[block]; }

 private:
  std::vector<int32_t> ref_;   // [num_blocks]
  std::vector<int32_t> free_;  // stack of free block ids; the most recently freed is reused first
};

// The blocks of every running sequence: how many tokens each holds and its block table.
class KvCacheManager {
 public:
  KvCacheManager(int32_t num_blocks, int32_t block_size);

  int32_t block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }

  // Blocks needed to hold `tokens` tokens.
  int32_t blocks_for(int64_t tokens) const {
    return static_cast<int32_t>((tokens + block_size_ - 1) / block_size_);
  }
  // Grows `seq`'s table so it can hold `total_tokens`; all or nothing (kUnavailable when the
  // pool is short, leaving the table as it was). A new seq id starts an empty table, with room
  // for the blocks of `token_limit` (the most tokens the sequence will hold: its prompt and its
  // max_new_tokens) when given, so the table never reallocates while it grows.
  Status reserve(int64_t seq, int64_t total_tokens, int64_t token_limit = 0);
  // Frees every block of `seq` (a finished, cancelled or preempted sequence). Unknown ids: no-op.
  void free(int64_t seq);
  // The block table of `seq` (empty when unknown).
  const std::vector<int32_t>& block_table(int64_t seq) const;
  bool can_reserve(int64_t seq, int64_t total_tokens) const;

 private:
  struct Seq {
    int64_t id;
    std::vector<int32_t> blocks;
  };
  Seq* find(int64_t seq);
  const Seq* find(int64_t seq) const;

  BlockPool pool_;
  int32_t block_size_;
  std::vector<Seq> seqs_;  // few at a time (the running batch): a flat vector beats a map
};

}  // namespace vlm

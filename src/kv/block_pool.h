// Paged KV cache bookkeeping: a pool of fixed-size blocks with reference counts and, for prefix
// caching, a map from block contents (kv/block_hash.h) to the block that holds them (vLLM v1's
// BlockPool and KVCacheManager). Plain data, no tensors: the engine maps block ids to memory.
// Not thread-safe: the engine thread owns it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kv/block_hash.h"
#include "vlm/status.h"

namespace vlm {

// One change to the set of cached block contents, for a consumer that mirrors it (the KV event
// stream a KV-aware router reads). Recorded only while a log is attached.
struct KvCacheEvent {
  enum class Kind : uint8_t {
    kStored,   // `hashes` now name blocks: a run of a sequence's blocks, keyed in order
    kRemoved,  // `hashes` name no block any more (evicted to make room)
    kCleared,  // every hash was forgotten
  };
  Kind kind = Kind::kStored;
  int64_t seq = -1;         // kStored: the sequence whose blocks were keyed
  int32_t first_block = 0;  // kStored: the first one's index in its block table
  std::vector<BlockHash> hashes;
  std::optional<BlockHash> parent;  // kStored: the hash of the block before the run, if any
};

// Free blocks (reference count 0) wait in one list, allocated from its head. A freed block
// without a hash goes to the head (reused first); one that holds a hash (cached contents) goes
// to the tail, so cached blocks are evicted least recently used first, and only once no other
// free block is left. Free cached blocks count as free: they are reclaimable.
class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  int32_t num_free() const { return num_free_; }
  int32_t num_used() const { return num_blocks() - num_free(); }
  // Blocks that hold a hash (in use or free).
  int32_t num_cached() const { return num_cached_; }
  int64_t evictions() const { return evictions_; }

  // Takes n free blocks (ref count 1 each), a cached one losing its hash (evicted), or, when
  // fewer than n are free, none: kUnavailable.
  Status allocate(int32_t n, std::vector<int32_t>* out);
  // Adds a reference (a block shared by two sequences, or a cache hit); a free block leaves the
  // free list.
  void touch(int32_t block);
  // Drops one reference per block, in reverse order (a sequence's last block is freed first, so
  // that it is evicted before the blocks its head shares with other prompts).
  void release(std::span<const int32_t> blocks);
  int32_t ref_count(int32_t block) const { return ref_[block]; }

  // The block holding `hash`, or -1.
  int32_t lookup(const BlockHash& hash) const;
  // Records that `block` (in use, its K/V computed or being computed this step) holds `hash`;
  // true when it does now. No-op (false) when the block already has a hash or another block holds
  // this one (two requests computed the same contents; the first stays the one found).
  bool cache(int32_t block, const BlockHash& hash);
  bool has_hash(int32_t block) const { return hashed_[block] != 0; }
  const BlockHash& hash_of(int32_t block) const { return hash_[block]; }  // when has_hash
  // Forgets every hash (the blocks stay where they are).
  void reset_cache();
  // KV events: from now on evictions and resets are recorded in order in event_log(), which
  // KvCacheManager also appends its stored runs to. Off by default (event_log() is null).
  void enable_event_log() { log_on_ = true; }
  std::vector<KvCacheEvent>* event_log() { return log_on_ ? &log_ : nullptr; }

 private:
  void unlink(int32_t b);
  void push_front(int32_t b);
  void push_back(int32_t b);
  void drop_hash(int32_t b);
  size_t home(const BlockHash& h) const { return BlockHashHash{}(h)&mask_; }

  std::vector<int32_t> ref_;  // [num_blocks]
  std::vector<int32_t> prev_,
      next_;                     // [num_blocks + 1]: the free list; index num_blocks is its head
  std::vector<uint8_t> hashed_;  // [num_blocks]: hash_[b] is valid
  std::vector<BlockHash> hash_;  // [num_blocks]
  // hash → block: open addressing with linear probing over at least twice as many slots as
  // blocks (block id, or -1), the keys in hash_. Fixed at construction, so that keying a block in
  // a decode step allocates nothing.
  std::vector<int32_t> slots_;
  size_t mask_ = 0;
  int32_t num_cached_ = 0;
  int32_t num_free_ = 0;
  int64_t evictions_ = 0;
  bool log_on_ = false;
  std::vector<KvCacheEvent> log_;
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
  // Gives back `seq`'s blocks past those `total_tokens` tokens need (never a keyed one): the room
  // a step reserved for proposals that were rejected. Unknown ids: no-op.
  void trim(int64_t seq, int64_t total_tokens);
  // The block table of `seq` (empty when unknown).
  const std::vector<int32_t>& block_table(int64_t seq) const;

  // Prefix caching. The longest run of `hashes` (a sequence's full blocks in order) found in the
  // cache, at most `max_tokens` tokens of it, into *blocks (cleared first); returns its length in
  // blocks.
  int32_t cached_prefix(std::span<const BlockHash> hashes, int64_t max_tokens,
                        std::vector<int32_t>* blocks) const;
  // Whether a new `seq` starting with the cached `hit` blocks could grow to `total_tokens`.
  bool can_reserve_prefix(std::span<const int32_t> hit, int64_t total_tokens) const;
  // Starts the table of a new `seq` with the cached `hit` blocks (a reference each) and grows it
  // to `total_tokens`; all or nothing, as reserve().
  Status reserve_prefix(int64_t seq, std::span<const int32_t> hit, int64_t total_tokens,
                        int64_t token_limit = 0);
  // Records the hashes of `seq`'s blocks that are full at `tokens` tokens (as far as `hashes`,
  // its full blocks' hashes, goes) and not recorded yet.
  void cache_full_blocks(int64_t seq, std::span<const BlockHash> hashes, int64_t tokens);
  void reset_cache() { pool_.reset_cache(); }

  // KV events: from now on every change to the cached set (blocks keyed, evicted, all forgotten)
  // is recorded in order until take_events() hands it over. Off by default (nothing recorded).
  void enable_events() { pool_.enable_event_log(); }
  // Moves the changes recorded since the last call into *out (cleared first).
  void take_events(std::vector<KvCacheEvent>* out);

 private:
  struct Seq {
    int64_t id;
    std::vector<int32_t> blocks;
    int32_t num_hashed = 0;  // blocks[0, num_hashed) had their hash recorded
  };
  Seq* find(int64_t seq);
  const Seq* find(int64_t seq) const;
  Seq& add_seq(int64_t seq, int64_t total_tokens, int64_t token_limit);

  BlockPool pool_;
  int32_t block_size_;
  std::vector<Seq> seqs_;  // few at a time (the running batch): a flat vector beats a map
};

}  // namespace vlm

// Byte-pair merging over token ids: the merge table and the merge loop of the BPE model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace vlm::tok {

// (left id, right id) -> (rank, merged id), in an open-addressing table: the lookup sits in the
// innermost loop of encode, and a flat table is several times faster than std::unordered_map.
class MergeMap {
 public:
  struct Entry {
    int32_t rank;
    int32_t merged;
  };

  void reserve(size_t n);
  // Later inserts of the same pair overwrite earlier ones, as in Hugging Face's HashMap build.
  void insert(int32_t left, int32_t right, int32_t rank, int32_t merged);
  // nullptr when the pair has no merge.
  const Entry* find(int32_t left, int32_t right) const {
    if (slots_.empty()) return nullptr;
    const uint64_t key = make_key(left, right);
    for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.entry;
      if (s.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint64_t key;
    Entry entry;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are >= 0, so no real key is all ones

  // Whether n entries stay within the load factor of a table of `slots` (at most 3 in 5 used:
  // linear probing's chains stay short).
  static bool fits(size_t n, size_t slots) { return n * 5 <= slots * 3; }
  static uint64_t make_key(int32_t left, int32_t right) {
    return (uint64_t{static_cast<uint32_t>(left)} << 32) | static_cast<uint32_t>(right);
  }
  size_t slot_of(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);  // Fibonacci hashing
  }
  void rehash(size_t capacity);

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
  size_t size_ = 0;
};

// Merges `ids` (one id per byte of a pre-tokenized piece) in place, exactly as Hugging Face's
// BPE `Word::merge_all` without dropout: repeatedly merge the adjacent pair with the lowest rank,
// the leftmost one on ties.
void bpe_merge(const MergeMap& merges, std::vector<int32_t>* ids);

// The two strategies bpe_merge chooses between by length; exposed so tests can check they agree.
void bpe_merge_scan(const MergeMap& merges, std::vector<int32_t>* ids);
void bpe_merge_heap(const MergeMap& merges, std::vector<int32_t>* ids);

}  // namespace vlm::tok

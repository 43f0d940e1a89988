// A string -> id map for the vocab: keys live in one arena and the table is open-addressed, so
// building it makes a handful of allocations instead of one per entry, and the 450k lookups made
// while resolving merges at load time stay cheap (std::unordered_map was a third of load time).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace vlm::tok {

class StringIdMap {
 public:
  void reserve(size_t n) {
    entries_.reserve(n);
    if (n * 2 > slots_.size()) rehash(n * 2);
  }

  // Inserts or overwrites.
  void insert(std::string_view key, int32_t id) {
    if ((entries_.size() + 1) * 2 > slots_.size()) rehash((entries_.size() + 1) * 2);
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const int32_t e = slots_[i];
      if (e < 0) {
        slots_[i] = static_cast<int32_t>(entries_.size());
        entries_.push_back(Entry{static_cast<uint32_t>(h >> 32),
                                 static_cast<uint32_t>(arena_.size()),
                                 static_cast<uint32_t>(key.size()), id});
        arena_.append(key);
        return;
      }
      if (matches(entries_[e], h, key)) {
        entries_[e].id = id;
        return;
      }
    }
  }

  std::optional<int32_t> find(std::string_view key) const {
    if (slots_.empty()) return std::nullopt;
    const uint64_t h = hash(key);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const int32_t e = slots_[i];
      if (e < 0) return std::nullopt;
      if (matches(entries_[e], h, key)) return entries_[e].id;
    }
  }

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint32_t hash_hi;  // upper hash bits: most mismatches are rejected without touching the arena
    uint32_t offset;   // key bytes in arena_
    uint32_t length;
    int32_t id;
  };

  static uint64_t hash(std::string_view key) { return std::hash<std::string_view>{}(key); }

  bool matches(const Entry& e, uint64_t h, std::string_view key) const {
    return e.hash_hi == static_cast<uint32_t>(h >> 32) && e.length == key.size() &&
           std::string_view(arena_.data() + e.offset, e.length) == key;
  }

  void rehash(size_t min_slots) {
    size_t n = 16;
    while (n < min_slots) n <<= 1;
    slots_.assign(n, -1);
    mask_ = n - 1;
    for (size_t e = 0; e < entries_.size(); ++e) {
      const std::string_view key(arena_.data() + entries_[e].offset, entries_[e].length);
      size_t i = hash(key) & mask_;
      while (slots_[i] >= 0) i = (i + 1) & mask_;
      slots_[i] = static_cast<int32_t>(e);
    }
  }

  std::vector<int32_t> slots_;  // index into entries_, or -1
  size_t mask_ = 0;
  std::vector<Entry> entries_;
  std::string arena_;
};

// Strings by index in one arena: n strings cost their bytes and 4 more each (a
// std::vector<std::string> costs 32 each and a heap block for every one past 15 bytes; the vocab's
// text and bytes, 151k entries each, went from ~10 MB to ~3).
class StringTable {
 public:
  void reserve(size_t n, size_t bytes) {
    ends_.reserve(n);
    arena_.reserve(bytes);
  }
  void push_back(std::string_view s) {
    arena_.append(s);
    ends_.push_back(static_cast<uint32_t>(arena_.size()));
  }
  std::string_view operator[](size_t i) const {
    const uint32_t begin = i == 0 ? 0 : ends_[i - 1];
    return std::string_view(arena_.data() + begin, ends_[i] - begin);
  }
  size_t size() const { return ends_.size(); }

 private:
  std::string arena_;
  std::vector<uint32_t> ends_;  // string i is arena_[ends_[i - 1], ends_[i])
};

}  // namespace vlm::tok

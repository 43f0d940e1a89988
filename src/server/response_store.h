// The Responses API's stored responses (store, previous_response_id, GET and DELETE
// /v1/responses/{id}): in memory, bounded by a count and by bytes, the least recently used
// evicted first. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

namespace vlm {

class ResponseStore {
 public:
  struct Entry {
    std::string response_json;      // the response object as GET returns it
    std::string conversation_json;  // the chat messages a continuation starts from
  };

  // At most `max_entries` responses and `max_bytes` of their JSON (0 entries: nothing is kept).
  ResponseStore(size_t max_entries, size_t max_bytes)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}

  bool enabled() const { return max_entries_ > 0 && max_bytes_ > 0; }
  // Keeps `e` under `id` (the most recently used), evicting the least recently used beyond the
  // bounds; false (nothing kept) when it alone exceeds max_bytes or the store is off.
  bool put(const std::string& id, Entry e);
  // The entry (now the most recently used), or nullopt.
  std::optional<Entry> get(const std::string& id);
  bool erase(const std::string& id);
  size_t size() const;
  size_t bytes() const;

 private:
  using List = std::list<std::pair<std::string, Entry>>;  // most recently used first
  static size_t cost(const Entry& e) { return e.response_json.size() + e.conversation_json.size(); }

  const size_t max_entries_, max_bytes_;
  mutable std::mutex mu_;
  List lru_;
  std::unordered_map<std::string, List::iterator> by_id_;
  size_t bytes_ = 0;
};

}  // namespace vlm

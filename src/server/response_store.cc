#include "server/response_store.h"

#include <utility>

namespace vlm {

bool ResponseStore::put(const std::string& id, Entry e) {
  const size_t c = cost(e);
  if (!enabled() || c > max_bytes_) return false;
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = by_id_.find(id); it != by_id_.end()) {
    bytes_ -= cost(it->second->second);
    lru_.erase(it->second);
    by_id_.erase(it);
  }
  lru_.emplace_front(id, std::move(e));
  by_id_[id] = lru_.begin();
  bytes_ += c;
  while (lru_.size() > max_entries_ || bytes_ > max_bytes_) {
    bytes_ -= cost(lru_.back().second);
    by_id_.erase(lru_.back().first);
    lru_.pop_back();
  }
  return true;
}

std::optional<ResponseStore::Entry> ResponseStore::get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return std::nullopt;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  if (it == by_id_.end()) return false;
  bytes_ -= cost(it->second->second);
  lru_.erase(it->second);
  by_id_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace vlm

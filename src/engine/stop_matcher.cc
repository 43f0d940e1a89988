#include "engine/stop_matcher.h"

#include <algorithm>

namespace vlm {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::push(const std::string& text) {
  if (stopped_) return {};
  pending_ += text;
  // Earliest stop string occurrence in the pending text.
  size_t cut = std::string::npos;
  for (const auto& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    stopped_ = true;
    emitted_ += out;
    return out;
  }
  // Hold back the longest tail of pending_ that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (pending_.compare(pending_.size() - len, len, s, 0, len) == 0) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  emitted_ += out;
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(pending_);
  emitted_ += out;
  return out;
}

}  // namespace vlm

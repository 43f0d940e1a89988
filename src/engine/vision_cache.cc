#include "engine/vision_cache.h"

namespace vlm {

VisionCacheKey VisionCacheKey::of(std::span<const uint8_t> bytes, int64_t min_pixels,
                                  int64_t max_pixels) {
  VisionCacheKey k;
  k.content = Sha256::of(bytes);
  k.min_pixels = min_pixels;
  k.max_pixels = max_pixels;
  return k;
}

VisionCacheKey VisionCacheKey::of_video(std::span<const uint8_t> bytes, double fps,
                                        int64_t min_frames, int64_t max_frames, int64_t min_pixels,
                                        int64_t max_pixels) {
  VisionCacheKey k = of(bytes, min_pixels, max_pixels);
  Sha256 h;
  h.update(k.content.data(), k.content.size());
  h.update("video", 5);
  h.update_value(fps);
  h.update_value(min_frames);
  h.update_value(max_frames);
  k.content = h.finish();
  return k;
}

size_t EncodedImage::bytes() const {
  size_t n = out.embeds.size() * sizeof(float);
  for (const auto& d : out.deepstack) n += d.size() * sizeof(float);
  n += draft.embeds.size() * sizeof(float);
  for (const auto& d : draft.deepstack) n += d.size() * sizeof(float);
  return n;
}

std::shared_ptr<const EncodedImage> VisionCache::get(const VisionCacheKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->second;
}

void VisionCache::put(const VisionCacheKey& key, std::shared_ptr<const EncodedImage> value) {
  const size_t size = value->bytes();
  if (size > capacity_) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(key) != 0) return;  // another request encoded it meanwhile; keep the first
  lru_.emplace_front(key, std::move(value));
  index_[key] = lru_.begin();
  stats_.bytes += size;
  while (stats_.bytes > capacity_) {
    auto& victim = lru_.back();
    stats_.bytes -= victim.second->bytes();
    index_.erase(victim.first);
    lru_.pop_back();
  }
  stats_.entries = static_cast<int64_t>(lru_.size());
}

void VisionCache::count(bool hit) {
  std::lock_guard<std::mutex> lock(mu_);
  ++(hit ? stats_.hits : stats_.misses);
}

VisionCache::Stats VisionCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace vlm

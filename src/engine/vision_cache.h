// Vision-encoder outputs kept by image content and resize parameters, so an image that comes back
// (a follow-up turn, the same picture from many users, n > 1) is encoded once. Least recently
// used entries go first when the byte budget is exceeded. Thread-safe: HTTP threads look up,
// the engine thread looks up and inserts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/sha256.h"
#include "model/vision_encoder.h"

namespace vlm {

// What identifies one encoder input: the SHA-256 of the encoded file's bytes (a key no client can
// make collide with another's image) plus the pixel budget smart_resize used (the same file at
// another budget is another input). The prefix cache keys image blocks with it too.
struct VisionCacheKey {
  Sha256Digest content{};
  int64_t min_pixels = 0, max_pixels = 0;

  static VisionCacheKey of(std::span<const uint8_t> bytes, int64_t min_pixels, int64_t max_pixels);
  // A video: `content` is the SHA-256 of the bytes' digest, a tag and the frame sampling (fps,
  // min and max frames), so the same file sampled otherwise, or read as an image (a GIF), is
  // another input.
  static VisionCacheKey of_video(std::span<const uint8_t> bytes, double fps, int64_t min_frames,
                                 int64_t max_frames, int64_t min_pixels, int64_t max_pixels);
  bool operator==(const VisionCacheKey&) const = default;
};

struct EncodedImage {
  GridThw grid;  // a video's: grid.t temporal groups
  VisionOutput out;
  VisionOutput draft;  // a speculative draft model's vision tower's (empty without one)
  // A video's: the "<t.t seconds>" text of each temporal group, and the frames sampled.
  std::vector<std::string> timestamps;
  int64_t frames = 0;
  size_t bytes() const;  // memory held by the features
};

class VisionCache {
 public:
  explicit VisionCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The entry for `key` (and marks it recently used), or null.
  std::shared_ptr<const EncodedImage> get(const VisionCacheKey& key);
  // Stores an entry; entries larger than the whole budget are not kept. Holders of evicted
  // entries keep them alive (shared_ptr) until they are done.
  void put(const VisionCacheKey& key, std::shared_ptr<const EncodedImage> value);
  // Counts one image of a request: served from the cache (hit) or encoded (miss). Counted by
  // the caller once per image, since an image may be looked up more than once on its way.
  void count(bool hit);

  struct Stats {
    int64_t hits = 0, misses = 0, entries = 0;
    size_t bytes = 0;
  };
  Stats stats() const;

 private:
  struct KeyHash {
    size_t operator()(const VisionCacheKey& k) const {
      return Sha256DigestHash{}(k.content) ^ static_cast<size_t>(k.max_pixels * 31 + k.min_pixels);
    }
  };
  using Lru = std::list<std::pair<VisionCacheKey, std::shared_ptr<const EncodedImage>>>;

  size_t capacity_;
  mutable std::mutex mu_;
  Lru lru_;  // front: most recently used
  std::unordered_map<VisionCacheKey, Lru::iterator, KeyHash> index_;
  Stats stats_;
};

}  // namespace vlm

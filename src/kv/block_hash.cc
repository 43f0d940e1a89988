#include "kv/block_hash.h"

#include <random>

namespace vlm {

BlockHasher::BlockHasher() {
  std::random_device rd;
  for (size_t i = 0; i < seed_.size(); i += 4) {
    const uint32_t v = rd();
    std::memcpy(seed_.data() + i, &v, 4);
  }
}

BlockHasher::BlockHasher(const BlockHash& seed) : seed_(seed) {}

// NOTE: every field has a fixed width and every list its count first, so two different
// (parent, tokens, extras) never serialize to the same bytes.
BlockHash BlockHasher::hash(const BlockHash* parent, std::span<const int32_t> tokens,
                            std::span<const BlockExtraKey> extras) const {
  Sha256 h;
  const BlockHash& p = parent != nullptr ? *parent : seed_;
  h.update(p.data(), p.size());
  h.update_value(static_cast<uint32_t>(tokens.size()));
  h.update(tokens.data(), tokens.size_bytes());
  h.update_value(static_cast<uint32_t>(extras.size()));
  for (const BlockExtraKey& e : extras) {
    h.update_value(static_cast<uint8_t>(e.kind));
    h.update(e.content.data(), e.content.size());
    h.update(e.params.data(), sizeof e.params);
  }
  return h.finish();
}

}  // namespace vlm

// What identifies a full KV block's contents for prefix caching: a chained SHA-256 over the
// parent block's hash, the block's token ids and its extra keys (vLLM's scheme; SHA-256 since
// its hash-collision advisory GHSA-rm76-4mrf-v9r8). The first block's parent is a seed drawn at
// random when the hasher is made, so keys are neither predictable nor comparable across
// processes.
#pragma once

#include <cstdint>
#include <span>

#include "core/sha256.h"

namespace vlm {

using BlockHash = Sha256Digest;
using BlockHashHash = Sha256DigestHash;

// What a block's K/V depends on besides its token ids and what precedes it: every image whose
// tokens it covers (its placeholders all share one id).
struct BlockExtraKey {
  enum class Kind : uint8_t { kImage = 1 };
  Kind kind = Kind::kImage;
  Sha256Digest content{};           // image: SHA-256 of its encoded bytes
  std::array<int64_t, 2> params{};  // image: the min and max pixels it was resized with
  bool operator==(const BlockExtraKey&) const = default;
};

class BlockHasher {
 public:
  BlockHasher();                                // a random seed
  explicit BlockHasher(const BlockHash& seed);  // a given one (tests)

  // The hash of a block of `tokens` after the block `parent` (null: the first block).
  BlockHash hash(const BlockHash* parent, std::span<const int32_t> tokens,
                 std::span<const BlockExtraKey> extras) const;

 private:
  BlockHash seed_;
};

}  // namespace vlm

#include "core/sha256.h"

#include <nettle/sha2.h>

namespace vlm {

std::string sha256_hex(const Sha256Digest& d) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(2 * d.size(), '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = kHex[d[i] >> 4];
    s[2 * i + 1] = kHex[d[i] & 15];
  }
  return s;
}

static_assert(sizeof(sha256_ctx) <= 128 && alignof(sha256_ctx) <= 8);

Sha256::Sha256() { sha256_init(reinterpret_cast<sha256_ctx*>(ctx_)); }

void Sha256::update(const void* data, size_t n) {
  sha256_update(reinterpret_cast<sha256_ctx*>(ctx_), n, static_cast<const uint8_t*>(data));
}

Sha256Digest Sha256::finish() {
  Sha256Digest d;
  sha256_digest(reinterpret_cast<sha256_ctx*>(ctx_), d.size(), d.data());  // also re-inits
  return d;
}

Sha256Digest Sha256::of(std::span<const uint8_t> bytes) {
  Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.finish();
}

}  // namespace vlm

// The cache's content hashes: SHA-256 (LFS files) and git's blob SHA-1 (the others), by Nettle.
#include <nettle/sha1.h>
#include <nettle/sha2.h>

#include <cstdio>
#include <string>

#include "hub/hub_internal.h"

namespace vlm::hub {

static_assert(sizeof(sha256_ctx) <= 256 && sizeof(sha1_ctx) <= 256);

ContentHash::ContentHash(Kind kind, int64_t size) : kind_(kind) {
  if (kind_ == Kind::kSha256) {
    sha256_init(reinterpret_cast<sha256_ctx*>(ctx_));
    return;
  }
  sha1_init(reinterpret_cast<sha1_ctx*>(ctx_));
  const std::string header = "blob " + std::to_string(size) + std::string(1, '\0');
  update(header.data(), header.size());
}

void ContentHash::update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (kind_ == Kind::kSha256) {
    sha256_update(reinterpret_cast<sha256_ctx*>(ctx_), n, p);
  } else {
    sha1_update(reinterpret_cast<sha1_ctx*>(ctx_), n, p);
  }
}

std::string ContentHash::hex() {
  uint8_t digest[SHA256_DIGEST_SIZE];
  size_t n = SHA1_DIGEST_SIZE;
  if (kind_ == Kind::kSha256) {
    n = SHA256_DIGEST_SIZE;
    sha256_digest(reinterpret_cast<sha256_ctx*>(ctx_), n, digest);
  } else {
    sha1_digest(reinterpret_cast<sha1_ctx*>(ctx_), n, digest);
  }
  std::string out;
  char buf[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", digest[i]);
    out += buf;
  }
  return out;
}

}  // namespace vlm::hub

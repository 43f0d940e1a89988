// SHA-256 (Nettle) for content keys a client must not be able to make collide: the vision cache's
// image keys and the prefix cache's block hashes. Incremental, and allocation-free.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace vlm {

using Sha256Digest = std::array<uint8_t, 32>;

// Hash-table hashing of a digest: its first 8 bytes (already uniformly distributed).
struct Sha256DigestHash {
  size_t operator()(const Sha256Digest& d) const {
    uint64_t v;
    std::memcpy(&v, d.data(), sizeof v);
    return static_cast<size_t>(v);
  }
};

// The digest in lowercase hexadecimal (64 characters).
std::string sha256_hex(const Sha256Digest& d);

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  template <typename T>
  void update_value(const T& v) {
    update(&v, sizeof v);
  }
  Sha256Digest finish();  // the digest; the object starts over

  static Sha256Digest of(std::span<const uint8_t> bytes);

 private:
  alignas(8) unsigned char ctx_[128];  // Nettle's struct sha256_ctx
};

}  // namespace vlm

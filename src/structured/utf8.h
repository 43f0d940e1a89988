// UTF-8 and hexadecimal digits, as the structured-output front ends read and write them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace vlm::structured {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// How many bytes the UTF-8 encoding of cp takes (1 to 4; cp <= kMaxCodePoint).
inline int utf8_length(uint32_t cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

// Appends the UTF-8 encoding of cp (cp <= kMaxCodePoint) to *out.
inline void append_utf8(uint32_t cp, std::string* out) {
  const int n = utf8_length(cp);
  if (n == 1) {
    out->push_back(static_cast<char>(cp));
    return;
  }
  static constexpr uint32_t kLead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  out->push_back(static_cast<char>(kLead[n] | (cp >> (6 * (n - 1)))));
  for (int i = n - 2; i >= 0; --i) {
    out->push_back(static_cast<char>(0x80 | ((cp >> (6 * i)) & 0x3F)));
  }
}

// Decodes the character that starts at s[*pos]: on success stores it in *cp, moves *pos past it
// and returns true. Returns false, leaving *pos and *cp alone, at the end of s or where the
// bytes are not the shortest encoding of a Unicode scalar value (a bad lead or continuation
// byte, a truncated sequence, an overlong form, a surrogate, or a value above U+10FFFF).
inline bool decode_utf8(std::string_view s, size_t* pos, uint32_t* cp) {
  const size_t start = *pos;
  if (start >= s.size()) return false;
  const auto b0 = static_cast<uint8_t>(s[start]);
  const int n = b0 < 0x80           ? 1
                : (b0 >> 5) == 0x6  ? 2
                : (b0 >> 4) == 0xE  ? 3
                : (b0 >> 3) == 0x1E ? 4
                                    : 0;
  if (n == 0 || s.size() - start < static_cast<size_t>(n)) return false;
  uint32_t c = n == 1 ? b0 : n == 2 ? (b0 & 0x1Fu) : n == 3 ? (b0 & 0x0Fu) : (b0 & 0x07u);
  for (int i = 1; i < n; ++i) {
    const auto b = static_cast<uint8_t>(s[start + static_cast<size_t>(i)]);
    if ((b >> 6) != 2) return false;
    c = (c << 6) | (b & 0x3Fu);
  }
  static constexpr uint32_t kMinOf[] = {0, 0, 0x80, 0x800, 0x10000};
  if (c < kMinOf[n] || c > kMaxCodePoint || (c >= 0xD800 && c <= 0xDFFF)) return false;
  *cp = c;
  *pos = start + static_cast<size_t>(n);
  return true;
}

// The value of a hexadecimal digit (either case), or -1 for any other character.
inline int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace vlm::structured

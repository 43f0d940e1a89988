#include "server/base64.h"

#include <array>

namespace vlm {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// 0..63 for alphabet characters, -1 otherwise (padding is handled separately).
constexpr std::array<int8_t, 256> make_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kAlphabet[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr std::array<int8_t, 256> kTable = make_table();

}  // namespace

size_t base64_decoded_size(std::string_view text) {
  if (text.size() % 4 != 0) return 0;
  size_t n = text.size() / 4 * 3;
  if (!text.empty() && text.back() == '=') --n;
  if (text.size() >= 2 && text[text.size() - 2] == '=') --n;
  return n;
}

Result<std::vector<uint8_t>> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) {
    return invalid_argument("base64 length " + std::to_string(text.size()) +
                            " is not a multiple of 4 (padding is required)");
  }
  std::vector<uint8_t> out;
  out.reserve(base64_decoded_size(text));
  for (size_t q = 0; q < text.size(); q += 4) {
    const bool last = q + 4 == text.size();
    int pad = 0;
    uint32_t acc = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = text[q + k];
      if (c == '=') {
        // Padding is only the last one or two characters of the final quantum.
        if (!last || k < 2)
          return invalid_argument("misplaced '=' at offset " + std::to_string(q + k));
        ++pad;
        acc <<= 6;
        continue;
      }
      if (pad > 0) return invalid_argument("data after '=' at offset " + std::to_string(q + k));
      const int8_t v = kTable[static_cast<uint8_t>(c)];
      if (v < 0)
        return invalid_argument("invalid base64 character at offset " + std::to_string(q + k));
      acc = (acc << 6) | static_cast<uint32_t>(v);
    }
    // RFC 4648 §3.5: the bits dropped by padding must be zero, else the input
    // is not canonical.
    if ((pad == 1 && (acc & 0xFF) != 0) || (pad == 2 && (acc & 0xFFFF) != 0)) {
      return invalid_argument("non-zero padding bits in the final base64 quantum");
    }
    out.push_back(static_cast<uint8_t>(acc >> 16));
    if (pad < 2) out.push_back(static_cast<uint8_t>(acc >> 8));
    if (pad < 1) out.push_back(static_cast<uint8_t>(acc));
  }
  return out;
}

std::string base64_encode(std::span<const uint8_t> bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = (uint32_t{bytes[i]} << 16) | (uint32_t{bytes[i + 1]} << 8) | bytes[i + 2];
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t v = uint32_t{bytes[i]} << 16;
    if (rest == 2) v |= uint32_t{bytes[i + 1]} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  return base64_encode(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

}  // namespace vlm

#include "tokenizer/utf8.h"

#include <utf8proc.h>

#include <array>

namespace vlm::tok {

Utf8Step utf8_step(const unsigned char* p, size_t n) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) return {1, true, false};
  int need;  // total length of the sequence the lead byte announces
  // The second byte's allowed range depends on the lead byte: it excludes overlongs (E0, F0),
  // surrogates (ED) and code points above U+10FFFF (F4). Later bytes are always 80..BF.
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};  // stray continuation byte, C0/C1 or F5..FF: never valid
  }
  for (int k = 1; k < need; ++k) {
    if (static_cast<size_t>(k) >= n) return {k, false, true};
    const unsigned char b = p[k];
    if (b < lo || b > hi) return {k, false, false};
    lo = 0x80;
    hi = 0xBF;
  }
  return {need, true, false};
}

bool utf8_is_valid(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    // ASCII runs are the common case; skip them eight bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      __builtin_memcpy(&w, p + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    Utf8Step st = utf8_step(p + i, n - i);
    if (!st.valid) return false;
    i += st.len;
  }
  return true;
}

void utf8_append_lossy(std::string_view s, std::string* out) {
  if (utf8_is_valid(s)) {
    out->append(s);
    return;
  }
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    Utf8Step st = utf8_step(p + i, s.size() - i);
    if (st.valid) {
      out->append(s.data() + i, st.len);
    } else {
      out->append("\xEF\xBF\xBD");
    }
    i += st.len;
  }
}

void utf8_append_codepoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

uint32_t utf8_next(std::string_view s, size_t* pos) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + *pos;
  Utf8Step st = utf8_step(p, s.size() - *pos);
  if (!st.valid) {
    *pos += 1;
    return 0xFFFFFFFFu;
  }
  uint32_t cp;
  switch (st.len) {
    case 1:
      cp = p[0];
      break;
    case 2:
      cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
      break;
    case 3:
      cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
      break;
    default:
      cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
  *pos += st.len;
  return cp;
}

namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_cp;
  std::array<int16_t, 324> to_byte;  // the alphabet's code points are all below 256 + 68

  ByteTables() {
    to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      // Same construction as GPT-2's bytes_to_unicode(): printable Latin-1 bytes keep their
      // code point, the others are numbered from U+0100 in byte order.
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? b : 256 + extra++;
      to_byte[to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return byte_tables().to_cp[b]; }

int unicode_to_byte(uint32_t cp) {
  const ByteTables& t = byte_tables();
  return cp < t.to_byte.size() ? t.to_byte[cp] : -1;
}

bool is_punctuation(uint32_t cp) {
  if (cp > 0x10FFFF) return false;
  const utf8proc_category_t c = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

}  // namespace vlm::tok

// UTF-8 helpers for the tokenizer: validation step by step (the basis of lossy decoding and of
// the incremental detokenizer) and the GPT-2 byte <-> unicode mapping used by byte-level BPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace vlm::tok {

// One step of UTF-8 decoding at the start of a byte range.
struct Utf8Step {
  int len;         // bytes consumed: the whole character, or the maximal invalid subpart (>= 1)
  bool valid;      // true when `len` bytes form one well-formed character
  bool truncated;  // invalid only because the input ended inside a character that could still
                   // become valid (the incremental detokenizer holds such a tail back)
};

// Requires n >= 1. A "maximal subpart" follows Unicode §3.9 (U+FFFD substitution of maximal
// subparts), which is what Rust's String::from_utf8_lossy and WHATWG TextDecoder implement.
Utf8Step utf8_step(const unsigned char* p, size_t n);

// True when `s` is entirely well-formed UTF-8.
bool utf8_is_valid(std::string_view s);

// Appends `s` to `out`, replacing each maximal invalid subsequence by one U+FFFD.
void utf8_append_lossy(std::string_view s, std::string* out);

// Appends the UTF-8 encoding of code point `cp` (must be a scalar value).
void utf8_append_codepoint(uint32_t cp, std::string* out);

// Decodes one code point from valid UTF-8 at `s[*pos]` and advances *pos. Returns 0xFFFFFFFF
// (and advances by one byte) on invalid input, so callers never loop forever.
uint32_t utf8_next(std::string_view s, size_t* pos);

// Whether Unicode's general category of `cp` is punctuation (Pc, Pd, Ps, Pe, Pi, Pf, Po), as
// utf8proc's tables say (Python's unicodedata.category(c).startswith("P")).
bool is_punctuation(uint32_t cp);

// GPT-2 byte-level alphabet: each byte maps to one printable code point (bytes that are already
// printable map to themselves; the rest to U+0100 and up) so BPE vocab entries are valid text.
uint32_t byte_to_unicode(uint8_t b);
// Inverse mapping; returns -1 for code points that are not in the alphabet.
int unicode_to_byte(uint32_t cp);

}  // namespace vlm::tok

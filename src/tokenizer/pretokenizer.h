// Normalization (NFC) and pre-tokenization (the split regex) of the text between added tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/status.h"

namespace vlm::tok {

// Unicode NFC of valid UTF-8 `s` (utf8proc). Embedded NULs are kept. Returns false only when
// utf8proc rejects the input or runs out of memory; `out` is then left unspecified. Text that NFC
// cannot change is recognised with a per-code-point table and copied instead.
bool nfc(std::string_view s, std::string* out);
// The same, always through utf8proc (the reference the fast path is tested against).
bool nfc_full(std::string_view s, std::string* out);
// True when NFC never changes `cp` and it never combines with a preceding code point.
bool nfc_is_inert(uint32_t cp);

// Rewrites `\s` and `\S` in a Hugging Face / Oniguruma pattern into explicit classes of the
// Unicode White_Space code points. PCRE2's UCP `\s` differs (it adds U+180E), and the tokenizer
// must split exactly where the Rust library does. Fails on `\S` inside a character class, which
// has no flat rewrite.
Result<std::string> rewrite_whitespace_classes(std::string_view pattern);

// A compiled split regex with "Isolated" behaviour: every match is a piece, and so is every
// stretch of text between matches. Immutable after creation, usable from many threads.
class SplitRegex {
 public:
  // `pattern` is in Hugging Face syntax; it is rewritten (see above) and compiled with
  // PCRE2_UTF | PCRE2_UCP, JIT-compiled when the library supports it.
  static Result<std::unique_ptr<SplitRegex>> compile(std::string_view pattern);
  ~SplitRegex();

  // Appends the [begin, end) byte ranges of the pieces of valid UTF-8 `text` to `pieces`.
  // Returns false if the regex engine fails (resource limit); the caller treats that as one piece.
  bool split(std::string_view text, std::vector<std::pair<size_t, size_t>>* pieces) const;

 private:
  struct Code;
  explicit SplitRegex(std::unique_ptr<Code> code);
  std::unique_ptr<Code> code_;
};

}  // namespace vlm::tok

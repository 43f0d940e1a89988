#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <cstdint>
#include <cstdlib>

namespace vlm::tok {

bool nfc_full(std::string_view s, std::string* out) {
  out->clear();
  utf8proc_uint8_t* dst = nullptr;
  // No UTF8PROC_NULLTERM: the length bounds the input, so U+0000 inside the text survives.
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &dst, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) return false;
  out->assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return true;
}

namespace {

// One bit per code point: set when the code point is "NFC-inert": NFC leaves it unchanged, its
// canonical combining class is 0, and it never composes with what precedes it (it is not, and its
// decomposition does not start with, the second half of any canonical composition). NFC never
// changes a string of inert code points, and a string can be normalized in pieces cut just before
// inert code points. Most text (ASCII, CJK, Hangul syllables, emoji) is inert, and checking it here
// is several times faster than running utf8proc over it.
class NfcInertTable {
 public:
  NfcInertTable() : bits_(kCodePoints / 64, 0) {
    std::vector<uint8_t> second(kCodePoints, 0);
    // Hangul jamo compose algorithmically (L+V, LV+T), without decomposition data. T starts at
    // U+11A7 (T_BASE, not a real consonant), which utf8proc, like the unicode-normalization fork
    // the Rust tokenizers use, also composes (LV + U+11A7 -> LV); the table must agree with that.
    for (uint32_t cp = 0x1161; cp <= 0x1175; ++cp) second[cp] = 1;
    for (uint32_t cp = 0x11A7; cp <= 0x11C2; ++cp) second[cp] = 1;
    // Every code point after the first in a full canonical decomposition is marked: that covers
    // the second half of every composition pair (or, should it decompose, its first code point).
    utf8proc_int32_t buf[32];
    std::vector<uint32_t> decomposable;
    for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      if (utf8proc_get_property(cp)->decomp_seqindex == UINT16_MAX) continue;
      const utf8proc_ssize_t n = canonical_decomposition(cp, buf);
      if (n < 1 || (n == 1 && static_cast<uint32_t>(buf[0]) == cp)) continue;  // compat only
      decomposable.push_back(cp);
      for (utf8proc_ssize_t k = 1; k < n; ++k) second[buf[k]] = 1;
    }
    std::vector<uint8_t> inert(kCodePoints, 1);
    for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
      if ((cp >= 0xD800 && cp <= 0xDFFF) || second[cp] ||
          utf8proc_get_property(cp)->combining_class != 0) {
        inert[cp] = 0;
      }
    }
    std::string one, normalized;
    for (uint32_t cp : decomposable) {
      if (!inert[cp]) continue;
      const utf8proc_ssize_t n = canonical_decomposition(cp, buf);
      one.clear();
      utf8_append(cp, &one);
      if (n < 1 || second[buf[0]] || !nfc_full(one, &normalized) || normalized != one) {
        inert[cp] = 0;
      }
    }
    for (uint32_t cp = 0; cp < kCodePoints; ++cp) {
      if (inert[cp]) bits_[cp >> 6] |= uint64_t{1} << (cp & 63);
    }
  }

  bool inert(uint32_t cp) const { return (bits_[cp >> 6] >> (cp & 63)) & 1; }

 private:
  static constexpr uint32_t kCodePoints = 0x110000;

  static utf8proc_ssize_t canonical_decomposition(uint32_t cp, utf8proc_int32_t (&buf)[32]) {
    int boundclass = UTF8PROC_BOUNDCLASS_START;
    return utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 32, UTF8PROC_DECOMPOSE,
                                   &boundclass);
  }
  static void utf8_append(uint32_t cp, std::string* out) {
    utf8proc_uint8_t b[4];
    const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), b);
    out->append(reinterpret_cast<const char*>(b), static_cast<size_t>(n));
  }

  std::vector<uint64_t> bits_;
};

const NfcInertTable& nfc_inert_table() {
  static const NfcInertTable table;  // built once, on first use (thread-safe static init)
  return table;
}

}  // namespace

bool nfc(std::string_view s, std::string* out) {
  out->clear();
  // Code points below U+0300 are all inert (the table agrees; see the tests), so text whose bytes
  // are all below 0xCC (the lead byte of U+0300) is already NFC. This is most Latin text.
  bool simple = true;
  for (unsigned char c : s) {
    if (c >= 0xCC) {
      simple = false;
      break;
    }
  }
  if (simple) {
    out->assign(s);
    return true;
  }
  const NfcInertTable& table = nfc_inert_table();
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  // Decodes the code point at `i` of valid UTF-8 and returns its length.
  auto decode = [&](size_t i, uint32_t* cp) -> int {
    const unsigned char b = p[i];
    if (b < 0x80) {
      *cp = b;
      return 1;
    }
    if (b < 0xE0) {
      *cp = ((b & 0x1Fu) << 6) | (p[i + 1] & 0x3Fu);
      return 2;
    }
    if (b < 0xF0) {
      *cp = ((b & 0x0Fu) << 12) | ((p[i + 1] & 0x3Fu) << 6) | (p[i + 2] & 0x3Fu);
      return 3;
    }
    *cp = ((b & 0x07u) << 18) | ((p[i + 1] & 0x3Fu) << 12) | ((p[i + 2] & 0x3Fu) << 6) |
          (p[i + 3] & 0x3Fu);
    return 4;
  };
  size_t copied = 0;    // s[0, copied) is already in `out`
  size_t boundary = 0;  // start of the last inert code point: NFC may cut the text there
  size_t i = 0;
  std::string chunk;
  while (i < n) {
    uint32_t cp;
    const int len = decode(i, &cp);
    if (table.inert(cp)) {
      boundary = i;
      i += len;
      continue;
    }
    // Normalize from the last cut point up to the next inert code point, copy the rest as is.
    size_t j = i + len;
    while (j < n) {
      const int l = decode(j, &cp);
      if (table.inert(cp)) break;
      j += l;
    }
    out->append(s.substr(copied, boundary - copied));
    if (!nfc_full(s.substr(boundary, j - boundary), &chunk)) return false;
    out->append(chunk);
    copied = boundary = i = j;
  }
  out->append(s.substr(copied));
  return true;
}

bool nfc_is_inert(uint32_t cp) { return cp < 0x110000 && nfc_inert_table().inert(cp); }

namespace {

// Unicode White_Space (PropList.txt), the set Oniguruma's `\s` matches in Unicode mode.
constexpr std::string_view kWhiteSpace =
    "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

}  // namespace

Result<std::string> rewrite_whitespace_classes(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() * 2);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpace;
        } else {
          out += '[';
          out += kWhiteSpace;
          out += ']';
        }
      } else if (e == 'S') {
        if (in_class) {
          return unimplemented("split regex uses \\S inside a character class");
        }
        out += "[^";
        out += kWhiteSpace;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // POSIX class such as [:alpha:] inside a class: copy through its closing ']'.
      const size_t end = pattern.find(":]", i + 2);
      if (end == std::string_view::npos) continue;
      out.append(pattern.substr(i + 1, end + 2 - (i + 1)));
      i = end + 1;
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

struct SplitRegex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() {
    if (code) pcre2_code_free(code);
  }
};

namespace {

// Match state is per thread so that a shared, immutable SplitRegex can be used concurrently
// without locks or per-call allocation. The match data holds one pair (only the whole match is
// read) and so fits any pattern; the JIT stack lets long runs of one class match in one piece.
struct ThreadMatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;

  ThreadMatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && jit_stack) pcre2_jit_stack_assign(context, nullptr, jit_stack);
  }
  ~ThreadMatchState() {
    if (jit_stack) pcre2_jit_stack_free(jit_stack);
    if (context) pcre2_match_context_free(context);
    if (data) pcre2_match_data_free(data);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

SplitRegex::SplitRegex(std::unique_ptr<Code> code) : code_(std::move(code)) {}
SplitRegex::~SplitRegex() = default;

Result<std::unique_ptr<SplitRegex>> SplitRegex::compile(std::string_view pattern) {
  Result<std::string> rewritten = rewrite_whitespace_classes(pattern);
  if (!rewritten.ok()) return rewritten.status();
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  auto code = std::make_unique<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten->data()), rewritten->size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
  if (code->code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return invalid_argument("split regex does not compile at offset " + std::to_string(err_offset) +
                            ": " + reinterpret_cast<char*>(buf));
  }
  // JIT is an optimisation only: without it (unsupported CPU, or a library built without JIT)
  // the interpreter gives identical matches.
  code->jit = pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<SplitRegex>(new SplitRegex(std::move(code)));
}

bool SplitRegex::split(std::string_view text,
                       std::vector<std::pair<size_t, size_t>>* pieces) const {
  ThreadMatchState& st = thread_match_state();
  if (st.data == nullptr) return false;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  size_t gap_begin = 0;  // start of text not yet covered by a piece
  while (pos < text.size()) {
    // The caller validated the UTF-8, so PCRE2 need not re-check it on every call (that check
    // would make the loop quadratic in the text length).
    int rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, st.data,
                         st.context);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH && code_->jit) {
      // A JIT resource limit: the interpreter keeps its backtracking state on the heap.
      rc = pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       st.data, st.context);
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    const size_t begin = ov[0], end = ov[1];
    if (begin > gap_begin) pieces->emplace_back(gap_begin, begin);
    if (end > begin) {
      pieces->emplace_back(begin, end);
      gap_begin = end;
      pos = end;
    } else {
      // An empty match yields no piece; step over one character so the scan moves on.
      pos = begin + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  if (gap_begin < text.size()) pieces->emplace_back(gap_begin, text.size());
  return true;
}

}  // namespace vlm::tok

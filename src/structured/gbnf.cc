// GBNF text → grammar.
//
// The notation (as llama.cpp reads it): rules `name ::= alternatives`, names of letters, digits,
// '-' and '_'; items are string literals "...", character classes [...] and [^...] over code
// points, `.` (any character), rule names and parenthesised groups; `|` separates alternatives;
// `*`, `+`, `?`, `{m}`, `{m,}` and `{m,n}` repeat the item before them; `#` starts a comment
// that runs to the end of the line. Escapes in literals and classes: \n \r \t \\ \" \[ \] \xHH
// \uHHHH \UHHHHHHHH (plus \- \^ \f \v, which llama.cpp refuses).
//
// A rule ends where the next one begins: at a line whose first item is a name followed by
// `::=`, or at the end of the text. llama.cpp also ends a rule at a newline outside parentheses
// (unless after `::=` or `|`); continuing the rule there instead accepts more texts and reads
// every text llama.cpp accepts the same way.
#include "structured/gbnf.h"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace vlm::structured {
namespace {

constexpr int64_t kMaxRepeat = 10000;
constexpr int kMaxNesting = 100;  // parentheses (bounds the parser's recursion)
constexpr uint32_t kMaxCodePoint = 0x10FFFF;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

bool hex_digit(char c, uint32_t* v) {
  if (c >= '0' && c <= '9') {
    *v = static_cast<uint32_t>(c - '0');
  } else if (c >= 'a' && c <= 'f') {
    *v = static_cast<uint32_t>(c - 'a' + 10);
  } else if (c >= 'A' && c <= 'F') {
    *v = static_cast<uint32_t>(c - 'A' + 10);
  } else {
    return false;
  }
  return true;
}

std::string utf8(uint32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view t) : t_(t) {}

  Result<Grammar> parse() {
    skip_blank();
    while (pos_ < t_.size()) {
      VLM_RETURN_IF_ERROR(rule());
      skip_blank();
    }
    // The undefined rule used first in the text, so the error points at the earliest one.
    const std::string* undefined = nullptr;
    size_t undefined_at = 0;
    for (const auto& [name, r] : rules_) {
      if (!r.defined && (!undefined || r.first_use < undefined_at)) {
        undefined = &name;
        undefined_at = r.first_use;
      }
    }
    if (undefined) return error("undefined rule '" + *undefined + "'", undefined_at);
    const auto root = rules_.find("root");
    if (root == rules_.end()) return invalid_argument("grammar (GBNF): there is no 'root' rule");
    g_.set_root(root->second.id);
    VLM_RETURN_IF_ERROR(g_.finalize().with_context("gbnf"));
    return std::move(g_);
  }

 private:
  Status error(const std::string& what, size_t at) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < at && i < t_.size(); ++i) {
      if (t_[i] == '\n') {
        ++line;
        column = 1;
      } else if ((static_cast<uint8_t>(t_[i]) & 0xC0) != 0x80) {
        ++column;  // columns count characters, not UTF-8 bytes
      }
    }
    return invalid_argument("grammar (GBNF): " + what + " (line " + std::to_string(line) +
                            ", column " + std::to_string(column) + ")");
  }

  bool at(char c) const { return pos_ < t_.size() && t_[pos_] == c; }

  // Skips spaces, tabs, newlines and comments; returns whether a newline was crossed.
  bool skip_blank() {
    bool newline = false;
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (c == ' ' || c == '\t' || c == '\r') {
        ++pos_;
      } else if (c == '\n') {
        newline = true;
        ++pos_;
      } else if (c == '#') {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
    return newline;
  }
  void skip_spaces() {
    while (at(' ') || at('\t')) ++pos_;
  }

  // Whether a rule definition (`name ::=`) starts at pos_.
  bool at_rule_start() const {
    size_t i = pos_;
    while (i < t_.size() && name_char(t_[i])) ++i;
    if (i == pos_) return false;
    while (i < t_.size() && (t_[i] == ' ' || t_[i] == '\t')) ++i;
    return t_.substr(i, 3) == "::=";
  }

  // The named rule, made at its first mention (a definition or a use).
  struct Named {
    int32_t id = 0;
    bool defined = false;
    size_t first_use = 0;
  };
  Named& named(const std::string& name, size_t use) {
    auto [it, fresh] = rules_.emplace(name, Named{});
    if (fresh) {
      it->second.id = g_.new_rule(name);
      it->second.first_use = use;
    }
    return it->second;
  }

  Status rule() {
    const size_t start = pos_;
    while (pos_ < t_.size() && name_char(t_[pos_])) ++pos_;
    if (pos_ == start) return error("expected a rule name", pos_);
    const std::string name(t_.substr(start, pos_ - start));
    skip_spaces();
    if (t_.substr(pos_, 3) != "::=") return error("expected '::=' after '" + name + "'", pos_);
    pos_ += 3;
    Named& r = named(name, start);
    if (r.defined) return error("rule '" + name + "' is defined twice", start);
    r.defined = true;
    const int32_t id = r.id;
    std::vector<Sequence> alts;
    VLM_RETURN_IF_ERROR(alternatives(name, 0, &alts));
    if (at(')')) return error("unbalanced ')'", pos_);
    for (auto& a : alts) g_.add_alternative(id, std::move(a));
    return ok_status();
  }

  Status alternatives(const std::string& name, int depth, std::vector<Sequence>* alts) {
    for (;;) {
      Sequence seq;
      VLM_RETURN_IF_ERROR(sequence(name, depth, &seq));
      alts->push_back(std::move(seq));
      if (!at('|')) return ok_status();
      ++pos_;
    }
  }

  Status too_large(size_t at) const {
    if (g_.num_elements() <= kMaxGrammarElements) return ok_status();
    return error("the grammar needs more than " + std::to_string(kMaxGrammarElements) + " elements",
                 at);
  }

  Status sequence(const std::string& name, int depth, Sequence* seq) {
    size_t last = std::string::npos;  // where the last item starts in seq
    for (;;) {
      const bool newline = skip_blank();
      if (pos_ >= t_.size() || at('|') || at(')')) return ok_status();
      if (newline && at_rule_start()) return ok_status();
      const size_t item = pos_;
      const char c = t_[pos_];
      if (c == '"') {
        last = seq->size();
        VLM_RETURN_IF_ERROR(literal(seq));
      } else if (c == '[') {
        last = seq->size();
        VLM_ASSIGN_OR_RETURN(const Element e, char_class());
        seq->push_back(e);
      } else if (c == '.') {
        ++pos_;
        last = seq->size();
        seq->push_back(g_.code_points({{0, kMaxCodePoint}}));
      } else if (name_char(c)) {
        while (pos_ < t_.size() && name_char(t_[pos_])) ++pos_;
        last = seq->size();
        seq->push_back(Grammar::ref(named(std::string(t_.substr(item, pos_ - item)), item).id));
      } else if (c == '(') {
        if (depth + 1 > kMaxNesting) return error("parentheses nested deeper than 100", item);
        ++pos_;
        std::vector<Sequence> alts;
        VLM_RETURN_IF_ERROR(alternatives(name, depth + 1, &alts));
        if (!at(')')) return error("missing ')' for the '(' here", item);
        ++pos_;
        last = seq->size();
        seq->push_back(g_.group(std::move(alts), name));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last == std::string::npos)
          return error(std::string("nothing before '") + c + "'", item);
        int64_t min = 0, max = -1;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        ++pos_;
        if (c == '{') VLM_RETURN_IF_ERROR(bounds(item, &min, &max));
        Sequence body(seq->begin() + static_cast<std::ptrdiff_t>(last), seq->end());
        seq->resize(last);
        if (body.size() > 1) body = {g_.group({std::move(body)}, name)};
        Element e;
        if (min == 0 && max < 0) {
          e = g_.star(std::move(body));
        } else if (min == 1 && max < 0) {
          e = g_.plus(std::move(body));
        } else if (min == 0 && max == 1) {
          e = g_.optional(std::move(body));
        } else {
          e = g_.repeat(std::move(body), min, max);
        }
        seq->push_back(e);
        VLM_RETURN_IF_ERROR(too_large(item));
      } else {
        return error(std::string("unexpected '") + c + "'", item);
      }
    }
  }

  // After '{': m}, m,} or m,n} (blanks allowed around the numbers).
  Status bounds(size_t start, int64_t* min, int64_t* max) {
    auto number = [&](int64_t* v) {
      skip_blank();
      const size_t s = pos_;
      *v = 0;
      while (pos_ < t_.size() && t_[pos_] >= '0' && t_[pos_] <= '9') {
        *v = std::min<int64_t>(*v * 10 + (t_[pos_] - '0'), kMaxRepeat + 1);
        ++pos_;
      }
      skip_blank();
      return pos_ > s;
    };
    if (!number(min)) return error("expected a number after '{'", pos_);
    *max = *min;
    if (at(',')) {
      ++pos_;
      if (!number(max)) *max = -1;
    }
    if (!at('}')) return error("expected '}'", pos_);
    ++pos_;
    if (*min > kMaxRepeat || *max > kMaxRepeat) {
      return error("a repetition count above " + std::to_string(kMaxRepeat), start);
    }
    if (*max >= 0 && *min > *max) return error("repetition bounds in the wrong order", start);
    return ok_status();
  }

  // One character of a literal or class: an escape or a UTF-8 character.
  Result<uint32_t> character() {
    const size_t start = pos_;
    if (at('\\')) {
      ++pos_;
      if (pos_ >= t_.size()) return error("unterminated escape", start);
      const char e = t_[pos_++];
      size_t digits = 0;
      switch (e) {
        case 'n':
          return uint32_t{'\n'};
        case 'r':
          return uint32_t{'\r'};
        case 't':
          return uint32_t{'\t'};
        case 'f':
          return uint32_t{'\f'};
        case 'v':
          return uint32_t{'\v'};
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
          return static_cast<uint32_t>(e);
        case 'x':
          digits = 2;
          break;
        case 'u':
          digits = 4;
          break;
        case 'U':
          digits = 8;
          break;
        default:
          return error(std::string("unknown escape '\\") + e + "'", start);
      }
      uint32_t v = 0;
      for (size_t i = 0; i < digits; ++i) {
        uint32_t d;
        if (pos_ >= t_.size() || !hex_digit(t_[pos_], &d)) {
          return error("expected " + std::to_string(digits) + " hex digits", start);
        }
        v = v * 16 + d;
        ++pos_;
      }
      if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
        return error("not a Unicode scalar value", start);
      }
      return v;
    }
    const auto b0 = static_cast<uint8_t>(t_[pos_]);
    const int len = b0 < 0x80         ? 1
                    : (b0 >> 5) == 6  ? 2
                    : (b0 >> 4) == 14 ? 3
                    : (b0 >> 3) == 30 ? 4
                                      : 0;
    if (len == 0 || start + static_cast<size_t>(len) > t_.size()) {
      return error("invalid UTF-8", start);
    }
    uint32_t c = len == 1 ? b0 : len == 2 ? (b0 & 0x1Fu) : len == 3 ? (b0 & 0x0Fu) : (b0 & 0x07u);
    for (int i = 1; i < len; ++i) {
      const auto b = static_cast<uint8_t>(t_[start + static_cast<size_t>(i)]);
      if ((b >> 6) != 2) return error("invalid UTF-8", start);
      c = (c << 6) | (b & 0x3Fu);
    }
    static constexpr uint32_t kMinOf[] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < kMinOf[len] || c > kMaxCodePoint || (c >= 0xD800 && c <= 0xDFFF)) {
      return error("invalid UTF-8", start);
    }
    pos_ += static_cast<size_t>(len);
    return c;
  }

  Status literal(Sequence* seq) {
    const size_t start = pos_;
    ++pos_;
    std::string bytes;
    for (;;) {
      if (pos_ >= t_.size()) return error("unterminated string literal", start);
      if (at('"')) break;
      VLM_ASSIGN_OR_RETURN(const uint32_t c, character());
      bytes += utf8(c);
    }
    ++pos_;
    Sequence s = g_.literal(bytes);
    seq->insert(seq->end(), s.begin(), s.end());
    return ok_status();
  }

  Result<Element> char_class() {
    const size_t start = pos_;
    ++pos_;
    const bool negate = at('^');
    if (negate) ++pos_;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    for (;;) {
      if (pos_ >= t_.size()) return error("unterminated character class", start);
      if (at(']')) break;
      const size_t item = pos_;
      VLM_ASSIGN_OR_RETURN(const uint32_t lo, character());
      uint32_t hi = lo;
      if (at('-') && pos_ + 1 < t_.size() && t_[pos_ + 1] != ']') {
        ++pos_;
        VLM_ASSIGN_OR_RETURN(hi, character());
        if (hi < lo) return error("character range in the wrong order", item);
      }
      ranges.emplace_back(lo, hi);
    }
    ++pos_;
    if (negate) {
      std::sort(ranges.begin(), ranges.end());
      std::vector<std::pair<uint32_t, uint32_t>> rest;
      uint32_t next = 0;
      for (const auto& [lo, hi] : ranges) {
        if (lo > next) rest.emplace_back(next, lo - 1);
        next = std::max(next, hi + 1);
      }
      if (next <= kMaxCodePoint) rest.emplace_back(next, kMaxCodePoint);
      ranges = std::move(rest);
    }
    // An empty class matches nothing: code_points gives an empty byte set, which finalize()
    // prunes (and reports if the root is left with no text at all).
    return g_.code_points(std::move(ranges));
  }

  std::string_view t_;
  size_t pos_ = 0;
  Grammar g_;
  std::map<std::string, Named> rules_;
};

}  // namespace

Result<Grammar> parse_gbnf(std::string_view text) { return Parser(text).parse(); }

}  // namespace vlm::structured

// Regular expressions → grammar, in two steps: the pattern is parsed into a small syntax tree
// (characters as code-point sets, concatenation, alternation, repetition), then the tree is
// emitted as grammar rules.
//
// The syntax is the part that Python's `re` and ECMAScript (JSON Schema's `pattern`) agree on.
// Where the two read the same text differently, the pattern is refused or compiled to what both
// accept, because a constrained output must never leave the language the caller asked for:
//   - `.` is any character except the line terminators \n, \r, U+2028 and U+2029 (Python's `.`
//     excludes only \n; ECMAScript's all four).
//   - \d, \w and \s stand for their ASCII characters only (Python's \d and \w are Unicode-aware,
//     and either dialect's \s holds more spaces). \D and \W are the other ASCII characters, and a
//     negated class holding \d, \w, \D or \W matches ASCII characters only: which non-ASCII
//     characters Python counts as digits or word characters is not modelled. \S and a negated class
//     holding \s exclude every character either dialect counts as whitespace.
//   - `]` first in a class (`[]a]`: Python's literal, ECMAScript's empty class), `{,n}` (Python's
//     {0,n}, ECMAScript's literal text) and letter escapes with no common meaning (Python's \A,
//     \Z and \U are ECMAScript's letters A, Z and U) are errors.
// Features no context-free grammar built here can express (backreferences, lookarounds, word
// boundaries, inline flags, possessive quantifiers, atomic groups) are refused by name.
#include "structured/regex.h"

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "structured/utf8.h"

namespace vlm::structured {
namespace {

constexpr int64_t kMaxRepeat = 10000;
// Deeper group nesting is refused: it bounds the parser's recursion, and the parse stacks of the
// grammar it becomes stay well under the automaton's depth limit (pda.h).
constexpr int kMaxNesting = 100;

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive code-point ranges

Ranges normalized(Ranges rs) {
  std::sort(rs.begin(), rs.end());
  Ranges out;
  for (const auto& r : rs) {
    if (!out.empty() && r.first <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, r.second);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

Ranges complement(const Ranges& rs) {
  Ranges out;
  uint32_t next = 0;
  for (const auto& r : normalized(rs)) {
    if (r.first > next) out.emplace_back(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

Ranges intersect(const Ranges& a0, const Ranges& b0) {
  const Ranges a = normalized(a0), b = normalized(b0);
  Ranges out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint32_t lo = std::max(a[i].first, b[j].first);
    const uint32_t hi = std::min(a[i].second, b[j].second);
    if (lo <= hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second) {
      ++i;
    } else {
      ++j;
    }
  }
  return out;
}

void append(Ranges* to, const Ranges& from) { to->insert(to->end(), from.begin(), from.end()); }

const Ranges& digit_ranges() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word_ranges() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
// \D and \W: the ASCII characters outside \d and \w.
const Ranges& ascii_non_digit_ranges() {
  static const Ranges r = intersect(complement(digit_ranges()), {{0x00, 0x7F}});
  return r;
}
const Ranges& ascii_non_word_ranges() {
  static const Ranges r = intersect(complement(word_ranges()), {{0x00, 0x7F}});
  return r;
}
// Every character that is not ASCII: what Python's Unicode-aware \d, \w, \D and \W may add.
const Ranges& non_ascii_ranges() {
  static const Ranges r = {{0x80, kMaxCodePoint}};
  return r;
}
const Ranges& ascii_space_ranges() {
  static const Ranges r = {{'\t', '\r'}, {' ', ' '}};
  return r;
}
// Every character Python's str.isspace() or ECMAScript's \s counts as whitespace.
const Ranges& any_space_ranges() {
  static const Ranges r = {{0x09, 0x0D},     {0x1C, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},
                           {0x1680, 0x1680}, {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                           {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return r;
}
const Ranges& line_terminators() {
  static const Ranges r = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};
  return r;
}

// A class item, as two bounds on the characters it stands for: `surely` ⊆ the item ⊆ `maybe`
// in both dialects (they differ for \d, \w, \s and their negations: Python's are Unicode-aware,
// ECMAScript's \d and \w are ASCII and its \s is another set of spaces). A class keeps the lower
// bound; its negation is the complement of the upper bound, so either way it is a subset of both
// readings.
struct CharSet {
  Ranges surely, maybe;
  bool single = false;  // one literal character (may be a range's end)
  uint32_t cp = 0;
};

CharSet exact(Ranges r) { return CharSet{r, r}; }
// surely, and maybe the non-ASCII characters too.
CharSet ascii_or_more(const Ranges& surely) {
  Ranges maybe = surely;
  append(&maybe, non_ascii_ranges());
  return CharSet{surely, normalized(std::move(maybe))};
}
CharSet one(uint32_t c) { return CharSet{{{c, c}}, {{c, c}}, true, c}; }

// The syntax tree, in an arena: a node's children come before it.
struct Node {
  enum class Kind { kEmpty, kChars, kConcat, kAlt, kRepeat, kStart, kEnd };
  Kind kind = Kind::kEmpty;
  size_t offset = 0;
  Ranges chars;              // kChars
  std::vector<int> kids;     // kConcat, kAlt, kRepeat (one)
  int64_t min = 0, max = 0;  // kRepeat; max < 0: unbounded
  bool nullable = true;
};

bool ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool ascii_alnum(char c) { return (c >= '0' && c <= '9') || ascii_letter(c); }

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  Result<int> parse() {
    VLM_ASSIGN_OR_RETURN(const int root, alternation(0));
    if (pos_ < p_.size()) return error("unbalanced ')'", pos_);  // the only way to stop early
    VLM_RETURN_IF_ERROR(check_anchors(root, true, true));
    return root;
  }
  const std::vector<Node>& nodes() const { return nodes_; }

 private:
  static Status error(const std::string& what, size_t offset) {
    return invalid_argument("regex: " + what + " (offset " + std::to_string(offset) + ")");
  }
  static Status unsupported(const std::string& feature, size_t offset) {
    return error(feature + " is not supported", offset);
  }

  int add(Node n) {
    switch (n.kind) {
      case Node::Kind::kChars:
        n.nullable = false;
        break;
      case Node::Kind::kConcat:
        n.nullable = std::all_of(n.kids.begin(), n.kids.end(),
                                 [&](int k) { return nodes_[static_cast<size_t>(k)].nullable; });
        break;
      case Node::Kind::kAlt:
        n.nullable = std::any_of(n.kids.begin(), n.kids.end(),
                                 [&](int k) { return nodes_[static_cast<size_t>(k)].nullable; });
        break;
      case Node::Kind::kRepeat:
        n.nullable = n.min == 0 || nodes_[static_cast<size_t>(n.kids[0])].nullable;
        break;
      default:
        n.nullable = true;
    }
    nodes_.push_back(std::move(n));
    return static_cast<int>(nodes_.size() - 1);
  }
  int chars(Ranges r, size_t offset) {
    Node n;
    n.kind = Node::Kind::kChars;
    n.offset = offset;
    n.chars = normalized(std::move(r));
    return add(std::move(n));
  }

  bool at(char c) const { return pos_ < p_.size() && p_[pos_] == c; }

  Result<int> alternation(int depth) {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    alt.offset = pos_;
    for (;;) {
      VLM_ASSIGN_OR_RETURN(const int s, sequence(depth));
      alt.kids.push_back(s);
      if (!at('|')) break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return alt.kids[0];
    return add(std::move(alt));
  }

  Result<int> sequence(int depth) {
    Node seq;
    seq.kind = Node::Kind::kConcat;
    seq.offset = pos_;
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      const size_t start = pos_;
      VLM_ASSIGN_OR_RETURN(int item, atom(depth));
      VLM_ASSIGN_OR_RETURN(item, quantified(item, start));
      seq.kids.push_back(item);
    }
    if (seq.kids.empty()) {
      Node e;
      e.offset = seq.offset;
      return add(std::move(e));
    }
    if (seq.kids.size() == 1) return seq.kids[0];
    return add(std::move(seq));
  }

  // Whether a `{...}` quantifier starts at pos_; sets its bounds and end.
  bool brace_quantifier(int64_t* min, int64_t* max, size_t* end, bool* too_big) const {
    size_t i = pos_ + 1;
    auto number = [&](int64_t* v) {
      const size_t s = i;
      *v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
        *v = std::min<int64_t>(*v * 10 + (p_[i] - '0'), kMaxRepeat + 1);
        ++i;
      }
      return i > s;
    };
    if (!number(min)) return false;
    *max = *min;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      if (!number(max)) *max = -1;
    }
    if (i >= p_.size() || p_[i] != '}') return false;
    *end = i + 1;
    *too_big = *min > kMaxRepeat || *max > kMaxRepeat;
    return true;
  }
  // `{,n}` or `{,}`: Python reads a repetition with no lower bound, ECMAScript literal text.
  bool brace_without_min() const {
    size_t i = pos_ + 1;
    if (i >= p_.size() || p_[i] != ',') return false;
    ++i;
    while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') ++i;
    return i < p_.size() && p_[i] == '}';
  }
  // Whether pos_ is at a quantifier (for "nothing to repeat" and "multiple repeat").
  bool at_quantifier() const {
    if (pos_ >= p_.size()) return false;
    const char c = p_[pos_];
    if (c == '*' || c == '+' || c == '?') return true;
    int64_t a, b;
    size_t e;
    bool big;
    return c == '{' && (brace_quantifier(&a, &b, &e, &big) || brace_without_min());
  }

  Result<int> quantified(int item, size_t start) {
    if (pos_ >= p_.size()) return item;
    const size_t q = pos_;
    int64_t min = 0, max = -1;
    const char c = p_[pos_];
    if (c == '*') {
      ++pos_;
    } else if (c == '+') {
      min = 1;
      ++pos_;
    } else if (c == '?') {
      max = 1;
      ++pos_;
    } else if (c == '{') {
      if (brace_without_min()) {
        return error("'{,n}' is a repetition in Python but literal text in ECMAScript; write {0,n}",
                     q);
      }
      size_t end;
      bool too_big;
      if (!brace_quantifier(&min, &max, &end, &too_big)) return item;  // a literal '{'
      if (too_big) return unsupported("a repetition count above 10000", q);
      if (max >= 0 && min > max) {
        return error("bad repetition range " + std::string(p_.substr(q, end - q)), q);
      }
      pos_ = end;
    } else {
      return item;
    }
    const Node::Kind k = nodes_[static_cast<size_t>(item)].kind;
    if (k == Node::Kind::kStart || k == Node::Kind::kEnd) return error("nothing to repeat", q);
    if (at('?')) {
      ++pos_;  // lazy: the same language
    } else if (at('+')) {
      return unsupported("a possessive quantifier", pos_);
    }
    if (at_quantifier()) return error("multiple repeat", pos_);
    Node n;
    n.kind = Node::Kind::kRepeat;
    n.offset = start;
    n.kids = {item};
    n.min = min;
    n.max = max;
    return add(std::move(n));
  }

  Result<uint32_t> utf8() {
    uint32_t c = 0;
    if (!decode_utf8(p_, &pos_, &c)) return error("invalid UTF-8", pos_);
    return c;
  }

  Result<int> atom(int depth) {
    const size_t start = pos_;
    const char c = p_[pos_];
    switch (c) {
      case '(':
        return group(depth);
      case '[': {
        VLM_ASSIGN_OR_RETURN(Ranges r, char_class());
        return chars(std::move(r), start);
      }
      case '.':
        ++pos_;
        return chars(complement(line_terminators()), start);
      case '^':
      case '$': {
        ++pos_;
        Node n;
        n.kind = c == '^' ? Node::Kind::kStart : Node::Kind::kEnd;
        n.offset = start;
        return add(std::move(n));
      }
      case '*':
      case '+':
      case '?':
        return error("nothing to repeat", start);
      case '{':
        if (at_quantifier()) return error("nothing to repeat", start);
        ++pos_;
        return chars({{'{', '{'}}, start);
      case '\\': {
        VLM_ASSIGN_OR_RETURN(CharSet s, escape(false));
        return chars(std::move(s.surely), start);
      }
      default: {
        VLM_ASSIGN_OR_RETURN(const uint32_t cp, utf8());
        return chars({{cp, cp}}, start);
      }
    }
  }

  Result<int> group(int depth) {
    const size_t start = pos_;
    ++pos_;
    if (at('?')) {
      const std::string_view rest = p_.substr(pos_ + 1);
      auto starts = [&](std::string_view s) { return rest.substr(0, s.size()) == s; };
      if (starts(":")) {
        pos_ += 2;
      } else if (starts("P<") || starts("<")) {
        if (starts("<=")) return unsupported("lookbehind", start);
        if (starts("<!")) return unsupported("negative lookbehind", start);
        pos_ += starts("P<") ? 3u : 2u;
        const size_t name = pos_;
        if (pos_ < p_.size() && (ascii_letter(p_[pos_]) || p_[pos_] == '_')) {
          while (pos_ < p_.size() && (ascii_alnum(p_[pos_]) || p_[pos_] == '_')) ++pos_;
        }
        if (pos_ == name || !at('>')) return error("bad group name", name);
        ++pos_;
      } else if (starts("=")) {
        return unsupported("lookahead", start);
      } else if (starts("!")) {
        return unsupported("negative lookahead", start);
      } else if (starts("P=")) {
        return unsupported("backreference", start);
      } else if (starts(">")) {
        return unsupported("an atomic group", start);
      } else if (starts("(")) {
        return unsupported("a conditional group", start);
      } else if (starts("#")) {
        // A comment (Python): it matches nothing.
        const size_t close = p_.find(')', pos_);
        if (close == std::string_view::npos) return error("missing ')'", start);
        pos_ = close + 1;
        Node e;
        e.offset = start;
        return add(std::move(e));
      } else if (!rest.empty() &&
                 std::string_view("aiLmsux-").find(rest[0]) != std::string_view::npos) {
        return unsupported("an inline flag", start);
      } else {
        return error("unknown group syntax", start);
      }
    }
    if (depth + 1 > kMaxNesting) return unsupported("nesting deeper than 100 groups", start);
    VLM_ASSIGN_OR_RETURN(const int inner, alternation(depth + 1));
    if (!at(')')) return error("missing ')'", start);
    ++pos_;
    return inner;
  }

  // After '[': the characters of the class (a subset of both dialects' readings).
  Result<Ranges> char_class() {
    const size_t start = pos_;
    ++pos_;
    const bool negate = at('^');
    if (negate) ++pos_;
    if (at(']')) {
      return error(
          "']' first in a class is a literal in Python but ends an empty class in "
          "ECMAScript; write \\]",
          pos_);
    }
    CharSet set;
    for (;;) {
      if (pos_ >= p_.size()) return error("unterminated character class", start);
      if (at(']')) {
        ++pos_;
        break;
      }
      const size_t item_at = pos_;
      VLM_ASSIGN_OR_RETURN(CharSet a, class_atom());
      if (at('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        VLM_ASSIGN_OR_RETURN(CharSet b, class_atom());
        if (!a.single || !b.single || a.cp > b.cp) {
          return error("bad character range " + std::string(p_.substr(item_at, pos_ - item_at)),
                       item_at);
        }
        a = exact({{a.cp, b.cp}});
      }
      append(&set.surely, a.surely);
      append(&set.maybe, a.maybe);
    }
    return negate ? complement(set.maybe) : normalized(set.surely);
  }

  Result<CharSet> class_atom() {
    if (at('\\')) return escape(true);
    VLM_ASSIGN_OR_RETURN(const uint32_t c, utf8());
    return one(c);
  }

  Result<uint32_t> hex(size_t digits, size_t at_offset) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      const int d = pos_ < p_.size() ? hex_digit(p_[pos_]) : -1;
      if (d < 0) {
        return error("bad escape " + std::string(p_.substr(at_offset, pos_ - at_offset)),
                     at_offset);
      }
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    return v;
  }

  // At '\\': a character or a class escape.
  Result<CharSet> escape(bool in_class) {
    const size_t start = pos_;
    ++pos_;
    if (pos_ >= p_.size()) return error("trailing backslash", start);
    const char c = p_[pos_];
    if (!ascii_alnum(c)) {
      VLM_ASSIGN_OR_RETURN(const uint32_t cp, utf8());  // an escaped symbol is itself
      return one(cp);
    }
    ++pos_;
    switch (c) {
      // ECMAScript reads these with ASCII, Python with Unicode: the ASCII part is surely in,
      // the non-ASCII characters may be.
      case 'd':
        return ascii_or_more(digit_ranges());
      case 'D':
        return ascii_or_more(ascii_non_digit_ranges());
      case 'w':
        return ascii_or_more(word_ranges());
      case 'W':
        return ascii_or_more(ascii_non_word_ranges());
      case 's':
        return CharSet{ascii_space_ranges(), any_space_ranges()};
      case 'S':
        return CharSet{complement(any_space_ranges()), complement(ascii_space_ranges())};
      case 'n':
        return one('\n');
      case 't':
        return one('\t');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case '0': {
        // \0, or an octal escape of up to three digits (Python and ECMAScript's Annex B agree).
        uint32_t v = 0;
        for (int i = 0; i < 2 && pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '7'; ++i) {
          v = v * 8 + static_cast<uint32_t>(p_[pos_++] - '0');
        }
        return one(v);
      }
      case 'x': {
        VLM_ASSIGN_OR_RETURN(const uint32_t v, hex(2, start));
        return one(v);
      }
      case 'u': {
        uint32_t v;
        if (at('{')) {
          ++pos_;
          const size_t digits = pos_;
          v = 0;
          while (pos_ < p_.size() && hex_digit(p_[pos_]) >= 0 && v <= kMaxCodePoint) {
            v = v * 16 + static_cast<uint32_t>(hex_digit(p_[pos_]));
            ++pos_;
          }
          if (pos_ == digits || !at('}') || v > kMaxCodePoint) {
            return error("bad escape " + std::string(p_.substr(start, pos_ - start)), start);
          }
          ++pos_;
        } else {
          VLM_ASSIGN_OR_RETURN(v, hex(4, start));
          // A UTF-16 surrogate pair spelled as two escapes is the one character it encodes.
          if (v >= 0xD800 && v <= 0xDBFF && p_.substr(pos_, 2) == "\\u") {
            const size_t save = pos_;
            pos_ += 2;
            auto low = hex(4, save);
            if (low.ok() && *low >= 0xDC00 && *low <= 0xDFFF) {
              v = 0x10000 + ((v - 0xD800) << 10) + (*low - 0xDC00);
            } else {
              pos_ = save;
            }
          }
        }
        if (v >= 0xD800 && v <= 0xDFFF) return unsupported("a lone surrogate", start);
        return one(v);
      }
      case 'c':
        if (pos_ < p_.size() && ascii_letter(p_[pos_])) {
          return one(static_cast<uint32_t>(p_[pos_++]) % 32);
        }
        return error("bad escape \\c", start);
      case 'b':
        if (in_class) return one('\b');
        return unsupported("a word boundary \\b", start);
      case 'B':
        return unsupported("a word boundary \\B", start);
      case 'p':
      case 'P':
        return unsupported("a Unicode property escape", start);
      case 'k':
        return unsupported("backreference", start);
      case 'N':
        return unsupported("a named character escape", start);
      default:
        if (c >= '1' && c <= '9') {
          if (in_class) return unsupported("an octal escape in a class", start);
          return unsupported("backreference", start);
        }
        return error(std::string("unknown escape \\") + c, start);
    }
  }

  // Anchors only where they hold in every match: '^' before anything that consumes text, '$'
  // after it. Those are ignored (the match is full anyway); anywhere else they would shrink the
  // language in ways this compiler does not model, so they are refused.
  Status check_anchors(int id, bool at_start, bool at_end) const {
    const Node& n = nodes_[static_cast<size_t>(id)];
    auto width0 = [&](int k) {
      const Node::Kind kk = nodes_[static_cast<size_t>(k)].kind;
      return kk == Node::Kind::kEmpty || kk == Node::Kind::kStart || kk == Node::Kind::kEnd;
    };
    switch (n.kind) {
      case Node::Kind::kStart:
        if (!at_start) return error("'^' is only supported at the start of the pattern", n.offset);
        return ok_status();
      case Node::Kind::kEnd:
        if (!at_end) return error("'$' is only supported at the end of the pattern", n.offset);
        return ok_status();
      case Node::Kind::kConcat: {
        // Whether everything before (after) each part is of zero width.
        const size_t m = n.kids.size();
        std::vector<char> before(m + 1, 1), after(m + 1, 1);
        for (size_t i = 0; i < m; ++i) before[i + 1] = before[i] && width0(n.kids[i]);
        for (size_t i = m; i-- > 0;) after[i] = after[i + 1] && width0(n.kids[i]);
        for (size_t i = 0; i < m; ++i) {
          VLM_RETURN_IF_ERROR(
              check_anchors(n.kids[i], at_start && before[i], at_end && after[i + 1]));
        }
        return ok_status();
      }
      case Node::Kind::kAlt:
        for (int k : n.kids) VLM_RETURN_IF_ERROR(check_anchors(k, at_start, at_end));
        return ok_status();
      case Node::Kind::kRepeat: {
        const bool once = n.max >= 0 && n.max <= 1;
        return check_anchors(n.kids[0], at_start && once, at_end && once);
      }
      default:
        return ok_status();
    }
  }

  std::string_view p_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
};

// Emits the syntax tree as grammar rules. Each node has two forms: its language, and its
// language without the empty string ("non-empty"). Repetition always repeats the non-empty form
// of its body, so `(a*)*` becomes (a a*)* and no rule can reach itself without consuming a byte;
// the language is the same, since an iteration that matches nothing can be left out.
class Emitter {
 public:
  Emitter(Grammar* g, const std::vector<Node>& nodes, bool json)
      : g_(g), nodes_(nodes), json_(json), memo_(nodes.size()) {}

  Sequence emit(int id, bool nonempty) {
    auto& slot = memo_[static_cast<size_t>(id)][nonempty ? 1 : 0];
    if (!slot) slot = build(nodes_[static_cast<size_t>(id)], nonempty);
    return *slot;
  }
  bool too_large() const { return g_->num_elements() > kMaxGrammarElements; }

  Element element(Sequence s, const char* name = "seq") {
    if (s.size() == 1) return s[0];
    return g_->group({std::move(s)}, name);
  }

 private:
  // The empty language: a byte set no byte is in (finalize() drops what leads to it).
  Sequence nothing() { return {g_->bytes(ByteSet{})}; }
  bool is_nothing(const Sequence& s) const {
    return s.size() == 1 && s[0].kind == Element::Kind::kBytes && g_->byte_set(s[0].id).empty();
  }

  Sequence build(const Node& n, bool nonempty) {
    if (too_large()) return nothing();  // the caller reports it
    switch (n.kind) {
      case Node::Kind::kChars: {
        // Equal sets (every '.', say) share their rules.
        auto it = chars_.find(n.chars);
        if (it == chars_.end()) {
          it = chars_.emplace(n.chars, json_ ? json_chars(n.chars) : raw_chars(n.chars)).first;
        }
        return it->second;
      }
      case Node::Kind::kConcat:
        return concat(n, nonempty);
      case Node::Kind::kAlt: {
        // The branches' non-empty forms, and the empty string once if some branch matches it:
        // `(|)` is the empty string, `(a|)` a|ε, and no two alternatives both match nothing
        // (which would multiply the ways through a row of such groups).
        const bool with_empty = n.nullable && !nonempty;
        std::vector<Sequence> alts;
        for (int k : n.kids) {
          Sequence s = emit(k, with_empty || nonempty);
          if (!is_nothing(s)) alts.push_back(std::move(s));
        }
        if (with_empty) {
          if (alts.empty()) return {};
          if (alts.size() == 1) return {g_->optional(std::move(alts[0]))};
          alts.emplace_back();
        }
        if (alts.empty()) return nothing();
        if (alts.size() == 1) return std::move(alts[0]);
        return {g_->group(std::move(alts), "alt")};
      }
      case Node::Kind::kRepeat:
        return repeat(n, nonempty);
      default:  // the empty string, or an anchor (checked, then ignored)
        return nonempty ? nothing() : Sequence{};
    }
  }

  Sequence concat(const Node& n, bool nonempty) {
    std::vector<int> kids;
    for (int k : n.kids) {
      const Node::Kind kind = nodes_[static_cast<size_t>(k)].kind;
      if (kind != Node::Kind::kEmpty && kind != Node::Kind::kStart && kind != Node::Kind::kEnd) {
        kids.push_back(k);
      }
    }
    if (!nonempty || !n.nullable) {
      Sequence out;
      for (int k : kids) {
        Sequence s = emit(k, false);
        out.insert(out.end(), s.begin(), s.end());
      }
      return out;
    }
    if (kids.empty()) return nothing();
    // Every part may be empty: non-empty(x1 ... xn) = non-empty(x1) x2...xn | non-empty(x2...xn),
    // built from the right with the suffixes as shared rules.
    Sequence suffix;               // x(i+1) ... xn
    std::optional<Sequence> rest;  // non-empty(x(i+1) ... xn)
    for (size_t i = kids.size(); i-- > 0;) {
      Sequence first = emit(kids[i], true);
      std::vector<Sequence> alts;
      if (!is_nothing(first)) {
        first.insert(first.end(), suffix.begin(), suffix.end());
        alts.push_back(std::move(first));
      }
      if (rest && !is_nothing(*rest)) alts.push_back(std::move(*rest));
      if (alts.empty()) {
        rest = nothing();
      } else if (alts.size() == 1) {
        rest = std::move(alts[0]);
      } else {
        rest = Sequence{g_->group(std::move(alts), "nonempty")};
      }
      Sequence whole = emit(kids[i], false);
      whole.insert(whole.end(), suffix.begin(), suffix.end());
      suffix = whole.size() <= 1 ? whole : Sequence{element(std::move(whole))};
    }
    return *rest;
  }

  Sequence repeat(const Node& n, bool nonempty) {
    const Node& body_node = nodes_[static_cast<size_t>(n.kids[0])];
    // Repetitions of a body that may be empty: any number of them up to max, since the empty
    // ones can be dropped.
    const int64_t min = body_node.nullable ? 0 : n.min;
    const int64_t max = n.max;
    if (max == 0) return nonempty ? nothing() : Sequence{};
    Sequence body = emit(n.kids[0], true);
    if (is_nothing(body)) return min == 0 && !nonempty ? Sequence{} : nothing();
    if (body.size() > 1) body = {element(std::move(body))};
    if (nonempty && min == 0) {
      // non-empty(x{0,max}) = x' x'{0,max-1}, x' the body's non-empty form.
      if (max == 1) return body;
      Sequence out = body;
      out.push_back(rep(body, 0, max < 0 ? -1 : max - 1));
      return out;
    }
    return {rep(std::move(body), min, max)};
  }

  Element rep(Sequence body, int64_t min, int64_t max) {
    if (min == 0 && max < 0) return g_->star(std::move(body));
    if (min == 1 && max < 0) return g_->plus(std::move(body));
    if (min == 0 && max == 1) return g_->optional(std::move(body));
    return g_->repeat(std::move(body), min, max);
  }

  // The characters as their UTF-8 bytes.
  Sequence raw_chars(const Ranges& all) {
    static const Ranges no_surrogates = complement({{0xD800, 0xDFFF}});
    const Ranges r = intersect(all, no_surrogates);
    if (r.empty()) return nothing();
    if (r.size() == 1 && r[0].first == r[0].second) {
      std::string text;
      append_utf8(r[0].first, &text);
      return g_->literal(text);
    }
    if (r.back().second < 0x80) {
      ByteSet b;
      for (const auto& [lo, hi] : r) {
        b.add_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
      }
      return {g_->bytes(b)};
    }
    return {g_->code_points(r)};
  }

  // The characters as they are spelled inside a JSON string: '"', '\' and the controls escaped
  // (the two-character escape where JSON has one, else \u00xx in lower case), the rest raw.
  Sequence json_chars(const Ranges& r) {
    static const Ranges escaped = {{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}};
    const Ranges raw = intersect(r, complement(escaped));
    const Ranges esc = intersect(r, escaped);
    std::vector<Sequence> alts;
    if (!raw.empty()) alts.push_back(raw_chars(raw));
    if (!esc.empty()) {
      ByteSet short_form, low[2];  // \n ...; \u000x and \u001x by their last hex digit
      for (const auto& [lo, hi] : esc) {
        for (uint32_t c = lo; c <= hi; ++c) {
          switch (c) {
            case '\b':
              short_form.add('b');
              break;
            case '\t':
              short_form.add('t');
              break;
            case '\n':
              short_form.add('n');
              break;
            case '\f':
              short_form.add('f');
              break;
            case '\r':
              short_form.add('r');
              break;
            case '"':
              short_form.add('"');
              break;
            case '\\':
              short_form.add('\\');
              break;
            default:
              low[c >> 4].add(static_cast<uint8_t>("0123456789abcdef"[c & 15]));
          }
        }
      }
      std::vector<Sequence> tails;
      if (!short_form.empty()) tails.push_back({g_->bytes(short_form)});
      for (int h = 0; h < 2; ++h) {
        if (low[h].empty()) continue;
        Sequence t = g_->literal(h == 0 ? "u000" : "u001");
        t.push_back(g_->bytes(low[h]));
        tails.push_back(std::move(t));
      }
      Sequence s = {g_->byte('\\')};
      if (tails.size() == 1) {
        s.insert(s.end(), tails[0].begin(), tails[0].end());
      } else {
        s.push_back(g_->group(std::move(tails), "escape"));
      }
      alts.push_back(std::move(s));
    }
    if (alts.empty()) return nothing();
    if (alts.size() == 1) return std::move(alts[0]);
    return {g_->group(std::move(alts), "chars")};
  }

  Grammar* g_;
  const std::vector<Node>& nodes_;
  bool json_;
  std::vector<std::array<std::optional<Sequence>, 2>> memo_;
  std::map<Ranges, Sequence> chars_;
};

}  // namespace

Result<Element> add_regex(Grammar* g, std::string_view pattern, bool in_json_string) {
  Parser parser(pattern);
  VLM_ASSIGN_OR_RETURN(const int root, parser.parse());
  Emitter emitter(g, parser.nodes(), in_json_string);
  Sequence s = emitter.emit(root, false);
  if (emitter.too_large()) {
    return invalid_argument("regex: the pattern needs more than " +
                            std::to_string(kMaxGrammarElements) + " grammar elements");
  }
  if (s.size() == 1) return s[0];
  return g->group({std::move(s)}, "regex");
}

Result<Grammar> compile_regex(std::string_view pattern) {
  Grammar g;
  VLM_ASSIGN_OR_RETURN(const Element e, add_regex(&g, pattern, false));
  g.set_root(g.rule("root", {{e}}));
  VLM_RETURN_IF_ERROR(g.finalize().with_context("regex"));
  return g;
}

}  // namespace vlm::structured

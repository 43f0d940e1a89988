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
//
// An unbounded repetition of something that can match the empty string (`("a"?)*`,
// `("a" | "")+`) repeats its non-empty form instead, as the regular-expression front end does, so
// that no rule reaches itself without reading a byte.
#include "structured/gbnf.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "structured/utf8.h"

namespace vlm::structured {
namespace {

constexpr int64_t kMaxRepeat = 10000;
constexpr int kMaxNesting = 100;  // parentheses (bounds the parser's recursion)

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
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
    VLM_RETURN_IF_ERROR(fill_repeats());
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

  // The alternatives up to the next ')' or the end of the rule. An empty one is kept once only:
  // `("" | "")` is the empty string, and two ways to match nothing in every group of a row of
  // such groups would multiply the automaton's paths.
  Status alternatives(const std::string& name, int depth, std::vector<Sequence>* alts) {
    bool has_empty = false;
    for (;;) {
      Sequence seq;
      VLM_RETURN_IF_ERROR(sequence(name, depth, &seq));
      if (!seq.empty() || !has_empty) {
        has_empty = has_empty || seq.empty();
        alts->push_back(std::move(seq));
      }
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
        if (max < 0) {
          // Unbounded: whether the body can match nothing is known only once every rule is
          // read, so the rule is filled in later (fill_repeats).
          const int32_t r = g_.new_rule(name);
          repeats_.push_back(Repeat{r, std::move(body), min, item});
          e = Grammar::ref(r);
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
        const int d = pos_ < t_.size() ? hex_digit(t_[pos_]) : -1;
        if (d < 0) return error("expected " + std::to_string(digits) + " hex digits", start);
        v = v * 16 + static_cast<uint32_t>(d);
        ++pos_;
      }
      if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
        return error("not a Unicode scalar value", start);
      }
      return v;
    }
    uint32_t c = 0;
    if (!decode_utf8(t_, &pos_, &c)) return error("invalid UTF-8", start);
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
      append_utf8(c, &bytes);
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

  // Fills the rules of the unbounded repetitions (`*`, `+`, `{m,}`). A body that cannot match the
  // empty string is repeated as it is. One that can (`("a"?)*`, `("a" | "")+`) would let the
  // repetition reach itself again without reading a byte, a left recursion the automaton cannot
  // run; its non-empty form is repeated instead, from zero times on. The language is the same:
  // x{m,} is x* when x matches the empty string, and x* is (x without ε)*, since an iteration
  // that matches nothing can be left out.
  Status fill_repeats() {
    const size_t n = g_.rules().size();
    repeat_of_.assign(n, -1);
    for (size_t i = 0; i < repeats_.size(); ++i) {
      repeat_of_[static_cast<size_t>(repeats_[i].rule)] = static_cast<int32_t>(i);
    }
    nullable_ = nullable_rules();
    nonempty_.assign(n, -1);
    for (const Repeat& r : repeats_) {
      const std::string name = g_.rules()[static_cast<size_t>(r.rule)].name;
      if (!seq_nullable(r.body)) {
        const Element e = r.min == 0   ? g_.star(r.body)
                          : r.min == 1 ? g_.plus(r.body)
                                       : g_.repeat(r.body, r.min, -1);
        g_.add_alternative(r.rule, {e});
      } else if (std::optional<Sequence> body = nonempty_seq(r.body, name)) {
        g_.add_alternative(r.rule, {g_.star(std::move(*body))});
      } else {
        g_.add_alternative(r.rule, {});  // the body matches only the empty string
      }
      VLM_RETURN_IF_ERROR(too_large(r.at));
    }
    // The non-empty forms of the rules the bodies lead to, each made once, as they are needed.
    while (!pending_.empty() && g_.num_elements() <= kMaxGrammarElements) {
      const int32_t r = pending_.back();
      pending_.pop_back();
      const int32_t copy = nonempty_[static_cast<size_t>(r)];
      const std::string name = g_.rules()[static_cast<size_t>(r)].name;
      if (const int32_t i = repeat_of_[static_cast<size_t>(r)]; i >= 0) {
        // The non-empty strings of x* are those of x' x*, x' the non-empty form of x (repetition
        // rules are read from their record: their rule holds the form above).
        std::optional<Sequence> s = nonempty_seq(repeats_[static_cast<size_t>(i)].body, name);
        if (s) {
          s->push_back(Grammar::ref(r));
          g_.add_alternative(copy, std::move(*s));
        }
        continue;
      }
      const std::vector<Sequence> alts = g_.rules()[static_cast<size_t>(r)].alternatives;
      for (const Sequence& alt : alts) {
        if (std::optional<Sequence> s = nonempty_seq(alt, name)) {
          g_.add_alternative(copy, std::move(*s));
        }
      }
    }
    return ok_status();  // finalize() refuses a grammar that grew too large here
  }

  // Which rules can match the empty string (a fixed point over the rules as read, with a
  // repetition standing for ε when it may repeat zero times and for its body otherwise).
  std::vector<char> nullable_rules() const {
    const std::vector<Rule>& rules = g_.rules();
    const size_t n = rules.size();
    std::vector<char> nullable(n, 0);
    std::vector<std::vector<size_t>> used_in(n);  // rule → alternatives that refer to it
    std::vector<int32_t> owner;                   // per alternative: its rule
    std::vector<size_t> waiting;                  // per alternative: rules not yet nullable
    std::vector<int32_t> queue;
    auto mark = [&](int32_t r) {
      if (!nullable[static_cast<size_t>(r)]) {
        nullable[static_cast<size_t>(r)] = 1;
        queue.push_back(r);
      }
    };
    auto add = [&](int32_t r, const Sequence& alt) {
      if (std::any_of(alt.begin(), alt.end(),
                      [](const Element& e) { return e.kind == Element::Kind::kBytes; })) {
        return;  // reads a byte
      }
      if (alt.empty()) {
        mark(r);
        return;
      }
      for (const Element& e : alt) used_in[static_cast<size_t>(e.id)].push_back(owner.size());
      owner.push_back(r);
      waiting.push_back(alt.size());
    };
    for (size_t r = 0; r < n; ++r) {
      const auto rule = static_cast<int32_t>(r);
      if (const int32_t i = repeat_of_[r]; i >= 0) {
        const Repeat& rp = repeats_[static_cast<size_t>(i)];
        add(rule, rp.min == 0 ? Sequence{} : rp.body);
      } else {
        for (const Sequence& alt : rules[r].alternatives) add(rule, alt);
      }
    }
    while (!queue.empty()) {
      const int32_t s = queue.back();
      queue.pop_back();
      for (size_t a : used_in[static_cast<size_t>(s)]) {
        if (--waiting[a] == 0) mark(owner[a]);
      }
    }
    return nullable;
  }

  // Whether a sequence read from the text can match the empty string: rules only, all nullable.
  bool seq_nullable(const Sequence& seq) const {
    return std::all_of(seq.begin(), seq.end(), [&](const Element& e) {
      return e.kind == Element::Kind::kRule && nullable_[static_cast<size_t>(e.id)];
    });
  }

  // A sequence read from the text without the empty string; none when it matches only that.
  // When every part may be empty, non-empty(x1 ... xn) = non-empty(x1) x2...xn |
  // non-empty(x2...xn), built from the right with each suffix as one shared rule (linear size).
  std::optional<Sequence> nonempty_seq(const Sequence& seq, const std::string& name) {
    if (!seq_nullable(seq)) return seq;
    Sequence suffix;               // x(i+1) ... xn, as at most one element
    std::optional<Sequence> rest;  // non-empty(x(i+1) ... xn)
    for (size_t i = seq.size(); i-- > 0;) {
      Sequence first = {nonempty_rule(seq[i].id)};
      first.insert(first.end(), suffix.begin(), suffix.end());
      if (rest) {
        rest = Sequence{g_.group({std::move(first), std::move(*rest)}, name)};
      } else {
        rest = std::move(first);
      }
      if (i > 0) {
        Sequence whole = {seq[i]};
        whole.insert(whole.end(), suffix.begin(), suffix.end());
        suffix = whole.size() == 1 ? whole : Sequence{g_.group({std::move(whole)}, name)};
      }
    }
    return rest;
  }

  // A reference to the non-empty form of rule r (which can match the empty string), a rule of
  // the same name filled from the worklist; a rule that matches only the empty string ends with
  // no alternatives, which finalize() prunes like any rule with no text.
  Element nonempty_rule(int32_t r) {
    int32_t& copy = nonempty_[static_cast<size_t>(r)];
    if (copy < 0) {
      const std::string name = g_.rules()[static_cast<size_t>(r)].name;
      copy = g_.new_rule(name);
      pending_.push_back(r);
    }
    return Grammar::ref(copy);
  }

  struct Repeat {
    int32_t rule;   // filled by fill_repeats()
    Sequence body;  // one element
    int64_t min;
    size_t at;  // where the quantifier is in the text
  };

  std::string_view t_;
  size_t pos_ = 0;
  Grammar g_;
  std::map<std::string, Named> rules_;
  std::vector<Repeat> repeats_;
  // For fill_repeats(), per rule read from the text: its repetition (or -1), whether it can
  // match the empty string, its non-empty form (or -1); and the non-empty forms to fill.
  std::vector<int32_t> repeat_of_;
  std::vector<char> nullable_;
  std::vector<int32_t> nonempty_;
  std::vector<int32_t> pending_;
};

}  // namespace

Result<Grammar> parse_gbnf(std::string_view text) { return Parser(text).parse(); }

}  // namespace vlm::structured

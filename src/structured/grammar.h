// Context-free grammars over bytes: the common form every structured-output front end (JSON
// Schema, regular expressions, GBNF text, tool calls) compiles to, and that the token matcher
// (structured/matcher.h) runs against the vocabulary.
//
// A grammar is a list of rules; a rule is a list of alternatives; an alternative is a sequence of
// elements, each a set of bytes (one byte of the output) or a reference to a rule. Text is bytes:
// a UTF-8 character is a sequence of byte sets (code_points() builds them), so the output is
// valid UTF-8 exactly when the grammar says so.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "vlm/status.h"

namespace vlm::structured {

// A set of byte values.
struct ByteSet {
  std::array<uint64_t, 4> w{};
  bool has(uint8_t b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { w[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  void add(const ByteSet& o) {
    for (int i = 0; i < 4; ++i) w[i] |= o.w[i];
  }
  bool empty() const { return (w[0] | w[1] | w[2] | w[3]) == 0; }
  bool operator==(const ByteSet& o) const { return w == o.w; }
  static ByteSet of(uint8_t b) {
    ByteSet s;
    s.add(b);
    return s;
  }
  static ByteSet range(uint8_t lo, uint8_t hi) {
    ByteSet s;
    s.add_range(lo, hi);
    return s;
  }
};

struct ByteSetHash {
  size_t operator()(const ByteSet& s) const {
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (uint64_t w : s.w) h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
    return static_cast<size_t>(h ^ (h >> 31));
  }
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  int32_t id = 0;  // Grammar::byte_set(id) or Grammar::rules()[id]
};
using Sequence = std::vector<Element>;

struct Rule {
  std::string name;
  std::vector<Sequence> alternatives;  // an empty sequence matches the empty string
};

// Limits that keep a hostile schema or pattern from taking the server's memory: a grammar with
// more elements than this is refused.
inline constexpr int64_t kMaxGrammarElements = 1 << 20;

class Grammar {
 public:
  // A new rule with no alternatives yet: add them with add_alternative (a rule may be referred
  // to before it is filled, for recursion). Returns its id.
  int32_t new_rule(std::string name);
  void add_alternative(int32_t rule, Sequence seq);
  // new_rule + add_alternative for each.
  int32_t rule(std::string name, std::vector<Sequence> alternatives);

  Element bytes(const ByteSet& s);  // interned: equal sets share an id
  Element byte(uint8_t b) { return bytes(ByteSet::of(b)); }
  static Element ref(int32_t rule) { return {Element::Kind::kRule, rule}; }
  Sequence literal(std::string_view text);  // one element per byte

  // Combinators: each makes a new rule and returns a reference to it.
  Element group(std::vector<Sequence> alternatives, std::string name = "group");
  Element optional(Sequence s);  // s | ε
  Element star(Sequence s);      // s*, right-recursive (the matcher's stacks stay flat)
  Element plus(Sequence s);      // s s*
  // s{min,max}; max < 0: unbounded. Bounded repetition unrolls into max rules (nested
  // optionals, so a state knows how many more it may take).
  Element repeat(Sequence s, int64_t min, int64_t max);
  // Exactly the UTF-8 encodings of the Unicode scalar values in the given inclusive code-point
  // ranges (any order, may overlap; surrogates D800–DFFF and values above 10FFFF never match).
  Element code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges);

  void set_root(int32_t rule) { root_ = rule; }
  int32_t root() const { return root_; }
  const std::vector<Rule>& rules() const { return rules_; }
  const ByteSet& byte_set(int32_t id) const { return sets_[static_cast<size_t>(id)]; }
  int32_t num_byte_sets() const { return static_cast<int32_t>(sets_.size()); }
  int64_t num_elements() const { return elements_; }

  // Makes the grammar runnable, or says why it is not: a root is set; the alternatives that can
  // never complete (an empty byte set, a rule with no finite text) are dropped, so that no path
  // leads to a dead end; the root still derives some text; no rule reaches itself without
  // consuming a byte (left recursion); at most kMaxGrammarElements elements. The message names
  // the rule. Call once, after building and before running.
  Status finalize();

  // GBNF-like text (`name ::= alt | alt`, byte sets as [\x..]), for tests and debugging.
  std::string to_string() const;

 private:
  std::vector<Rule> rules_;
  std::vector<ByteSet> sets_;
  std::unordered_map<ByteSet, int32_t, ByteSetHash> set_ids_;  // interning
  int32_t root_ = -1;
  int64_t elements_ = 0;
};

// Whether `text` is in the grammar's language (a plain simulation for tests; the matcher is what
// generation uses). The grammar must be finalized.
bool matches(const Grammar& g, std::string_view text);
// Whether `text` is a prefix of some string in the language.
bool matches_prefix(const Grammar& g, std::string_view text);

}  // namespace vlm::structured

// The byte-level pushdown automaton of a grammar: the set of parse stacks after some output, and
// how one more byte changes it (llama.cpp's grammar stacks, over bytes). The token matcher
// (structured/matcher.h) caches what it computes; this is the plain simulation underneath.
#pragma once

#include <cstdint>
#include <vector>

#include "structured/grammar.h"

namespace vlm::structured {

// A parse stack: positions in the flattened grammar, bottom first. The top is always a byte
// element (the next byte must be in its set); below it are the places to return to. An empty
// stack means the whole grammar is complete.
using Stack = std::vector<int32_t>;
using StackSet = std::vector<Stack>;  // sorted, no duplicates

// Nesting deeper than this many frames is not followed (a path that needs it is dropped): a
// recursive grammar such as any-JSON stays bounded.
inline constexpr size_t kMaxStackDepth = 400;
// A state keeps at most this many stacks (the first ones in order): an ambiguous grammar
// (`(a|a)*`) cannot make one byte cost unbounded work. Dropping stacks keeps the output in the
// language: every stack can complete on its own (finalize() leaves no dead alternative), unless
// completing needs nesting past kMaxStackDepth; it only loses some ways of going on (a state
// of an enum with more values than this starts with the first ones only).
inline constexpr size_t kMaxStacks = 4096;

class Pda {
 public:
  explicit Pda(const Grammar& g);  // g must be finalized

  StackSet initial() const;
  // The stacks after byte b (empty: b is not allowed).
  StackSet advance(const StackSet& s, uint8_t b) const;
  bool accepting(const StackSet& s) const { return !s.empty() && s.front().empty(); }
  // The bytes some stack accepts next.
  ByteSet next_bytes(const StackSet& s) const;
  const ByteSet& top_set(const Stack& st) const {
    return sets_[static_cast<size_t>(elems_[static_cast<size_t>(st.back())] >> 1)];
  }

 private:
  static constexpr int32_t kEnd = -1;
  void expand(Stack st, StackSet* out) const;

  std::vector<int32_t> elems_;  // per alternative: codes (set id * 2, rule id * 2 + 1), kEnd
  std::vector<std::vector<int32_t>> alt_starts_;  // per rule
  std::vector<ByteSet> sets_;
  int32_t root_ = 0;
};

}  // namespace vlm::structured

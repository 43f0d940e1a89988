// Grammar-constrained decoding: which tokens of the vocabulary keep the output inside a grammar.
//
// TokenVocab holds every token's bytes in a trie (flattened in preorder, so a walk is a loop over
// an array that skips a subtree in one jump). A CompiledGrammar pairs a grammar with a vocabulary
// and caches, across every request that uses it, what the pushdown automaton computes: each set
// of parse stacks met so far is a state with a 256-entry transition row filled on demand (a
// lazily built DFA over the automaton's configurations), and each state's token mask once it has
// been walked. The mask of a state is one walk of the trie in which a node costs one table lookup
// and a dead byte skips its whole subtree. A GrammarMatcher is one sequence's position in it.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"
#include "structured/pda.h"

namespace vlm::structured {

class TokenVocab {
 public:
  // bytes[id]: what token `id` adds to the text; an empty string marks an id that grammar text
  // never uses (special tokens, unused ids). vocab_size may exceed bytes.size() (padding rows).
  TokenVocab(const std::vector<std::string>& bytes, int64_t vocab_size);

  int64_t vocab_size() const { return vocab_; }
  int64_t words() const { return (vocab_ + 63) / 64; }  // uint64 words of a mask
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }

 private:
  friend class CompiledGrammar;
  int64_t vocab_;
  std::vector<std::string> bytes_;
  // Trie in preorder; node 0 is the root (no byte). A node: its byte, its depth, the first
  // node after its subtree, and its tokens (ids whose bytes end here) as tokens_[tok, tok +
  // ntok). One 12-byte record, read in order by a walk.
  struct Node {
    int32_t end = 0;
    int32_t tok = 0;
    uint16_t depth = 0;
    uint8_t byte = 0;
    uint8_t ntok = 0;
  };
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  std::array<int32_t, 256> byte_token_;  // the token of exactly that one byte, or -1
  int32_t max_depth_ = 0;
};

class CompiledGrammar {
 public:
  // g must be finalized. walk_budget_ms: how long a mask's walk may make new transitions
  // before it falls back to one-byte tokens (matcher.cc).
  CompiledGrammar(const Grammar& g, std::shared_ptr<const TokenVocab> vocab,
                  double walk_budget_ms = kDefaultWalkBudgetMs);
  static constexpr double kDefaultWalkBudgetMs = 50;

  const TokenVocab& vocab() const { return *vocab_; }
  const Pda& pda() const { return pda_; }

  // The cache's contents, for the benchmarks and /metrics.
  struct Stats {
    int64_t states = 0, masks = 0, mask_walks = 0, mask_hits = 0;
    int64_t mask_fallbacks = 0;  // walks cut short (one-byte tokens only)
  };
  Stats stats() const;

 private:
  friend class GrammarMatcher;
  using MaskPtr = std::shared_ptr<const std::vector<uint64_t>>;
  struct State {
    StackSet stacks;
    bool accepting = false;
    MaskPtr mask;  // tokens allowed from here (end tokens not included); null: not walked
  };
  // The state for `stacks` (interning it). Caller holds mu_.
  int32_t intern(StackSet stacks);
  // The transition on byte b: a state, or -1 (b not allowed). Caller holds mu_.
  int32_t step(int32_t state, uint8_t b);
  void fill_row(int32_t state);  // every byte's transition from `state`
  MaskPtr mask(int32_t state);   // takes mu_
  MaskPtr walk(int32_t state);   // caller holds mu_
  // Drops every state and mask when the cache (rows, masks, stacks) outgrows its budget; matchers
  // re-intern their stacks (they keep a copy) when they see the epoch change. Caller holds mu_.
  void maybe_reset();

  std::shared_ptr<const TokenVocab> vocab_;
  double walk_budget_ms_;
  Pda pda_;
  StackSet initial_;
  mutable std::mutex mu_;
  uint64_t epoch_ = 0;
  std::vector<State> states_;
  std::vector<int32_t> trans_;  // [state * 256 + byte]: -2 unknown, -1 dead, else a state
  std::unordered_map<std::string, int32_t> ids_;
  std::deque<int32_t> masked_;  // states holding a mask, oldest first (evicted first)
  int64_t mask_bytes_ = 0;
  int64_t state_bytes_ = 0;  // the states' stacks and keys
  int64_t walks_ = 0, hits_ = 0, fallbacks_ = 0;
  std::vector<int32_t> path_;  // walk scratch: the state at each depth
};

class GrammarMatcher {
 public:
  // end_ids: the tokens that end the generation; they are allowed exactly when the output is
  // complete. activate_after >= 0: the grammar starts after that token (the end of a reasoning
  // block the prompt opened); until then any token but an end token is allowed.
  GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar, std::vector<int32_t> end_ids,
                 int32_t activate_after = -1);

  // Sets the logits of the tokens that would leave the grammar to -infinity. Never leaves every
  // token at -infinity: a state has a continuation or is complete, and at a dead end (nesting
  // deeper than the automaton follows) the end tokens are allowed, so the reply stops there.
  void apply(float* logits);
  // The allowed tokens as a bit mask ([vocab().words()] words), end tokens included.
  void fill(uint64_t* words);
  // Advances over a sampled token. False (the state unchanged) if the grammar does not allow it.
  bool accept(int32_t id);
  bool complete() const;                      // an end token is allowed now
  bool terminated() const { return ended_; }  // an end token was accepted
  bool active() const { return activate_after_ < 0; }

 private:
  void sync();  // re-interns the stacks after a cache reset
  // The current state's mask (active matcher); marks a dead end (and *done) when it allows
  // nothing and the output is not complete.
  CompiledGrammar::MaskPtr mask_now(bool* done);

  std::shared_ptr<CompiledGrammar> g_;
  std::vector<int32_t> end_ids_;
  std::vector<float> saved_;  // apply()'s copy of the end tokens' logits
  int32_t activate_after_;
  int32_t state_ = -1;
  uint64_t epoch_ = 0;
  StackSet stacks_;
  bool ended_ = false;
  bool dead_end_ = false;  // nothing was allowed: the end tokens were, to stop the reply
};

}  // namespace vlm::structured

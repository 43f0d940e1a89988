// Speculative decoding's proposers (docs/architecture.md, "Speculative decoding"): given a
// sequence, up to max_k tokens it may continue with, which the next step verifies. Called on the
// engine thread; allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "vlm/engine.h"
#include "vlm/status.h"

namespace vlm {

// What a proposer sees of a sequence: its ids (prompt, then output), each position's image
// feature row (>= 0: an image or video placeholder) and the prompt's length.
struct ProposeInput {
  std::span<const int32_t> ids;
  std::span<const int32_t> feature_row;
  int64_t prompt_len = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Writes up to max_k (>= 1) proposed ids to out and returns how many (0: none).
  virtual int32_t propose(const ProposeInput& in, int32_t max_k, int32_t* out) = 0;
};

// Prompt lookup: for n from ngram_max down to ngram_min, the last n ids of the sequence are
// looked for earlier in it (the latest place first); the first match proposes the ids that
// followed it, up to max_k, stopping before a placeholder or the sequence's end.
class NgramProposer final : public Proposer {
 public:
  NgramProposer(int32_t ngram_min, int32_t ngram_max) : min_(ngram_min), max_(ngram_max) {}
  int32_t propose(const ProposeInput& in, int32_t max_k, int32_t* out) override;

 private:
  int32_t min_, max_;
};

// The proposer `spec` asks for (null for SpecMethod::kNone); invalid_argument for bad sizes. A
// kCustom proposal is cut before its first id outside [0, vocab).
Result<std::unique_ptr<Proposer>> make_proposer(const SpecOptions& spec, int64_t vocab);

}  // namespace vlm

// Speculative decoding's proposers (docs/architecture.md, "Speculative decoding"): given a
// sequence, up to max_k tokens it may continue with, which the next step verifies. Called on the
// engine thread; allocate nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/text_decoder.h"
#include "vlm/engine.h"
#include "vlm/status.h"

namespace vlm {

// A request's image and video features as a draft model's vision tower made them: the rows the
// sequence's feature_row numbers, [features, draft hidden], and each DeepStack tap's.
struct DraftFeatures {
  std::vector<float> embeds;
  std::vector<std::vector<float>> deepstack;
};

// What a proposer sees of a sequence: its ids (prompt, then output), each position's image
// feature row (>= 0: an image or video placeholder) and the prompt's length; for a draft model
// or the MTP head also the request, its 3-D positions [ids.size()], its features for the draft
// (may be null) and its block table in the target's cache (may be null).
struct ProposeInput {
  std::span<const int32_t> ids;
  std::span<const int32_t> feature_row;
  int64_t prompt_len = 0;
  int64_t request_id = 0;
  Positions3 pos;
  const DraftFeatures* features = nullptr;
  const std::vector<int32_t>* block_table = nullptr;
};

// One request's share of a step's proposals: at most max_k (>= 1) ids to `out`, their count to k.
struct ProposeJob {
  ProposeInput in;
  int32_t max_k = 0;
  int32_t* out = nullptr;
  int32_t k = 0;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  // Writes up to max_k (>= 1) proposed ids to out and returns how many (0: none).
  virtual int32_t propose(const ProposeInput& in, int32_t max_k, int32_t* out) = 0;
  // Every request's proposals for the next step together (a draft model runs them as batched
  // passes); by default propose() for each. An error is the proposer's fault: the jobs' k are 0
  // and the requests go on without proposals.
  virtual Status propose_batch(std::span<ProposeJob> jobs) {
    for (ProposeJob& j : jobs) j.k = propose(j.in, j.max_k, j.out);
    return ok_status();
  }
  // Request `id` has ended: whatever the proposer keeps for it goes.
  virtual void forget(int64_t /*id*/) {}
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

// num_tokens within 1..SpecOptions::kMaxTokens.
Status check_spec_tokens(const SpecOptions& spec);

// The proposer `spec` asks for (null for SpecMethod::kNone); invalid_argument for bad sizes. A
// kCustom proposal is cut before its first id outside [0, vocab). kDraft and kMtp are
// DraftProposer's and MtpProposer's (engine/draft_proposer.h, engine/mtp_proposer.h): refused
// here.
Result<std::unique_ptr<Proposer>> make_proposer(const SpecOptions& spec, int64_t vocab);

}  // namespace vlm

// Token sampling with the transformers processor order: repetition penalty → (presence,
// frequency penalties, OpenAI-style) → temperature → top-k → top-p → min-p → draw.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "ops/backend.h"
#include "ops/ops.h"
#include "structured/matcher.h"

namespace vlm {

struct ResolvedSampling {
  bool greedy = true;
  double temperature = 1.0;
  int64_t top_k = 0;  // 0 = off
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  uint64_t seed = 0;
  std::vector<std::pair<int32_t, float>> logit_bias;  // ids within the vocabulary
};

class Sampler {
 public:
  // Buffers are sized for the vocabulary once; sample() allocates nothing.
  Sampler(int64_t vocab_size, const ResolvedSampling& params);

  // Records prompt ids (for the repetition penalty, which in transformers covers the prompt).
  void add_prompt(std::span<const int32_t> ids);
  // Makes room for `max_new` more generated ids in the penalty lists, so that sample() allocates
  // nothing however many distinct ids come out (call after add_prompt).
  void reserve_generated(int64_t max_new);
  // Picks the next id from logits [vocab] (modified in place) and records it as generated.
  int32_t sample(float* logits);
  // Speculative decoding's verification of one proposed id: picks the next id from logits [vocab]
  // (modified in place) so that it is distributed exactly as sample()'s pick — greedy: the same
  // argmax; sampling: the proposal accepted with its probability under sample()'s distribution,
  // else a draw from that distribution without it — records it, and sets *accepted when it is
  // the proposal.
  int32_t sample_speculative(float* logits, int32_t draft, bool* accepted);
  // Greedy with no penalty and no logit bias: the pick is the logits' argmax (the first
  // largest), which a device may compute itself (then record() it).
  bool plain_greedy() const {
    return p_.greedy && p_.repetition_penalty == 1.0 && p_.presence_penalty == 0.0 &&
           p_.frequency_penalty == 0.0 && p_.logit_bias.empty() && think_budget_ < 0 && !grammar_;
  }
  // Whether device_draw() can stand for sample(): not with a logit bias (the device draw has
  // none), whose rows come to the host.
  bool device_can_draw() const { return p_.logit_bias.empty() && think_budget_ < 0 && !grammar_; }
  // Structured output: sample() picks only among the tokens the grammar allows (after the logit
  // bias and the penalties, before the temperature and the filters), and record() moves it.
  void set_grammar(std::unique_ptr<structured::GrammarMatcher> matcher) {
    grammar_ = std::move(matcher);
  }
  structured::GrammarMatcher* grammar() const { return grammar_.get(); }
  // Records `id` as generated, as sample() does with its pick.
  void record(int32_t id);
  // A thinking budget: after `budget` tokens of reasoning (from the start when open_in_prompt,
  // else after `open_id`), sample() returns `close_id`. The host then samples every token.
  void set_thinking_budget(int64_t budget, int32_t open_id, int32_t close_id, bool open_in_prompt);
  // The log-probability of `chosen` under the log-softmax of `raw` [vocab] (the logits before
  // bias, penalties and temperature, as vLLM reports them), its rank (1 + the ids strictly more
  // likely, as vLLM's) and the k most likely ids with theirs, best first (ties: the lower id).
  // One vector pass for the maximum and the rank, one for the sum (ops::logsumexp on `isa`), one
  // selection for the top k: no vocabulary-sized output.
  static void logprobs(const float* raw, int64_t vocab, int32_t chosen, int32_t k, ops::Isa isa,
                       float* logprob, int64_t* rank, std::pair<int32_t, float>* top,
                       int32_t* num_top);
  // The next draw for a device to make (then record() its pick): the penalties of the ids seen
  // so far ([penalty_begin, penalty_end) of *penalties, which is refilled), the filters, and u
  // from this sampler's generator. Greedy is top-k 1 at temperature 1.
  void device_draw(ops::SampleParams* out, std::vector<ops::PenaltyEntry>* penalties);

 private:
  void apply_penalties(float* logits) const;  // logit bias first, then the penalties
  bool budget_spent() const;                  // the thinking budget forces its close now
  // The ids a draw picks from after temperature, top-k, top-p and min-p: idx_[0, n) with weights
  // probs_[0, n), best first; returns n and their sum.
  int64_t candidates(const float* logits, double* total);
  // The candidate where `r` (uniform over the weights' sum, less candidate `skip`'s when >= 0)
  // falls, candidate `skip` left out.
  int32_t pick(int64_t n, double r, int64_t skip) const;

  int64_t vocab_;
  ResolvedSampling p_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> seen_;       // [vocab] in prompt or output (repetition penalty)
  std::vector<int32_t> counts_;     // [vocab] times generated (presence / frequency)
  std::vector<int32_t> seen_list_;  // ids with seen_ set, to visit only those
  std::vector<int32_t> out_list_;   // ids with counts_ > 0
  std::vector<int32_t> idx_;        // [vocab] candidate ids
  std::vector<float> probs_;        // [vocab] candidate probabilities
  std::vector<float> kth_heap_;     // [top_k] the top-k selection's heap
  // The thinking budget (set_thinking_budget): < 0 none.
  int64_t think_budget_ = -1, thought_ = 0;
  int32_t think_open_ = -1, think_close_ = -1;
  bool thinking_ = false, started_ = false;
  std::unique_ptr<structured::GrammarMatcher> grammar_;
};

}  // namespace vlm

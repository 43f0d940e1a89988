#include "engine/proposer.h"

#include <algorithm>
#include <string>
#include <utility>

namespace vlm {

int32_t NgramProposer::propose(const ProposeInput& in, int32_t max_k, int32_t* out) {
  const int64_t len = static_cast<int64_t>(in.ids.size());
  const int32_t* ids = in.ids.data();
  for (int64_t n = std::min<int64_t>(max_, len - 1); n >= min_; --n) {
    const int32_t* suffix = ids + len - n;
    // The latest earlier place the suffix occurs at: [s, s + n) with s + n < len, so that at
    // least one id follows it.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (ids[s + n - 1] != suffix[n - 1] || !std::equal(suffix, suffix + n, ids + s)) continue;
      int32_t k = 0;
      for (int64_t p = s + n; p < len && k < max_k; ++p) {
        if (in.feature_row[static_cast<size_t>(p)] >= 0) break;  // never a placeholder
        out[k++] = ids[p];
      }
      if (k > 0) return k;
    }
  }
  return 0;
}

namespace {

class CallbackProposer final : public Proposer {
 public:
  CallbackProposer(decltype(SpecOptions::propose) fn, int64_t vocab)
      : fn_(std::move(fn)), vocab_(vocab) {}
  int32_t propose(const ProposeInput& in, int32_t max_k, int32_t* out) override {
    const int32_t k = std::clamp(fn_(in.ids, in.prompt_len, max_k, out), 0, max_k);
    for (int32_t j = 0; j < k; ++j) {
      if (out[j] < 0 || out[j] >= vocab_) return j;
    }
    return k;
  }

 private:
  decltype(SpecOptions::propose) fn_;
  int64_t vocab_;
};

}  // namespace

Status check_spec_tokens(const SpecOptions& spec) {
  if (spec.num_tokens < 1 || spec.num_tokens > SpecOptions::kMaxTokens) {
    return invalid_argument("--spec-tokens must be 1.." + std::to_string(SpecOptions::kMaxTokens) +
                            " (got " + std::to_string(spec.num_tokens) + ")");
  }
  return ok_status();
}

Result<std::unique_ptr<Proposer>> make_proposer(const SpecOptions& spec, int64_t vocab) {
  if (spec.method == SpecMethod::kNone) return std::unique_ptr<Proposer>();
  VLM_RETURN_IF_ERROR(check_spec_tokens(spec));
  if (spec.method == SpecMethod::kDraft || spec.method == SpecMethod::kMtp) {
    return invalid_argument(
        "speculative decoding: a draft model's or the MTP head's proposer is made with its model");
  }
  if (spec.method == SpecMethod::kCustom) {
    if (!spec.propose) return invalid_argument("speculative decoding: kCustom needs `propose`");
    return std::unique_ptr<Proposer>(new CallbackProposer(spec.propose, vocab));
  }
  if (spec.ngram_min < 1 || spec.ngram_max < spec.ngram_min) {
    return invalid_argument("--ngram-min must be >= 1 and --ngram-max >= --ngram-min (got " +
                            std::to_string(spec.ngram_min) + " and " +
                            std::to_string(spec.ngram_max) + ")");
  }
  return std::unique_ptr<Proposer>(new NgramProposer(spec.ngram_min, spec.ngram_max));
}

}  // namespace vlm

#include "sched/step_budget.h"

#include <algorithm>

#include "sched/scheduler.h"

namespace vlm {

double StepBudget::auto_side_budget_ms(double pass_ms, int64_t waiting) {
  const double passes =
      std::clamp(kSidePassesPerWaiting * static_cast<double>(waiting), 1.0, kMaxSidePasses);
  return std::max(1.0, passes * pass_ms);
}

void StepBudget::begin_step(int64_t waiting) {
  encode_ms_ = 0;
  if (max_side_ms_ > 0) {
    side_ms_ = max_side_ms_;
  } else {
    side_ms_ = auto_side_budget_ms(decode_ms_ > 0 ? decode_ms_ : forward_ms_, waiting);
  }
}

StepBudget::EncodeShare StepBudget::encode_share(int64_t num_running,
                                                 int64_t pending_prefill_tokens) const {
  EncodeShare share;
  if (!enabled() || num_running == 0) return share;  // whole: nothing waits for it
  share.budget_ms = side_ms_ - std::min(side_ms_, prefill_token_ms() *
                                                      static_cast<double>(pending_prefill_tokens));
  share.run = share.budget_ms >= 0.25 * side_ms_;
  return share;
}

int64_t StepBudget::prefill_limit(int64_t none) const {
  if (!enabled() || prefill_token_ms() <= 0) return none;
  const double left = std::max(0.0, side_ms_ - encode_ms_);
  return std::max<int64_t>(kMinSideChunk, static_cast<int64_t>(left / prefill_token_ms()));
}

// A prompt token's cost is a ratio of two averages, time over tokens, so that steps with a few
// prompt tokens (noisy alone) count by their size.
void StepBudget::observe_forward(const SchedulerOutput& out, double ms) {
  constexpr double kNew = 0.2;
  auto avg = [](double old, double now) { return old > 0 ? (1 - kNew) * old + kNew * now : now; };
  forward_ms_ = avg(forward_ms_, ms);
  // Chunks of more than one token are prefills (a decode is one, or its proposals with it).
  int64_t prompt_tokens = 0;
  for (const ScheduledItem& it : out.items) {
    if (it.num_tokens > 1 && it.num_spec == 0) prompt_tokens += it.num_tokens;
  }
  if (prompt_tokens == 0) {
    decode_ms_ = avg(decode_ms_, ms);
  } else if (decode_ms_ > 0) {
    extra_ms_ = (1 - kNew) * extra_ms_ + kNew * std::max(0.0, ms - decode_ms_);
    extra_tokens_ = (1 - kNew) * extra_tokens_ + kNew * static_cast<double>(prompt_tokens);
  }
}

size_t StepBudget::encode_batch_size(std::span<const EncodeCandidate> candidates,
                                     bool tower_batches, int64_t max_patches) {
  if (candidates.empty()) return 0;
  size_t n = 1;
  int64_t patches = candidates[0].patches;
  while (tower_batches && candidates[0].batchable && n < candidates.size() &&
         candidates[n].batchable && patches + candidates[n].patches <= max_patches) {
    patches += candidates[n++].patches;
  }
  return n;
}

}  // namespace vlm

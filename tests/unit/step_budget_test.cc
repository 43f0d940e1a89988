// The side budget beside running decodes (sched/step_budget.h) and the scheduler that owns it,
// driven with made-up pass times: no model.
#include "sched/step_budget.h"

#include <gtest/gtest.h>

#include <vector>

#include "sched/scheduler.h"

namespace vlm {
namespace {

// A step over `items` (request id, tokens) as the scheduler would hand it out.
SchedulerOutput step_of(const std::vector<std::pair<int64_t, int64_t>>& items) {
  SchedulerOutput out;
  for (const auto& [id, n] : items) out.items.push_back({id, 0, n});
  return out;
}

// Without --max-encoder-ms the side budget follows the queue: one decode pass while at most one
// request waits for side work (an encode or a prompt), more for more, up to the cap; a pass not
// measured yet still leaves a positive budget.
TEST(StepBudget, AutoSideBudgetGrowsWithTheQueue) {
  const double pass = 120;
  EXPECT_DOUBLE_EQ(StepBudget::auto_side_budget_ms(pass, 0), pass);
  EXPECT_DOUBLE_EQ(StepBudget::auto_side_budget_ms(pass, 1), pass);
  EXPECT_GT(StepBudget::auto_side_budget_ms(pass, 2), pass);
  double last = pass;
  for (int64_t waiting = 2; waiting <= 16; ++waiting) {
    const double b = StepBudget::auto_side_budget_ms(pass, waiting);
    EXPECT_GE(b, last) << waiting << " waiting";
    last = b;
  }
  EXPECT_DOUBLE_EQ(StepBudget::auto_side_budget_ms(pass, 1000), StepBudget::kMaxSidePasses * pass);
  EXPECT_GE(StepBudget::auto_side_budget_ms(0, 3), 1.0);
}

// The cost model: decode-only passes set the pace; a pass with prompt tokens costs its time
// beyond that pace per prompt token (a ratio of averages).
TEST(StepBudget, PromptTokenCostIsTheTimeBeyondADecodePass) {
  StepBudget b(0);
  EXPECT_EQ(b.prefill_token_ms(), 0);
  b.observe_forward(step_of({{1, 1}, {2, 1}}), 100);  // decodes only
  EXPECT_DOUBLE_EQ(b.decode_pass_ms(), 100);
  EXPECT_EQ(b.prefill_token_ms(), 0);
  b.observe_forward(step_of({{1, 1}, {3, 50}}), 200);  // 50 prompt tokens: 100 ms beyond
  EXPECT_DOUBLE_EQ(b.prefill_token_ms(), 2);
  b.observe_forward(step_of({{1, 1}, {3, 150}}), 400);  // 150 tokens, 300 ms beyond: still 2
  EXPECT_DOUBLE_EQ(b.prefill_token_ms(), 2);
  b.observe_forward(step_of({{1, 1}}), 150);  // the pace moves by a fifth of the change
  EXPECT_DOUBLE_EQ(b.decode_pass_ms(), 110);
}

// The encode's share: whole with nothing running (or no budget); beside decodes, what the
// pending prompt tokens leave of the side budget, and nothing when that is under a quarter.
TEST(StepBudget, EncodeShareIsWhatThePendingPromptsLeave) {
  StepBudget off(-1);
  off.begin_step(3);
  EXPECT_TRUE(off.encode_share(4, 1000).run);
  EXPECT_LE(off.encode_share(4, 1000).budget_ms, 0);

  StepBudget b(80);  // a fixed budget of 80 ms
  b.observe_forward(step_of({{1, 1}}), 100);
  b.observe_forward(step_of({{1, 1}, {2, 10}}), 110);  // 1 ms a prompt token
  b.begin_step(1);
  EXPECT_DOUBLE_EQ(b.side_ms(), 80);
  EXPECT_LE(b.encode_share(0, 500).budget_ms, 0);  // nothing runs: whole
  EXPECT_TRUE(b.encode_share(0, 500).run);
  const StepBudget::EncodeShare some = b.encode_share(2, 30);
  EXPECT_TRUE(some.run);
  EXPECT_DOUBLE_EQ(some.budget_ms, 50);
  EXPECT_FALSE(b.encode_share(2, 70).run);  // 10 ms left: under a quarter of 80
}

// The prefill limit beside decodes: what the side budget has left after the encode, at the
// measured cost of a prompt token, never below kMinSideChunk; none before a measurement.
TEST(StepBudget, PrefillLimitFollowsTheBudgetLeftAfterTheEncode) {
  constexpr int64_t kNone = -7;
  StepBudget b(0);
  b.begin_step(1);
  EXPECT_EQ(b.prefill_limit(kNone), kNone);  // not measured yet
  b.observe_forward(step_of({{1, 1}}), 100);
  b.observe_forward(step_of({{1, 1}, {2, 100}}), 150);  // 0.5 ms a prompt token
  b.begin_step(1);                                      // one waiting: one pass, 100 ms
  EXPECT_DOUBLE_EQ(b.side_ms(), 100);
  EXPECT_EQ(b.prefill_limit(kNone), 200);
  b.add_encode_ms(60);
  EXPECT_EQ(b.prefill_limit(kNone), 80);
  b.add_encode_ms(60);  // over the budget: still the minimum chunk
  EXPECT_EQ(b.prefill_limit(kNone), StepBudget::kMinSideChunk);
  b.begin_step(1);  // a new step forgets the encode
  EXPECT_EQ(b.prefill_limit(kNone), 200);
  EXPECT_EQ(StepBudget(-1).prefill_limit(kNone), kNone);
}

// Which images go into one encode: the first alone, unless the tower batches resized images;
// then batchable ones while they fit the patch budget.
TEST(StepBudget, EncodeBatchTakesBatchableImagesWithinThePatchBudget) {
  using C = StepBudget::EncodeCandidate;
  const std::vector<C> rgb = {{100, true}, {200, true}, {300, true}, {50, false}, {10, true}};
  EXPECT_EQ(StepBudget::encode_batch_size({}, true), 0u);
  EXPECT_EQ(StepBudget::encode_batch_size(rgb, false), 1u);
  EXPECT_EQ(StepBudget::encode_batch_size(rgb, true), 3u);  // stops at the unbatchable one
  EXPECT_EQ(StepBudget::encode_batch_size(rgb, true, 350), 2u);
  EXPECT_EQ(StepBudget::encode_batch_size(rgb, true, 50), 1u);   // the first goes whatever it is
  const std::vector<C> first_not = {{100, false}, {100, true}};  // patchified: it goes alone
  EXPECT_EQ(StepBudget::encode_batch_size(first_not, true), 1u);
}

// The scheduler drives its budget: a prompt beside a running decode is chunked to the budget's
// limit once the cost is measured (automatic: one decode pass, 100 ms; fixed: 40 ms), and whole
// without a side budget.
TEST(StepBudget, SchedulerChunksPromptsBesideDecodesToTheBudget) {
  for (double max_side_ms : {-1.0, 0.0, 40.0}) {
    SchedulerConfig c;
    c.num_blocks = 64;
    c.block_size = 16;
    c.max_num_seqs = 4;
    c.max_batched_tokens = 512;
    c.max_side_ms = max_side_ms;
    Result<Scheduler> made = Scheduler::create(c);
    ASSERT_TRUE(made.ok());
    Scheduler s = std::move(made).value();
    ASSERT_TRUE(s.add(1, 8, 16).ok());
    SchedulerOutput out;
    s.begin_step(0);
    s.schedule(&out);
    ASSERT_EQ(out.items.size(), 1u);
    s.update({{1, 8}});
    s.append_token(1);  // request 1 decodes from now on
    s.record_forward(step_of({{1, 1}}), 100);
    s.record_forward(step_of({{1, 1}, {9, 100}}), 200);  // 1 ms a prompt token
    ASSERT_TRUE(s.add(2, 300, 16).ok());
    s.begin_step(0);  // one prefilling: a budget of one pass, 100 ms: 100 tokens
    // The pending prompt (300 ms at 1 ms a token) takes the whole budget: an encode would wait.
    EXPECT_EQ(s.encode_share().run, max_side_ms < 0) << max_side_ms;
    const int64_t want = max_side_ms < 0 ? 300 : max_side_ms > 0 ? 40 : 100;
    s.schedule(&out);
    ASSERT_EQ(out.items.size(), 2u);
    EXPECT_EQ(out.items[1].request_id, 2);
    EXPECT_EQ(out.items[1].num_tokens, want) << max_side_ms;
  }
}

}  // namespace
}  // namespace vlm

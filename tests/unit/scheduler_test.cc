// The continuous-batching scheduler with fake requests: token budget, decode priority, chunked
// prefill, FCFS admission by free blocks, preemption, abort/finish, and a seeded simulation that
// checks the invariants every step.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace vlm {
namespace {

using State = SchedRequest::State;

Scheduler make(const SchedulerConfig& c) {
  Result<Scheduler> s = Scheduler::create(c);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return std::move(s).value();
}

SchedulerConfig config(int32_t num_blocks, int32_t block_size, int64_t max_num_seqs,
                       int64_t max_batched_tokens, bool chunked = true) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.max_num_seqs = max_num_seqs;
  c.max_batched_tokens = max_batched_tokens;
  c.chunked_prefill = chunked;
  return c;
}

const ScheduledItem* item_of(const SchedulerOutput& out, int64_t id) {
  for (const ScheduledItem& i : out.items) {
    if (i.request_id == id) return &i;
  }
  return nullptr;
}

std::vector<int64_t> ids_of(const SchedulerOutput& out) {
  std::vector<int64_t> ids;
  for (const ScheduledItem& i : out.items) ids.push_back(i.request_id);
  return ids;
}

// The engine's part of a step: every scheduled token gets computed; a request that has caught up
// samples one token and finishes once it reaches its token limit. Returns the ids that finished.
std::vector<int64_t> run_step(Scheduler& s, const SchedulerOutput& out) {
  std::vector<std::pair<int64_t, int64_t>> computed;
  for (const ScheduledItem& i : out.items) computed.emplace_back(i.request_id, i.num_tokens);
  s.update(computed);
  std::vector<int64_t> finished;
  for (const ScheduledItem& i : out.items) {
    const SchedRequest* r = s.find(i.request_id);
    if (r == nullptr || r->num_computed_tokens < r->num_tokens) continue;
    s.append_token(i.request_id);
    if (r->num_tokens == r->num_tokens_limit()) {
      s.finish(i.request_id);
      finished.push_back(i.request_id);
    }
  }
  return finished;
}

TEST(Scheduler, CreateValidatesConfig) {
  EXPECT_TRUE(Scheduler::create(config(8, 16, 4, 64)).ok());
  const SchedulerConfig bad[] = {config(0, 16, 4, 64), config(8, 0, 4, 64), config(8, 16, 0, 64),
                                 config(8, 16, 4, 0), config(8, 16, 8, 4)};
  for (const SchedulerConfig& c : bad) {
    Result<Scheduler> s = Scheduler::create(c);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  }
  SchedulerConfig no_queue = config(8, 16, 4, 64);
  no_queue.max_waiting = 0;
  EXPECT_EQ(Scheduler::create(no_queue).status().code(), StatusCode::kInvalidArgument);
}

TEST(Scheduler, AddRejectsBadImpossibleAndOverflowingRequests) {
  SchedulerConfig c = config(4, 16, 4, 64);  // 64 tokens of cache
  c.max_waiting = 2;
  Scheduler s = make(c);
  EXPECT_EQ(s.add(1, 0, 5).code(), StatusCode::kInvalidArgument);   // empty prompt
  EXPECT_EQ(s.add(1, 10, 0).code(), StatusCode::kInvalidArgument);  // no room to generate
  const Status impossible = s.add(1, 10, 55);                       // 5 blocks > 4
  EXPECT_EQ(impossible.code(), StatusCode::kOutOfRange);
  EXPECT_NE(impossible.message().find("KV blocks"), std::string::npos) << impossible.message();
  ASSERT_TRUE(s.add(1, 10, 54).ok());  // exactly the whole cache: allowed
  EXPECT_EQ(s.add(1, 5, 3).code(), StatusCode::kInvalidArgument);  // duplicate id
  ASSERT_TRUE(s.add(2, 5, 3).ok());
  EXPECT_EQ(s.add(3, 5, 3).code(), StatusCode::kResourceExhausted);  // queue full
  EXPECT_EQ(s.num_waiting(), 2);
  s.schedule();  // admits both, which empties the queue
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_TRUE(s.add(3, 5, 3).ok());
}

TEST(Scheduler, ChunkedPrefillTilesThePromptExactly) {
  Scheduler s = make(config(64, 16, 4, 32));
  ASSERT_TRUE(s.add(1, 100, 3).ok());
  std::vector<ScheduledItem> seen;
  for (int step = 0; step < 20 && s.find(1) != nullptr; ++step) {
    const SchedulerOutput out = s.schedule();
    EXPECT_LE(out.total_tokens, 32);
    ASSERT_EQ(out.items.size(), 1u);
    seen.push_back(out.items[0]);
    // The blocks reserved cover exactly what is being computed.
    EXPECT_EQ(static_cast<int64_t>(s.block_table(1).size()),
              (out.items[0].first_token + out.items[0].num_tokens + 15) / 16);
    run_step(s, out);
  }
  ASSERT_EQ(s.find(1), nullptr) << "never finished";
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 32}, {32, 32}, {64, 32},
                                                         {96, 4}, {100, 1}, {101, 1}};
  ASSERT_EQ(seen.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(seen[i].first_token, want[i].first) << i;
    EXPECT_EQ(seen[i].num_tokens, want[i].second) << i;
  }
  EXPECT_EQ(s.kv_blocks_used(), 0);
}

TEST(Scheduler, WithoutChunkingPrefillIsAllOrNothingAndOversizeRunsAlone) {
  Scheduler s = make(config(64, 16, 4, 64, /*chunked=*/false));
  ASSERT_TRUE(s.add(1, 40, 2).ok());
  ASSERT_TRUE(s.add(2, 40, 2).ok());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1}));  // 2 would need 40 of the 24 left: not split
  EXPECT_EQ(out.total_tokens, 40);
  run_step(s, out);
  out = s.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(item_of(out, 2)->num_tokens, 40);

  // A prompt larger than the whole budget waits until nothing else runs, then runs alone.
  Scheduler t = make(config(64, 16, 4, 64, /*chunked=*/false));
  ASSERT_TRUE(t.add(4, 10, 4).ok());
  ASSERT_TRUE(t.add(5, 100, 1).ok());
  bool big_ran = false;
  for (int step = 0; step < 20 && t.find(5) != nullptr; ++step) {
    out = t.schedule();
    if (const ScheduledItem* big = item_of(out, 5)) {
      EXPECT_EQ(out.items.size(), 1u);
      EXPECT_EQ(big->num_tokens, 100);
      EXPECT_EQ(t.find(4), nullptr);
      big_ran = true;
    } else {
      EXPECT_LE(out.total_tokens, 64);
    }
    run_step(t, out);
  }
  EXPECT_TRUE(big_ran);
}

TEST(Scheduler, DecodesGetTheirTokenBeforePrefills) {
  Scheduler s = make(config(256, 16, 8, 16));
  for (int64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(id, 4, 96).ok());
  run_step(s, s.schedule());  // all three prefilled (12 tokens): now decoding
  ASSERT_TRUE(s.add(10, 200, 1).ok());
  int prefill_steps = 0;
  while (s.find(10) != nullptr && s.find(10)->num_computed_tokens < 200) {
    const SchedulerOutput out = s.schedule();
    ASSERT_EQ(out.items.size(), 4u);
    for (size_t i = 0; i < 3; ++i) {  // the decodes come first, one token each
      EXPECT_EQ(out.items[i].num_tokens, 1);
      EXPECT_NE(out.items[i].request_id, 10);
    }
    EXPECT_EQ(out.items[3].request_id, 10);
    const int64_t left = 200 - s.find(10)->num_computed_tokens;
    EXPECT_EQ(out.items[3].num_tokens, std::min<int64_t>(left, 16 - 3));  // the rest of the budget
    EXPECT_LE(out.total_tokens, 16);
    run_step(s, out);
    ASSERT_LT(++prefill_steps, 100);
  }
  EXPECT_EQ(prefill_steps, (200 + 12) / 13);
}

// The engine's time budget beside running streams: prefill chunks together get at most the limit
// while the step holds decodes, the whole token budget when it holds none, and an unchunked
// prefill is never split by it.
TEST(Scheduler, PrefillLimitCapsPrefillsOnlyBesideDecodes) {
  Scheduler s = make(config(256, 16, 8, 64));
  ASSERT_TRUE(s.add(1, 30, 40).ok());
  SchedulerOutput out;
  s.schedule(&out, /*prefill_limit=*/5);
  EXPECT_EQ(out.total_tokens, 30);  // no decodes yet: the limit does not apply
  run_step(s, out);
  ASSERT_TRUE(s.add(2, 20, 4).ok());
  ASSERT_TRUE(s.add(3, 20, 4).ok());
  EXPECT_EQ(s.pending_prefill_tokens(), 40);
  s.schedule(&out, 5);
  ASSERT_EQ(out.items.size(), 2u);  // 1's decode, then 5 of 2's prompt; 3 waits for a chunk
  EXPECT_EQ(out.items[0].request_id, 1);
  EXPECT_EQ(out.items[0].num_tokens, 1);
  EXPECT_EQ(out.items[1].request_id, 2);
  EXPECT_EQ(out.items[1].num_tokens, 5);
  run_step(s, out);
  EXPECT_EQ(s.pending_prefill_tokens(), 35);
  s.schedule(&out, 6);  // 2's next 6 tokens (9 left: at least the limit); 3 still waits
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(item_of(out, 2)->num_tokens, 6);
  run_step(s, out);
  s.schedule(&out, 6);  // 2's last 9 tokens (under twice the limit: no 3-token chunk later)
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(item_of(out, 2)->num_tokens, 9);
  run_step(s, out);
  s.schedule(&out, 12);  // 3's whole prompt: 20 tokens, under twice the limit
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(item_of(out, 3)->num_tokens, 20);
  run_step(s, out);

  // Without chunking a prompt is all or nothing: the limit leaves it whole.
  Scheduler t = make(config(256, 16, 8, 64, /*chunked=*/false));
  ASSERT_TRUE(t.add(1, 10, 40).ok());
  run_step(t, t.schedule());
  ASSERT_TRUE(t.add(2, 30, 4).ok());
  t.schedule(&out, 5);
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(item_of(out, 2)->num_tokens, 30);
}

TEST(Scheduler, TokenBudgetIsFilledButNeverExceeded) {
  Scheduler s = make(config(256, 16, 16, 50));
  for (int64_t id = 0; id < 10; ++id) ASSERT_TRUE(s.add(id, 30, 10).ok());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(out.total_tokens, 50);  // 30 + a 20-token first chunk of the next
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{0, 1}));
  for (int step = 0; step < 200 && (s.num_running() + s.num_waiting()) > 0; ++step) {
    int64_t sum = 0;
    for (const ScheduledItem& i : out.items) sum += i.num_tokens;
    EXPECT_EQ(sum, out.total_tokens);
    EXPECT_LE(out.total_tokens, 50);
    EXPECT_GT(out.total_tokens, 0);
    run_step(s, out);
    out = s.schedule();
  }
  EXPECT_EQ(s.num_running() + s.num_waiting(), 0);
}

TEST(Scheduler, MaxNumSeqsCapsTheRunningSet) {
  Scheduler s = make(config(64, 16, 2, 64));
  for (int64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(id, 4, 2).ok());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.num_waiting(), 1);
  while (s.find(1) != nullptr) {
    EXPECT_EQ(item_of(out, 3), nullptr);
    EXPECT_LE(s.num_running(), 2);
    run_step(s, out);
    out = s.schedule();
  }
  EXPECT_NE(item_of(out, 3), nullptr);  // a slot opened: admitted the next step
}

TEST(Scheduler, AdmissionNeedsFreeBlocksAndTheHeadBlocksLaterRequests) {
  Scheduler s = make(config(8, 16, 8, 512));  // 128 tokens of cache
  ASSERT_TRUE(s.add(1, 64, 6).ok());
  run_step(s, s.schedule());           // 1 holds 4 blocks, then 5 for its first decode
  ASSERT_TRUE(s.add(2, 80, 10).ok());  // needs 5 blocks: only 3 free
  ASSERT_TRUE(s.add(3, 10, 2).ok());   // needs 1 block: would fit, but must not overtake 2
  for (int step = 0; step < 3; ++step) {
    const SchedulerOutput out = s.schedule();
    EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1}));
    EXPECT_EQ(s.find(2)->state, State::kWaiting);
    EXPECT_EQ(s.find(3)->state, State::kWaiting);
    EXPECT_EQ(s.kv_blocks_used(), 5);
    run_step(s, out);
  }
  s.finish(1);
  EXPECT_EQ(s.kv_blocks_used(), 0);
  const SchedulerOutput out = s.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{2, 3}));  // FCFS order
  EXPECT_EQ(s.kv_blocks_used(), 6);
}

TEST(Scheduler, PreemptsTheNewestWhichRecomputesFromTheFrontOfTheQueue) {
  Scheduler s = make(config(4, 4, 4, 64));  // 16 tokens of cache
  ASSERT_TRUE(s.add(1, 7, 5).ok());
  ASSERT_TRUE(s.add(2, 7, 5).ok());
  run_step(s, s.schedule());  // both prefilled: 2 blocks each, 8 tokens each
  run_step(s, s.schedule());  // one decode each: 9 tokens, 8 computed; still 2 blocks each
  ASSERT_EQ(s.kv_blocks_used(), 4);
  ASSERT_TRUE(s.add(3, 3, 2).ok());  // queued behind: the preempted request must go ahead of it

  SchedulerOutput out = s.schedule();  // 1 needs a third block: none free
  EXPECT_EQ(out.preempted, (std::vector<int64_t>{2}));
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1}));  // and no admission in a preempting step
  const SchedRequest* b = s.find(2);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->state, State::kPreempted);
  EXPECT_EQ(b->num_computed_tokens, 0);
  EXPECT_EQ(b->num_tokens, 9);
  EXPECT_TRUE(s.block_table(2).empty());
  EXPECT_EQ(s.kv_blocks_used(), 3);
  EXPECT_EQ(s.num_waiting(), 2);

  bool recomputed = false;
  std::vector<int64_t> admitted_after;  // order in which 2 and 3 next appear
  for (int step = 0; step < 50 && s.num_running() + s.num_waiting() > 0; ++step) {
    run_step(s, out);
    out = s.schedule();
    for (const ScheduledItem& i : out.items) {
      if (i.request_id == 2 && !recomputed) {
        EXPECT_EQ(i.first_token, 0);
        EXPECT_EQ(i.num_tokens, 9);  // prompt and both generated tokens, from scratch
        recomputed = true;
      }
      if (i.request_id != 1 && std::find(admitted_after.begin(), admitted_after.end(),
                                         i.request_id) == admitted_after.end()) {
        admitted_after.push_back(i.request_id);
      }
    }
  }
  EXPECT_TRUE(recomputed);
  EXPECT_EQ(admitted_after, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.num_running() + s.num_waiting(), 0);  // everything finished
  EXPECT_EQ(s.kv_blocks_used(), 0);
}

// Speculative decoding: a decoding request's proposals ride with its token (1 + k, num_spec k)
// once every running request has its tokens, within the budget left; computing fewer than
// scheduled (a rejection) gives the blocks of the rest back.
TEST(Scheduler, SpecTokensRideWithDecodesWithinBudgetAndFreeBlocks) {
  Scheduler s = make(config(5, 4, 4, 8));  // 20 tokens of cache, 8 tokens a step
  ASSERT_TRUE(s.add(1, 4, 16).ok());
  ASSERT_TRUE(s.add(2, 4, 16).ok());
  run_step(s, s.schedule());  // 4 + 4 prompt tokens; each samples one: 5 tokens, 4 computed
  s.set_spec_tokens(1, 10);   // more than the budget leaves: 8 - 1 (its token) - 1 (2's)
  s.set_spec_tokens(2, 3);
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.items.size(), 2u);
  EXPECT_EQ(item_of(out, 1)->num_spec, 6);
  EXPECT_EQ(item_of(out, 1)->num_tokens, 7);
  EXPECT_EQ(item_of(out, 2)->num_spec, 0);  // the budget's last token is its own
  EXPECT_EQ(item_of(out, 2)->num_tokens, 1);
  EXPECT_EQ(out.total_tokens, 8);
  EXPECT_EQ(s.kv_blocks_used(), 3 + 2);  // 1: 4 + 7 positions, 2: 4 + 1
  // 1 accepted 2 of its 6 proposals: it computed 3 and holds 4 + 1 + 3 tokens (the 2 accepted
  // and the one after); the rest of its positions are written over later.
  for (int i = 0; i < 3; ++i) s.append_token(1);
  s.append_token(2);
  s.update({{1, 3}, {2, 1}});
  EXPECT_EQ(s.find(1)->num_computed_tokens, 7);
  EXPECT_EQ(s.find(1)->num_tokens, 8);
  EXPECT_TRUE(s.find(1)->is_decoding());
  EXPECT_EQ(s.kv_blocks_used(), 2 + 2);  // the block of 1's rejected proposals went back
  // That block holds 2's 6 proposals next.
  s.set_spec_tokens(1, 0);
  s.set_spec_tokens(2, 6);
  out = s.schedule();
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.items.size(), 2u);
  EXPECT_EQ(item_of(out, 1)->num_tokens, 1);
  EXPECT_EQ(item_of(out, 2)->num_spec, 6);
  EXPECT_EQ(s.kv_blocks_used(), 5);
}

// An older decode's proposals never take the block a newer decode needs for its own token: the
// newer one is not preempted for them, and the proposals wait for free blocks.
TEST(Scheduler, SpecTokensNeverTakeABlockARunningRequestNeeds) {
  Scheduler s = make(config(4, 4, 4, 16));  // 16 tokens of cache
  ASSERT_TRUE(s.add(1, 4, 12).ok());
  ASSERT_TRUE(s.add(2, 4, 12).ok());
  run_step(s, s.schedule());  // 1 block each, 5 tokens each: both need a second block next
  s.set_spec_tokens(1, 6);    // would need 2 more blocks: the 2 free ones
  const SchedulerOutput out = s.schedule();
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.items.size(), 2u);
  EXPECT_EQ(item_of(out, 1)->num_spec, 0);
  EXPECT_EQ(item_of(out, 2)->num_tokens, 1);
  EXPECT_EQ(s.kv_blocks_used(), 4);
}

// A hybrid model's state slots: each running request holds a distinct one from admission; a full
// set of slots holds admission back (beside max_num_seqs, which here is larger); finishing,
// aborting and preemption give slots back; slots with prefix caching need snapshots.
TEST(Scheduler, StateSlotsGateAdmissionAndReturnOnFinishAbortAndPreemption) {
  SchedulerConfig c = config(4, 4, 8, 64);  // 16 tokens of cache, 8 sequences, 2 slots
  c.num_state_slots = 2;
  Scheduler s = make(c);
  ASSERT_TRUE(s.add(1, 7, 5).ok());
  ASSERT_TRUE(s.add(2, 7, 5).ok());
  ASSERT_TRUE(s.add(3, 2, 1).ok());
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1, 2}));  // 3 waits for a slot, not a block
  EXPECT_EQ(s.state_slot(1), 0);
  EXPECT_EQ(s.state_slot(2), 1);
  EXPECT_EQ(s.state_slot(3), -1);
  EXPECT_EQ(s.state_slots_free(), 0);
  run_step(s, out);
  run_step(s, s.schedule());  // one decode each: 1 needs a third block next
  out = s.schedule();         // 2 preempted: its slot is back, and 3 stays out this step
  ASSERT_EQ(out.preempted, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.state_slot(2), -1);
  EXPECT_EQ(s.state_slots_free(), 1);
  s.abort(1);  // 1's slot is back too
  EXPECT_EQ(s.state_slots_free(), 2);
  for (int step = 0; step < 50 && s.num_running() + s.num_waiting() > 0; ++step) {
    out = s.schedule();
    std::set<int32_t> slots;
    for (const ScheduledItem& i : out.items) {
      const int32_t slot = s.state_slot(i.request_id);
      EXPECT_GE(slot, 0);
      EXPECT_TRUE(slots.insert(slot).second) << "two requests of one step share slot " << slot;
    }
    run_step(s, out);
  }
  EXPECT_EQ(s.num_running() + s.num_waiting(), 0);  // 2 (recomputed) and 3 finished
  EXPECT_EQ(s.state_slots_free(), 2);

  c.prefix_caching = true;
  EXPECT_FALSE(Scheduler::create(c).ok());  // no snapshots
  c.snapshot_interval = 6;                  // not a multiple of the block (4)
  c.num_snapshots = 2;
  EXPECT_FALSE(Scheduler::create(c).ok());
  c.snapshot_interval = 8;
  EXPECT_TRUE(Scheduler::create(c).ok());
  c.chunked_prefill = false;
  EXPECT_FALSE(Scheduler::create(c).ok());
  c.chunked_prefill = true;
  c.prefix_caching = false;  // snapshots without prefix caching
  EXPECT_FALSE(Scheduler::create(c).ok());
  c.snapshot_interval = c.num_snapshots = 0;
  c.num_state_slots = -1;
  EXPECT_FALSE(Scheduler::create(c).ok());
}

TEST(Scheduler, TheNewestPreemptsItselfAndOlderRequestsKeepRunning) {
  Scheduler s = make(config(4, 4, 4, 64));
  ASSERT_TRUE(s.add(1, 3, 5).ok());
  ASSERT_TRUE(s.add(2, 12, 4).ok());
  run_step(s, s.schedule());  // 1 block + 3 blocks: the cache is full
  const SchedulerOutput out = s.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1}));
  EXPECT_EQ(out.preempted, (std::vector<int64_t>{2}));
  EXPECT_EQ(s.find(1)->state, State::kRunning);
  EXPECT_EQ(s.find(2)->state, State::kPreempted);
  SchedulerOutput next = out;
  for (int step = 0; step < 50 && s.num_running() + s.num_waiting() > 0; ++step) {
    run_step(s, next);
    next = s.schedule();
  }
  EXPECT_EQ(s.num_running() + s.num_waiting(), 0);
  EXPECT_EQ(s.kv_blocks_used(), 0);
}

TEST(Scheduler, AbortFreesBlocksAtOnceAndLeavesOthersAlone) {
  Scheduler s = make(config(16, 16, 4, 256));
  ASSERT_TRUE(s.add(1, 40, 20).ok());
  ASSERT_TRUE(s.add(2, 20, 40).ok());
  run_step(s, s.schedule());
  ASSERT_EQ(s.kv_blocks_used(), 3 + 2);
  const std::vector<int32_t> table1 = s.block_table(1);
  const int64_t computed1 = s.find(1)->num_computed_tokens;

  s.abort(2);
  EXPECT_EQ(s.kv_blocks_used(), 3);
  EXPECT_EQ(s.find(2), nullptr);
  EXPECT_TRUE(s.block_table(2).empty());
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.block_table(1), table1);
  s.abort(99);  // unknown: no-op
  EXPECT_EQ(s.kv_blocks_used(), 3);

  ASSERT_TRUE(s.add(3, 10, 10).ok());
  s.abort(3);  // still waiting: leaves the queue
  EXPECT_EQ(s.num_waiting(), 0);
  SchedulerOutput out = s.schedule();
  EXPECT_EQ(ids_of(out), (std::vector<int64_t>{1}));
  EXPECT_EQ(out.items[0].first_token, computed1);

  s.abort(1);  // aborted between schedule() and update(): the update is ignored
  run_step(s, out);
  EXPECT_EQ(s.kv_blocks_used(), 0);
  EXPECT_EQ(s.num_running(), 0);
}

TEST(Scheduler, FinishFreesBlocks) {
  Scheduler s = make(config(16, 16, 4, 256));
  ASSERT_TRUE(s.add(1, 40, 20).ok());
  ASSERT_TRUE(s.add(2, 20, 40).ok());
  run_step(s, s.schedule());
  EXPECT_EQ(s.kv_blocks_used(), 5);
  s.finish(1);
  EXPECT_EQ(s.kv_blocks_used(), 2);
  EXPECT_EQ(s.find(1), nullptr);
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_EQ(s.kv_blocks_total(), 16);
}

// Prefix caching: hashes of a token sequence's full blocks.
std::vector<BlockHash> hashes_of(const BlockHasher& h, const std::vector<int32_t>& tokens,
                                 int32_t bs) {
  std::vector<BlockHash> out;
  for (size_t k = 0; (k + 1) * bs <= tokens.size(); ++k) {
    out.push_back(h.hash(k == 0 ? nullptr : &out[k - 1],
                         std::span(tokens).subspan(k * bs, static_cast<size_t>(bs)), {}));
  }
  return out;
}

SchedulerConfig caching(SchedulerConfig c) {
  c.prefix_caching = true;
  return c;
}

TEST(SchedulerPrefixCache, AdmissionStartsAfterTheCachedBlocks) {
  Scheduler s = make(caching(config(32, 8, 4, 256)));
  const BlockHasher h;
  std::vector<int32_t> a(40), b(40);
  for (int i = 0; i < 40; ++i) a[i] = b[i] = i;
  for (int i = 28; i < 40; ++i) b[i] = 100 + i;  // b shares a's first 3 blocks
  ASSERT_TRUE(s.add(1, 40, 4, hashes_of(h, a, 8)).ok());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.items.size(), 1u);
  EXPECT_EQ(out.items[0].first_token, 0);
  EXPECT_EQ(s.find(1)->num_cached_tokens, 0);
  while (s.find(1) != nullptr) run_step(s, s.schedule());
  EXPECT_EQ(s.kv_blocks_used(), 0);  // finished: its cached blocks count as free
  EXPECT_EQ(s.prefix_cache_stats().cached_blocks, 5);

  ASSERT_TRUE(s.add(2, 40, 4, hashes_of(h, b, 8)).ok());
  ASSERT_TRUE(s.add(3, 40, 4, hashes_of(h, a, 8)).ok());
  ASSERT_TRUE(s.add(4, 40, 4, hashes_of(h, a, 8), /*reads_prefix_cache=*/false).ok());
  out = s.schedule();
  ASSERT_EQ(out.items.size(), 3u);
  EXPECT_EQ(item_of(out, 2)->first_token, 24);  // 3 blocks
  EXPECT_EQ(item_of(out, 3)->first_token, 32);  // 4 of 5: the last token is always computed
  EXPECT_EQ(item_of(out, 3)->num_tokens, 8);
  EXPECT_EQ(item_of(out, 4)->first_token, 0);
  EXPECT_EQ(s.find(2)->num_cached_tokens, 24);
  EXPECT_EQ(s.find(3)->num_cached_tokens, 32);
  EXPECT_EQ(s.block_table(2)[0], s.block_table(3)[0]);
  EXPECT_NE(s.block_table(4)[0], s.block_table(3)[0]);
  const Scheduler::PrefixCacheStats st = s.prefix_cache_stats();
  EXPECT_EQ(st.queries, 40 + 40 + 40);  // request 4 did not look
  EXPECT_EQ(st.hits, 24 + 32);
  // Blocks in use by running requests count as used, once each.
  EXPECT_EQ(s.kv_blocks_used(), 5 + 2 + 5);
}

TEST(SchedulerPrefixCache, RequestsOfOneStepShareWhatTheFirstComputes) {
  // n > 1: identical prompts admitted together. The first computes the prompt; the blocks it
  // fills are keyed at once, so the others start after them in the same step.
  Scheduler s = make(caching(config(32, 8, 4, 256)));
  const BlockHasher h;
  std::vector<int32_t> p(30);
  for (int i = 0; i < 30; ++i) p[i] = 7 * i;
  for (int64_t id = 1; id <= 3; ++id) ASSERT_TRUE(s.add(id, 30, 2, hashes_of(h, p, 8)).ok());
  const SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.items.size(), 3u);
  EXPECT_EQ(item_of(out, 1)->first_token, 0);
  EXPECT_EQ(item_of(out, 2)->first_token, 24);
  EXPECT_EQ(item_of(out, 3)->first_token, 24);
  EXPECT_EQ(out.total_tokens, 30 + 6 + 6);
  EXPECT_EQ(s.kv_blocks_used(), 4 + 1 + 1);
}

TEST(SchedulerPrefixCache, PreemptedRequestsFindTheirOwnBlocksAgain) {
  // Two requests fill a small cache; the newest is preempted, and readmitted later it finds its
  // prompt and generated blocks still cached (keyed as the tokens filled them).
  Scheduler s = make(caching(config(9, 4, 2, 64)));  // 6 + 5 blocks at their limits
  const BlockHasher h;
  std::vector<std::vector<int32_t>> tok = {{}, {}, {}};
  for (int i = 0; i < 8; ++i) {
    tok[1].push_back(i);
    tok[2].push_back(50 + i);
  }
  ASSERT_TRUE(s.add(1, 8, 16, hashes_of(h, tok[1], 4)).ok());
  ASSERT_TRUE(s.add(2, 8, 12, hashes_of(h, tok[2], 4)).ok());
  bool preempted = false;
  int64_t cached_on_return = -1;
  for (int step = 0; step < 100 && (s.find(1) != nullptr || s.find(2) != nullptr); ++step) {
    const SchedulerOutput out = s.schedule();
    if (!out.preempted.empty()) preempted = true;
    if (preempted && cached_on_return < 0) {
      if (const ScheduledItem* it = item_of(out, 2); it != nullptr)
        cached_on_return = it->first_token;
    }
    std::vector<std::pair<int64_t, int64_t>> computed;
    for (const ScheduledItem& i : out.items) computed.emplace_back(i.request_id, i.num_tokens);
    s.update(computed);
    for (const ScheduledItem& i : out.items) {
      const SchedRequest* r = s.find(i.request_id);
      if (r->num_computed_tokens < r->num_tokens) continue;
      if (r->num_tokens + 1 == r->num_tokens_limit()) {
        s.finish(i.request_id);
        continue;
      }
      s.append_token(i.request_id);
      auto& t = tok[i.request_id];
      t.push_back(static_cast<int32_t>(1000 + t.size()));
      if (t.size() % 4 == 0) s.add_block_hash(i.request_id, hashes_of(h, t, 4).back());
    }
  }
  EXPECT_TRUE(preempted);
  EXPECT_GT(cached_on_return, 8) << "the readmitted request should find its generated blocks";
  EXPECT_EQ(s.kv_blocks_used(), 0);
}

// Many requests of random sizes arriving over time, some aborted, driven to completion; every
// step checks the budget, the block accounting and that the work in flight makes progress.
// With prefix caching the prompts come from a few shared texts and every token computed is
// written to its block's slot as a fingerprint of the sequence up to it, so that each step checks
// that what a chunk attends to (its earlier positions, through its table) holds its own prefix.
struct SimParams {
  bool chunked;
  uint32_t seed;
  bool prefix_caching = false;
  bool hybrid = false;  // state slots and snapshots (every 32 tokens, 3 of them)
  bool spec = false;    // proposals for decoding requests, a random number of them accepted
};

// A hybrid model's scheduler for the snapshot tests: 64 blocks of 4 tokens, 4 sequences and
// state slots, a step budget of 8 tokens (prefill chunks of 8), prefix caching with a snapshot
// every 8 tokens in `snapshots` snapshots.
SchedulerConfig snapshots_config(int32_t snapshots) {
  SchedulerConfig c = config(64, 4, 4, 8);
  c.prefix_caching = true;
  c.num_state_slots = 4;
  c.snapshot_interval = 8;
  c.num_snapshots = snapshots;
  return c;
}

// A hybrid model's snapshots (interval 8 tokens, blocks of 4, a step budget of 8): a chunk
// that ends at a snapshot point has its state kept there, keyed by the hash of the block ending
// there and taken after its step (`saves`); a request with the same prefix resumes from the
// longest cached run of blocks that ends at a snapshot (`restores`: into its own slot), one that
// shares only part of a snapshot interval resumes from the one before, and with two snapshots the
// least recently used is replaced.
TEST(SchedulerPrefixCache, HybridSnapshotsAlignChunksAndHitsResumeFromThem) {
  SchedulerConfig c = snapshots_config(2);
  Scheduler s = make(c);
  BlockHasher h;
  std::vector<int32_t> a(21), b(21), d(21);
  for (int i = 0; i < 21; ++i) {
    a[i] = 10 + i;
    b[i] = i < 12 ? a[i] : 100 + i;  // shares blocks 0..2 (12 tokens) with a
    d[i] = i < 4 ? a[i] : 200 + i;   // shares block 0 only
  }
  ASSERT_TRUE(s.add(1, 21, 1, hashes_of(h, a, 4)).ok());
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (first, n) of request 1
  std::vector<StateCopy> saves;
  for (int step = 0; step < 10 && s.find(1) != nullptr; ++step) {
    const SchedulerOutput out = s.schedule();
    EXPECT_TRUE(out.restores.empty());
    for (const ScheduledItem& i : out.items) chunks.emplace_back(i.first_token, i.num_tokens);
    saves.insert(saves.end(), out.saves.begin(), out.saves.end());
    run_step(s, out);
  }
  EXPECT_EQ(chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 8}, {8, 8}, {16, 5}}));
  ASSERT_EQ(saves.size(), 2u);  // at 8 and 16 (not 21: no full block ends there)
  EXPECT_EQ(saves[0].slot, 0);
  EXPECT_NE(saves[0].snapshot, saves[1].snapshot);
  EXPECT_EQ(s.snapshots_held(), 2);

  ASSERT_TRUE(s.add(2, 21, 1, hashes_of(h, a, 4)).ok());  // the same prompt: resumes at 16
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.items.size(), 1u);
  EXPECT_EQ(out.items[0].first_token, 16);
  ASSERT_EQ(out.restores.size(), 1u);
  EXPECT_EQ(out.restores[0].snapshot, saves[1].snapshot);
  EXPECT_EQ(out.restores[0].slot, s.state_slot(2));
  run_step(s, out);

  ASSERT_TRUE(s.add(3, 21, 1, hashes_of(h, b, 4)).ok());  // 3 blocks cached: resumes at 8
  out = s.schedule();
  ASSERT_EQ(out.items.size(), 1u);
  EXPECT_EQ(out.items[0].first_token, 8);
  ASSERT_EQ(out.restores.size(), 1u);
  EXPECT_EQ(out.restores[0].snapshot, saves[0].snapshot);
  EXPECT_EQ(out.items[0].num_tokens, 8);  // to the next snapshot point, 16
  ASSERT_EQ(out.saves.size(), 1u);        // b's own state at 16 replaces the older of a's
  EXPECT_EQ(out.saves[0].snapshot, saves[1].snapshot);
  EXPECT_EQ(s.snapshot_evictions(), 1);
  run_step(s, out);

  ASSERT_TRUE(s.add(4, 21, 1, hashes_of(h, d, 4)).ok());  // 1 block cached, no snapshot at 4
  out = s.schedule();
  ASSERT_EQ(out.items.size(), 2u);  // 3's next chunk, and 4 from the start
  EXPECT_EQ(item_of(out, 4)->first_token, 0);
  EXPECT_TRUE(out.restores.empty());
  EXPECT_EQ(s.prefix_cache_stats().hits, 16 + 8);

  // With a budget of 64 a 21-token prompt ends its first chunk at the furthest snapshot point it
  // reaches (16), not at every one, and keeps one state there; the rest follows.
  c.max_batched_tokens = 64;
  Scheduler big = make(c);
  ASSERT_TRUE(big.add(1, 21, 1, hashes_of(h, a, 4)).ok());
  out = big.schedule();
  ASSERT_EQ(out.items.size(), 1u);
  EXPECT_EQ(out.items[0].num_tokens, 16);
  EXPECT_EQ(out.saves.size(), 1u);
  run_step(big, out);
  out = big.schedule();
  EXPECT_EQ(out.items[0].num_tokens, 5);
  EXPECT_TRUE(out.saves.empty());
  // A failed step forgets every snapshot with the blocks' keys.
  big.reset_prefix_cache();
  EXPECT_EQ(big.snapshots_held(), 0);
}

// Past its prompt a request keeps one snapshot, its latest: a reply crossing five snapshot points
// saves them in one snapshot, except that the one another request has resumed from (at 24) is
// left in place and the reply takes another for the next. The other prompt keeps its last
// snapshot (24; its 8 and 16 are evicted), and a follow-up turn sharing the prompt and the reply
// resumes from the reply's last one.
TEST(SchedulerPrefixCache, AReplyKeepsOnlyItsLatestSnapshot) {
  Scheduler s = make(snapshots_config(4));
  BlockHasher h;
  std::vector<int32_t> other(25), turn(8);
  for (int i = 0; i < 25; ++i) other[i] = 500 + i;
  for (int i = 0; i < 8; ++i) turn[i] = 10 + i;
  ASSERT_TRUE(s.add(1, 25, 1, hashes_of(h, other, 4)).ok());  // snapshots at 8, 16 and 24
  for (int step = 0; step < 10 && s.find(1) != nullptr; ++step) run_step(s, s.schedule());
  EXPECT_EQ(s.snapshots_held(), 3);
  ASSERT_TRUE(s.add(2, 8, 41, hashes_of(h, turn, 4)).ok());  // the prompt's own at 8
  std::vector<int32_t> reply_saves;
  int64_t resumed_from = -1;  // request 3's restore
  for (int step = 0; step < 80 && (s.find(2) != nullptr || s.find(3) != nullptr); ++step) {
    const SchedulerOutput out = s.schedule();
    for (const StateCopy& k : out.saves) {
      if (k.slot == s.state_slot(2)) reply_saves.push_back(k.snapshot);
    }
    if (!out.restores.empty()) resumed_from = out.restores[0].snapshot;
    std::vector<std::pair<int64_t, int64_t>> computed;
    for (const ScheduledItem& i : out.items) computed.emplace_back(i.request_id, i.num_tokens);
    s.update(computed);
    if (const SchedRequest* q = s.find(3); q != nullptr && q->num_computed_tokens == q->num_tokens)
      s.finish(3);
    const SchedRequest* r = s.find(2);
    if (r == nullptr || r->num_computed_tokens < r->num_tokens) continue;
    if (r->num_tokens + 1 == r->num_tokens_limit()) {
      s.finish(2);
      continue;
    }
    s.append_token(2);
    turn.push_back(static_cast<int32_t>(1000 + turn.size()));
    if (turn.size() % 4 == 0) s.add_block_hash(2, hashes_of(h, turn, 4).back());
    if (reply_saves.size() == 3 && s.find(3) == nullptr && resumed_from < 0) {
      // A prompt sharing the reply's first 24 tokens: it resumes from the reply's snapshot.
      std::vector<int32_t> branch(turn.begin(), turn.begin() + 24);
      for (int i = 0; i < 5; ++i) branch.push_back(3000 + i);
      ASSERT_TRUE(s.add(3, 29, 1, hashes_of(h, branch, 4)).ok());
    }
  }
  // 48 tokens computed: saves at 8 (the prompt) and at 16, 24, 32, 40, 48 (the reply).
  ASSERT_EQ(reply_saves.size(), 6u);
  EXPECT_NE(reply_saves[0], reply_saves[1]);
  EXPECT_EQ(reply_saves[2], reply_saves[1]);  // 24 replaced 16
  EXPECT_EQ(resumed_from, reply_saves[2]);    // request 3 resumed from 24 ...
  EXPECT_NE(reply_saves[3], reply_saves[2]);  // ... so 32 took another snapshot
  EXPECT_EQ(reply_saves[4], reply_saves[3]);
  EXPECT_EQ(reply_saves[5], reply_saves[3]);
  EXPECT_EQ(s.snapshots_held(), 4);
  EXPECT_EQ(s.snapshot_evictions(), 2);  // the other prompt's 8 and 16

  // The other prompt still resumes from its last snapshot, at 24; the follow-up turn from 48.
  ASSERT_TRUE(s.add(4, 25, 1, hashes_of(h, other, 4)).ok());
  SchedulerOutput out = s.schedule();
  ASSERT_EQ(out.restores.size(), 1u);
  EXPECT_EQ(item_of(out, 4)->first_token, 24);
  run_step(s, out);
  std::vector<int32_t> next = turn;
  for (int i = 0; i < 6; ++i) next.push_back(2000 + i);
  ASSERT_TRUE(s.add(5, static_cast<int64_t>(next.size()), 1, hashes_of(h, next, 4)).ok());
  out = s.schedule();
  ASSERT_EQ(out.restores.size(), 1u);
  EXPECT_EQ(out.restores[0].snapshot, reply_saves.back());
  EXPECT_EQ(item_of(out, 5)->first_token, 48);
}

class SchedulerSimulation : public ::testing::TestWithParam<SimParams> {};

TEST_P(SchedulerSimulation, KeepsInvariantsAndDrains) {
  const auto [chunked, seed, prefix_caching, hybrid, spec] = GetParam();
  SchedulerConfig c = config(32, 16, 8, 128, chunked);  // 512 tokens: preemption is common
  c.prefix_caching = prefix_caching;
  if (hybrid) {
    c.num_state_slots = 8;
    c.snapshot_interval = 32;
    c.num_snapshots = 3;
  }
  c.max_waiting = 24;
  Scheduler s = make(c);
  std::mt19937 rng(seed);
  auto uniform = [&rng](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };

  constexpr int64_t kRequests = 300;
  std::vector<std::pair<int64_t, int64_t>> pending;  // (prompt, prompt + max new), in id order
  for (int64_t i = 0; i < kRequests; ++i) {
    const int64_t prompt = uniform(1, 300);
    pending.emplace_back(prompt, prompt + uniform(1, 120));
  }
  const BlockHasher hasher;
  std::vector<std::vector<int32_t>> texts(3), tokens(kRequests);
  for (auto& t : texts) {
    for (int i = 0; i < 300; ++i) t.push_back(static_cast<int32_t>(uniform(0, 9)));
  }
  for (int64_t i = 0; i < kRequests; ++i) {  // a shared text's head, then the request's own
    const auto& t = texts[static_cast<size_t>(uniform(0, 2))];
    const int64_t shared = uniform(0, pending[i].first);
    tokens[i].assign(t.begin(), t.begin() + shared);
    while (static_cast<int64_t>(tokens[i].size()) < pending[i].first)
      tokens[i].push_back(static_cast<int32_t>(uniform(0, 9)));
  }
  // fingerprint(i, p): the sequence of request i up to and including position p. With proposals
  // (`drafts`, set for its next step), a step's positions past its tokens hold the fingerprint of
  // the sequence the proposals would make (seen(i, p)): right where they are accepted, written
  // over before anyone reads them where not.
  std::vector<std::vector<int32_t>> drafts(kRequests);
  auto fp_of = [](const std::vector<int32_t>& t, const std::vector<int32_t>& d, int64_t p) {
    uint64_t f = 1469598103934665603ull;
    for (int64_t k = 0; k <= p; ++k) {
      const size_t n = t.size();
      const int32_t v = k < static_cast<int64_t>(n) ? t[k] : d[static_cast<size_t>(k) - n];
      f = (f ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    }
    return f;
  };
  auto fingerprint = [&](int64_t i, int64_t p) { return fp_of(tokens[i], {}, p); };
  auto seen = [&](int64_t i, int64_t p) { return fp_of(tokens[i], drafts[i], p); };
  std::vector<uint64_t> slots(static_cast<size_t>(c.num_blocks) * 16, 0);
  // A hybrid model's state: each slot and snapshot holds the fingerprint of the sequence its
  // state is at the end of (0: nothing).
  std::vector<uint64_t> state(8, 0), snap(3, 0);
  std::set<int64_t> live, finished, aborted;
  int64_t next = 0, preemptions = 0, rejected = 0;
  // The engine's part of a step with proposals: a verify item accepts a random number of them;
  // its tokens (those accepted, then one that differs from the next proposal) join, keyed as they
  // fill blocks, then the computed counts (the engine's order); requests at their limit finish.
  int64_t verified = 0, accepted = 0;
  auto run_spec_step = [&](const SchedulerOutput& out) {
    std::vector<std::pair<int64_t, int64_t>> computed;
    for (const ScheduledItem& i : out.items) {
      const SchedRequest* r = s.find(i.request_id);
      int64_t n = i.num_tokens;
      if (i.num_spec > 0) {
        const auto& d = drafts[i.request_id];
        const int64_t a = uniform(0, i.num_spec);
        ++verified;
        accepted += a;
        for (int64_t j = 0; j <= a; ++j) {
          auto& t = tokens[i.request_id];
          s.append_token(i.request_id);
          t.push_back(j < a ? d[j] : (d[j] + 1) % 10);
          if (prefix_caching && t.size() % 16 == 0)
            s.add_block_hash(i.request_id, hashes_of(hasher, t, 16).back());
        }
        n = a + 1;
      } else if (r->num_computed_tokens + n == r->num_tokens) {
        s.append_token(i.request_id);  // caught up: one token (its id joins below)
      }
      computed.emplace_back(i.request_id, n);
    }
    s.update(computed);
    std::vector<int64_t> done;
    for (const ScheduledItem& i : out.items) {
      drafts[i.request_id].clear();
      const SchedRequest* r = s.find(i.request_id);
      if (r != nullptr && r->num_tokens == r->num_tokens_limit()) {
        s.finish(i.request_id);
        done.push_back(i.request_id);
      }
    }
    return done;
  };
  constexpr int kMaxSteps = 20000;
  int step = 0;
  for (; step < kMaxSteps; ++step) {
    if (next == kRequests && live.empty()) break;
    for (int64_t k = uniform(0, 3); k > 0 && next < kRequests; --k) {
      const Status st =
          s.add(next, pending[next].first, pending[next].second - pending[next].first,
                prefix_caching ? hashes_of(hasher, tokens[next], 16) : std::vector<BlockHash>{});
      if (st.code() == StatusCode::kResourceExhausted) {
        ++rejected;  // the client retries later
        break;
      }
      ASSERT_TRUE(st.ok()) << st.message();
      live.insert(next++);
    }
    if (!live.empty() && uniform(0, 199) == 0) {  // a client disconnects now and then
      auto it = live.begin();
      std::advance(it, uniform(0, static_cast<int64_t>(live.size()) - 1));
      s.abort(*it);
      aborted.insert(*it);
      live.erase(it);
    }

    const SchedulerOutput out = s.schedule();
    preemptions += static_cast<int64_t>(out.preempted.size());
    // Budget, with the one documented exception: an oversize unchunked prefill alone.
    int64_t sum = 0;
    std::set<int64_t> ids;
    for (const ScheduledItem& i : out.items) {
      sum += i.num_tokens;
      ASSERT_TRUE(ids.insert(i.request_id).second) << "scheduled twice";
      const SchedRequest* r = s.find(i.request_id);
      ASSERT_NE(r, nullptr);
      EXPECT_EQ(r->state, State::kRunning);
      EXPECT_GE(i.num_tokens, 1);
      EXPECT_EQ(i.first_token, r->num_computed_tokens);
      EXPECT_LE(i.first_token + i.num_tokens - i.num_spec, r->num_tokens);
      if (i.num_spec > 0) {
        EXPECT_TRUE(r->is_decoding());
        EXPECT_LE(i.num_spec, static_cast<int64_t>(drafts[i.request_id].size()));
      }
      EXPECT_GE(static_cast<int64_t>(s.block_table(i.request_id).size()) * 16,
                i.first_token + i.num_tokens);
    }
    // A hybrid model: resumes copy snapshots into slots; then every chunk after the first reads
    // its own sequence's state at its first token, from a slot no other chunk of the step has;
    // the snapshots the step completes copy slots out after it.
    if (hybrid) {
      for (const StateCopy& r : out.restores) state[r.slot] = snap[r.snapshot];
      std::set<int32_t> used;
      for (const ScheduledItem& i : out.items) {
        const int32_t slot = s.state_slot(i.request_id);
        ASSERT_GE(slot, 0);
        ASSERT_TRUE(used.insert(slot).second) << "two chunks of step " << step << " share a slot";
        if (i.first_token > 0) {
          ASSERT_EQ(state[slot], fingerprint(i.request_id, i.first_token - 1))
              << "request " << i.request_id << " resumes from a wrong state at " << i.first_token
              << ", step " << step;
        }
        state[slot] = fingerprint(i.request_id, i.first_token + i.num_tokens - 1);
      }
      for (const StateCopy& v : out.saves) snap[v.snapshot] = state[v.slot];
    }
    // The forward pass: every chunk's K/V written, then its attention reads its prefix (within a
    // layer, all stores come before any attention).
    for (const ScheduledItem& i : out.items) {
      const auto& table = s.block_table(i.request_id);
      for (int64_t p = i.first_token; p < i.first_token + i.num_tokens; ++p)
        slots[table[p / 16] * 16 + p % 16] = seen(i.request_id, p);
    }
    for (const ScheduledItem& i : out.items) {
      const auto& table = s.block_table(i.request_id);
      for (int64_t p = 0; p < i.first_token + i.num_tokens; ++p) {
        ASSERT_EQ(slots[table[p / 16] * 16 + p % 16], seen(i.request_id, p))
            << "request " << i.request_id << " reads a wrong K/V at " << p << ", step " << step;
      }
    }
    EXPECT_EQ(sum, out.total_tokens);
    if (chunked || out.items.size() > 1) {
      ASSERT_LE(out.total_tokens, c.max_batched_tokens) << "step " << step;
    }
    if (!live.empty()) ASSERT_FALSE(out.items.empty()) << "livelock at step " << step;
    EXPECT_LE(s.num_running(), c.max_num_seqs);
    for (int64_t id : out.preempted) {
      ASSERT_NE(s.find(id), nullptr);
      EXPECT_EQ(s.find(id)->state, State::kPreempted);
      EXPECT_EQ(ids.count(id), 0u);
    }
    // Block accounting: the pool's used count is exactly the blocks the tables hold.
    std::set<int32_t> held_blocks;
    int64_t table_blocks = 0;
    for (int64_t id : live) {
      const SchedRequest* r = s.find(id);
      ASSERT_NE(r, nullptr) << id;
      const auto& table = s.block_table(id);
      table_blocks += static_cast<int64_t>(table.size());
      held_blocks.insert(table.begin(), table.end());
      if (r->state != State::kRunning) EXPECT_EQ(table.size(), 0u);
    }
    ASSERT_EQ(static_cast<int64_t>(held_blocks.size()), s.kv_blocks_used());
    if (!prefix_caching) ASSERT_EQ(table_blocks, s.kv_blocks_used());
    EXPECT_EQ(s.num_running() + s.num_waiting(), static_cast<int64_t>(live.size()));

    for (int64_t id : spec ? run_spec_step(out) : run_step(s, out)) {
      live.erase(id);
      finished.insert(id);
    }
    for (const ScheduledItem& i : out.items) {  // sampled tokens join; full blocks are keyed
      const SchedRequest* r = s.find(i.request_id);
      if (r == nullptr) continue;
      auto& t = tokens[i.request_id];
      while (static_cast<int64_t>(t.size()) < r->num_tokens) {
        t.push_back(static_cast<int32_t>(uniform(0, 9)));
        if (prefix_caching && t.size() % 16 == 0)
          s.add_block_hash(i.request_id, hashes_of(hasher, t, 16).back());
      }
    }
    for (int64_t id : live) {  // each request's blocks cover its computed tokens
      const SchedRequest* r = s.find(id);
      EXPECT_GE(static_cast<int64_t>(s.block_table(id).size()) * 16, r->num_computed_tokens);
      // The next step's proposals: 0 to 4 of them, a token short of the request's limit.
      const int64_t room = r->num_tokens_limit() - r->num_tokens - 1;
      if (!spec || r->state != State::kRunning || !r->is_decoding() || room < 1) continue;
      drafts[id].resize(static_cast<size_t>(uniform(0, std::min<int64_t>(4, room))));
      for (int32_t& v : drafts[id]) v = static_cast<int32_t>(uniform(0, 9));
      s.set_spec_tokens(id, static_cast<int64_t>(drafts[id].size()));
    }
  }
  ASSERT_LT(step, kMaxSteps) << "requests starved: " << live.size() << " never finished";
  EXPECT_EQ(static_cast<int64_t>(finished.size() + aborted.size()), kRequests);
  EXPECT_EQ(s.kv_blocks_used(), 0);
  EXPECT_EQ(s.num_running(), 0);
  EXPECT_EQ(s.num_waiting(), 0);
  EXPECT_GT(preemptions, 0) << "the simulation should exercise preemption";
  RecordProperty("steps", step);
  RecordProperty("preemptions", static_cast<int>(preemptions));
  EXPECT_GT(rejected, 0) << "the simulation should exercise the full queue";
  if (hybrid) EXPECT_GT(s.snapshot_evictions(), 0) << "the simulation should replace snapshots";
  if (spec) {
    EXPECT_GT(verified, 1000) << "the simulation should verify proposals";
    EXPECT_GT(accepted, 1000) << "and accept some";
  }
  if (prefix_caching) {
    EXPECT_GT(s.prefix_cache_stats().hits, 1000) << "the simulation should exercise prefix hits";
    EXPECT_GT(s.prefix_cache_stats().evictions, 0) << "and evictions";
    EXPECT_LE(s.prefix_cache_stats().cached_blocks, c.num_blocks);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Seeds, SchedulerSimulation,
    ::testing::Values(SimParams{true, 1u}, SimParams{true, 2u}, SimParams{false, 3u},
                      SimParams{false, 4u}, SimParams{true, 5u, true}, SimParams{true, 6u, true},
                      SimParams{false, 7u, true}, SimParams{true, 8u, true, true},
                      SimParams{true, 9u, true, true}, SimParams{true, 10u, false, false, true},
                      SimParams{true, 11u, true, false, true},
                      SimParams{false, 12u, true, false, true}));

}  // namespace
}  // namespace vlm

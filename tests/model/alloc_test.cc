// Steady-state decoding allocates nothing: every heap allocation in this binary is counted while
// a flag is up, around decode steps after a warm-up — of the text decoder alone (short and long
// contexts, the latter through split-K attention), of Engine::generate (the engine thread and the
// caller's, which reads the stream) and of the engine core's batched steps (the engine thread),
// Qwen3.5's hybrid layers among them.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>

#include "core/thread_pool.h"
#include "model/fixture_model.h"
#include "model/qwen3vl_weights.h"
#include "model/text_decoder.h"
#include "vlm/engine.h"

namespace {
std::atomic<bool> g_counting{false};
std::atomic<bool> g_engine_thread_only{false};  // count only where t_engine_thread is set
std::atomic<int64_t> g_allocations{0};
thread_local bool t_engine_thread = false;
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting.load(std::memory_order_relaxed) &&
      (t_engine_thread || !g_engine_thread_only.load(std::memory_order_relaxed))) {
    g_allocations.fetch_add(1);
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace vlm {
namespace {

TEST(Allocation, CounterSeesAllocations) {
  g_allocations = 0;
  g_counting = true;
  auto* v = new std::vector<int>(100);
  g_counting = false;
  delete v;
  EXPECT_EQ(g_allocations.load(), 2);  // the vector object and its buffer
}

TEST(Allocation, DecodeStepsAndRepeatedPrefillAllocateNothing) {
  // text-f32-untied also with INT8 weights (--quant int8: owned I8 copies, per-row scales) and
  // INT4 weights (--quant int4: decode runs the INT4 kernel, the 12-token prefill widens blocks
  // of rows to BF16 in per-thread buffers that grow once).
  // qwen35-f32-a: Qwen3.5's Gated DeltaNet layers, their state in a slot of the cache.
  for (auto [name, quant] : {std::pair{"text-bf16-hd128", WeightQuant::kNone},
                             std::pair{"qwen35-f32-a", WeightQuant::kNone},
                             std::pair{"text-f32-untied", WeightQuant::kNone},
                             std::pair{"text-f32-untied", WeightQuant::kInt8},
                             std::pair{"text-f32-untied", WeightQuant::kInt4}}) {
    auto m = test_util::load_fixture_model(std::string(VLM_FIXTURES_DIR) + "/" + name);
    ASSERT_TRUE(m.ok()) << m.status().message();
    ThreadPool pool(2);
    ASSERT_TRUE(quantize_text_weights(&m->text, quant, pool).ok());
    test_util::CpuDecoder dec(m->cfg, m->text, pool, 16);
    KvCache cache;
    ASSERT_TRUE(dec.allocate(&cache, 1, 64).ok());
    std::vector<float> logits(m->cfg.text_config.vocab_size);
    std::vector<int32_t> ids = {5, 9, 70, 300, 4, 8, 12, 16, 20, 24, 28, 32};
    std::vector<int64_t> pos(16);
    auto run = [&](const int32_t* p, int64_t n, int64_t first) {
      for (int64_t i = 0; i < n; ++i) pos[i] = first + i;
      Positions3 p3{pos.data(), pos.data(), pos.data()};
      return dec.forward(p, n, p3, first, cache, LogitRows::kLast, logits.data());
    };
    // Warm-up: one prefill (per-thread scratch for many-row matmuls grows once) and one step.
    ASSERT_TRUE(run(ids.data(), 12, 0).ok());
    ASSERT_TRUE(run(ids.data(), 1, 12).ok());

    g_allocations = 0;
    g_counting = true;
    Status s;
    for (int64_t step = 0; step < 10 && s.ok(); ++step) s = run(ids.data() + step, 1, 13 + step);
    if (s.ok()) s = run(ids.data(), 12, 0);  // a second prefill reuses everything too
    g_counting = false;
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(g_allocations.load(), 0) << name << (quant == WeightQuant::kInt8 ? " int8" : "")
                                       << (quant == WeightQuant::kInt4 ? " int4" : "");
  }
}

TEST(Allocation, LongContextDecodeStepsAllocateNothing) {
  // Contexts past 1024 keys take split-K decode attention (partial states in a per-thread buffer
  // sized once per model shape).
  auto m = test_util::load_fixture_model(std::string(VLM_FIXTURES_DIR) + "/text-f32-untied");
  ASSERT_TRUE(m.ok()) << m.status().message();
  ThreadPool pool(2);
  test_util::CpuDecoder dec(m->cfg, m->text, pool, 64);
  KvCache cache;
  ASSERT_TRUE(dec.allocate(&cache, 1, 1200).ok());
  std::vector<float> logits(m->cfg.text_config.vocab_size);
  std::vector<int32_t> ids(64);
  for (int64_t i = 0; i < 64; ++i) ids[i] = static_cast<int32_t>(3 + (i * 37) % 900);
  std::vector<int64_t> pos(64);
  auto run = [&](int64_t n, int64_t first) {
    for (int64_t i = 0; i < n; ++i) pos[i] = first + i;
    Positions3 p3{pos.data(), pos.data(), pos.data()};
    return dec.forward(ids.data(), n, p3, first, cache, LogitRows::kLast, logits.data());
  };
  int64_t first = 0;
  for (; first + 64 <= 1088; first += 64) ASSERT_TRUE(run(64, first).ok());
  ASSERT_TRUE(run(1, first++).ok());  // warm-up: the first split-K step sizes its buffer

  g_allocations = 0;
  g_counting = true;
  Status s;
  for (int64_t step = 0; step < 20 && s.ok(); ++step) s = run(1, first++);
  g_counting = false;
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(g_allocations.load(), 0);
}

using test_util::load_fixture_engine;

// Greedy, and sampling with every filter and penalty on.
std::vector<SamplingParams> sampling_cases() {
  SamplingParams greedy;
  greedy.do_sample = false;
  SamplingParams sampled;
  sampled.do_sample = true;
  sampled.temperature = 0.8;
  sampled.top_k = 40;
  sampled.top_p = 0.9;
  sampled.min_p = 0.01;
  sampled.repetition_penalty = 1.1;
  sampled.presence_penalty = 0.5;
  sampled.frequency_penalty = 0.25;
  sampled.seed = 7;
  return {greedy, sampled};
}

TEST(Allocation, GenerateDecodeStepsAllocateNothing) {
  // Counted from the 3rd token's callback to the 40th's: 37 decode steps with sampling.
  for (const char* name : {"text-f32-untied", "text-bf16-hd128"}) {
    auto engine = load_fixture_engine(name);
    ASSERT_NE(engine, nullptr);
    for (const SamplingParams& sp : sampling_cases()) {
      GenerateRequest req;
      for (int i = 0; i < 21; ++i) req.prompt_ids.push_back(5 + (i * 53) % 400);
      req.max_new_tokens = 40;
      req.ignore_eos = true;
      req.sampling = sp;
      int64_t seen = 0, counted = -1;
      auto res = engine->generate(req, [&](const TokenEvent&) {
        ++seen;
        if (seen == 3) {
          g_allocations = 0;
          g_counting = true;
        }
        if (seen == 40) {
          g_counting = false;
          counted = g_allocations.load();
        }
        return true;
      });
      g_counting = false;
      ASSERT_TRUE(res.ok()) << res.status().message();
      ASSERT_EQ(seen, 40);
      EXPECT_EQ(counted, 0) << name << (sp.do_sample.value_or(false) ? " sampled" : " greedy");
    }
  }
}

// Three requests decode together (one greedy, one sampled, one with top logprobs); counting runs
// on the engine thread (where `notify` is called, once per token) from the step where each has 3
// tokens until the shortest is 2 tokens from its end. The streams are read afterwards: their
// arrays hold every token.
// With `spec`: speculative decoding's verify steps, its proposals accepted at times.
void expect_batched_decode_allocates_nothing(const std::string& name,
                                             const SpecOptions& spec = {}) {
  SCOPED_TRACE(name);
  constexpr int kReqs = 3;
  BatchingOptions bo;
  bo.spec = spec;
  bo.num_blocks = 64;
  bo.max_num_seqs = kReqs;
  bo.max_batched_tokens = 64;
  bo.batch_wait_ms = 60000;  // the idle engine starts once all kReqs are queued: they run together
  auto engine = load_fixture_engine(name, bo);
  ASSERT_NE(engine, nullptr);
  const auto samplings = sampling_cases();
  const int64_t max_new[kReqs] = {45, 50, 55};
  std::atomic<int64_t> counts[kReqs] = {};
  std::atomic<int64_t> counted{-1};
  std::atomic<bool> started{false}, stopped{false};
  std::vector<GenerateRequest> reqs(kReqs);
  for (int r = 0; r < kReqs; ++r) {
    for (int i = 0; i < 5 + 14 * r; ++i) reqs[r].prompt_ids.push_back(7 + (i * 61 + r) % 400);
    reqs[r].max_new_tokens = max_new[r];
    reqs[r].ignore_eos = true;
    reqs[r].sampling = samplings[r % 2];
    if (r == 2) reqs[r].logprobs = 3;
  }
  auto on_token = [&](int r) {
    t_engine_thread = true;
    counts[r].fetch_add(1);
    bool all = true;
    for (int i = 0; i < kReqs; ++i) all = all && counts[i].load() >= 3;
    if (all && !started.exchange(true)) {
      g_allocations = 0;
      g_engine_thread_only = true;
      g_counting = true;
    }
    if (started && counts[0].load() >= max_new[0] - 2 && !stopped.exchange(true)) {
      g_counting = false;
      counted = g_allocations.load();
    }
  };
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int r = 0; r < kReqs; ++r) {
    auto s = engine->submit(reqs[r], [&on_token, r] { on_token(r); });
    ASSERT_TRUE(s.ok()) << s.status().message();
    streams.push_back(std::move(s).value());
  }
  engine->wait_idle();
  g_counting = false;
  g_engine_thread_only = false;
  for (int r = 0; r < kReqs; ++r) {
    EXPECT_EQ(counts[r].load(), max_new[r]) << r;
    int64_t tokens = 0;
    RequestOutput piece;
    while (streams[r]->next(&piece)) tokens += piece.token_id >= 0;
    EXPECT_EQ(tokens, max_new[r]) << r;
  }
  ASSERT_TRUE(stopped.load());
  EXPECT_EQ(counted.load(), 0);
  if (spec.method != SpecMethod::kNone) EXPECT_GT(engine->core_stats().spec_accepted_tokens, 0);
}

TEST(Allocation, EngineCoreBatchedDecodeStepsAllocateNothing) {
  expect_batched_decode_allocates_nothing("text-f32-untied");
  expect_batched_decode_allocates_nothing("qwen35-f32-a");  // hybrid: state slots per sequence
}

TEST(Allocation, SpeculativeVerifyStepsAllocateNothing) {
  SpecOptions spec;
  spec.method = SpecMethod::kNgram;
  spec.ngram_min = 1;
  expect_batched_decode_allocates_nothing("text-f32-untied", spec);
}

}  // namespace
}  // namespace vlm

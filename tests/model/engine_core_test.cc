// Continuous batching: requests submitted concurrently to the EngineCore produce exactly the
// tokens each produces alone through Engine::generate (f32, greedy) — with and without
// preemption — and an aborted request frees its KV blocks without disturbing the others.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine_core.h"
#include "model/fixture_model.h"
#include "test_util.h"
#include "vlm/bench.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;

using test_util::load_fixture_engine;

std::vector<GenerateRequest> requests(int n, int max_new) {
  std::vector<GenerateRequest> out;
  for (int i = 0; i < n; ++i) {
    GenerateRequest r;
    for (int j = 0; j < 1 + (i * 7) % 40; ++j) r.prompt_ids.push_back(3 + (i * 131 + j * 17) % 990);
    r.max_new_tokens = max_new + (i % 3);
    r.sampling.do_sample = false;
    r.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

struct Collected {
  std::mutex mu;
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, CoreEvent> last;
};

// Submits every request from 4 threads at once; returns tokens by request index.
std::vector<std::vector<int32_t>> run_concurrently(EngineCore& core,
                                                   const std::vector<GenerateRequest>& reqs) {
  Collected got;
  std::vector<int64_t> ids(reqs.size(), -1);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < reqs.size(); i += 4) {
        auto id = core.submit(reqs[i], [&got](const CoreEvent& ev) {
          std::lock_guard<std::mutex> lock(got.mu);
          if (ev.token_id >= 0) got.tokens[ev.request_id].push_back(ev.token_id);
          if (ev.finished) got.last[ev.request_id] = ev;
        });
        ids[i] = id.ok() ? *id : -1;
      }
    });
  }
  for (auto& th : threads) th.join();
  core.wait_idle();
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_GE(ids[i], 0);
    std::lock_guard<std::mutex> lock(got.mu);
    EXPECT_TRUE(got.last.count(ids[i])) << "request " << i << " never finished";
    if (got.last.count(ids[i])) {
      EXPECT_TRUE(got.last[ids[i]].error.ok()) << got.last[ids[i]].error.message();
      EXPECT_EQ(got.last[ids[i]].reason, FinishReason::kLength);
    }
    out.push_back(got.tokens[ids[i]]);
  }
  return out;
}

TEST(EngineCore, SixteenConcurrentRequestsEqualSequentialOnes) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  auto reqs = requests(16, 8);
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(engine->generate(r)->output_ids);
  BatchingOptions o;
  o.block_size = 4;
  o.max_num_seqs = 8;          // half wait at first: they join as others leave
  o.max_batched_tokens = 48;   // long prompts are prefilled in chunks beside running decodes
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok()) << core.status().message();
  EXPECT_EQ(run_concurrently(**core, reqs), want);
  auto st = (*core)->stats();
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_GT(st.steps, 0);
}

TEST(EngineCore, PreemptionUnderKvPressureKeepsResultsExact) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  auto reqs = requests(12, 10);
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(engine->generate(r)->output_ids);
  BatchingOptions o;
  o.block_size = 4;
  o.num_blocks = 16;  // 64 positions for up to 8 sequences of up to ~52 tokens: must preempt
  o.max_num_seqs = 8;
  o.max_batched_tokens = 32;
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok()) << core.status().message();
  EXPECT_EQ(run_concurrently(**core, reqs), want);
  auto st = (*core)->stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST(EngineCore, ImagesThroughTheBatchMatchGenerate) {
  auto engine = load_fixture_engine("vision-f32");
  ASSERT_NE(engine, nullptr);
  auto ref = nlohmann::json::parse(test_util::read_file(kFixtures + "/vision-f32/reference.json"));
  std::vector<GenerateRequest> reqs;
  for (const auto& c : ref["cases"]) {
    GenerateRequest r;
    r.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& name : c["images"]) {
      const auto& im = ref["images"][name];
      const std::string src = im["source"];
      ImageInput in;
      in.path = (src.rfind("synthetic", 0) == 0 ? kFixtures + "/vision-f32"
                                                 : std::string(VLM_TESTDATA_DIR) + "/images") +
                "/" + src;
      in.min_pixels = im["min_pixels"].get<int64_t>();
      in.max_pixels = im["max_pixels"].get<int64_t>();
      r.images.push_back(in);
    }
    r.max_new_tokens = 12;
    r.sampling.do_sample = false;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(engine->generate(r)->output_ids);
  BatchingOptions o;
  o.block_size = 8;
  o.max_batched_tokens = 24;  // images split across chunks next to other requests' decodes
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok());
  EXPECT_EQ(run_concurrently(**core, reqs), want);

  // The vision cache: each distinct (file, pixel budget) is encoded once; every other use of it,
  // including all of the second round, is a hit, and the replies do not change.
  std::set<std::tuple<std::string, int64_t, int64_t>> distinct;
  int64_t total = 0;
  for (const auto& r : reqs) {
    for (const auto& in : r.images) distinct.emplace(in.path, *in.min_pixels, *in.max_pixels);
    total += static_cast<int64_t>(r.images.size());
  }
  EngineCore::Stats st = (*core)->stats();
  EXPECT_EQ(st.vision_cache_misses, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(st.vision_cache_hits, total - static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(st.vision_cache_entries, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(run_concurrently(**core, reqs), want);
  st = (*core)->stats();
  EXPECT_EQ(st.vision_cache_misses, static_cast<int64_t>(distinct.size()));
  EXPECT_EQ(st.vision_cache_hits, 2 * total - static_cast<int64_t>(distinct.size()));

  // A broken image is refused at submit, naming the image.
  GenerateRequest bad = reqs[0];
  bad.images[0].path.clear();
  bad.images[0].bytes = {0x89, 'P', 'N', 'G', 1, 2, 3};
  auto bad_id = (*core)->submit(bad, [](const CoreEvent&) {});
  ASSERT_FALSE(bad_id.ok());
  EXPECT_NE(bad_id.status().message().find("image 1"), std::string::npos) << bad_id.status().message();
}

// An image is priced in tokens from its header before it is decoded or resized: one the context
// cannot hold is refused at submit (400 upstream) without a pixel of work. The 32x32 PNG at a
// budget of 1e8 pixels would be upscaled to ~97,000 tokens; the other is a 4000x4000 PNG header
// with no pixel data at all (decoding it would fail differently).
TEST(EngineCore, ImagesArePricedBeforeTheyAreDecoded) {
  auto engine = load_fixture_engine("vision-f32");
  ASSERT_NE(engine, nullptr);
  BatchingOptions o;
  o.max_batched_tokens = 64;
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok()) << core.status().message();
  GenerateRequest r;
  r.prompt_ids = {5, 6, 1002, 1000, 1003, 7};  // text, vision_start, one image pad, vision_end, text
  ImageInput small;
  const std::string png = test_util::read_file(kFixtures + "/../../unit/fixtures/images/png_rgb.png");
  small.bytes.assign(png.begin(), png.end());
  small.min_pixels = 100000000;
  small.max_pixels = 100000000;
  GenerateRequest upscaled = r;
  upscaled.images = {small};
  auto refused = (*core)->submit(upscaled, [](const CoreEvent&) {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("image 1"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("tokens at the pixel budget"), std::string::npos)
      << refused.status().message();
  // A header that promises 4000x4000 and nothing else: priced (and refused) from the header.
  std::string header = png.substr(0, 33);  // signature + IHDR chunk
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i) header[at + i] = static_cast<char>(v >> (24 - 8 * i));
  };
  put32(16, 4000);
  put32(20, 4000);
  ImageInput big;
  big.bytes.assign(header.begin(), header.end());
  GenerateRequest huge = r;
  huge.images = {big};
  auto priced = (*core)->submit(huge, [](const CoreEvent&) {});
  ASSERT_FALSE(priced.ok());
  EXPECT_NE(priced.status().message().find("4000x4000"), std::string::npos) << priced.status().message();
  EXPECT_NE(priced.status().message().find("tokens at the pixel budget"), std::string::npos)
      << priced.status().message();
  EXPECT_EQ(std::string(priced.status().message()).find("/"), std::string::npos)
      << "no path in the message: " << priced.status().message();
}

// max_tokens near INT64_MAX is checked without overflow: refused, the number shown as sent.
TEST(EngineCore, HugeMaxTokensIsRefusedWithoutOverflow) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  BatchingOptions o;
  o.max_batched_tokens = 64;
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok()) << core.status().message();
  GenerateRequest r = requests(1, 1)[0];
  r.max_new_tokens = std::numeric_limits<int64_t>::max();
  auto refused = (*core)->submit(r, [](const CoreEvent&) {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("9223372036854775807"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(refused.status().message().find("-"), std::string::npos) << refused.status().message();
}

TEST(EngineCore, VisionCacheIsBoundedInBytes) {
  auto engine = load_fixture_engine("vision-f32");
  ASSERT_NE(engine, nullptr);
  BatchingOptions o;
  o.block_size = 8;
  o.max_batched_tokens = 64;
  o.vision_cache_mib = 0;  // nothing fits: every image is encoded again
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok());
  auto ref = nlohmann::json::parse(test_util::read_file(kFixtures + "/vision-f32/reference.json"));
  GenerateRequest r;
  r.prompt_ids = ref["cases"][0]["prompt_ids"].get<std::vector<int32_t>>();
  ImageInput in;
  in.path = kFixtures + "/vision-f32/synthetic_tiny.png";
  r.images = {in};
  r.max_new_tokens = 2;
  const auto first = run_concurrently(**core, {r, r});
  EXPECT_EQ(first[0], first[1]);
  EXPECT_EQ((*core)->stats().vision_cache_hits, 0);
  EXPECT_EQ((*core)->stats().vision_cache_misses, 2);
  EXPECT_EQ((*core)->stats().vision_cache_entries, 0);
}

// Logprobs: log-softmax of the raw logits, checked against Engine::logits on the same sequence.
TEST(EngineCore, LogprobsAreTheModelsLogSoftmax) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  GenerateRequest r = requests(3, 6)[2];
  r.logprobs = 4;
  r.sampling.repetition_penalty = 1.3;  // penalties change sampling, never the reported logprobs
  BatchingOptions o;
  o.block_size = 8;
  o.max_batched_tokens = 64;
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok());
  std::vector<CoreEvent> events;
  std::mutex mu;
  ASSERT_TRUE((*core)->submit(r, [&](const CoreEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    if (ev.token_id >= 0) events.push_back(ev);
  }).ok());
  (*core)->wait_idle();
  ASSERT_EQ(events.size(), static_cast<size_t>(*r.max_new_tokens));
  std::vector<int32_t> seq = r.prompt_ids;
  for (const auto& ev : events) seq.push_back(ev.token_id);
  auto logits = engine->logits(seq);
  ASSERT_TRUE(logits.ok());
  const int64_t V = engine->vocab_size();
  for (size_t t = 0; t < events.size(); ++t) {
    const float* row = logits->data() + (r.prompt_ids.size() - 1 + t) * V;
    double mx = row[0], sum = 0;
    for (int64_t i = 0; i < V; ++i) mx = std::max<double>(mx, row[i]);
    for (int64_t i = 0; i < V; ++i) sum += std::exp(row[i] - mx);
    const double lse = mx + std::log(sum);
    const CoreEvent& ev = events[t];
    EXPECT_NEAR(ev.logprob, row[ev.token_id] - lse, 1e-4) << "token " << t;
    ASSERT_EQ(ev.top_logprobs.size(), 4u);
    std::vector<int32_t> order(V);
    for (int64_t i = 0; i < V; ++i) order[i] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + 4, order.end(),
                      [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    for (int k = 0; k < 4; ++k) {
      EXPECT_EQ(ev.top_logprobs[k].first, order[k]) << "token " << t << " rank " << k;
      EXPECT_NEAR(ev.top_logprobs[k].second, row[order[k]] - lse, 1e-4);
    }
  }
}

// The queue is bounded: past max_waiting queued requests, submit says ResourceExhausted (the
// server's 429) and the queued ones still finish.
TEST(EngineCore, FullQueueRefusesAtSubmit) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  BatchingOptions o;
  o.block_size = 8;
  o.max_batched_tokens = 64;
  o.max_num_seqs = 1;
  o.max_waiting = 2;
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok());
  std::mutex mu;
  std::condition_variable cv;
  int tokens = 0, finished = 0;
  auto on_event = [&](const CoreEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    if (ev.token_id >= 0) ++tokens;
    if (ev.finished) ++finished;
    cv.notify_all();
  };
  auto reqs = requests(4, 8);
  reqs[0].max_new_tokens = 400;  // runs until aborted below
  auto running = (*core)->submit(reqs[0], on_event);
  ASSERT_TRUE(running.ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return tokens >= 2; });  // the step of token 1 has published its stats
  }
  ASSERT_EQ((*core)->stats().running, 1);
  EXPECT_TRUE((*core)->submit(reqs[1], on_event).ok());
  EXPECT_TRUE((*core)->submit(reqs[2], on_event).ok());
  auto refused = (*core)->submit(reqs[3], on_event);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  (*core)->abort(*running);
  (*core)->wait_idle();
  EXPECT_EQ(finished, 2);
}

// A request that could never fit the whole KV cache is refused at submit (the scheduler's own
// check), and one that fits exactly is served.
TEST(EngineCore, RequestLargerThanTheKvCacheIsRefusedAtSubmit) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  BatchingOptions o;
  o.block_size = 4;
  o.num_blocks = 4;  // 16 tokens in all
  o.max_batched_tokens = 64;
  auto core = EngineCore::create(*engine, o);
  ASSERT_TRUE(core.ok());
  GenerateRequest r = requests(1, 0)[0];  // a 1-token prompt
  r.max_new_tokens = 16;
  auto refused = (*core)->submit(r, [](const CoreEvent&) {});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(refused.status().message().find("KV blocks"), std::string::npos) << refused.status().message();
  r.max_new_tokens = 15;
  EXPECT_EQ(run_concurrently(**core, {r}).at(0).size(), 15u);
  r.max_new_tokens = 0;
  EXPECT_FALSE((*core)->submit(r, [](const CoreEvent&) {}).ok());  // nothing to sample
}

TEST(EngineCore, AbortFreesBlocksAndBadRequestsFailAlone) {
  auto engine = load_fixture_engine("text-f32-untied");
  ASSERT_NE(engine, nullptr);
  BatchingOptions o;
  o.block_size = 4;
  o.max_batched_tokens = 1000;  // more than the engine's scratch (prefill_chunk 64): refused
  EXPECT_FALSE(EngineCore::create(*engine, o).ok());
  o.max_batched_tokens = 64;
  auto core_or = EngineCore::create(*engine, o);
  ASSERT_TRUE(core_or.ok()) << core_or.status().message();
  EngineCore& core = **core_or;
  std::mutex mu;
  std::condition_variable cv;
  int long_tokens = 0;
  bool long_finished = false;
  GenerateRequest long_req = requests(1, 0)[0];
  long_req.max_new_tokens = 2000;
  auto long_id = core.submit(long_req, [&](const CoreEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    if (ev.token_id >= 0) ++long_tokens;
    if (ev.finished) long_finished = true;
    cv.notify_all();
  });
  ASSERT_TRUE(long_id.ok());
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return long_tokens >= 5; });
  }
  EXPECT_GT(core.stats().kv_blocks_used, 0);
  // A bad request (token id outside the vocabulary) is refused at submit; the running one goes on.
  GenerateRequest bad;
  bad.prompt_ids = {1, 5000};
  auto bad_id = core.submit(bad, [](const CoreEvent&) {});
  ASSERT_FALSE(bad_id.ok());
  EXPECT_NE(bad_id.status().message().find("outside the vocabulary"), std::string::npos);
  // So is one that cannot fit the context, counted with its generation budget.
  GenerateRequest too_long = requests(1, 1)[0];
  too_long.max_new_tokens = engine->max_context();
  auto too_long_id = core.submit(too_long, [](const CoreEvent&) {});
  ASSERT_FALSE(too_long_id.ok());
  EXPECT_EQ(too_long_id.status().code(), StatusCode::kOutOfRange);
  {
    std::unique_lock<std::mutex> lock(mu);
    const int seen = long_tokens;
    cv.wait(lock, [&] { return long_tokens >= seen + 3; });
  }
  core.abort(*long_id);
  core.wait_idle();
  EXPECT_FALSE(long_finished);  // aborted requests get no final event
  EXPECT_EQ(core.stats().kv_blocks_used, 0);
  // Invalid sampling is refused at submit.
  GenerateRequest bad_top_p = requests(1, 2)[0];
  bad_top_p.sampling.top_p = 0.0;
  EXPECT_FALSE(core.submit(bad_top_p, [](const CoreEvent&) {}).ok());
  // And the core still serves.
  auto reqs = requests(3, 4);
  std::vector<std::vector<int32_t>> want;
  for (const auto& r : reqs) want.push_back(engine->generate(r)->output_ids);
  EXPECT_EQ(run_concurrently(core, reqs), want);
}

// The batched-decode benchmark (vlm/bench.h) counts the tokens sampled after every request has
// its first one. No timing assertions.
TEST(EngineCore, BatchedDecodeBenchCountsTheDecodeWindow) {
  auto engine = load_fixture_engine("vision-f32");  // a vocabulary with image pads: the prompts must avoid them
  ASSERT_NE(engine, nullptr);
  for (int64_t id : synthetic_prompt_ids(500, engine->vocab_size(), 7)) {
    ASSERT_TRUE(id >= 3 && id < engine->vocab_size() - 32) << id;
  }
  BatchedDecodeOptions o;
  o.prompt_tokens = 20;
  o.gen_tokens = 5;
  o.reps = 2;
  o.max_batched_tokens = 64;
  o.batch = 1;  // one sequence: its gen_tokens decode steps exactly
  auto one = bench_batched_decode(*engine, o);
  ASSERT_TRUE(one.ok()) << one.status().message();
  ASSERT_EQ(one->size(), 2u);
  for (const auto& r : *one) {
    EXPECT_EQ(r.tokens, 5);
    EXPECT_GE(r.decode_ms, 0);
    EXPECT_GT(r.first_tokens_ms, 0);
  }
  // Three sequences queued together prefill in one step (60 ≤ 64 tokens), then decode together:
  // 3 × 5 tokens, unless the engine started before the last was queued (then fewer count).
  o.batch = 3;
  o.reps = 1;
  auto three = bench_batched_decode(*engine, o);
  ASSERT_TRUE(three.ok()) << three.status().message();
  ASSERT_EQ(three->size(), 1u);
  EXPECT_LE((*three)[0].tokens, 15);
  EXPECT_GE((*three)[0].tokens, 5);
  // The engine is usable again afterwards.
  GenerateRequest r;
  r.prompt_ids = synthetic_prompt_ids(4, engine->vocab_size());
  r.max_new_tokens = 2;
  EXPECT_TRUE(engine->generate(r).ok());
  o.batch = 0;
  EXPECT_FALSE(bench_batched_decode(*engine, o).ok());
}

}  // namespace
}  // namespace vlm

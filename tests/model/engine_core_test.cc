// Continuous batching: requests submitted concurrently to the EngineCore produce exactly the
// tokens each produces alone through Engine::generate (f32, greedy) — with and without
// preemption — and an aborted request frees its KV blocks without disturbing the others.
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine_core.h"
#include "test_util.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;

std::unique_ptr<Engine> load(const std::string& name) {
  EngineOptions o;
  o.model_dir = kFixtures + "/" + name;
  o.require_tokenizer = false;
  o.n_threads = 2;
  o.prefill_chunk = 64;
  auto e = Engine::load(o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

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
  auto engine = load("text-f32-untied");
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
  auto engine = load("text-f32-untied");
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
  auto engine = load("vision-f32");
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
                                                 : std::string(VLM_SHARED_DIR) + "/data/images") +
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
}

TEST(EngineCore, AbortFreesBlocksAndBadRequestsFailAlone) {
  auto engine = load("text-f32-untied");
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
  // A bad request (token id outside the vocabulary) fails on its own.
  GenerateRequest bad;
  bad.prompt_ids = {1, 5000};
  CoreEvent bad_ev;
  auto bad_id = core.submit(bad, [&](const CoreEvent& ev) {
    std::lock_guard<std::mutex> lock(mu);
    if (ev.finished) bad_ev = ev;
  });
  ASSERT_TRUE(bad_id.ok());
  core.abort(*long_id);
  core.wait_idle();
  EXPECT_FALSE(bad_ev.error.ok());
  EXPECT_NE(bad_ev.error.message().find("outside the vocabulary"), std::string::npos);
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

}  // namespace
}  // namespace vlm

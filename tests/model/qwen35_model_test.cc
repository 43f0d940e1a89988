// Qwen3.5 (model_type qwen3_5: Gated DeltaNet + gated attention; and qwen3_5_moe, its mixture of
// experts, for logits, greedy paths, images and video) through the whole engine against
// transformers 5.x (tests/model/fixtures/qwen35-*, qwen35moe-*, made by
// scripts/make_qwen35_reference.py):
// prefill logits over prompts that cross several 64-token chunks, a one-token prompt, greedy
// continuations (the recurrent decode), one and two images and a video through the tower without
// DeepStack; batched equal to alone, chunk splits at every boundary, preemption; what the loader
// refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "fixture_model.h"
#include "io/npy.h"
#include "ops/ops.h"
#include "test_util.h"
#include "vlm/engine.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;
const std::string kVideos = std::string(VLM_REPO_DIR) + "/tests/unit/fixtures/videos";
const std::string kImage = kFixtures + "/vision-f32/synthetic_tiny.png";
constexpr double kTol = 1e-4;  // max |Δlogit| / max |logit|

nlohmann::json reference(const std::string& name) {
  return nlohmann::json::parse(test_util::read_file(kFixtures + "/" + name + "/reference.json"));
}

EngineOptions options(const std::string& name, ops::Isa isa, int64_t chunk) {
  EngineOptions o = test_util::fixture_engine_options(name);
  o.cpu_isa = parse_cpu_isa(ops::isa_name(isa)).value();
  o.prefill_chunk = chunk;
  // A step's budget (the prefill chunk) must cover one token of every running sequence.
  o.batching.max_num_seqs = std::min<int64_t>(o.batching.max_num_seqs, chunk);
  return o;
}

std::unique_ptr<Engine> engine(const std::string& name, ops::Isa isa, int64_t chunk = 64) {
  auto e = Engine::load(options(name, isa, chunk));
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

using test_util::rel_err;

std::vector<int32_t> greedy(Engine& e, GenerateRequest req, int64_t n) {
  req.max_new_tokens = n;
  req.sampling.do_sample = false;
  req.ignore_eos = true;
  auto res = e.generate(req);
  EXPECT_TRUE(res.ok()) << res.status().message();
  return res.ok() ? res->output_ids : std::vector<int32_t>{};
}

struct Param {
  std::string fixture;
  ops::Isa isa;
};

std::vector<Param> params() {
  std::vector<Param> out;
  for (const char* f : {"qwen35-f32-a", "qwen35-f32-b", "qwen35moe-f32-a", "qwen35moe-f32-b"}) {
    for (ops::Isa isa : ops::runnable_isas()) out.push_back({f, isa});
  }
  return out;
}

class Qwen35Text : public ::testing::TestWithParam<Param> {};

// Prompts of 1, 7 and 150 tokens (the last crosses two 64-token chunks of the delta rule and of
// the engine's prefill), every position's logits.
TEST_P(Qwen35Text, LogitsMatchTransformers) {
  auto e = engine(GetParam().fixture, GetParam().isa);
  ASSERT_NE(e, nullptr);
  const auto ref = reference(GetParam().fixture);
  ASSERT_EQ(ref["logits"].size(), 3u);
  for (const auto& c : ref["logits"]) {
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    SCOPED_TRACE(std::to_string(ids.size()) + " ids");
    auto got = e->logits(ids);
    ASSERT_TRUE(got.ok()) << got.status().message();
    auto want = read_npy(kFixtures + "/" + GetParam().fixture + "/" + c["file"].get<std::string>());
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_EQ(got->size(), want->f32.size());
    EXPECT_LE(rel_err(*got, want->f32), kTol);
  }
}

// 40 greedy tokens: the prompt's chunked state carried into the recurrent decode steps.
TEST_P(Qwen35Text, GreedyTokensMatchTransformers) {
  auto e = engine(GetParam().fixture, GetParam().isa);
  ASSERT_NE(e, nullptr);
  const auto ref = reference(GetParam().fixture);
  ASSERT_EQ(ref["greedy"].size(), 2u);
  for (const auto& c : ref["greedy"]) {
    GenerateRequest req;
    req.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["output_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(want.size(), 40u);
    EXPECT_EQ(greedy(*e, req, c["max_new_tokens"].get<int64_t>()), want);
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, Qwen35Text, ::testing::ValuesIn(params()), [](const auto& info) {
  return test_util::param_name(info.param.fixture + "_" + ops::isa_name(info.param.isa));
});

// Images and a video (the tower without DeepStack, M-RoPE over the rotary part): the expanded
// prompt, every position's logits and a greedy continuation. Prefill chunks of 5 and 16 tokens
// split the images' and the video's pads across chunks.
class Qwen35Vision : public ::testing::TestWithParam<Param> {};

TEST_P(Qwen35Vision, ImagesAndVideoMatchTransformers) {
  int checked = 0;
  const std::string& fixture = GetParam().fixture;
  const auto ref = reference(fixture);
  for (int64_t chunk : {5, 16}) {
    SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
    auto e = engine(fixture, GetParam().isa, chunk);
    ASSERT_NE(e, nullptr);
    ASSERT_TRUE(e->has_vision());
    for (const auto& c : ref["mm_cases"]) {
      SCOPED_TRACE(c["name"].get<std::string>());
      const auto ids = e->tokenizer()->encode(c["text"].get<std::string>());
      std::vector<ImageInput> images;
      for (size_t i = 0; i < c["images"].size(); ++i) images.push_back({.path = kImage});
      std::vector<VideoInput> videos;
      for (const auto& v : c["videos"]) {
        VideoInput in;
        const std::string s = test_util::read_file(kVideos + "/" + v.get<std::string>());
        in.bytes.assign(s.begin(), s.end());
        videos.push_back(std::move(in));
      }
      std::vector<int32_t> expanded;
      Engine::LogitsOptions o;
      o.expanded_ids = &expanded;
      o.videos = videos;
      auto got = e->logits(ids, images, o);
      ASSERT_TRUE(got.ok()) << got.status().message();
      EXPECT_EQ(expanded, c["input_ids"].get<std::vector<int32_t>>());
      auto want = read_npy(kFixtures + "/" + fixture + "/" + c["logits"].get<std::string>());
      ASSERT_TRUE(want.ok()) << want.status().message();
      ASSERT_EQ(got->size(), want->f32.size());
      EXPECT_LE(rel_err(*got, want->f32), kTol);

      GenerateRequest req;
      req.prompt_ids = ids;
      req.images = images;
      req.videos = videos;
      EXPECT_EQ(greedy(*e, req, 20), c["greedy"].get<std::vector<int32_t>>());
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6);
}

std::vector<Param> vision_params() {
  std::vector<Param> out;
  for (const char* f : {"qwen35-f32-a", "qwen35moe-f32-a"}) {
    for (ops::Isa isa : ops::runnable_isas()) out.push_back({f, isa});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, Qwen35Vision, ::testing::ValuesIn(vision_params()),
                         [](const auto& info) {
                           return test_util::param_name(info.param.fixture + "_" +
                                                        ops::isa_name(info.param.isa));
                         });

// The encoder slicing on the hybrid model: while a text stream decodes, each image's and video's
// tower pass is cut into one unit per step (a budget of a nanosecond); the stream gets a token at
// (nearly) every step, and every image and video request's greedy reply is transformers'. Each
// request runs twice: the second resumes from the state snapshot its first run kept (the chained
// block hashes include the images), and its reply stays the same.
TEST(Qwen35Batch, EncodesAreSlicedBesideARunningStream) {
  const auto ref = reference("qwen35-f32-a");
  std::mutex mu;
  std::vector<int64_t> slices;  // per step that encoded
  EngineOptions o = options("qwen35-f32-a", ops::detected_isa(), 16);
  o.batching.max_encoder_ms = 1e-6;
  o.batching.vision_cache_mib = 0;  // every image is encoded
  o.batching.state_snapshot_interval = 16;
  o.batching.state_snapshots = 32;  // room for round 1's 16 (prompts' and replies' latest)
  o.on_encode = [&](int64_t n, double) {
    std::lock_guard<std::mutex> lock(mu);
    slices.push_back(n);
  };
  auto loaded = Engine::load(o);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  Engine& e = **loaded;
  GenerateRequest text;
  text.prompt_ids = ref["greedy"][1]["prompt_ids"].get<std::vector<int32_t>>();
  text.max_new_tokens = 3000;
  text.ignore_eos = true;
  text.sampling.do_sample = false;
  auto runner = e.submit(text);
  ASSERT_TRUE(runner.ok()) << runner.status().message();
  RequestOutput piece;
  ASSERT_TRUE((*runner)->next(&piece));  // it decodes
  std::vector<int64_t> stream_steps;
  int64_t media = 0, hits_before = 0, resumable = 0;
  for (int round = 0; round < 2; ++round) {
    if (round == 1) hits_before = e.core_stats().prefix_cache_hits;
    for (const auto& c : ref["mm_cases"]) {
      // Again: from the snapshot at the last multiple of 16 before the prompt's last token.
      if (round == 1) resumable += (static_cast<int64_t>(c["input_ids"].size()) - 1) / 16 * 16;
      SCOPED_TRACE(c["name"].get<std::string>() + (round ? ", again" : ""));
      GenerateRequest req;
      req.prompt_ids = e.tokenizer()->encode(c["text"].get<std::string>());
      for (size_t i = 0; i < c["images"].size(); ++i) req.images.push_back({.path = kImage});
      for (const auto& v : c["videos"]) {
        VideoInput in;
        const std::string s = test_util::read_file(kVideos + "/" + v.get<std::string>());
        in.bytes.assign(s.begin(), s.end());
        req.videos.push_back(std::move(in));
      }
      media += static_cast<int64_t>(req.images.size() + req.videos.size());
      req.max_new_tokens = 20;
      req.sampling.do_sample = false;
      req.ignore_eos = true;
      auto s = e.submit(req);
      ASSERT_TRUE(s.ok()) << s.status().message();
      std::vector<int32_t> got;
      while ((*s)->next(&piece)) {
        ASSERT_TRUE(piece.error.ok()) << piece.error.message();
        if (piece.token_id >= 0) got.push_back(piece.token_id);
      }
      EXPECT_EQ(got, c["greedy"].get<std::vector<int32_t>>());
      while ((*runner)->try_next(&piece)) {
        if (piece.token_id >= 0) stream_steps.push_back(piece.step);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    // One unit a step, and a tower pass takes several (its stages: 4 per block and a few more).
    EXPECT_GE(static_cast<int64_t>(slices.size()), media * 6);
    for (int64_t n : slices) EXPECT_EQ(n, 1);
  }
  ASSERT_FALSE(stream_steps.empty());
  const int64_t span = stream_steps.back() - stream_steps.front() + 1;
  EXPECT_GE(static_cast<double>(stream_steps.size()), 0.9 * static_cast<double>(span));
  // The second round resumed from its prompts' snapshots.
  EXPECT_EQ(e.core_stats().prefix_cache_hits - hits_before, resumable);
  (*runner)->cancel();
  e.wait_idle();
}

// Every prefill chunk size from 1 to 70 gives the 70-token prompt's greedy path: the state (conv
// window and recurrent state) carries across every split of the chunked delta rule.
TEST(Qwen35Chunks, EverySplitGivesTheSameGreedyPath) {
  const auto ref = reference("qwen35-f32-b");
  const auto& c = ref["greedy"][1];
  GenerateRequest req;
  req.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(req.prompt_ids.size(), 70u);
  const auto want = c["output_ids"].get<std::vector<int32_t>>();
  for (int64_t chunk = 1; chunk <= 70; ++chunk) {
    SCOPED_TRACE("prefill chunk " + std::to_string(chunk));
    auto e = Engine::load(options("qwen35-f32-b", ops::detected_isa(), chunk));
    ASSERT_TRUE(e.ok()) << e.status().message();
    auto out = greedy(**e, req, 8);
    ASSERT_EQ(out.size(), 8u);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), want.begin()));
  }
}

// Several sequences in one engine, submitted together (mixed lengths: their prefill chunks and
// decode rows share passes, each in its own state slot) give each one's greedy path alone; with a
// KV cache too small for all of them the engine preempts, frees the slot and recomputes.
TEST(Qwen35Batch, BatchedAndPreemptedEqualAlone) {
  const auto ref = reference("qwen35-f32-a");
  std::vector<GenerateRequest> reqs;
  std::vector<std::vector<int32_t>> want;
  for (const auto& c : ref["greedy"]) {
    GenerateRequest r;
    r.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    reqs.push_back(r);
    want.push_back(c["output_ids"].get<std::vector<int32_t>>());
  }
  for (const auto& c : ref["logits"]) {  // prompts of 1, 7 and 150 ids: their paths alone first
    GenerateRequest r;
    r.prompt_ids = c["ids"].get<std::vector<int32_t>>();
    auto e = engine("qwen35-f32-a", ops::detected_isa());
    ASSERT_NE(e, nullptr);
    want.push_back(greedy(*e, r, 40));
    reqs.push_back(r);
  }
  for (int32_t blocks : {0, 14}) {  // 0: room for all; 14 blocks of 16: preemptions
    SCOPED_TRACE(blocks == 0 ? "room for all" : "preempting");
    BatchingOptions b;
    b.num_blocks = blocks;
    b.block_size = 16;
    b.max_num_seqs = 4;  // five requests, four state slots: one waits its turn
    EngineOptions o = options("qwen35-f32-a", ops::detected_isa(), 32);
    o.batching = b;
    auto e = Engine::load(o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (GenerateRequest r : reqs) {
      r.max_new_tokens = 40;
      r.sampling.do_sample = false;
      r.ignore_eos = true;
      auto s = (*e)->submit(r);
      ASSERT_TRUE(s.ok()) << s.status().message();
      streams.push_back(std::move(s).value());
    }
    for (size_t i = 0; i < streams.size(); ++i) {
      EXPECT_EQ(test_util::stream_tokens(*streams[i]), want[i]) << "request " << i;
    }
    const auto st = (*e)->core_stats();
    EXPECT_EQ(st.state_slots, 4);
    if (blocks > 0) EXPECT_GT(st.preemptions, 0);
  }
}

// Prefix caching with state snapshots (every 32 tokens here, blocks of 16): a prompt seen before
// resumes from the snapshot at the end of its longest cached run of blocks, and one that shares
// only part of an interval from the snapshot before; the rows computed after the hit equal a cold
// run's (≤ 1e-5), and so do greedy continuations. With a single snapshot each new prompt replaces
// it, and outputs never change.
TEST(Qwen35PrefixCache, HitsResumeFromSnapshotsAndEqualColdRuns) {
  const auto ref = reference("qwen35-f32-a");
  const auto p = ref["logits"][2]["ids"].get<std::vector<int32_t>>();  // 150 ids
  std::vector<int32_t> q(p.begin(), p.begin() + 90);                   // 5 blocks shared
  for (int i = 0; i < 40; ++i) q.push_back(3 + (i * 37) % 390);
  EngineOptions o = options("qwen35-f32-a", ops::detected_isa(), 32);  // chunks end every 32
  o.batching.state_snapshot_interval = 32;
  o.batching.state_snapshots = 4;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  auto run = [&](const std::vector<int32_t>& ids, bool read, int64_t* cached) {
    Engine::LogitsOptions lo;
    lo.read_prefix_cache = read;
    lo.cached_tokens = cached;
    auto r = (*e)->logits(ids, {}, lo);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::vector<float>{};
  };
  const int64_t V = 422;
  auto tail = [&](const std::vector<float>& v, int64_t from) {
    return std::vector<float>(v.begin() + from * V, v.end());
  };
  // p: computed in full (its snapshots kept), then again: 9 blocks cached, the last snapshot at
  // 128. q, after that: p's first 5 blocks (80 tokens) cached, the last snapshot among them at 64;
  // then q in full for comparison.
  for (const auto& [ids, resume] : {std::pair{p, int64_t{128}}, std::pair{q, int64_t{64}}}) {
    SCOPED_TRACE(std::to_string(ids.size()) + " ids");
    const bool warm_first = resume == 64;
    int64_t cached_cold = -1, cached_warm = -1;
    std::vector<float> cold, warm;
    if (warm_first) warm = run(ids, true, &cached_warm);
    cold = run(ids, false, &cached_cold);
    if (!warm_first) warm = run(ids, true, &cached_warm);
    EXPECT_EQ(cached_cold, 0);
    EXPECT_EQ(cached_warm, resume);
    ASSERT_EQ(warm.size(), cold.size());
    EXPECT_LE(rel_err(tail(warm, resume), tail(cold, resume)), 1e-5);
  }
  // Every snapshot point: prefixes of p (computed in full above) resume from the last snapshot
  // within their cached blocks (32, 64, 96, 128), their rows equal to p's.
  const auto cold_p = run(p, false, nullptr);
  for (const auto& [n, resume] :
       {std::pair{40, 32}, std::pair{70, 64}, std::pair{100, 96}, std::pair{140, 128}}) {
    SCOPED_TRACE("a prefix of " + std::to_string(n));
    int64_t cached = -1;
    const auto warm = run(std::vector<int32_t>(p.begin(), p.begin() + n), true, &cached);
    EXPECT_EQ(cached, resume);
    ASSERT_EQ(static_cast<int64_t>(warm.size()), n * V);
    EXPECT_LE(rel_err(tail(warm, resume),
                      std::vector<float>(cold_p.begin() + resume * V, cold_p.begin() + n * V)),
              1e-5);
  }
  const auto st = (*e)->core_stats();
  EXPECT_TRUE(st.prefix_caching);
  EXPECT_GT(st.state_snapshots_held, 0);

  // Greedy paths with three snapshots: the 70-id prompt keeps its states at 32, 64 and 96
  // (decoding past 96) and runs again from 64; the 5-id prompt's state at 32 replaces the least
  // recently used (the first prompt's at 32); the 70-id prompt resumes from 64 once more. Every
  // path stays the reference's.
  o.batching.state_snapshots = 3;
  auto two = Engine::load(o);
  ASSERT_TRUE(two.ok()) << two.status().message();
  for (int k : {1, 1, 0, 1}) {
    const auto& c = ref["greedy"][k];
    GenerateRequest req;
    req.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(greedy(**two, req, 40), c["output_ids"].get<std::vector<int32_t>>()) << k;
  }
  const auto st2 = (*two)->core_stats();
  EXPECT_EQ(st2.prefix_cache_hits, 2 * 64);
  EXPECT_EQ(st2.state_snapshot_evictions, 1);
}

// Structured output and several samples of one prompt (as n > 1 runs them: requests that share
// the prompt, the later ones resuming from a snapshot the first kept) on the hybrid model: every
// reply follows its grammar, and each seeded sample is the same whether it ran alone or beside
// the others.
TEST(Qwen35PrefixCache, StructuredSamplesOfOnePromptAreTheSameAloneOrTogether) {
  const auto ref = reference("qwen35-f32-a");
  EngineOptions o = options("qwen35-f32-a", ops::detected_isa(), 32);
  o.batching.state_snapshot_interval = 32;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  GenerateRequest base;
  base.prompt_ids = ref["logits"][2]["ids"].get<std::vector<int32_t>>();
  base.max_new_tokens = 12;
  base.sampling.do_sample = true;
  base.sampling.temperature = 1.0;
  base.structured.kind = StructuredOutput::Kind::kRegex;
  base.structured.spec = "[a-z]{2,6}( [a-z]{2,6}){0,2}";
  const std::regex follows(base.structured.spec);
  std::vector<std::vector<int32_t>> alone;
  for (int64_t seed = 1; seed <= 4; ++seed) {
    GenerateRequest r = base;
    r.sampling.seed = static_cast<uint64_t>(seed);
    auto res = (*e)->generate(r);
    ASSERT_TRUE(res.ok()) << res.status().message();
    EXPECT_TRUE(std::regex_match(res->text, follows)) << res->text;
    alone.push_back(res->output_ids);
  }
  EXPECT_GT(std::set<std::vector<int32_t>>(alone.begin(), alone.end()).size(), 1u);  // sampled
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int64_t seed = 1; seed <= 4; ++seed) {
    GenerateRequest r = base;
    r.sampling.seed = static_cast<uint64_t>(seed);
    auto st = (*e)->submit(r);
    ASSERT_TRUE(st.ok()) << st.status().message();
    streams.push_back(std::move(st).value());
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    std::vector<int32_t> out;
    RequestOutput piece;
    RequestStats stats;
    while (streams[i]->next(&piece)) {
      ASSERT_TRUE(piece.error.ok()) << piece.error.message();
      if (piece.token_id >= 0) out.push_back(piece.token_id);
      stats = piece.stats;
    }
    EXPECT_EQ(out, alone[i]) << "seed " << i + 1;
    EXPECT_EQ(stats.cached_tokens, 128);  // the prompt's last snapshot point
  }
}

// --kv-cache-memory holds the state slots first and K/V blocks in the rest; a budget too small for
// the slots is refused, naming them.
TEST(Qwen35Batch, KvCacheMemoryHoldsTheStateSlotsAndTheBlocks) {
  EngineOptions o = options("qwen35-f32-a", ops::detected_isa(), 64);
  o.batching.max_num_seqs = 8;
  o.batching.kv_cache_memory = 1 << 20;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  const auto st = (*e)->core_stats();
  EXPECT_EQ(st.state_slots, 8);
  EXPECT_GT(st.state_slot_bytes, 0);
  EXPECT_EQ(st.state_snapshots, 8);  // max_num_seqs
  const int64_t total =
      st.kv_cache_bytes + (st.state_slots + st.state_snapshots) * st.state_slot_bytes;
  EXPECT_LE(total, int64_t{1} << 20);
  // One block more would not fit.
  const int64_t block = st.kv_cache_bytes / (st.kv_blocks_total + 1);
  EXPECT_GT(total + block, int64_t{1} << 20);

  o.batching.kv_cache_memory = 16 * st.state_slot_bytes;  // slots and snapshots, no blocks
  e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("state slots"), std::string::npos) << e.status().message();
}

// The fixtures' configs: the layer_types lists, the rotary part, the state geometry; the
// zero-centred norms stored as 1 + w.
TEST(Qwen35Config, HybridLayersAndZeroCentredNorms) {
  auto a = test_util::load_fixture_model(kFixtures + "/qwen35-f32-a");
  ASSERT_TRUE(a.ok()) << a.status().message();
  const Qwen3VLTextConfig& t = a->cfg.text_config;
  EXPECT_EQ(t.family, ModelFamily::kQwen35);
  EXPECT_EQ(t.num_linear_layers(), 3);
  EXPECT_TRUE(t.linear_layer(0) && t.linear_layer(2) && !t.linear_layer(3));
  EXPECT_EQ(t.rotary_dim, 8);  // 32 · 0.25
  EXPECT_TRUE(a->cfg.vision_config.deepstack_visual_indexes.empty());
  EXPECT_TRUE(a->text.layers[0].linear);
  EXPECT_EQ(a->text.layers[0].delta.conv1d.size(), 96u * 4);
  EXPECT_EQ(a->text.layers[3].q_proj.shape, (std::vector<int64_t>{4 * 32 * 2, 64}));
  const TensorView raw = *a->store->get("model.language_model.norm.weight");
  EXPECT_EQ(a->text.norm[5], 1.0f + static_cast<const float*>(raw.data)[5]);
  const TensorView gated = *a->store->get("model.language_model.layers.1.linear_attn.norm.weight");
  EXPECT_EQ(a->text.layers[1].delta.norm[3], static_cast<const float*>(gated.data)[3]);

  auto b = test_util::load_fixture_model(kFixtures + "/qwen35-f32-b");
  ASSERT_TRUE(b.ok()) << b.status().message();
  const Qwen3VLTextConfig& u = b->cfg.text_config;
  std::vector<bool> linear;
  for (int64_t l = 0; l < u.num_hidden_layers; ++l) linear.push_back(u.linear_layer(l));
  EXPECT_EQ(linear, (std::vector<bool>{true, false, true, true, false}));
  EXPECT_EQ(u.rotary_dim, 8);  // 16 · 0.5
  EXPECT_EQ(u.linear_num_value_heads / u.linear_num_key_heads, 2);
}

// Without layer_types, every full_attention_interval-th layer is full attention (transformers'
// default 4); without partial_rotary_factor a quarter of each head rotates; a text-only
// qwen3_5_text config (Qwen3_5ForCausalLM) is the same family. Qwen3-VL configs keep whole-head
// rotary and refuse a partial factor.
TEST(Qwen35Config, IntervalDefaultRotaryAndTextOnlyConfigs) {
  auto cfg = nlohmann::json::parse(test_util::read_file(kFixtures + "/qwen35-f32-a/config.json"));
  nlohmann::json& t = cfg["text_config"];
  t.erase("layer_types");
  t["num_hidden_layers"] = 6;
  t["full_attention_interval"] = 3;
  t["rope_parameters"].erase("partial_rotary_factor");
  auto r = parse_qwen3vl_config(cfg.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::vector<bool> linear;
  for (int64_t l = 0; l < 6; ++l) linear.push_back(r->text_config.linear_layer(l));
  EXPECT_EQ(linear, (std::vector<bool>{true, true, false, true, true, false}));
  EXPECT_EQ(r->text_config.rotary_dim, 8);  // 32 / 4
  t.erase("full_attention_interval");       // the default, 4
  r = parse_qwen3vl_config(cfg.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->text_config.linear_layer(2) && !r->text_config.linear_layer(3));

  nlohmann::json text = t;  // flat, as a text-only checkpoint writes it
  text["model_type"] = "qwen3_5_text";
  r = parse_qwen3vl_config(text.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->text_config.family, ModelFamily::kQwen35);
  EXPECT_FALSE(r->has_vision);

  t["full_attention_interval"] = 100;  // no full-attention layer among 6
  r = parse_qwen3vl_config(cfg.dump(), "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("full_attention"), std::string::npos);

  auto vl = nlohmann::json::parse(test_util::read_file(kFixtures + "/text-f32-untied/config.json"));
  r = parse_qwen3vl_config(vl.dump(), "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->text_config.rotary_dim, r->text_config.head_dim);
  vl["text_config"]["partial_rotary_factor"] = 0.5;
  r = parse_qwen3vl_config(vl.dump(), "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("partial_rotary_factor"), std::string::npos);
}

// Model types are known by name: another is refused naming it; a broken hybrid config names the
// field.
TEST(Qwen35Config, UnknownModelTypesAndBrokenFieldsAreRefused) {
  const std::string cfg = test_util::read_file(kFixtures + "/qwen35-f32-a/config.json");
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string s = cfg;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  auto r = parse_qwen3vl_config(edit("\"model_type\": \"qwen3_5\"", "\"model_type\": \"llama\""),
                                "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'llama'"), std::string::npos) << r.status().message();
  // The same fields under the MoE's name: every layer sparse, with Qwen3_5MoeTextConfig's
  // expert defaults (qwen35_moe_test checks those).
  r = parse_qwen3vl_config(edit("\"model_type\": \"qwen3_5\"", "\"model_type\": \"qwen3_5_moe\""),
                           "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->text_config.num_experts, 256);
  r = parse_qwen3vl_config(
      edit("\"linear_attention\",\n      \"linear_attention\",", "\"linear_attention\","),
      "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layer_types"), std::string::npos) << r.status().message();
  r = parse_qwen3vl_config(edit("\"linear_num_value_heads\": 2", "\"linear_num_value_heads\": 3"),
                           "config.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("linear_num_value_heads"), std::string::npos);
}

// --device cuda refuses a Qwen3.5 checkpoint at load, naming the model and the way out (no CUDA
// kernel of the hybrid layers has run on a GPU yet).
TEST(Qwen35Config, CudaRefusesAtLoad) {
  EngineOptions o = test_util::fixture_engine_options("qwen35-f32-a");
  o.device = Device::kCuda;
  auto e = Engine::load(o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(e.status().message().find("Qwen3.5"), std::string::npos) << e.status().message();
  EXPECT_NE(e.status().message().find("--device cpu"), std::string::npos) << e.status().message();
}

// Without generation_config.json (the published Qwen3.5 repositories have none) a request stops at
// config.json's eos_token_id and at the tokenizer's eos (<|im_end|>, where a chat turn ends):
// config.json here names the third token of a known greedy path, where generation then stops.
TEST(Qwen35Config, WithoutGenerationConfigStopsAtConfigAndTokenizerEos) {
  namespace fs = std::filesystem;
  test_util::TempDir tmp;
  const std::string src = kFixtures + "/qwen35-f32-a";
  for (const char* f : {"model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "preprocessor_config.json", "video_preprocessor_config.json"}) {
    fs::copy_file(src + "/" + f, tmp.path() / f);
  }
  const auto ref = reference("qwen35-f32-a");
  const auto path = ref["greedy"][0]["output_ids"].get<std::vector<int32_t>>();
  const int32_t stop = path[2];
  ASSERT_TRUE(path[0] != stop && path[1] != stop && stop != 410) << "pick another fixture token";
  std::string cfg = test_util::read_file(src + "/config.json");
  const std::string from = "\"eos_token_id\": 410",
                    to = "\"eos_token_id\": " + std::to_string(stop);
  ASSERT_NE(cfg.find(from), std::string::npos);
  cfg.replace(cfg.find(from), from.size(), to);
  {
    std::ofstream f(tmp.path() / "config.json");
    f << cfg;
  }
  EngineOptions o;
  o.model_dir = tmp.path().string();
  o.n_threads = 1;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*e)->eos_token_ids(), (std::vector<int32_t>{stop, 410}));
  GenerateRequest req;
  req.prompt_ids = ref["greedy"][0]["prompt_ids"].get<std::vector<int32_t>>();
  req.max_new_tokens = 20;
  req.sampling.do_sample = false;
  auto r = (*e)->generate(req);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->output_ids, (std::vector<int32_t>{path[0], path[1], stop}));
  EXPECT_EQ(r->finish_reason, FinishReason::kStop);
}

// A missing Gated DeltaNet tensor is named with its file.
TEST(Qwen35Config, MissingLinearAttentionTensorIsNamed) {
  const std::string victim = "model.language_model.layers.2.linear_attn.A_log";
  const Status s = test_util::load_with_edited_tensor("qwen35-f32-b", victim, nullptr);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(victim), std::string::npos) << s.message();
}

// INT8 and INT4 weights and the BF16 / INT8 KV cache run the hybrid layers too, their logits
// over the 150-token prompt near the f32 run's.
// NOTE(vlm): measured (avx512, f32 activations): mean|Δ|/max|logit| and top-1 agreement: INT8
// 1.5e-2, 86.7%; INT4 (groups of 32) 0.117, 20.7%; a BF16 KV cache 3.8e-5, 100%; INT8 KV
// 1.2e-4, 100% (only every fourth layer keeps K/V).
// About 3× the Qwen3-VL fixtures' figures (quant_test: INT8 ~5e-3, INT4 ~6e-2), uniform over
// the positions (no growth along the recurrence): this fixture's N(0, 0.15²) matrices give
// sharper logits, and 34% of its positions are within 3% of max|logit| of a tie. Bounds: 2× the
// measured mean error, top-1 at least 0.8× the measured.
TEST(Qwen35Quant, QuantizedWeightsAndKvTypesStayNearF32) {
  const auto ref = reference("qwen35-f32-a");
  const auto ids = ref["logits"][2]["ids"].get<std::vector<int32_t>>();
  auto want = read_npy(kFixtures + "/qwen35-f32-a/" + ref["logits"][2]["file"].get<std::string>());
  ASSERT_TRUE(want.ok());
  const int64_t V = 422, rows = static_cast<int64_t>(ids.size());
  struct Variant {
    Quant quant;
    KvCacheDtype kv;
    double mean_bound, top1_bound;
  };
  for (const Variant& v : {Variant{Quant::kInt8, KvCacheDtype::kF32, 3e-2, 0.69},
                           Variant{Quant::kInt4, KvCacheDtype::kF32, 0.24, 0.16},
                           Variant{Quant::kNone, KvCacheDtype::kBF16, 8e-5, 0.95},
                           Variant{Quant::kNone, KvCacheDtype::kInt8, 2.5e-4, 0.95}}) {
    SCOPED_TRACE(std::string(quant_name(v.quant)) + " / " + kv_cache_dtype_name(v.kv));
    EngineOptions o = options("qwen35-f32-a", ops::detected_isa(), 64);
    o.quant = v.quant;
    o.kv_cache_dtype = v.kv;
    auto e = Engine::load(o);
    ASSERT_TRUE(e.ok()) << e.status().message();
    auto got = (*e)->logits(ids);
    ASSERT_TRUE(got.ok()) << got.status().message();
    ASSERT_EQ(got->size(), want->f32.size());
    double sum = 0, peak = 0;
    int64_t same = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const float* g = got->data() + r * V;
      const float* w = want->f32.data() + r * V;
      for (int64_t i = 0; i < V; ++i) {
        sum += std::fabs(static_cast<double>(g[i]) - w[i]);
        peak = std::max(peak, std::fabs(static_cast<double>(w[i])));
      }
      same += std::max_element(g, g + V) - g == std::max_element(w, w + V) - w;
    }
    const double mean = sum / static_cast<double>(rows * V) / peak;
    const double top1 = static_cast<double>(same) / static_cast<double>(rows);
    std::printf("  %s weights, %s KV: mean|d|/max|logit| %.3g, top-1 %.1f%%\n", quant_name(v.quant),
                kv_cache_dtype_name(v.kv), mean, 100 * top1);
    EXPECT_LE(mean, v.mean_bound);
    EXPECT_GT(mean, 0.0);  // the variant changed something
    EXPECT_GE(top1, v.top1_bound);
  }
}

}  // namespace
}  // namespace vlm

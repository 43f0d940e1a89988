// Speculative decoding through the whole engine (docs/architecture.md, "Speculative decoding"):
// on every Qwen3-VL fixture (dense, MoE, images, video), greedy output with proposals — prompt
// lookup, an oracle that proposes the plain output's own next tokens, one that always proposes
// wrong ones — is the plain output token for token, with each token's logprob equal bit for bit
// (the verify pass's rows are a one-row step's), batched with other requests, with prefix hits and
// with preemption. The oracle makes K + 1 tokens a step; a stop token inside an accepted run ends
// the reply there; penalties and a logit bias act on the verified rows as on plain ones; the
// counters add up. Sampling's exactness is the chi-square test below.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "engine/draft_proposer.h"
#include "engine/proposer.h"
#include "model/fixture_model.h"
#include "ops/cpu_backend.h"
#include "test_util.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

const std::string kFixtures = VLM_FIXTURES_DIR;
constexpr int32_t kK = 4;

// What a request produced: its tokens, each token's logprob, how it ended.
struct Output {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
  FinishReason reason = FinishReason::kNone;
  int64_t cached_tokens = 0;
  bool operator==(const Output& o) const {
    return tokens == o.tokens && logprobs == o.logprobs && reason == o.reason;
  }
};

std::ostream& operator<<(std::ostream& os, const Output& o) {
  os << "[";
  for (size_t i = 0; i < o.tokens.size(); ++i) {
    os << (i ? " " : "") << o.tokens[i] << "(" << (i < o.logprobs.size() ? o.logprobs[i] : 0)
       << ")";
  }
  return os << "] reason " << static_cast<int>(o.reason);
}

Output drain(RequestStream& stream) {
  Output out;
  RequestOutput piece;
  while (stream.next(&piece)) {
    EXPECT_TRUE(piece.error.ok()) << piece.error.message();
    if (piece.token_id >= 0) out.tokens.push_back(piece.token_id);
    for (const TokenLogprob& e : piece.logprobs) out.logprobs.push_back(e.logprob);
    if (piece.finished) {
      out.reason = piece.finish_reason;
      out.cached_tokens = piece.stats.cached_tokens;
    }
  }
  return out;
}

// Submits every request at once and reads their streams: they share the engine's steps.
std::vector<Output> run_all(Engine& e, const std::vector<GenerateRequest>& reqs) {
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& r : reqs) {
    auto s = e.submit(r);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (s.ok()) streams.push_back(std::move(s).value());
  }
  std::vector<Output> out;
  for (auto& s : streams) out.push_back(drain(*s));
  e.wait_idle();
  return out;
}

// Each request alone (the plain reference).
std::vector<Output> run_alone(Engine& e, const std::vector<GenerateRequest>& reqs) {
  std::vector<Output> out;
  for (const auto& r : reqs) out.push_back(run_all(e, {r})[0]);
  return out;
}

// fixture: a fixture's name, or a checkpoint directory's absolute path.
EngineOptions options(const std::string& fixture, const BatchingOptions& b) {
  EngineOptions o = test_util::fixture_engine_options(fixture, b);
  if (fixture.rfind('/', 0) == 0) o.model_dir = fixture;
  o.prefill_chunk = 32;
  return o;
}

std::unique_ptr<Engine> load(const std::string& fixture, const BatchingOptions& b = {}) {
  auto e = Engine::load(options(fixture, b));
  EXPECT_TRUE(e.ok()) << e.status().message();
  return e.ok() ? std::move(e).value() : nullptr;
}

VideoInput clip(const std::string& name) {
  VideoInput v;
  v.path = std::string(VLM_REPO_DIR) + "/tests/unit/fixtures/videos/" + name;
  return v;
}

// Greedy requests with logprobs for a fixture: text prompts, the vision fixture's image cases, the
// video fixture's video cases; each twice (the second finds the first's blocks cached).
std::vector<GenerateRequest> requests_for(const std::string& fixture, const Engine& e) {
  // (Qwen3.5's: its greedy prompts, and its image, two-image and video cases.)
  std::vector<GenerateRequest> out;
  auto add = [&](GenerateRequest r, int64_t max_new) {
    r.max_new_tokens = max_new;
    r.sampling.do_sample = false;
    r.ignore_eos = true;
    r.logprobs = 0;
    out.push_back(std::move(r));
  };
  if (fixture == "vision-f32" || fixture == "video-f32") {
    const auto ref =
        nlohmann::json::parse(test_util::read_file(kFixtures + "/" + fixture + "/reference.json"));
    for (const auto& c : ref["cases"]) {
      GenerateRequest r;
      if (fixture == "vision-f32") {
        r.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
        for (const auto& name : c["images"]) {
          r.images.push_back(test_util::vision_fixture_image(ref, name));
        }
      } else {
        if (c.contains("frames_fps") || !c["images"].empty()) continue;
        r.prompt_ids = e.tokenizer()->encode(c["text"].get<std::string>());
        for (const auto& name : c["videos"]) r.videos.push_back(clip(name));
      }
      add(r, 20);
    }
  } else if (fixture.rfind("qwen35", 0) == 0) {  // Qwen3.5: its greedy prompts and media cases
    const auto ref =
        nlohmann::json::parse(test_util::read_file(kFixtures + "/" + fixture + "/reference.json"));
    for (const auto& g : ref["greedy"]) {
      GenerateRequest r;
      r.prompt_ids = g["prompt_ids"].get<std::vector<int32_t>>();
      add(r, 24);
    }
    for (const auto& c : ref.value("mm_cases", nlohmann::json::array())) {
      GenerateRequest r;
      r.prompt_ids = e.tokenizer()->encode(c["text"].get<std::string>());
      for (size_t i = 0; i < c["images"].size(); ++i) {
        r.images.push_back({.path = kFixtures + "/vision-f32/synthetic_tiny.png"});
      }
      for (const auto& name : c["videos"]) r.videos.push_back(clip(name));
      add(r, 20);
    }
  } else {
    for (int i = 0; i < 5; ++i) {
      GenerateRequest r;
      for (int j = 0; j < 3 + (i * 11) % 30; ++j) {
        r.prompt_ids.push_back(3 + (i * 131 + j * 17) % 990);
      }
      add(r, 24 + 3 * i);
    }
  }
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) out.push_back(out[i]);
  return out;
}

// An oracle proposer: the plain output's own next tokens, found by the expanded prompt (`wrong`:
// each one id off, so the first proposal always fails).
SpecOptions oracle(std::shared_ptr<std::map<std::vector<int32_t>, std::vector<int32_t>>> replies,
                   bool wrong, int64_t vocab) {
  SpecOptions s;
  s.method = SpecMethod::kCustom;
  s.num_tokens = kK;
  s.propose = [replies, wrong, vocab](std::span<const int32_t> ids, int64_t prompt_len,
                                      int32_t max_k, int32_t* out) -> int32_t {
    auto it = replies->find(std::vector<int32_t>(ids.begin(), ids.begin() + prompt_len));
    if (it == replies->end()) return 0;
    const std::vector<int32_t>& reply = it->second;
    const size_t g = ids.size() - static_cast<size_t>(prompt_len);
    int32_t k = 0;
    for (; k < max_k && g + static_cast<size_t>(k) < reply.size(); ++k) {
      const int32_t t = reply[g + static_cast<size_t>(k)];
      out[k] = wrong ? static_cast<int32_t>((t + 1) % vocab) : t;
    }
    return k;
  };
  return s;
}

// The plain replies by expanded prompt, for the oracle.
std::shared_ptr<std::map<std::vector<int32_t>, std::vector<int32_t>>> replies_of(
    const Engine& e, const std::vector<GenerateRequest>& reqs, const std::vector<Output>& want) {
  auto m = std::make_shared<std::map<std::vector<int32_t>, std::vector<int32_t>>>();
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto ids = e.prompt_tokens(reqs[i]);
    EXPECT_TRUE(ids.ok()) << ids.status().message();
    if (ids.ok()) (*m)[*ids] = want[i].tokens;
  }
  return m;
}

// Every pass under 32 rows (4 × (1 + 4) decode rows, or 24 tokens in all): each row's numbers
// are then those of a one-row step (docs/architecture.md), and the plain reference runs with the
// same limits, so that its prompt chunks are the same size too.
BatchingOptions exact_batching() {
  BatchingOptions b;
  b.block_size = 4;
  b.max_num_seqs = 4;
  b.max_batched_tokens = 24;
  return b;
}

// kDraftSelf: the fixture drafts for itself (its proposals are the plain output's, but for
// rounding); kDraftCut: all its layers but the last do (a layer-skipping draft with the same
// tokenizer and vision tower, which agrees with it part of the time: 8-37% of proposals).
// kMtp: the fixture with a random MTP head (qwen35-mtp; it agrees with the model now and then).
enum class Proposal { kNgram, kOracle, kWrong, kDraftSelf, kDraftCut, kMtp };

// The text decoder's layer count of a fixture.
int64_t fixture_layers(const std::string& fixture) {
  const auto cfg =
      nlohmann::json::parse(test_util::read_file(kFixtures + "/" + fixture + "/config.json"));
  return (cfg.contains("text_config") ? cfg["text_config"] : cfg)["num_hidden_layers"];
}

class SpecGreedy
    : public ::testing::TestWithParam<std::tuple<const char*, Proposal, bool /*preempt*/>> {};

TEST_P(SpecGreedy, EqualsPlainDecodingTokenForToken) {
  const auto [fixture, proposal, preempt] = GetParam();
  BatchingOptions b = exact_batching();
  auto plain = load(fixture, b);
  ASSERT_NE(plain, nullptr);
  const std::vector<GenerateRequest> reqs = requests_for(fixture, *plain);
  const std::vector<Output> want = run_alone(*plain, reqs);
  if (preempt) {  // room for the longest request and a little: the others must make way
    int64_t most = 0;
    for (const auto& r : reqs) {
      auto ids = plain->prompt_tokens(r);
      ASSERT_TRUE(ids.ok());
      most = std::max<int64_t>(most, static_cast<int64_t>(ids->size()) + *r.max_new_tokens);
    }
    b.num_blocks = static_cast<int32_t>((most + b.block_size - 1) / b.block_size + 3);
  }
  test_util::TempDir cut;
  std::string model = fixture;  // the one with proposals
  if (proposal == Proposal::kMtp) {
    ASSERT_TRUE(test_util::write_mtp_fixture(fixture, cut.path(), /*echo=*/true).ok());
    model = cut.path().string();
    b.spec.method = SpecMethod::kMtp;
    b.spec.num_tokens = kK;
  } else if (proposal == Proposal::kNgram) {
    b.spec.method = SpecMethod::kNgram;
    b.spec.num_tokens = kK;
    b.spec.ngram_min = 1;
    b.spec.ngram_max = 3;
  } else if (proposal == Proposal::kDraftSelf || proposal == Proposal::kDraftCut) {
    b.spec.method = SpecMethod::kDraft;
    b.spec.num_tokens = kK;
    b.spec.draft_model = kFixtures + "/" + fixture;
    if (proposal == Proposal::kDraftCut) {
      ASSERT_TRUE(test_util::write_truncated_fixture(
                      fixture, std::max<int64_t>(1, fixture_layers(fixture) - 1), cut.path())
                      .ok());
      b.spec.draft_model = cut.path().string();
    }
  } else {
    b.spec =
        oracle(replies_of(*plain, reqs, want), proposal == Proposal::kWrong, plain->vocab_size());
  }
  auto spec = load(model, b);
  ASSERT_NE(spec, nullptr);
  const std::vector<Output> got = run_all(*spec, reqs);
  ASSERT_EQ(got.size(), want.size());
  // Images encoded together (the tower batches the images of requests admitted at once) differ
  // from images encoded alone by rounding, with or without proposals, and so does a hybrid
  // model's prompt state prefilled in other chunks (its chunked form sums by chunk): there the
  // logprobs agree to 1e-5 (a hybrid's 1e-4) and the tokens exactly; elsewhere bit for bit.
  const std::string name = fixture;
  const bool hybrid = name.rfind("qwen35", 0) == 0;
  const bool media = name == "vision-f32" || name == "video-f32" || hybrid;
  int64_t cached = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    cached += got[i].cached_tokens;
    if (!media) {
      EXPECT_EQ(got[i], want[i]) << "request " << i;
      continue;
    }
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "request " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << "request " << i;
    ASSERT_EQ(got[i].logprobs.size(), want[i].logprobs.size()) << "request " << i;
    for (size_t t = 0; t < want[i].logprobs.size(); ++t) {
      EXPECT_NEAR(got[i].logprobs[t], want[i].logprobs[t], hybrid ? 1e-4 : 1e-5) << "request " << i;
    }
  }
  // A hybrid model's requests one at a time on a fresh engine (their prompts then prefilled in
  // the same chunks as the reference's, and their prefix hits resumed from the same snapshots):
  // the verify rows, run token by token with each state kept, and the state rolled back to where
  // the accepted tokens end, give the plain output bit for bit.
  if (hybrid) {
    auto fresh = load(model, b);
    ASSERT_NE(fresh, nullptr);
    const std::vector<Output> alone = run_alone(*fresh, reqs);
    int64_t cached_alone = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(alone[i], want[i]) << "request " << i;
      cached_alone += alone[i].cached_tokens;
    }
    if (!preempt) EXPECT_GT(cached_alone, 0);  // the second of a pair resumed from a snapshot
  }
  const Engine::CoreStats st = spec->core_stats();
  EXPECT_EQ(st.spec_tokens, kK);
  EXPECT_GT(st.spec_drafts, 0);
  EXPECT_LE(st.spec_accepted_tokens, st.spec_draft_tokens);
  int64_t per_pos = 0;
  for (int64_t a : st.spec_accepted_per_pos) per_pos += a;
  EXPECT_EQ(per_pos, st.spec_accepted_tokens);
  EXPECT_EQ(st.kv_blocks_used, 0);
  if (proposal == Proposal::kWrong) EXPECT_EQ(st.spec_accepted_tokens, 0);
  std::printf("%lld of %lld proposals accepted in %lld verifies\n",
              static_cast<long long>(st.spec_accepted_tokens),
              static_cast<long long>(st.spec_draft_tokens), static_cast<long long>(st.spec_drafts));
  if (proposal == Proposal::kOracle) EXPECT_GT(st.spec_accepted_tokens, st.spec_drafts);
  if (proposal == Proposal::kDraftCut) EXPECT_GT(st.spec_accepted_tokens, 0);
  // Drafting for itself, with the images and videos through its own tower: all but a rounding
  // tie accepted.
  if (proposal == Proposal::kDraftSelf) {
    EXPECT_GE(st.spec_accepted_tokens * 20, st.spec_draft_tokens * 19);
  }
  if (preempt) {
    EXPECT_GT(st.preemptions, 0);
  } else if (!hybrid) {    // (a hybrid's hits need its snapshots: checked one at a time below)
    EXPECT_GT(cached, 0);  // the second of each pair read the first's blocks
  }
}

// The test's name: fixture, proposer, and whether it preempts.
std::string spec_test_name(
    const ::testing::TestParamInfo<std::tuple<const char*, Proposal, bool>>& info) {
  std::string name = std::get<0>(info.param);
  std::replace(name.begin(), name.end(), '-', '_');
  const Proposal p = std::get<1>(info.param);
  name += p == Proposal::kNgram       ? "_ngram"
          : p == Proposal::kOracle    ? "_oracle"
          : p == Proposal::kWrong     ? "_wrong"
          : p == Proposal::kDraftSelf ? "_draft_self"
          : p == Proposal::kMtp       ? "_mtp"
                                      : "_draft_cut";
  return name + (std::get<2>(info.param) ? "_preempt" : "");
}

// Qwen3.5 (linear attention): a verify row's state after each token is kept, and the state
// where its accepted tokens end replaces the one that ran past (docs/architecture.md); a hybrid
// draft goes back to its state before the first proposal not kept. (qwen35-f32-b's first three
// layers, linear and full attention, draft for it.)
INSTANTIATE_TEST_SUITE_P(
    Hybrid, SpecGreedy,
    ::testing::Combine(::testing::Values("qwen35-f32-a", "qwen35-f32-b", "qwen35moe-f32-a"),
                       ::testing::Values(Proposal::kNgram, Proposal::kOracle, Proposal::kWrong,
                                         Proposal::kDraftSelf),
                       ::testing::Bool()),
    spec_test_name);
// Qwen3.5's MTP head (the fixtures with a head: one dense, one MoE), its rows over the images'
// features.
INSTANTIATE_TEST_SUITE_P(Mtp, SpecGreedy,
                         ::testing::Combine(::testing::Values("qwen35-f32-a", "qwen35moe-f32-a"),
                                            ::testing::Values(Proposal::kMtp), ::testing::Bool()),
                         spec_test_name);
INSTANTIATE_TEST_SUITE_P(HybridCut, SpecGreedy,
                         ::testing::Combine(::testing::Values("qwen35-f32-b"),
                                            ::testing::Values(Proposal::kDraftCut),
                                            ::testing::Bool()),
                         spec_test_name);

INSTANTIATE_TEST_SUITE_P(
    Fixtures, SpecGreedy,
    ::testing::Combine(::testing::Values("text-f32-untied", "moe-f32-e8k2", "vision-f32",
                                         "video-f32"),
                       ::testing::Values(Proposal::kNgram, Proposal::kOracle, Proposal::kWrong,
                                         Proposal::kDraftSelf, Proposal::kDraftCut),
                       ::testing::Bool()),
    spec_test_name);

// A hybrid model's reply snapshots under proposals: a verify row's snapshot point is after its
// first token, saved from that token's own state (not the slot's, which ran on over the
// proposals). The next turn (prompt, reply, one more token) resumes from a snapshot inside the
// reply and replies as it does after plain decoding, bit for bit, with proposals accepted (the
// oracle) and rejected (always wrong).
TEST(SpecDecode, AHybridModelsReplySnapshotsAreTakenWhereTheirTokensAre) {
  BatchingOptions b = exact_batching();
  b.state_snapshot_interval = 8;
  b.state_snapshots = 64;
  auto plain = load("qwen35-f32-b", b);
  ASSERT_NE(plain, nullptr);
  std::vector<GenerateRequest> turn1 = requests_for("qwen35-f32-b", *plain);
  turn1.resize(1);
  turn1[0].max_new_tokens = 30;
  const Output reply = run_alone(*plain, turn1)[0];
  GenerateRequest turn2 = turn1[0];
  turn2.prompt_ids.insert(turn2.prompt_ids.end(), reply.tokens.begin(), reply.tokens.end());
  turn2.prompt_ids.push_back(7);
  turn2.max_new_tokens = 12;
  const Output want = run_alone(*plain, {turn2})[0];
  for (const bool wrong : {false, true}) {
    BatchingOptions sb = b;
    sb.spec = oracle(replies_of(*plain, turn1, {reply}), wrong, plain->vocab_size());
    auto spec = load("qwen35-f32-b", sb);
    ASSERT_NE(spec, nullptr);
    EXPECT_EQ(run_alone(*spec, turn1)[0], reply);
    const Output got = run_alone(*spec, {turn2})[0];
    EXPECT_EQ(got, want) << (wrong ? "wrong proposals" : "the oracle's");
    // It resumed inside the reply (prompt snapshots alone end before it).
    EXPECT_GT(got.cached_tokens, static_cast<int64_t>(turn1[0].prompt_ids.size()));
    EXPECT_EQ(got.cached_tokens, want.cached_tokens);
    EXPECT_GT(spec->core_stats().spec_drafts, 0);
  }
}

// Alone, the oracle's proposals are all accepted: K + 1 tokens a step after the prefill's one,
// the last step's proposals cut so that the reply ends at max_tokens exactly.
TEST(SpecDecode, OracleMakesKPlusOneTokensAStep) {
  auto plain = load("text-f32-untied", exact_batching());
  ASSERT_NE(plain, nullptr);
  std::vector<GenerateRequest> reqs = requests_for("text-f32-untied", *plain);
  reqs.resize(1);
  reqs[0].max_new_tokens = 1 + 3 * (kK + 1) + 2;  // three full steps, then one of 2 tokens
  const std::vector<Output> want = run_alone(*plain, reqs);
  BatchingOptions b = exact_batching();
  b.spec = oracle(replies_of(*plain, reqs, want), false, plain->vocab_size());
  auto spec = load("text-f32-untied", b);
  ASSERT_NE(spec, nullptr);
  const int64_t steps0 = spec->core_stats().steps;
  EXPECT_EQ(run_all(*spec, reqs)[0], want[0]);
  const Engine::CoreStats st = spec->core_stats();
  EXPECT_EQ(st.steps - steps0, 1 + 4);  // the prefill, three steps of K + 1, one of 2
  EXPECT_EQ(st.spec_drafts, 4);
  EXPECT_EQ(st.spec_draft_tokens, 3 * kK + 1);
  EXPECT_EQ(st.spec_accepted_tokens, 3 * kK + 1);
  EXPECT_EQ(st.spec_accepted_per_pos[0], 4);
  for (int j = 1; j < kK; ++j) EXPECT_EQ(st.spec_accepted_per_pos[j], 3) << "position " << j;
}

// A draft model sees the request's images through its own vision tower: the vision fixture
// drafting for itself has its proposals accepted for image prompts, the same checkpoint without
// its tower (which sees each image as its pad tokens) far less often.
TEST(SpecDecode, TheDraftModelSeesTheImages) {
  auto plain = load("vision-f32", exact_batching());
  ASSERT_NE(plain, nullptr);
  std::vector<GenerateRequest> reqs = requests_for("vision-f32", *plain);
  reqs.resize(reqs.size() / 2);  // each image case once
  const std::vector<Output> want = run_alone(*plain, reqs);
  test_util::TempDir blind;
  ASSERT_TRUE(test_util::write_truncated_fixture("vision-f32", fixture_layers("vision-f32"),
                                                 blind.path(), /*drop_vision=*/true)
                  .ok());
  double rate[2] = {};
  for (int arm = 0; arm < 2; ++arm) {
    BatchingOptions b = exact_batching();
    b.spec.method = SpecMethod::kDraft;
    b.spec.num_tokens = kK;
    b.spec.adaptive = false;
    b.spec.draft_model = arm == 0 ? kFixtures + "/vision-f32" : blind.path().string();
    auto spec = load("vision-f32", b);
    ASSERT_NE(spec, nullptr);
    const std::vector<Output> got = run_all(*spec, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens);
    const Engine::CoreStats st = spec->core_stats();
    rate[arm] = static_cast<double>(st.spec_accepted_tokens) /
                static_cast<double>(std::max<int64_t>(st.spec_draft_tokens, 1));
  }
  std::printf("accepted: %.3f with the draft's tower, %.3f without\n", rate[0], rate[1]);
  EXPECT_GE(rate[0], 0.95);
  EXPECT_LT(rate[1], 0.8);
}

// A draft model's KV cache comes out of the same budget: with kv_cache_memory set, the target
// and the draft each get as many blocks as fit both caches' blocks together (one more each is
// scratch), and the stats count both.
TEST(SpecDecode, TheDraftModelsCacheComesOutOfTheSameBudget) {
  constexpr int64_t kBudget = 4 << 20, kBs = 16;
  auto block_bytes = [&](const std::string& fixture) {
    const auto cfg =
        nlohmann::json::parse(test_util::read_file(kFixtures + "/" + fixture + "/config.json"));
    const auto& tc = cfg["text_config"];
    const int64_t hd = tc.value(
        "head_dim", tc["hidden_size"].get<int64_t>() / tc["num_attention_heads"].get<int64_t>());
    return tc["num_hidden_layers"].get<int64_t>() * 2 * kBs *
           tc["num_key_value_heads"].get<int64_t>() * hd * 4;  // f32 K and V
  };
  const int64_t target = block_bytes("text-f32-untied"), draft = block_bytes("moe-f32-e8k2");
  BatchingOptions b;
  b.kv_cache_memory = kBudget;
  b.spec.method = SpecMethod::kDraft;
  b.spec.draft_model = kFixtures + "/moe-f32-e8k2";
  auto e = load("text-f32-untied", b);
  ASSERT_NE(e, nullptr);
  const Engine::CoreStats st = e->core_stats();
  EXPECT_EQ(st.kv_blocks_total, kBudget / (target + draft) - 1);
  EXPECT_EQ(st.kv_cache_bytes, (st.kv_blocks_total + 1) * (target + draft));
  EXPECT_LE(st.kv_cache_bytes, kBudget);
  GenerateRequest r = requests_for("text-f32-untied", *e)[0];
  EXPECT_EQ(run_all(*e, {r})[0].tokens.size(), static_cast<size_t>(*r.max_new_tokens));
}

// A hybrid model with proposals: each state slot has K more beside it (a verify row's state after
// each token), and they come out of the same budget as the slots, the snapshots and the blocks.
TEST(SpecDecode, AHybridModelsVerifyStatesComeOutOfTheBudget) {
  constexpr int64_t kBudget = 64 << 20;
  BatchingOptions b;
  b.kv_cache_memory = kBudget;
  b.max_num_seqs = 4;
  b.state_snapshots = 3;
  auto plain = load("qwen35-f32-a", b);
  b.spec.method = SpecMethod::kNgram;
  b.spec.num_tokens = kK;
  auto spec = load("qwen35-f32-a", b);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(spec, nullptr);
  const Engine::CoreStats p = plain->core_stats(), st = spec->core_stats();
  EXPECT_EQ(p.state_memory_bytes, (4 + 3) * p.state_slot_bytes);
  EXPECT_EQ(st.state_memory_bytes, (4 + 4 * kK + 3) * st.state_slot_bytes);
  EXPECT_LE(st.state_memory_bytes + st.kv_cache_bytes, kBudget);
  EXPECT_LT(st.kv_blocks_total, p.kv_blocks_total);  // the verify states took blocks' room
}

// A stop token inside a run of accepted proposals ends the reply there; penalties and a logit
// bias shape the verified rows as they shape plain ones (greedy picks they change).
TEST(SpecDecode, StopTokensPenaltiesAndBiasHoldInsideAcceptedRuns) {
  auto plain = load("text-f32-untied", exact_batching());
  ASSERT_NE(plain, nullptr);
  std::vector<GenerateRequest> reqs = requests_for("text-f32-untied", *plain);
  reqs.resize(3);
  const std::vector<Output> free_run = run_alone(*plain, reqs);
  ASSERT_GE(free_run[0].tokens.size(), 12u);
  const int32_t stop = free_run[0].tokens[9];
  reqs[0].stop_token_ids = {stop};
  reqs[0].ignore_eos = false;  // (ignore_eos would drop the stop ids too)
  reqs[1].sampling.repetition_penalty = 1.5;
  reqs[1].sampling.presence_penalty = 0.5;
  reqs[2].sampling.logit_bias = {{free_run[2].tokens[3], 5.0f}, {free_run[2].tokens[4], -5.0f}};
  const std::vector<Output> want = run_alone(*plain, reqs);
  EXPECT_LE(want[0].tokens.size(), 10u);
  EXPECT_EQ(want[0].reason, FinishReason::kStop);
  EXPECT_NE(want[1].tokens, free_run[1].tokens);  // the penalties changed greedy picks
  EXPECT_NE(want[2].tokens, free_run[2].tokens);  // and so did the bias
  BatchingOptions b = exact_batching();
  // The oracle proposes the unpenalised replies: accepted where the penalties agree.
  b.spec = oracle(replies_of(*plain, reqs, free_run), false, plain->vocab_size());
  auto spec = load("text-f32-untied", b);
  ASSERT_NE(spec, nullptr);
  const std::vector<Output> got = run_all(*spec, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_GT(spec->core_stats().spec_accepted_tokens, 0);
}

// A stop token that is an accepted proposal ends the reply inside its verify row: the row's later
// tokens are neither sampled nor counted, so the counters hold the proposals accepted up to the
// stop (every position but each step's last, whose token follows the proposals).
TEST(SpecDecode, AStopInsideAnAcceptedRunEndsTheRowAndItsCount) {
  auto plain = load("text-f32-untied", exact_batching());
  ASSERT_NE(plain, nullptr);
  std::vector<GenerateRequest> reqs = requests_for("text-f32-untied", *plain);
  reqs.resize(1);
  const std::vector<Output> free_run = run_alone(*plain, reqs);
  const std::vector<int32_t>& reply = free_run[0].tokens;
  // The first token from the 7th on that is new to the reply and not a step's last.
  size_t at = 6;
  while (at < reply.size() && (at % (kK + 1) == 0 || std::find(reply.begin(), reply.begin() + at,
                                                               reply[at]) != reply.begin() + at)) {
    ++at;
  }
  ASSERT_LT(at, reply.size());
  reqs[0].stop_token_ids = {reply[at]};
  reqs[0].ignore_eos = false;
  const std::vector<Output> want = run_alone(*plain, reqs);
  ASSERT_EQ(want[0].tokens.size(), at + 1);
  ASSERT_EQ(want[0].reason, FinishReason::kStop);
  BatchingOptions b = exact_batching();
  b.spec = oracle(replies_of(*plain, reqs, free_run), false, plain->vocab_size());
  auto spec = load("text-f32-untied", b);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(run_all(*spec, reqs)[0], want[0]);
  const Engine::CoreStats st = spec->core_stats();
  int64_t accepted = 0;  // tokens 1..at that were proposals: all but each step's last
  for (size_t i = 1; i <= at; ++i) accepted += i % (kK + 1) != 0;
  EXPECT_EQ(st.spec_accepted_tokens, accepted);
  EXPECT_EQ(st.spec_drafts, static_cast<int64_t>((at + kK) / (kK + 1)));
  EXPECT_EQ(st.spec_draft_tokens, kK * st.spec_drafts);
}

// A reply that ends in a verify step leaves the blocks its accepted proposals filled in the prefix
// cache, as plain decoding leaves the blocks its steps computed: the next turn (the prompt, the
// reply and one more token) finds as much of itself cached either way.
TEST(SpecDecode, ARequestEndingInAVerifyStepLeavesItsBlocksCached) {
  auto plain = load("text-f32-untied", exact_batching());
  ASSERT_NE(plain, nullptr);
  std::vector<GenerateRequest> first = requests_for("text-f32-untied", *plain);
  first.resize(1);
  first[0].max_new_tokens = 21;
  const std::vector<Output> reply = run_alone(*plain, first);
  GenerateRequest next = first[0];
  next.prompt_ids.insert(next.prompt_ids.end(), reply[0].tokens.begin(), reply[0].tokens.end());
  next.prompt_ids.push_back(7);
  next.max_new_tokens = 2;
  const int64_t plain_cached = run_alone(*plain, {next})[0].cached_tokens;
  BatchingOptions b = exact_batching();
  b.spec = oracle(replies_of(*plain, first, reply), false, plain->vocab_size());
  auto spec = load("text-f32-untied", b);
  ASSERT_NE(spec, nullptr);
  EXPECT_EQ(run_alone(*spec, first)[0], reply[0]);
  EXPECT_GT(spec->core_stats().spec_accepted_tokens, 0);
  const int64_t spec_cached = run_alone(*spec, {next})[0].cached_tokens;
  EXPECT_GT(plain_cached, static_cast<int64_t>(first[0].prompt_ids.size()));
  EXPECT_EQ(spec_cached, plain_cached);
}

// A checkpoint's text decoder on the CPU as a draft model, and DraftProposers over it (K = kK,
// blocks of 4 tokens, two requests at a time).
struct DraftUnderTest {
  ThreadPool pool{2};
  ops::CpuBackend be{pool, ops::detected_isa()};
  Result<test_util::FixtureModel> fm = internal_error("not loaded");
  std::unique_ptr<TextDecoder> dec;
  DraftModel m;

  Status load(const std::string& dir) {
    fm = test_util::load_fixture_model(dir);
    VLM_RETURN_IF_ERROR(fm.status());
    VLM_ASSIGN_OR_RETURN(dec, TextDecoder::create(fm->cfg, fm->text, be, 32));
    m.decoder = dec.get();
    m.vocab_size = fm->cfg.text_config.vocab_size;
    return ok_status();
  }
  // A proposer of `num_blocks` blocks, tables of up to `max_blocks_per_seq` (null on an error).
  std::unique_ptr<DraftProposer> proposer(int32_t num_blocks, int64_t max_blocks_per_seq) {
    SpecOptions spec;
    spec.method = SpecMethod::kDraft;
    spec.num_tokens = kK;
    auto p = DraftProposer::create(m, spec, m.vocab_size, num_blocks, 4, max_blocks_per_seq, 2);
    EXPECT_TRUE(p.ok()) << p.status().message();
    return p.ok() ? std::move(p).value() : nullptr;
  }
};

// A draft model's proposals, made step after step from what its cache holds (the proposals it
// fed that were kept, a hybrid draft's state rolled back to the last one kept), equal those of a
// draft that computes the whole sequence afresh, whatever the target keeps of them: none, some,
// all. Two requests share its passes. A sequence longer than a pass goes in over several calls.
TEST(DraftProposer, IncrementalProposalsEqualFreshOnes) {
  for (const std::string fixture : {"qwen35-f32-b", "text-f32-untied"}) {
    SCOPED_TRACE(fixture);
    // The fixture with its token mixers amplified: each proposal then depends on what the cache
    // holds of the whole sequence, not mostly on the last token.
    test_util::TempDir dir;
    ASSERT_TRUE(
        test_util::write_truncated_fixture(fixture, fixture_layers(fixture), dir.path(), false, 8)
            .ok());
    DraftUnderTest t;
    ASSERT_TRUE(t.load(dir.path().string()).ok());
    auto make = [&] { return t.proposer(64, 32); };
    std::unique_ptr<DraftProposer> draft = make();
    std::vector<int32_t> ids[2];
    std::vector<int64_t> pos;
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 9 + 5 * r; ++i) ids[r].push_back(3 + (i * 37 + r * 11) % 400);
    }
    uint32_t rng = 12345;
    auto next = [&] { return rng = rng * 1664525u + 1013904223u; };
    int64_t kept = 0, rolled_back = 0;
    for (int round = 0; round < 14; ++round) {
      pos.resize(std::max(ids[0].size(), ids[1].size()));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i);
      std::vector<int32_t> no_features[2], out[2], fresh_out(kK);
      ProposeJob jobs[2];
      for (int r = 0; r < 2; ++r) {
        no_features[r].assign(ids[r].size(), -1);
        out[r].assign(kK, -1);
        jobs[r].in = {
            ids[r], no_features[r], 9, r + 1, Positions3{pos.data(), pos.data(), pos.data()},
            nullptr};
        jobs[r].max_k = kK;
        jobs[r].out = out[r].data();
      }
      ASSERT_TRUE(draft->propose_batch(jobs).ok());
      for (int r = 0; r < 2; ++r) {
        // A fresh draft takes a pass's worth (32 tokens) of a sequence a call, proposing nothing
        // until it has the whole of it.
        std::unique_ptr<DraftProposer> fresh = make();
        int32_t k = 0, calls = 0;
        while (k == 0 && calls < 8) {
          k = fresh->propose(jobs[r].in, kK, fresh_out.data());
          ++calls;
        }
        EXPECT_EQ(calls, (static_cast<int64_t>(ids[r].size()) + 31) / 32);
        ASSERT_EQ(jobs[r].k, k) << "round " << round << ", request " << r;
        for (int32_t j = 0; j < k; ++j) {
          EXPECT_EQ(out[r][j], fresh_out[j]) << "round " << round << ", request " << r;
        }
        // The target keeps a of them, then its own token (the next proposal, or another).
        const int32_t a = static_cast<int32_t>(next() % static_cast<uint32_t>(k + 1));
        ids[r].insert(ids[r].end(), out[r].begin(), out[r].begin() + a);
        ids[r].push_back(a < k && next() % 3 == 0 ? out[r][a] : 3 + next() % 400);
        kept += a;
        rolled_back += a < k - 1 ? 1 : 0;
      }
    }
    EXPECT_GT(kept, 10);
    EXPECT_GT(rolled_back, 5);
  }
}

// A draft whose cache holds two requests' blocks (and, hybrid, two state slots): a third
// request takes those of the one that proposed least recently, which starts over when it
// proposes again; every proposal equals a fresh draft's.
TEST(DraftProposer, ARequestWithoutRoomTakesTheLeastRecentOnes) {
  for (const std::string fixture : {"qwen35-f32-b", "text-f32-untied"}) {
    SCOPED_TRACE(fixture);
    DraftUnderTest t;
    ASSERT_TRUE(t.load(kFixtures + "/" + fixture).ok());
    // 12 prompt tokens + 3 fed proposals: 4 blocks of 4 a request, 8 in all.
    std::unique_ptr<DraftProposer> draft = t.proposer(8, 8), fresh = t.proposer(8, 8);
    std::vector<int64_t> pos(12);
    for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int64_t>(i);
    const std::vector<int32_t> rows(12, -1);
    std::vector<int32_t> ids[4];
    for (int r = 1; r <= 3; ++r) {
      for (int i = 0; i < 12; ++i) ids[r].push_back(3 + (i * 29 + r * 53) % 400);
    }
    auto input = [&](int r) {
      return ProposeInput{ids[r], rows, 12, r, Positions3{pos.data(), pos.data(), pos.data()},
                          nullptr};
    };
    auto check = [&](int r) {
      std::vector<int32_t> out(kK), want(kK);
      const int32_t k = draft->propose(input(r), kK, out.data());
      fresh->forget(r);
      ASSERT_EQ(k, kK) << "request " << r;
      ASSERT_EQ(fresh->propose(input(r), kK, want.data()), kK);
      EXPECT_EQ(out, want) << "request " << r;
    };
    check(1);
    check(2);
    check(3);  // takes request 1's blocks (and slot)
    check(1);  // starts over, taking request 2's
    check(3);
  }
}

// Prompt lookup: the longest n-gram first, its latest earlier place, the ids after it up to
// max_k, never a placeholder; nothing below ngram_min.
TEST(NgramProposer, ProposesWhatFollowedTheLongestLatestMatch) {
  auto propose = [](NgramProposer& p, const std::vector<int32_t>& ids, int32_t max_k,
                    std::vector<int32_t> rows = {}) {
    if (rows.empty()) rows.assign(ids.size(), -1);
    std::vector<int32_t> out(static_cast<size_t>(max_k));
    const int32_t k = p.propose({ids, rows, 2}, max_k, out.data());
    out.resize(static_cast<size_t>(k));
    return out;
  };
  NgramProposer p(1, 3);
  EXPECT_EQ(propose(p, {1, 2, 3, 4, 9, 1, 2, 3}, 3), (std::vector<int32_t>{4, 9, 1}));
  EXPECT_EQ(propose(p, {1, 2, 3, 4, 9, 1, 2, 3}, 8), (std::vector<int32_t>{4, 9, 1, 2, 3}));
  EXPECT_EQ(propose(p, {5, 6, 7, 5, 6, 8, 5, 6}, 2), (std::vector<int32_t>{8, 5}));  // latest
  // [1 2 3] (3 ids) beats the later [2 3] (2 ids).
  EXPECT_EQ(propose(p, {1, 2, 3, 40, 2, 3, 50, 1, 2, 3}, 1), (std::vector<int32_t>{40}));
  // A placeholder ends a proposal; one right after the match leaves that place out.
  EXPECT_EQ(propose(p, {1, 2, 7, 8, 1, 2}, 4, {-1, -1, -1, 0, -1, -1}), (std::vector<int32_t>{7}));
  EXPECT_EQ(propose(p, {4, 1, 2, 7, 1, 2}, 4, {-1, -1, -1, 0, -1, -1}), (std::vector<int32_t>{}));
  EXPECT_EQ(propose(p, {1, 2, 3, 4}, 4), (std::vector<int32_t>{}));  // no id repeats
  NgramProposer two(2, 3);
  EXPECT_EQ(propose(two, {1, 9, 3, 1}, 4), (std::vector<int32_t>{}));  // only 1 id matches
  EXPECT_EQ(propose(two, {9, 1, 5, 9, 1}, 4), (std::vector<int32_t>{5, 9, 1}));
}

TEST(SpecDecode, BadOptionsAndHybridModelsAreRefusedByName) {
  auto refused = [](const std::string& fixture, SpecOptions s, const std::string& what) {
    BatchingOptions b;
    b.spec = std::move(s);
    auto e = Engine::load(options(fixture, b));
    ASSERT_FALSE(e.ok()) << what;
    EXPECT_NE(e.status().message().find(what), std::string::npos) << e.status().message();
  };
  SpecOptions s;
  s.method = SpecMethod::kNgram;
  s.num_tokens = 0;
  refused("text-f32-untied", s, "--spec-tokens");
  s.num_tokens = SpecOptions::kMaxTokens + 1;
  refused("text-f32-untied", s, "--spec-tokens");
  s.num_tokens = 4;
  s.ngram_min = 3;
  s.ngram_max = 2;
  refused("text-f32-untied", s, "--ngram-max");
  s.ngram_min = 1;
  SpecOptions custom;
  custom.method = SpecMethod::kCustom;
  refused("text-f32-untied", custom, "propose");
  s.draft_model = kFixtures + "/text-f32-untied";
  refused("text-f32-untied", s, "--spec-draft-model is for --spec draft");
  // A draft model: named, loadable, with the target's tokenizer, and no linear attention.
  SpecOptions d;
  d.method = SpecMethod::kDraft;
  refused("text-f32-untied", d, "--spec-draft-model");
  d.draft_model = kFixtures + "/no-such-model";
  refused("text-f32-untied", d, "loading the draft model");
  d.draft_model = kFixtures + "/tiny-fullvocab-bf16";
  refused("text-f32-untied", d, "its vocabulary is 151936 ids, this model's 1024");
  d.draft_model = kFixtures + "/text-f32-untied";
  refused("video-f32", d, "it has no tokenizer.json");
  test_util::TempDir other;  // video-f32 with two tokens of its tokenizer swapped
  ASSERT_TRUE(test_util::write_truncated_fixture("video-f32", 1, other.path()).ok());
  auto tok = nlohmann::json::parse(test_util::read_file(other.path() / "tokenizer.json"));
  auto& vocab = tok["model"]["vocab"];
  std::swap(vocab["a"], vocab["b"]);
  std::ofstream(other.path() / "tokenizer.json") << tok.dump();
  d.draft_model = other.path().string();
  refused("video-f32", d, "its tokenizer differs at id");
  EXPECT_TRUE(parse_spec_method("draft").ok());
  EXPECT_TRUE(parse_spec_method("ngram").ok());
  EXPECT_FALSE(parse_spec_method("eagle").ok());
}

}  // namespace
}  // namespace vlm

namespace vlm {
namespace {

// The upper tail of the chi-square distribution with `df` degrees of freedom at x: the
// regularized upper incomplete gamma Q(df / 2, x / 2), by its series below a + 1 and its
// continued fraction above (Numerical Recipes' gammq).
double chi2_sf(double x, double df) {
  const double a = df / 2, z = x / 2;
  if (z <= 0) return 1;
  const double log_pre = -z + a * std::log(z) - std::lgamma(a);
  if (z < a + 1) {
    double sum = 1 / a, term = sum;
    for (int n = 1; n < 10000 && term > sum * 1e-15; ++n) sum += (term *= z / (a + n));
    return 1 - sum * std::exp(log_pre);
  }
  double b = z + 1 - a, c = 1e300, d = 1 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2;
    d = an * d + b;
    d = std::abs(d) < 1e-300 ? 1e-300 : d;
    c = b + an / c;
    c = std::abs(c) < 1e-300 ? 1e-300 : c;
    d = 1 / d;
    const double del = d * c;
    h *= del;
    if (std::abs(del - 1) < 1e-15) break;
  }
  return std::exp(log_pre) * h;
}

// The chi-square test of homogeneity of two samples of equal size over kBins bins: `draft` alone,
// and the other ids in order of their pooled counts (a choice symmetric in the two samples), cut
// into bins of about equal pooled counts. The statistic and its degrees of freedom.
constexpr int kBins = 8;
std::pair<double, int> chi2_two_samples(const std::map<int32_t, int64_t>& a,
                                        const std::map<int32_t, int64_t>& b, int32_t draft) {
  std::map<int32_t, std::pair<int64_t, int64_t>> both;
  for (const auto& [k, n] : a) both[k].first += n;
  for (const auto& [k, n] : b) both[k].second += n;
  std::vector<std::pair<int64_t, int64_t>> bins{both[draft]};
  both.erase(draft);
  std::vector<std::pair<int64_t, int64_t>> rest;
  int64_t pooled = 0;
  for (const auto& [k, ab] : both) {
    rest.push_back(ab);
    pooled += ab.first + ab.second;
  }
  std::sort(rest.begin(), rest.end(),
            [](const auto& x, const auto& y) { return x.first + x.second > y.first + y.second; });
  const int64_t per_bin = pooled / (kBins - 1) + 1;
  bins.emplace_back(0, 0);
  for (const auto& ab : rest) {
    if (bins.back().first + bins.back().second >= per_bin) bins.emplace_back(0, 0);
    bins.back().first += ab.first;
    bins.back().second += ab.second;
  }
  double stat = 0;
  for (const auto& [x, y] : bins) {
    if (x + y > 0) stat += static_cast<double>((x - y) * (x - y)) / static_cast<double>(x + y);
  }
  return {stat, static_cast<int>(bins.size()) - 1};
}

// The 2nd, 3rd and 4th tokens of kDraws sampled replies to `base` (seeded 0 .. kDraws − 1) under
// each of `arms` on `model` (arm 0 without proposals): each later arm's acceptance rate, and
// per position a chi-square test of homogeneity against arm 0 at alpha 0.001. Its power is
// stated from the noncentral chi-square (Patnaik's approximation): against a rule that moves
// the probability of token `biased` by 0.03 (e.g. a rest that keeps the proposal: p → p(2 − p) is
// a far larger move), it is asserted >= 0.9.
constexpr int kDraws = 20000;
std::vector<double> expect_same_distribution(const std::string& model, const GenerateRequest& base,
                                             int32_t biased,
                                             const std::vector<BatchingOptions>& arms) {
  std::vector<GenerateRequest> reqs(kDraws, base);
  for (int i = 0; i < kDraws; ++i) reqs[static_cast<size_t>(i)].sampling.seed = i;
  std::vector<std::vector<std::map<int32_t, int64_t>>> counts(arms.size());  // [arm][position]
  std::vector<double> rate(arms.size());
  for (size_t arm = 0; arm < arms.size(); ++arm) {
    EngineOptions o = options(model, arms[arm]);
    o.prefill_chunk = 1024;
    auto loaded = Engine::load(o);
    EXPECT_TRUE(loaded.ok()) << loaded.status().message();
    if (!loaded.ok()) return rate;
    std::unique_ptr<Engine> e = std::move(loaded).value();
    counts[arm].resize(3);
    for (const Output& out : run_all(*e, reqs)) {
      EXPECT_EQ(out.tokens.size(), 4u);
      if (out.tokens.size() != 4) return rate;
      for (size_t p = 0; p < 3; ++p) ++counts[arm][p][out.tokens[p + 1]];
    }
    const Engine::CoreStats st = e->core_stats();
    if (arm == 0) continue;
    rate[arm] = static_cast<double>(st.spec_accepted_tokens) /
                static_cast<double>(std::max<int64_t>(st.spec_draft_tokens, 1));
    std::printf("arm %zu: %.3f of the proposals accepted\n", arm, rate[arm]);
  }
  for (size_t arm = 1; arm < arms.size(); ++arm) {
    for (size_t p = 0; p < 3; ++p) {
      const auto [stat, df] = chi2_two_samples(counts[0][p], counts[arm][p], biased);
      const double pvalue = chi2_sf(stat, df);
      // The power against a move of 0.03 in the token's probability q (the rest moved in
      // proportion): noncentrality (n / 2) · δ² (1/q + 1/(1 − q)) for two samples of n.
      const double q = static_cast<double>(counts[0][p][biased]) / kDraws, delta = 0.03;
      const double lambda = kDraws / 2.0 * delta * delta * (1 / q + 1 / (1 - q));
      // The critical value at alpha 0.001, then Patnaik: χ'²(df, λ) ≈ c · χ²(h).
      double lo = 0, hi = 10.0 * df + 100;
      for (int i = 0; i < 200; ++i) {
        ((chi2_sf((lo + hi) / 2, df) > 0.001) ? lo : hi) = (lo + hi) / 2;
      }
      const double c = (df + 2 * lambda) / (df + lambda);
      const double h = (df + lambda) * (df + lambda) / (df + 2 * lambda);
      const double power = chi2_sf(hi / c, h);
      std::printf("arm %zu, position %zu: chi2 %.1f, df %d, p %.3f; P(biased) %.3f; power %.3f\n",
                  arm, p + 2, stat, df, pvalue, q, power);
      EXPECT_GT(pvalue, 0.001) << "arm " << arm << ", position " << p + 2;
      EXPECT_GE(power, 0.9) << "position " << p + 2;
    }
  }
  return rate;
}

// Four tokens sampled at temperature 0.7, top-p 0.9, with a logit bias that gives token `biased`
// most of the mass.
GenerateRequest biased_sampling(int32_t biased) {
  GenerateRequest base;
  for (int j = 0; j < 12; ++j) base.prompt_ids.push_back(3 + j * 37 % 400);
  base.max_new_tokens = 4;
  base.ignore_eos = true;
  base.sampling.temperature = 0.7;
  base.sampling.top_p = 0.9;
  base.sampling.logit_bias = {{biased, 4.5f}};
  return base;
}

BatchingOptions sampling_batching() {
  BatchingOptions b;
  b.max_num_seqs = 64;
  b.max_batched_tokens = 1024;
  b.max_waiting = kDraws;
  return b;
}

// Sampling is exact (expect_same_distribution), for two proposers: a fixed one ([kDraft ×3],
// accepted about 40% of the time, so both the acceptance and the draw from the rest are
// exercised) and a draft model (the fixture itself, proposing its greedy continuation without the
// bias, which it does not know: accepted about 5% of the time).
TEST(SpecDecode, SampledRepliesAreDistributedAsWithoutProposals) {
  static constexpr int32_t kDraft = 500;
  BatchingOptions fixed_b = sampling_batching();
  fixed_b.spec.method = SpecMethod::kCustom;
  fixed_b.spec.num_tokens = 3;
  fixed_b.spec.propose = [](std::span<const int32_t>, int64_t, int32_t max_k, int32_t* out) {
    std::fill(out, out + max_k, kDraft);
    return max_k;
  };
  BatchingOptions draft_b = sampling_batching();
  draft_b.spec.method = SpecMethod::kDraft;
  draft_b.spec.num_tokens = 3;
  draft_b.spec.draft_model = kFixtures + "/text-f32-untied";
  const std::vector<double> rate = expect_same_distribution(
      "text-f32-untied", biased_sampling(kDraft), kDraft, {sampling_batching(), fixed_b, draft_b});
  ASSERT_EQ(rate.size(), 3u);
  EXPECT_GT(rate[1], 0.3);
  EXPECT_LT(rate[1], 0.95);
  EXPECT_GT(rate[2], 0.02);  // some accepted, most not
  EXPECT_LT(rate[2], 0.95);
}

// The same for Qwen3.5's MTP head (qwen35-f32-a's, made to propose the token it is given again:
// after a sampled biased token, the biased token, accepted often; after another, another).
TEST(SpecDecode, SampledRepliesWithTheMtpHeadAreDistributedAsWithout) {
  static constexpr int32_t kBiased = 200;
  test_util::TempDir dir;
  ASSERT_TRUE(test_util::write_mtp_fixture("qwen35-f32-a", dir.path(), /*echo=*/true).ok());
  BatchingOptions mtp_b = sampling_batching();
  mtp_b.spec.method = SpecMethod::kMtp;
  mtp_b.spec.num_tokens = 3;
  const std::vector<double> rate = expect_same_distribution(
      dir.path().string(), biased_sampling(kBiased), kBiased, {sampling_batching(), mtp_b});
  ASSERT_EQ(rate.size(), 2u);
  EXPECT_GT(rate[1], 0.1);
  EXPECT_LT(rate[1], 0.95);
}

}  // namespace
}  // namespace vlm

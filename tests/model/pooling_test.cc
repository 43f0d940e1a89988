// Pooling requests (GenerateRequest::pooling) through the engine on the vision fixture: the last
// prompt token's hidden state after the final norm and the logits of two ids there equal
// transformers' (scripts/make_pooling_reference.py) for text and image prompts — alone, all at
// once beside a generation (which still answers as transformers does), and again from the prefix
// cache — and bad pooling requests are refused before anything is queued. The prompts of
// Qwen3-VL-Embedding and -Reranker (vlm/pooling.h) equal transformers' rendering of the models'
// own message layout (scripts/make_pooling_prompts.py), token for token.
#include "vlm/pooling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "io/safetensors.h"
#include "model/fixture_model.h"
#include "test_util.h"
#include "vlm/engine.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

using test_util::load_fixture_engine;

const std::string kDir = std::string(VLM_FIXTURES_DIR) + "/vision-f32";

struct Case {
  std::string name;
  GenerateRequest request;  // pooling on
  std::vector<float> hidden, logits;
};

std::vector<Case> cases() {
  const auto vision = nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
  const auto ref = nlohmann::json::parse(test_util::read_file(kDir + "/pooling_reference.json"));
  std::vector<Case> out;
  for (const auto& c : ref["cases"]) {
    Case k;
    k.name = c["name"];
    k.request.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& im : c["images"]) {
      k.request.images.push_back(test_util::vision_fixture_image(vision, im));
    }
    k.request.pooling.enabled = true;
    k.request.pooling.logit_ids = ref["logit_ids"].get<std::vector<int32_t>>();
    k.hidden = c["hidden"].get<std::vector<float>>();
    k.logits = c["logits"].get<std::vector<float>>();
    out.push_back(std::move(k));
  }
  return out;
}

// The final piece of a request (every earlier piece carries no token).
RequestOutput last_piece(RequestStream& s) {
  RequestOutput piece, last;
  while (s.next(&piece)) {
    EXPECT_EQ(piece.token_id, -1) << "a pooling request sampled a token";
    last = std::move(piece);
  }
  EXPECT_TRUE(last.finished);
  return last;
}

double cosine(const std::vector<float>& a, const std::vector<float>& b) {
  const double ab = std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
  const double aa = std::inner_product(a.begin(), a.end(), a.begin(), 0.0);
  const double bb = std::inner_product(b.begin(), b.end(), b.begin(), 0.0);
  return ab / std::sqrt(aa * bb);
}

void expect_matches(const Case& c, const RequestOutput& got) {
  SCOPED_TRACE(c.name);
  ASSERT_TRUE(got.error.ok()) << got.error.message();
  ASSERT_EQ(got.pooled_hidden.size(), c.hidden.size());
  EXPECT_LE(test_util::rel_err(got.pooled_hidden, c.hidden), 1e-4);
  EXPECT_GE(cosine(got.pooled_hidden, c.hidden), 0.99999);
  ASSERT_EQ(got.pooled_logits.size(), c.logits.size());
  EXPECT_LE(test_util::rel_err(got.pooled_logits, c.logits), 1e-4);
  EXPECT_EQ(got.stats.completion_tokens, 0);
  EXPECT_GT(got.stats.prompt_tokens, static_cast<int64_t>(c.request.prompt_ids.size()) - 1);
}

TEST(Pooling, EachPromptAloneMatchesTransformers) {
  auto e = load_fixture_engine("vision-f32");
  ASSERT_NE(e, nullptr);
  const std::vector<Case> all = cases();
  ASSERT_EQ(all.size(), 5u);
  for (const Case& c : all) {
    auto s = e->submit(c.request);
    ASSERT_TRUE(s.ok()) << s.status().message();
    expect_matches(c, last_piece(**s));
  }
}

TEST(Pooling, AllAtOnceBesideAGenerationAndFromTheCache) {
  BatchingOptions b;
  b.max_batched_tokens = 48;  // chunked: pooling rows share steps with each other and a decode
  b.block_size = 4;           // every prompt holds whole blocks to find cached
  auto e = load_fixture_engine("vision-f32", b);
  ASSERT_NE(e, nullptr);
  const std::vector<Case> all = cases();
  // A generation of the "single" case, greedy, as transformers continues it.
  const auto vision = nlohmann::json::parse(test_util::read_file(kDir + "/reference.json"));
  const auto& single = vision["cases"][0];
  GenerateRequest gen;
  gen.prompt_ids = single["prompt_ids"].get<std::vector<int32_t>>();
  gen.images = all[0].request.images;
  gen.max_new_tokens = single["greedy"]["max_new_tokens"].get<int64_t>();
  gen.sampling.do_sample = false;
  gen.ignore_eos = true;
  auto g = e->submit(gen);
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (int round = 0; round < 2; ++round) {  // the second round finds every prompt cached
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (const Case& c : all) {
      auto s = e->submit(c.request);
      ASSERT_TRUE(s.ok()) << s.status().message();
      streams.push_back(std::move(s).value());
    }
    for (size_t i = 0; i < all.size(); ++i) {
      const RequestOutput got = last_piece(*streams[i]);
      expect_matches(all[i], got);
      if (round == 1) {
        EXPECT_GT(got.stats.cached_tokens, 0) << all[i].name;
        EXPECT_LT(got.stats.cached_tokens, got.stats.prompt_tokens) << all[i].name;
      }
    }
  }
  std::vector<int32_t> tokens;
  RequestOutput piece;
  while ((*g)->next(&piece)) {
    if (piece.token_id >= 0) tokens.push_back(piece.token_id);
  }
  EXPECT_EQ(tokens, single["greedy"]["output_ids"].get<std::vector<int32_t>>());
}

TEST(Pooling, BadRequestsAreRefused) {
  auto e = load_fixture_engine("vision-f32");
  ASSERT_NE(e, nullptr);
  Case c = cases().back();  // text only
  c.request.pooling.logit_ids = {3, 1024};
  auto s = e->submit(c.request);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("logit id 1024 is outside the vocabulary"), std::string::npos)
      << s.status().message();
  // Without logit ids: the hidden state alone; the generation's settings are ignored, even ones
  // a generation would refuse.
  Case h = cases().back();
  h.request.pooling.logit_ids.clear();
  h.request.logprobs = 50;
  h.request.sampling.temperature = -1.0;
  h.request.stop = {"x"};
  GenerateRequest refused = h.request;
  refused.pooling.enabled = false;
  EXPECT_FALSE(e->submit(refused).ok());
  EXPECT_FALSE(e->generate(h.request).ok());  // no reply to generate
  auto ok = e->submit(h.request);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  const RequestOutput got = last_piece(**ok);
  EXPECT_TRUE(got.pooled_logits.empty());
  EXPECT_GT(got.stats.prefill_ms, 0.0);
  EXPECT_LE(test_util::rel_err(got.pooled_hidden, h.hidden), 1e-4);
}

// An embedding checkpoint may come without lm_head.weight (saved without the head): with
// pooling_only it loads, pools the very hidden states of the whole checkpoint, and refuses what
// needs the head; without pooling_only it does not load (LoaderTest covers the error).
TEST(Pooling, PoolingOnlyLoadsACheckpointWithoutItsHead) {
  const std::string src = std::string(VLM_FIXTURES_DIR) + "/text-f32-untied";
  test_util::TempDir tmp;
  std::filesystem::copy_file(src + "/config.json", tmp.path() / "config.json");
  auto store = WeightStore::open_dir(src);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE(store->has("lm_head.weight"));
  std::vector<std::pair<std::string, TensorView>> tensors;
  for (const auto& n : store->names()) {
    if (n != "lm_head.weight") tensors.emplace_back(n, *store->get(n));
  }
  ASSERT_TRUE(write_safetensors((tmp.path() / "model.safetensors").string(), tensors).ok());
  EngineOptions o;
  o.model_dir = tmp.path().string();
  o.require_tokenizer = false;
  o.n_threads = 1;
  EXPECT_FALSE(Engine::load(o).ok());
  o.pooling_only = true;
  auto headless = Engine::load(o);
  ASSERT_TRUE(headless.ok()) << headless.status().message();
  const auto& notes = (*headless)->load_notes();
  EXPECT_TRUE(std::any_of(notes.begin(), notes.end(), [](const std::string& n) {
    return n.find("no lm_head.weight") != std::string::npos;
  }));
  o.model_dir = src;
  auto whole = Engine::load(o);
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  GenerateRequest r;
  r.prompt_ids = {5, 17, 3, 99, 42, 8, 61};
  r.pooling.enabled = true;
  auto a = (*headless)->submit(r);
  auto b = (*whole)->submit(r);
  ASSERT_TRUE(a.ok() && b.ok());
  const RequestOutput pa = last_piece(**a), pb = last_piece(**b);
  ASSERT_TRUE(pa.error.ok()) << pa.error.message();
  ASSERT_FALSE(pa.pooled_hidden.empty());
  EXPECT_EQ(pa.pooled_hidden, pb.pooled_hidden);
  GenerateRequest logits = r;
  logits.pooling.logit_ids = {1, 2};
  auto refused = (*headless)->submit(logits);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("lm_head.weight"), std::string::npos);
  EXPECT_TRUE((*whole)->submit(logits).ok());  // the whole checkpoint has logits to pool
  GenerateRequest gen = r;
  gen.pooling.enabled = false;
  gen.max_new_tokens = 2;
  auto no_gen = (*headless)->submit(gen);
  ASSERT_FALSE(no_gen.ok());
  EXPECT_NE(no_gen.status().message().find("does not generate"), std::string::npos);
  // pooling_only refuses generation with the head too.
  EXPECT_FALSE((*whole)->submit(gen).ok());
}

PoolingInput pooling_input(const nlohmann::json& j) {
  PoolingInput in;
  in.text = j.value("text", "");
  in.images.resize(j.value("images", 0));
  in.videos.resize(j.value("videos", 0));
  for (size_t i = 0; i < in.images.size(); ++i) in.images[i].path = "image" + std::to_string(i);
  for (size_t i = 0; i < in.videos.size(); ++i) in.videos[i].path = "video" + std::to_string(i);
  return in;
}

TEST(PoolingPrompts, EqualTheModelsOwnLayout) {
  const auto ref = nlohmann::json::parse(
      test_util::read_file(std::string(VLM_FIXTURES_DIR) + "/chat_template/pooling_prompts.json"));
  auto tok = Tokenizer::load(std::string(VLM_TESTDATA_DIR) + "/tokenizer");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  ASSERT_EQ(ref["embed"].size(), 9u);
  for (const auto& c : ref["embed"]) {
    const std::string instr = c["instruction"];
    SCOPED_TRACE(instr);
    const PoolingInput in = pooling_input(c["input"]);
    EXPECT_EQ(embedding_prompt(in, instr), c["text"].get<std::string>());
    auto r = embedding_request(**tok, in, instr);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->prompt_ids, c["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(r->images.size(), in.images.size());
    EXPECT_EQ(r->videos.size(), in.videos.size());
    EXPECT_TRUE(r->pooling.enabled);
    EXPECT_TRUE(r->pooling.logit_ids.empty());
  }
  ASSERT_EQ(ref["rerank"].size(), 4u);
  for (const auto& c : ref["rerank"]) {
    const PoolingInput q = pooling_input(c["query"]), d = pooling_input(c["document"]);
    EXPECT_EQ(rerank_prompt(q, d, c["instruction"].get<std::string>()),
              c["text"].get<std::string>());
    auto r = rerank_request(**tok, q, d, c["instruction"].get<std::string>());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->prompt_ids, c["ids"].get<std::vector<int32_t>>());
    ASSERT_EQ(r->images.size(), q.images.size() + d.images.size());
    if (!q.images.empty()) EXPECT_EQ(r->images.front().path, "image0");  // the query's first
    EXPECT_EQ(r->pooling.logit_ids, (std::vector<int32_t>{ref["no"], ref["yes"]}));
  }
}

TEST(PoolingPrompts, EmbeddingsAreUnitVectorsOfTheirFirstDimensions) {
  const std::vector<float> h = {3.f, 4.f, 12.f, -84.f};
  auto all = embedding_from_hidden(h);
  ASSERT_TRUE(all.ok());
  EXPECT_NEAR((*all)[0], 3.0 / 85.0, 1e-7);
  EXPECT_NEAR((*all)[3], -84.0 / 85.0, 1e-7);
  auto two = embedding_from_hidden(h, 2);  // Matryoshka: cut first, then normalised
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->size(), 2u);
  EXPECT_NEAR((*two)[0], 0.6, 1e-7);
  EXPECT_NEAR((*two)[1], 0.8, 1e-7);
  for (const int64_t bad : {int64_t{-1}, int64_t{5}}) {
    auto r = embedding_from_hidden(h, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("between 1 and 4"), std::string::npos);
  }
  const std::vector<float> zero(4, 0.f);
  auto z = embedding_from_hidden(zero);
  ASSERT_TRUE(z.ok());
  EXPECT_EQ((*z)[0], 0.f);  // no NaN for a zero vector
  EXPECT_NEAR(rerank_score(std::vector<float>{1.f, 1.f}), 0.5, 1e-12);
  EXPECT_NEAR(rerank_score(std::vector<float>{-2.f, 1.f}), 1.0 / (1.0 + std::exp(-3.0)), 1e-12);
  EXPECT_TRUE(std::isnan(rerank_score(std::vector<float>{1.f})));
}

// The score of the fixture's pooled logits equals the one of transformers' logits.
TEST(PoolingPrompts, ScoreOfPooledLogitsMatchesTransformers) {
  auto e = load_fixture_engine("vision-f32");
  ASSERT_NE(e, nullptr);
  for (const Case& c : cases()) {
    auto s = e->submit(c.request);
    ASSERT_TRUE(s.ok());
    const RequestOutput got = last_piece(**s);
    const double want = 1.0 / (1.0 + std::exp(static_cast<double>(c.logits[0]) - c.logits[1]));
    EXPECT_NEAR(rerank_score(got.pooled_logits), want, 1e-5) << c.name;
    auto emb = embedding_from_hidden(got.pooled_hidden);
    ASSERT_TRUE(emb.ok());
    auto ref = embedding_from_hidden(c.hidden);
    EXPECT_GE(cosine(*emb, *ref), 0.99999) << c.name;
  }
}

}  // namespace
}  // namespace vlm

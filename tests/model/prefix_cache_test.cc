// Prefix caching through the engine, on f32 fixtures: every logit row computed after a cache hit
// equals the row of a full prefill without the cache (to 1e-5 of the largest |logit|) — for text,
// one image, two images, hits ending at every block boundary (inside images too) with the rest
// split by chunked prefill, and generation under preemption — while two images with the same
// token layout, or one image at two pixel budgets, never share a block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "model/fixture_model.h"
#include "test_util.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

using test_util::load_fixture_engine;

const std::string kFixtures = VLM_FIXTURES_DIR;
constexpr int32_t kImagePad = 1000;  // the vision fixture's image_token_id

struct Prompt {
  std::vector<int32_t> ids;  // one pad per image
  std::vector<ImageInput> images;
};

// The vision fixture's case `name` (its prompt ids and images).
Prompt vision_case(const std::string& name) {
  static const auto ref =
      nlohmann::json::parse(test_util::read_file(kFixtures + "/vision-f32/reference.json"));
  for (const auto& c : ref["cases"]) {
    if (c["name"] != name) continue;
    Prompt p;
    p.ids = c["prompt_ids"].get<std::vector<int32_t>>();
    for (const auto& im : c["images"]) p.images.push_back(test_util::vision_fixture_image(ref, im));
    return p;
  }
  ADD_FAILURE() << "no case " << name;
  return {};
}

BatchingOptions no_cache() {
  BatchingOptions o;
  o.prefix_caching = false;
  return o;
}

struct Logits {
  std::vector<float> rows;  // [n, vocab]
  std::vector<int32_t> expanded;
  int64_t cached = -1;
};

Logits logits(Engine& e, const Prompt& p, bool read_cache) {
  Logits out;
  Engine::LogitsOptions o;
  o.expanded_ids = &out.expanded;
  o.read_prefix_cache = read_cache;
  o.cached_tokens = &out.cached;
  auto r = e.logits(p.ids, p.images, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) out.rows = std::move(r).value();
  return out;
}

// Rows [from, n) of `got` equal `want`'s to 1e-5 × max|logit| (over those rows of `want`).
void expect_rows_equal(const Logits& got, const Logits& want, int64_t vocab, int64_t from,
                       const std::string& what) {
  ASSERT_EQ(got.rows.size(), want.rows.size()) << what;
  const int64_t n = static_cast<int64_t>(want.rows.size()) / vocab;
  float peak = 0, worst = 0;
  for (int64_t i = from * vocab; i < n * vocab; ++i) {
    peak = std::max(peak, std::abs(want.rows[i]));
    worst = std::max(worst, std::abs(got.rows[i] - want.rows[i]));
  }
  EXPECT_GT(n, from) << what << ": no row left to compare";
  EXPECT_LE(worst, 1e-5f * peak) << what << ": rows " << from << ".." << n;
}

TEST(PrefixCache, TextHitsEqualAFullPrefill) {
  std::mt19937 rng(5);
  Prompt a, b;
  for (int i = 0; i < 70; ++i) a.ids.push_back(static_cast<int32_t>(3 + rng() % 900));
  b.ids.assign(a.ids.begin(), a.ids.begin() + 45);  // shares 5 blocks of 8 and a bit
  for (int i = 0; i < 30; ++i) b.ids.push_back(static_cast<int32_t>(3 + rng() % 900));
  auto cold = load_fixture_engine("text-f32-untied", no_cache());
  BatchingOptions o;
  o.block_size = 8;
  o.max_batched_tokens = 16;  // what follows a hit is prefilled in chunks
  auto warm = load_fixture_engine("text-f32-untied", o);
  ASSERT_TRUE(cold && warm);
  const int64_t V = warm->vocab_size();
  const Logits want_a = logits(*cold, a, false), want_b = logits(*cold, b, false);

  const Logits first = logits(*warm, a, true);  // nothing cached yet
  EXPECT_EQ(first.cached, 0);
  expect_rows_equal(first, want_a, V, 0, "cold");
  const Logits again = logits(*warm, a, true);
  EXPECT_EQ(again.cached, 64);  // 69 of 70 may hit: 8 whole blocks
  expect_rows_equal(again, want_a, V, again.cached, "the same prompt");
  const Logits other = logits(*warm, b, true);
  EXPECT_EQ(other.cached, 40);
  expect_rows_equal(other, want_b, V, other.cached, "a shared head");
  const Engine::CoreStats st = warm->core_stats();
  EXPECT_EQ(st.prefix_cache_queries, 70 + 70 + 75);
  EXPECT_EQ(st.prefix_cache_hits, 64 + 40);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_GT(st.prefix_cache_blocks, 0);
}

// The engine hands every change of the prefix cache to BatchingOptions::on_kv_events (on its
// thread): a prompt's whole blocks stored with their token ids, chained by parent hash; the same
// prompt again stores nothing new; a head shared with another prompt is its parent.
TEST(PrefixCache, KvEventsReachTheCallback) {
  std::mt19937 rng(7);
  Prompt a, b;
  for (int i = 0; i < 37; ++i) a.ids.push_back(static_cast<int32_t>(3 + rng() % 900));
  b.ids.assign(a.ids.begin(), a.ids.begin() + 16);
  for (int i = 0; i < 20; ++i) b.ids.push_back(static_cast<int32_t>(3 + rng() % 900));
  std::mutex mu;
  std::vector<KvEventBatch> batches;
  BatchingOptions o;
  o.block_size = 8;
  o.on_kv_events = [&](KvEventBatch batch) {
    std::lock_guard<std::mutex> lock(mu);
    batches.push_back(std::move(batch));
  };
  auto e = load_fixture_engine("text-f32-untied", o);
  ASSERT_TRUE(e);
  auto stored = [&] {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<KvEvent> out;
    for (const KvEventBatch& bt : batches) {
      EXPECT_EQ(bt.block_size, 8);
      EXPECT_GT(bt.ts, 1.5e9);  // seconds since the epoch
      for (const KvEvent& ev : bt.events) {
        if (ev.kind == KvEvent::Kind::kBlockStored) out.push_back(ev);
      }
    }
    batches.clear();
    return out;
  };
  logits(*e, a, true);
  e->wait_idle();
  std::vector<int32_t> ids;
  std::vector<uint64_t> hashes;
  for (const KvEvent& ev : stored()) {
    ids.insert(ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    ASSERT_EQ(ev.token_ids.size(), ev.block_hashes.size() * 8);
    if (!hashes.empty()) {
      ASSERT_TRUE(ev.parent_block_hash.has_value());
      EXPECT_EQ(*ev.parent_block_hash, hashes.back());
    } else {
      EXPECT_FALSE(ev.parent_block_hash.has_value());
    }
    hashes.insert(hashes.end(), ev.block_hashes.begin(), ev.block_hashes.end());
  }
  // 36 of 37 tokens may be cached (the last is computed again): 4 whole blocks.
  EXPECT_EQ(ids, std::vector<int32_t>(a.ids.begin(), a.ids.begin() + 32));
  logits(*e, a, true);
  e->wait_idle();
  EXPECT_TRUE(stored().empty()) << "the same prompt stored its blocks again";
  logits(*e, b, true);
  e->wait_idle();
  const std::vector<KvEvent> more = stored();
  ASSERT_FALSE(more.empty());
  ASSERT_TRUE(more.front().parent_block_hash.has_value());
  EXPECT_EQ(*more.front().parent_block_hash, hashes[1]);  // after the shared 16 tokens
  EXPECT_EQ(more.front().token_ids.front(), b.ids[16]);
}

// A hit may end at any block boundary, inside an image too. The cache holds exactly one copy
// of the prompt's blocks; a filler prompt of unrelated tokens takes all but the first j of them
// (the tail goes first), so that the prompt asked again hits exactly j blocks. What follows is
// prefilled in chunks of 12 tokens, splitting the images again.
class PrefixCacheImages : public ::testing::TestWithParam<std::string> {};

TEST_P(PrefixCacheImages, HitsEndingAtEveryBlockBoundaryEqualAFullPrefill) {
  const Prompt p = vision_case(GetParam());
  auto cold = load_fixture_engine("vision-f32", no_cache());
  ASSERT_NE(cold, nullptr);
  const Logits want = logits(*cold, p, false);
  const int64_t V = cold->vocab_size();
  const int64_t n = static_cast<int64_t>(want.expanded.size());
  constexpr int32_t kBs = 4;
  const int32_t blocks = static_cast<int32_t>((n + 1 + kBs - 1) / kBs);  // the prompt + 1 token
  BatchingOptions o;
  o.block_size = kBs;
  o.num_blocks = blocks;
  o.max_num_seqs = 4;
  o.max_batched_tokens = 12;
  auto warm = load_fixture_engine("vision-f32", o);
  ASSERT_NE(warm, nullptr);
  expect_rows_equal(logits(*warm, p, false), want, V, 0, "cold");

  // Where the images are: a boundary inside one is what the test is about.
  int64_t inside = 0;
  const int32_t max_hit = static_cast<int32_t>((n - 1) / kBs);
  std::mt19937 rng(9);
  for (int32_t j = 0; j <= max_hit; ++j) {
    Prompt filler;  // needs blocks - j blocks
    for (int64_t i = 0; i < int64_t{blocks - j} * kBs - 1; ++i)
      filler.ids.push_back(static_cast<int32_t>(3 + rng() % 900));
    ASSERT_TRUE(warm->logits(filler.ids).ok());
    const Logits got = logits(*warm, p, true);
    ASSERT_EQ(got.cached, int64_t{j} * kBs) << "hit of " << j << " blocks";
    const int64_t at = got.cached;
    if (at > 0 && at < n && want.expanded[at - 1] == want.expanded[at] &&
        want.expanded[at] == kImagePad) {
      ++inside;  // between two image tokens
    }
    expect_rows_equal(got, want, V, at, GetParam() + ", hit of " + std::to_string(at));
  }
  EXPECT_GT(inside, 1) << "some hits should end inside an image";
  EXPECT_EQ(warm->core_stats().kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, PrefixCacheImages,
                         ::testing::Values("single", "two_images", "multi_turn"));

// Two images with the same size (so the same token layout) are different blocks, and so is one
// image at two pixel budgets that resize it alike: a hit stops at the block the image starts in.
TEST(PrefixCache, DifferentImagesOrBudgetsNeverShareBlocks) {
  const Prompt png = vision_case("single");
  Prompt webp = png, budget = png;
  webp.images[0].path = std::string(VLM_TESTDATA_DIR) + "/images/cat_chelsea.webp";
  budget.images[0].max_pixels = *budget.images[0].max_pixels + 1;  // resized the same
  auto cold = load_fixture_engine("vision-f32", no_cache());
  BatchingOptions o;
  o.block_size = 4;
  auto warm = load_fixture_engine("vision-f32", o);
  ASSERT_TRUE(cold && warm);
  const int64_t V = warm->vocab_size();
  const Logits first = logits(*warm, png, true);
  const auto pad = std::find(first.expanded.begin(), first.expanded.end(), kImagePad);
  const int64_t image_start = pad - first.expanded.begin();
  ASSERT_LT(image_start, static_cast<int64_t>(first.expanded.size()));
  for (const Prompt* p : {&webp, &budget}) {
    const Logits want = logits(*cold, *p, false);
    ASSERT_EQ(want.expanded, first.expanded) << "the same token layout";
    const Logits got = logits(*warm, *p, true);
    EXPECT_EQ(got.cached, image_start / 4 * 4);
    expect_rows_equal(got, want, V, got.cached, p == &webp ? "webp" : "budget");
  }
  // And the first image again hits through it.
  EXPECT_GT(logits(*warm, png, true).cached, image_start + 20);
}

// n > 1: the same prompt submitted 4 times at once is computed once; the other three find it
// (in the same step or the next), and their tokens equal a request alone without the cache.
TEST(PrefixCache, CopiesOfOnePromptShareItsBlocks) {
  const Prompt p = vision_case("two_images");
  GenerateRequest r;
  r.prompt_ids = p.ids;
  r.images = p.images;
  r.max_new_tokens = 6;
  r.sampling.do_sample = false;
  r.ignore_eos = true;
  auto cold = load_fixture_engine("vision-f32", no_cache());
  BatchingOptions o;
  o.block_size = 4;
  auto warm = load_fixture_engine("vision-f32", o);
  ASSERT_TRUE(cold && warm);
  auto want = cold->generate(r);
  ASSERT_TRUE(want.ok()) << want.status().message();
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto s = warm->submit(r);
    ASSERT_TRUE(s.ok()) << s.status().message();
    streams.push_back(std::move(s).value());
  }
  for (auto& s : streams) {
    std::vector<int32_t> tokens;
    RequestOutput piece;
    while (s->next(&piece)) {
      if (piece.token_id >= 0) tokens.push_back(piece.token_id);
    }
    EXPECT_EQ(tokens, want->output_ids);
  }
  warm->wait_idle();
  const int64_t n = want->prompt_tokens;
  const Engine::CoreStats st = warm->core_stats();
  EXPECT_EQ(st.prefix_cache_queries, 4 * n);
  EXPECT_EQ(st.prefix_cache_hits, 3 * ((n - 1) / 4 * 4));
  EXPECT_EQ(st.kv_blocks_used, 0);
}

struct Streamed {
  std::vector<int32_t> tokens;
  std::vector<double> logprobs;
};

Streamed drain(RequestStream& stream) {
  Streamed out;
  RequestOutput piece;
  while (stream.next(&piece)) {
    EXPECT_TRUE(piece.error.ok()) << piece.error.message();
    if (piece.token_id >= 0) out.tokens.push_back(piece.token_id);
    for (const auto& e : piece.logprobs) out.logprobs.push_back(e.logprob);
  }
  return out;
}

// Generation with requests that share a long head, under KV pressure: preempted requests come
// back to cached blocks (theirs, or their neighbours'); every token and its logprob equal those of
// each request alone with no cache.
TEST(PrefixCache, PreemptedRequestsRecomputeFromTheCacheExactly) {
  std::mt19937 rng(21);
  std::vector<int32_t> head;
  for (int i = 0; i < 24; ++i) head.push_back(static_cast<int32_t>(3 + rng() % 900));
  std::vector<GenerateRequest> reqs;
  for (int k = 0; k < 10; ++k) {
    GenerateRequest r;
    r.prompt_ids = head;
    for (int i = 0; i < 1 + k % 5; ++i)
      r.prompt_ids.push_back(static_cast<int32_t>(3 + rng() % 900));
    r.max_new_tokens = 10;
    r.sampling.do_sample = false;
    r.ignore_eos = true;
    r.logprobs = 3;
    reqs.push_back(r);
  }
  auto cold = load_fixture_engine("text-f32-untied", no_cache());
  ASSERT_NE(cold, nullptr);
  std::vector<Streamed> want;
  for (const auto& r : reqs) {
    auto s = cold->submit(r);
    ASSERT_TRUE(s.ok()) << s.status().message();
    want.push_back(drain(**s));
  }
  BatchingOptions o;
  o.block_size = 4;
  o.num_blocks = 24;  // 96 positions for 8 sequences of ~35 tokens: must preempt
  o.max_num_seqs = 8;
  o.max_batched_tokens = 32;
  auto warm = load_fixture_engine("text-f32-untied", o);
  ASSERT_NE(warm, nullptr);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const auto& r : reqs) {
    auto s = warm->submit(r);
    ASSERT_TRUE(s.ok()) << s.status().message();
    streams.push_back(std::move(s).value());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    const Streamed got = drain(*streams[i]);
    EXPECT_EQ(got.tokens, want[i].tokens) << "request " << i;
    ASSERT_EQ(got.logprobs.size(), want[i].logprobs.size()) << "request " << i;
    for (size_t t = 0; t < got.logprobs.size(); ++t)
      EXPECT_NEAR(got.logprobs[t], want[i].logprobs[t], 1e-4) << "request " << i << " token " << t;
  }
  warm->wait_idle();
  const Engine::CoreStats st = warm->core_stats();
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.prefix_cache_hits, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

}  // namespace
}  // namespace vlm

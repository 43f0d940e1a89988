// Sampling: greedy, determinism by seed, each filter and penalty on hand-made logits.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/stop_matcher.h"

namespace vlm {
namespace {

ResolvedSampling sampled(uint64_t seed) {
  ResolvedSampling p;
  p.greedy = false;
  p.seed = seed;
  return p;
}

std::map<int32_t, int> histogram(const ResolvedSampling& p, const std::vector<float>& logits,
                                 int n) {
  Sampler s(static_cast<int64_t>(logits.size()), p);
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    std::vector<float> l = logits;
    h[s.sample(l.data())]++;
  }
  return h;
}

TEST(Sampler, GreedyPicksArgmax) {
  ResolvedSampling p;
  Sampler s(5, p);
  std::vector<float> l = {0.1f, 3.f, -1.f, 2.9f, 0.f};
  EXPECT_EQ(s.sample(l.data()), 1);
}

// A device's argmax stands in for sample() only for plain greedy; record() keeps the penalty
// state as sample() would have, so later picks agree.
TEST(Sampler, RecordKeepsPenaltiesAsSampleDoes) {
  ResolvedSampling p;
  p.greedy = true;
  EXPECT_TRUE(Sampler(8, p).plain_greedy());
  p.repetition_penalty = 2.0;
  EXPECT_FALSE(Sampler(8, p).plain_greedy());
  Sampler a(4, p), b(4, p);
  std::vector<float> first = {1.f, 3.f, 2.f, 0.f};
  const int32_t id = a.sample(first.data());
  ASSERT_EQ(id, 1);
  b.record(id);
  // Token 1 is penalised to 2.5 in both: 2 (2.8) wins; without the record, 1 (3.0) would.
  std::vector<float> next_a = {1.f, 5.f, 2.8f, 0.f}, next_b = next_a;
  EXPECT_EQ(a.sample(next_a.data()), 2);
  EXPECT_EQ(b.sample(next_b.data()), 2);
  ResolvedSampling q;
  q.greedy = false;
  EXPECT_FALSE(Sampler(8, q).plain_greedy());
}

// logit_bias is added to the logits before anything else (OpenAI semantics): +100 all but forces
// a token, -100 bans the argmax; greedy picks see it, and a device cannot stand in for it.
TEST(Sampler, LogitBiasShiftsTheLogitsFirst) {
  ResolvedSampling p;
  p.logit_bias = {{3, 100.f}};
  Sampler forced(5, p);
  EXPECT_FALSE(forced.plain_greedy());
  EXPECT_FALSE(forced.device_can_draw());
  std::vector<float> l = {0.1f, 3.f, -1.f, 2.9f, 0.f};
  EXPECT_EQ(forced.sample(l.data()), 3);
  p.logit_bias = {{1, -100.f}};
  std::vector<float> l2 = {0.1f, 3.f, -1.f, 2.9f, 0.f};
  EXPECT_EQ(Sampler(5, p).sample(l2.data()), 3);  // the argmax is banned: the runner-up
  // Sampling: a banned token never comes out; a small bias moves the odds.
  ResolvedSampling q = sampled(7);
  q.logit_bias = {{0, -100.f}};
  auto h = histogram(q, {2.f, 2.f, 2.f}, 600);
  EXPECT_EQ(h.count(0), 0u);
  EXPECT_GT(h[1], 200);
  EXPECT_GT(h[2], 200);
  ResolvedSampling none = sampled(7);
  EXPECT_TRUE(Sampler(3, none).device_can_draw());
}

// What a device draws from: the settings, u from the seeded generator, and one penalty entry per
// seen id (repetition for all, presence + frequency · count for the generated ones).
TEST(Sampler, DeviceDrawCarriesTheSettingsAndPenalties) {
  ResolvedSampling p;
  p.greedy = false;
  p.temperature = 0.5;
  p.top_k = 7;
  p.top_p = 0.9;
  p.min_p = 0.1;
  p.repetition_penalty = 1.5;
  p.presence_penalty = 0.25;
  p.frequency_penalty = 0.5;
  p.seed = 9;
  Sampler a(16, p), b(16, p);
  for (Sampler* s : {&a, &b}) {
    const int32_t prompt[] = {2, 5};
    s->add_prompt(prompt);
    s->record(5);
    s->record(5);
    s->record(9);
  }
  ops::SampleParams da, db;
  std::vector<ops::PenaltyEntry> pa, pb;
  a.device_draw(&da, &pa);
  b.device_draw(&db, &pb);
  EXPECT_EQ(da.top_k, 7);
  EXPECT_FLOAT_EQ(da.inv_temperature, 2.f);
  EXPECT_FLOAT_EQ(da.top_p, 0.9f);
  EXPECT_FLOAT_EQ(da.min_p, 0.1f);
  EXPECT_TRUE(da.u >= 0.f && da.u < 1.f);
  EXPECT_EQ(da.u, db.u);  // same seed, same draw
  ASSERT_EQ(da.penalty_end - da.penalty_begin, 3);
  ASSERT_EQ(pa.size(), 3u);
  std::map<int32_t, std::pair<float, float>> got;
  for (const ops::PenaltyEntry& e : pa) got[e.id] = {e.repetition, e.subtract};
  EXPECT_EQ(got[2], std::make_pair(1.5f, 0.f));          // prompt only: repetition
  EXPECT_EQ(got[5], std::make_pair(1.5f, 0.25f + 1.f));  // generated twice
  EXPECT_EQ(got[9], std::make_pair(1.5f, 0.75f));        // generated once
  ops::SampleParams next;
  a.device_draw(&next, &pa);
  EXPECT_NE(next.u, da.u);  // the generator moves on
  ResolvedSampling g;
  g.greedy = true;
  Sampler greedy(16, g);
  greedy.device_draw(&next, &pa);
  EXPECT_EQ(next.top_k, 1);  // greedy: the best token
  EXPECT_EQ(next.penalty_end - next.penalty_begin, 0);
}

TEST(Sampler, SameSeedSameSequenceDifferentSeedDiffers) {
  std::vector<float> logits(50, 0.f);  // uniform: every draw is pure chance
  auto run = [&](uint64_t seed) {
    Sampler s(50, sampled(seed));
    std::vector<int32_t> out;
    for (int i = 0; i < 40; ++i) {
      auto l = logits;
      out.push_back(s.sample(l.data()));
    }
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  auto p = sampled(1);
  p.top_k = 2;
  auto h = histogram(p, {0.f, 1.f, 2.f, 1.5f, -3.f}, 400);
  for (const auto& [id, n] : h) EXPECT_TRUE(id == 2 || id == 3) << id;
  EXPECT_EQ(h.size(), 2u);
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingMass) {
  auto p = sampled(2);
  p.top_p = 0.5;
  // probs ∝ e^[3, 2, 0, 0] ≈ [0.70, 0.26, 0.02, 0.02]: 0.70 ≥ 0.5, so only id 0 remains.
  auto h = histogram(p, {3.f, 2.f, 0.f, 0.f}, 200);
  EXPECT_EQ(h.size(), 1u);
  EXPECT_EQ(h.begin()->first, 0);
  p.top_p = 0.8;  // needs ids 0 and 1
  h = histogram(p, {3.f, 2.f, 0.f, 0.f}, 400);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
}

TEST(Sampler, MinPDropsTokensBelowFractionOfBest) {
  auto p = sampled(3);
  p.min_p = 0.2;
  // probs relative to the best: e^0=1, e^-1=0.37, e^-2=0.14 (< 0.2, dropped), e^-5 dropped.
  auto h = histogram(p, {0.f, -1.f, -2.f, -5.f}, 400);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(0) && h.count(1));
}

TEST(Sampler, TemperatureSharpens) {
  auto p = sampled(4);
  p.temperature = 0.05;  // logit gap 1 → probability ratio e^20
  auto h = histogram(p, {1.f, 0.f}, 200);
  EXPECT_EQ(h[0], 200);
}

TEST(Sampler, RepetitionPenaltyCoversPromptLikeTransformers) {
  ResolvedSampling p;
  p.repetition_penalty = 2.0;
  Sampler s(3, p);
  s.add_prompt(std::vector<int32_t>{0});
  std::vector<float> l = {3.f, 2.f, -1.f};  // id 0: 3 / 2 = 1.5 < 2 → id 1 wins
  EXPECT_EQ(s.sample(l.data()), 1);
  EXPECT_FLOAT_EQ(l[0], 1.5f);
  std::vector<float> l2 = {-1.f, -1.5f, -3.f};  // ids 0 and 1 now seen: -2, -3 → id 0 (-2) wins
  EXPECT_EQ(s.sample(l2.data()), 0);
  EXPECT_FLOAT_EQ(l2[1], -3.f);  // negative logits are multiplied
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountGeneratedTokens) {
  ResolvedSampling p;
  p.presence_penalty = 0.5;
  p.frequency_penalty = 0.25;
  Sampler s(2, p);
  std::vector<float> l = {1.f, 0.6f};
  EXPECT_EQ(s.sample(l.data()), 0);  // nothing generated yet: no penalty
  std::vector<float> l2 = {1.f, 0.6f};
  EXPECT_EQ(s.sample(l2.data()), 1);  // id 0: 1 - 0.5 - 0.25 = 0.25 < 0.6
  EXPECT_FLOAT_EQ(l2[0], 0.25f);
}

TEST(StopMatcher, HoldsBackPossiblePrefixAndCutsAtStop) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.push("Hello E"), "Hello ");  // "E" may start "END"
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("Dless"), "");  // "END" found: stop, drop the rest
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.emitted(), "Hello ");
}

TEST(StopMatcher, ReleasesFalseAlarmAndFlushes) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("a EN"), "a ");
  EXPECT_EQ(m.push("x"), "ENx");
  EXPECT_EQ(m.push("E"), "");
  EXPECT_EQ(m.flush(), "E");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.emitted(), "a ENxE");
}

}  // namespace
}  // namespace vlm

namespace vlm {
namespace {

// With a grammar, only its tokens are drawn: greedy, sampled, and with a top-k wider than what
// the grammar allows (the k-th largest logit is then -inf); the reply ends with the end token
// exactly when the grammar is complete.
TEST(SamplerTest, GrammarKeepsEveryDrawInside) {
  // Vocabulary: the 256 bytes, then "ab", "abc", then the end token (no bytes).
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  bytes.push_back("ab");
  bytes.push_back("abc");
  bytes.push_back("");
  const int32_t V = static_cast<int32_t>(bytes.size()), end = V - 1;
  structured::Grammar g;  // root ::= "abc" | "abd" | "x"
  g.set_root(g.rule("root", {g.literal("abc"), g.literal("abd"), g.literal("x")}));
  ASSERT_TRUE(g.finalize().ok());
  auto cg = std::make_shared<structured::CompiledGrammar>(
      g, std::make_shared<structured::TokenVocab>(bytes, V));
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int mode = 0; mode < 3; ++mode) {
    for (uint64_t seed = 0; seed < 50; ++seed) {
      ResolvedSampling p = mode == 0 ? ResolvedSampling{} : sampled(seed);
      if (mode == 2) p.top_k = 40;  // wider than the 5 tokens the grammar allows at first
      Sampler s(V, p);
      s.set_grammar(std::make_unique<structured::GrammarMatcher>(cg, std::vector<int32_t>{end}));
      std::string out;
      for (int step = 0; step < 8; ++step) {
        std::vector<float> logits(static_cast<size_t>(V));
        for (float& x : logits) x = nd(rng);
        const int32_t id = s.sample(logits.data());
        if (id == end) break;
        out += bytes[static_cast<size_t>(id)];
      }
      EXPECT_TRUE(s.grammar()->terminated()) << mode << " " << seed << " '" << out << "'";
      EXPECT_TRUE(out == "abc" || out == "abd" || out == "x") << mode << " '" << out << "'";
    }
  }
}

}  // namespace
}  // namespace vlm

// Qwen3.5's MTP head (speculative decoding's `--spec mtp`) against the reference forward of
// scripts/make_mtp_reference.py (written from vLLM's qwen3_5_mtp.py, transformers skipping
// mtp.*): on a dense and an MoE fixture with a random head, every prompt row's logits and the
// chained proposals' logits within 1e-4; the proposer, fed as the engine feeds it (a prompt step,
// then a verify step that kept part of its proposals), proposes what it proposes for the same
// sequence from scratch; and the head is refused where it cannot run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "engine/mtp_proposer.h"
#include "fixture_model.h"
#include "io/npy.h"
#include "test_util.h"
#include "vlm/engine.h"

namespace vlm {
namespace {

const std::string kMtpDir = std::string(VLM_FIXTURES_DIR) + "/qwen35-mtp";
constexpr int64_t kBlock = 16, kBlocks = 8;

nlohmann::json reference() {
  return nlohmann::json::parse(test_util::read_file(kMtpDir + "/reference.json"));
}

// The fixture with its head, loaded with it; a decoder of 64-token passes over it and its caches.
struct MtpModel {
  explicit MtpModel(const std::string& name, int64_t block = kBlock, int64_t blocks = kBlocks)
      : pool(2) {
    EXPECT_TRUE(test_util::write_mtp_fixture(name, dir.path()).ok());
    auto m = test_util::load_fixture_model(dir.path().string(), true);
    EXPECT_TRUE(m.ok()) << m.status().message();
    if (!m.ok()) return;
    fm = std::move(*m);
    dec = std::make_unique<test_util::CpuDecoder>(fm.cfg, fm.text, pool, 64);
    EXPECT_TRUE(dec->allocate(&cache, blocks, block).ok());
    vocab = fm.cfg.text_config.vocab_size;
  }
  test_util::TempDir dir;
  ThreadPool pool;
  test_util::FixtureModel fm;
  std::unique_ptr<test_util::CpuDecoder> dec;
  KvCache cache;
  int64_t vocab = 0;
};

std::vector<int32_t> table() {
  std::vector<int32_t> t(kBlocks);
  std::iota(t.begin(), t.end(), 0);
  return t;
}

std::vector<int64_t> arange(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

float max_diff(const float* got, const float* want, size_t n) {
  float d = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(got[i] - want[i]));
  return d;
}

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

TEST(MtpHead, RowsAndChainedProposalsEqualTheReference) {
  const nlohmann::json ref = reference();
  const int32_t K = ref["k"];
  for (const auto& c : ref["cases"]) {
    SCOPED_TRACE(c["model"].get<std::string>() + " case " + std::to_string(c["case"].get<int>()));
    MtpModel m(c["model"]);
    ASSERT_NE(m.dec, nullptr);
    ASSERT_TRUE((*m.dec)->has_mtp());
    const std::vector<int32_t> prompt = c["prompt"];
    const auto L = static_cast<int64_t>(prompt.size());
    const std::vector<int32_t> t = table();
    const std::vector<int64_t> pos = arange(L + K);
    // The trunk over the prompt: its greedy next token is the reference's.
    std::vector<float> logits(static_cast<size_t>(L * m.vocab));
    SeqChunk p;
    p.ids = prompt.data();
    p.n = L;
    p.pos = Positions3{pos.data(), pos.data(), pos.data()};
    p.block_table = t.data();
    p.num_table_blocks = kBlocks;
    p.rows = LogitRows::kLast;
    p.state_slot = 0;
    ASSERT_TRUE(m.dec->forward_batch(&p, 1, m.cache, logits.data()).ok());
    ASSERT_EQ(argmax(logits.data(), m.vocab), c["next_token"].get<int32_t>());
    // The head over every prompt row: (hidden p, token p + 1).
    KvCache mc;
    ASSERT_TRUE(
        (*m.dec)->allocate_mtp_cache(&mc, (*m.dec)->mtp_cache_spec(kBlock), kBlocks, kBlocks).ok());
    std::vector<int32_t> next(prompt.begin() + 1, prompt.end());
    next.push_back(c["next_token"]);
    std::vector<int32_t> rows(static_cast<size_t>(L));
    std::iota(rows.begin(), rows.end(), 0);
    SeqChunk h = p;
    h.ids = next.data();
    h.hidden_rows = rows.data();
    h.rows = LogitRows::kAll;
    h.state_slot = -1;
    Pass pass;
    const ops::Buf out{logits.data(), ops::Device::kCpu, DType::kF32};
    ASSERT_TRUE((*m.dec)->prepare(&h, 1, mc, Padding{}, &pass).ok());
    ASSERT_TRUE((*m.dec)->run_mtp(pass, mc, false, out).ok());
    auto want = read_npy(kMtpDir + "/" + c["rows"].get<std::string>());
    ASSERT_TRUE(want.ok()) << want.status().message();
    ASSERT_EQ(want->numel(), L * m.vocab);
    EXPECT_LE(max_diff(logits.data(), want->f32.data(), want->f32.size()), 1e-4f);
    // Chained: the last proposal and the head's output for it, one position on.
    auto chain = read_npy(kMtpDir + "/" + c["chain"].get<std::string>());
    ASSERT_TRUE(chain.ok()) << chain.status().message();
    const std::vector<int32_t> proposals = c["proposals"];
    int32_t last = argmax(logits.data() + (L - 1) * m.vocab, m.vocab);
    EXPECT_EQ(last, proposals[0]);
    int32_t row = static_cast<int32_t>(L - 1);
    for (int32_t d = 1; d < K; ++d) {
      SeqChunk s = h;
      s.ids = &last;
      s.n = 1;
      s.first = L - 1 + d;
      s.pos = Positions3{pos.data() + s.first, pos.data() + s.first, pos.data() + s.first};
      s.hidden_rows = &row;
      s.rows = LogitRows::kLast;
      ASSERT_TRUE((*m.dec)->prepare(&s, 1, mc, Padding{}, &pass).ok());
      ASSERT_TRUE((*m.dec)->run_mtp(pass, mc, true, out).ok());
      EXPECT_LE(max_diff(logits.data(), chain->f32.data() + (d - 1) * m.vocab,
                         static_cast<size_t>(m.vocab)),
                1e-4f)
          << "chained proposal " << d;
      last = argmax(logits.data(), m.vocab);
      EXPECT_EQ(last, proposals[static_cast<size_t>(d)]) << "chained proposal " << d;
      row = 0;
    }
  }
}

// A sequence as the engine holds it: ids and 1-D positions.
Sequence text_sequence(const std::vector<int32_t>& ids) {
  Sequence q;
  q.ids = ids;
  q.feature_row.assign(ids.size(), -1);
  q.pos_t = arange(static_cast<int64_t>(ids.size()));
  q.pos_h = q.pos_w = q.pos_t;
  return q;
}

// Proposals for `q` after a step of `row` (the trunk's pass over it first).
std::vector<int32_t> propose_after(MtpModel& m, MtpProposer& p, const StepRow& row,
                                   const SeqChunk& chunk, const Sequence& q, int32_t k) {
  std::vector<float> logits(static_cast<size_t>(chunk.n * m.vocab));
  EXPECT_TRUE(m.dec->forward_batch(&chunk, 1, m.cache, logits.data()).ok());
  EXPECT_TRUE(p.observe(std::span<const StepRow>(&row, 1)).ok());
  std::vector<int32_t> out(static_cast<size_t>(k));
  ProposeJob j;
  j.in.ids = q.ids;
  j.in.feature_row = q.feature_row;
  j.in.prompt_len = static_cast<int64_t>(q.ids.size());
  j.in.request_id = row.request_id;
  j.in.pos = Positions3{q.pos_t.data(), q.pos_h.data(), q.pos_w.data()};
  j.in.block_table = row.block_table;
  j.max_k = k;
  j.out = out.data();
  EXPECT_TRUE(p.propose_batch(std::span<ProposeJob>(&j, 1)).ok());
  out.resize(static_cast<size_t>(j.k));
  return out;
}

// The proposer as the engine drives it: after a prompt step, the reference's K proposals; after
// a verify step that kept one proposal of three (the target's next token after it appended),
// the proposals a fresh proposer makes for that sequence in one prompt step.
TEST(MtpProposer, ProposesAfterPromptAndVerifyStepsAsForTheWholeSequence) {
  const nlohmann::json ref = reference();
  const int32_t K = ref["k"];
  for (const auto& c : ref["cases"]) {
    SCOPED_TRACE(c["model"].get<std::string>() + " case " + std::to_string(c["case"].get<int>()));
    MtpModel m(c["model"]);
    ASSERT_NE(m.dec, nullptr);
    SpecOptions spec;
    spec.method = SpecMethod::kMtp;
    spec.num_tokens = K;
    auto made = MtpProposer::create(*m.dec->dec, spec, (*m.dec)->mtp_cache_spec(kBlock), kBlocks,
                                    kBlocks, 4);
    ASSERT_TRUE(made.ok()) << made.status().message();
    MtpProposer& p = **made;
    const std::vector<int32_t> t = table();
    std::vector<int32_t> ids = c["prompt"];
    const auto L = static_cast<int64_t>(ids.size());
    ids.push_back(c["next_token"]);
    Sequence q = text_sequence(ids);
    StepRow row{7, 0, L, StepKind::kGenerate, &q, &t, 0, {}, -1};
    SeqChunk chunk{
        q.ids.data(), L,      0, Positions3{q.pos_t.data(), q.pos_h.data(), q.pos_w.data()},
        t.data(),     kBlocks};
    chunk.rows = LogitRows::kLast;
    chunk.state_slot = 0;
    const std::vector<int32_t> first = propose_after(m, p, row, chunk, q, K);
    EXPECT_EQ(first, c["proposals"].get<std::vector<int32_t>>());
    // The verify step: the last token and three proposals; the first kept, then the target's.
    ASSERT_GE(first.size(), 3u);
    std::vector<int32_t> verify = {ids.back(), first[0], first[1], first[2]};
    const std::vector<int64_t> vpos = arange(L + 4);
    SeqChunk v{
        verify.data(), 4,      L, Positions3{vpos.data() + L, vpos.data() + L, vpos.data() + L},
        t.data(),      kBlocks};
    v.rows = LogitRows::kAll;
    v.state_slot = 0;  // (on from the prompt's state; the rows after the one kept are not read)
    std::vector<float> vl(static_cast<size_t>(4 * m.vocab));
    ASSERT_TRUE(m.dec->forward_batch(&v, 1, m.cache, vl.data()).ok());
    ids.push_back(first[0]);
    ids.push_back(argmax(vl.data() + m.vocab, m.vocab));  // the target's token after it
    Sequence q2 = text_sequence(ids);
    StepRow vrow{7, L, 4, StepKind::kVerify, &q2, &t, 0, {}, -1};
    // (the trunk's hidden states of the verify pass are the decoder's: observe reads them)
    ASSERT_TRUE(p.observe(std::span<const StepRow>(&vrow, 1)).ok());
    std::vector<int32_t> after(static_cast<size_t>(K));
    ProposeJob j;
    j.in.ids = q2.ids;
    j.in.feature_row = q2.feature_row;
    j.in.prompt_len = L;
    j.in.request_id = 7;
    j.in.pos = Positions3{q2.pos_t.data(), q2.pos_h.data(), q2.pos_w.data()};
    j.in.block_table = &t;
    j.max_k = K;
    j.out = after.data();
    ASSERT_TRUE(p.propose_batch(std::span<ProposeJob>(&j, 1)).ok());
    after.resize(static_cast<size_t>(j.k));
    // From scratch: a fresh model and proposer over the whole sequence.
    MtpModel fresh(c["model"]);
    auto made2 = MtpProposer::create(*fresh.dec->dec, spec, (*fresh.dec)->mtp_cache_spec(kBlock),
                                     kBlocks, kBlocks, 4);
    ASSERT_TRUE(made2.ok());
    const auto n = static_cast<int64_t>(ids.size()) - 1;
    StepRow whole{9, 0, n, StepKind::kGenerate, &q2, &t, 0, {}, -1};
    SeqChunk wc{
        q2.ids.data(), n,      0, Positions3{q2.pos_t.data(), q2.pos_h.data(), q2.pos_w.data()},
        t.data(),      kBlocks};
    wc.rows = LogitRows::kLast;
    wc.state_slot = 0;
    EXPECT_EQ(after, propose_after(fresh, **made2, whole, wc, q2, K));
    EXPECT_EQ(after.size(), static_cast<size_t>(K));
  }
}

// Two requests in one step (the second's hidden states after the first's), each proposing from
// the blocks that hold its sequence alone (blocks of 4 tokens: its chained rows go to its spare
// blocks): the reference's proposals for each.
TEST(MtpProposer, TwoRequestsInOneStepProposeTheirReferenceChains) {
  const nlohmann::json ref = reference();
  const int32_t K = ref["k"];
  for (const std::string model : {"qwen35-f32-a", "qwen35moe-f32-a"}) {
    SCOPED_TRACE(model);
    std::vector<nlohmann::json> cases;
    for (const auto& c : ref["cases"]) {
      if (c["model"] == model) cases.push_back(c);
    }
    ASSERT_EQ(cases.size(), 2u);
    constexpr int64_t kSmall = 4, kMany = 32;
    MtpModel m(model, kSmall, kMany);
    ASSERT_NE(m.dec, nullptr);
    SpecOptions spec;
    spec.method = SpecMethod::kMtp;
    spec.num_tokens = K;
    auto made =
        MtpProposer::create(*m.dec->dec, spec, (*m.dec)->mtp_cache_spec(kSmall), kMany, kMany, 4);
    ASSERT_TRUE(made.ok()) << made.status().message();
    Sequence q[2];
    std::vector<int32_t> tables[2];
    SeqChunk chunks[2];
    StepRow rows[2];
    int32_t next_block = 0;
    for (int i = 0; i < 2; ++i) {
      std::vector<int32_t> ids = cases[static_cast<size_t>(i)]["prompt"];
      const auto L = static_cast<int64_t>(ids.size());
      ids.push_back(cases[static_cast<size_t>(i)]["next_token"]);
      q[i] = text_sequence(ids);
      for (int64_t b = 0; b < (L + kSmall - 1) / kSmall; ++b) tables[i].push_back(next_block++);
      chunks[i] = SeqChunk{q[i].ids.data(),
                           L,
                           0,
                           Positions3{q[i].pos_t.data(), q[i].pos_h.data(), q[i].pos_w.data()},
                           tables[i].data(),
                           static_cast<int64_t>(tables[i].size())};
      chunks[i].rows = LogitRows::kLast;
      chunks[i].state_slot = i;
      rows[i] = StepRow{10 + i, 0, L, StepKind::kGenerate, &q[i], &tables[i], i, {}, -1};
    }
    std::vector<float> logits(static_cast<size_t>(2 * m.vocab));
    ASSERT_TRUE(m.dec->forward_batch(chunks, 2, m.cache, logits.data()).ok());
    ASSERT_TRUE((*made)->observe(std::span<const StepRow>(rows, 2)).ok());
    std::vector<int32_t> out[2];
    ProposeJob jobs[2];
    for (int i = 0; i < 2; ++i) {
      out[i].resize(static_cast<size_t>(K));
      jobs[i].in.ids = q[i].ids;
      jobs[i].in.feature_row = q[i].feature_row;
      jobs[i].in.prompt_len = static_cast<int64_t>(q[i].ids.size());
      jobs[i].in.request_id = 10 + i;
      jobs[i].in.pos = Positions3{q[i].pos_t.data(), q[i].pos_h.data(), q[i].pos_w.data()};
      jobs[i].in.block_table = &tables[i];
      jobs[i].max_k = K;
      jobs[i].out = out[i].data();
    }
    ASSERT_TRUE((*made)->propose_batch(std::span<ProposeJob>(jobs, 2)).ok());
    for (int i = 0; i < 2; ++i) {
      out[i].resize(static_cast<size_t>(jobs[i].k));
      EXPECT_EQ(out[i], cases[static_cast<size_t>(i)]["proposals"].get<std::vector<int32_t>>())
          << "request " << i;
    }
  }
}

TEST(MtpHead, ACheckpointWithoutOneIsRefusedByName) {
  for (const char* name : {"qwen35-f32-a", "text-f32-untied"}) {
    EngineOptions o = test_util::fixture_engine_options(name);
    o.batching.spec.method = SpecMethod::kMtp;
    auto e = Engine::load(o);
    ASSERT_FALSE(e.ok()) << name;
    EXPECT_NE(e.status().message().find("no MTP head"), std::string::npos) << e.status().message();
  }
  EXPECT_TRUE(parse_spec_method("mtp").ok());
  EXPECT_STREQ(spec_method_name(SpecMethod::kMtp), "mtp");
}

// Without --spec mtp the head is not read; with it, its bytes are beside each KV block.
TEST(MtpHead, ItsCacheComesOutOfTheSameBudget) {
  test_util::TempDir dir;
  ASSERT_TRUE(test_util::write_mtp_fixture("qwen35-f32-a", dir.path()).ok());
  auto blocks_with = [&](SpecMethod method) -> int64_t {
    EngineOptions o = test_util::fixture_engine_options("qwen35-f32-a");
    o.model_dir = dir.path().string();
    o.batching.kv_cache_memory = int64_t{4} << 20;
    o.batching.max_num_seqs = 4;
    o.batching.spec.method = method;
    auto e = Engine::load(o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? (*e)->core_stats().kv_blocks_total : 0;
  };
  const int64_t plain = blocks_with(SpecMethod::kNone), mtp = blocks_with(SpecMethod::kMtp);
  // One attention layer in the trunk: with the head's, each block costs twice as much.
  EXPECT_GT(mtp, 0);
  EXPECT_LT(mtp, plain * 6 / 10);
}

}  // namespace
}  // namespace vlm

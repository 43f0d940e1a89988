// Several sequences in one forward pass over a paged KV cache give the same logits as each
// sequence alone in a contiguous cache: prefill, chunked prefill joining a running batch, and
// decode steps mixed in one pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "kv/block_pool.h"
#include "model/fixture_model.h"
#include "model/text_decoder.h"

namespace vlm {
namespace {

using Model = test_util::FixtureModel;

Model load(const std::string& name) {
  return test_util::load_fixture_model(std::string(VLM_FIXTURES_DIR) + "/" + name).value();
}

struct Seq {
  std::vector<int32_t> ids;  // prompt, then generated tokens appended
  int64_t computed = 0;      // tokens whose KV is cached
  std::vector<int64_t> pos;  // positions 0..n-1 (text only: T = H = W)
};

int32_t argmax(const float* v, int64_t n) {
  return static_cast<int32_t>(std::max_element(v, v + n) - v);
}

// Greedy decode of one sequence alone (contiguous cache); returns the logits of every step.
std::vector<std::vector<float>> alone(const Model& m, std::vector<int32_t> ids, int steps) {
  ThreadPool pool(2);
  test_util::CpuDecoder dec(m.cfg, m.text, pool, 64);
  KvCache cache;
  std::vector<std::vector<float>> out;
  const Status allocated = dec.allocate(&cache, 1, 64);
  EXPECT_TRUE(allocated.ok()) << allocated.message();
  if (!allocated.ok()) return out;
  const int64_t V = m.cfg.text_config.vocab_size;
  std::vector<int64_t> pos(64);
  for (int64_t i = 0; i < 64; ++i) pos[i] = i;
  std::vector<float> logits(V);
  int64_t done = 0;
  for (int s = 0; s < steps; ++s) {
    const int64_t n = static_cast<int64_t>(ids.size()) - done;
    Positions3 p{pos.data() + done, pos.data() + done, pos.data() + done};
    EXPECT_TRUE(
        dec.forward(ids.data() + done, n, p, done, cache, LogitRows::kLast, logits.data()).ok());
    done = static_cast<int64_t>(ids.size());
    out.push_back(logits);
    ids.push_back(argmax(logits.data(), V));
  }
  return out;
}

double rel_err(const float* a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

TEST(Batch, PagedBatchEqualsSequencesAlone) {
  for (const char* name : {"text-f32-untied", "text-f32-hd128-tied"}) {
    Model m = load(name);
    const int64_t V = m.cfg.text_config.vocab_size;
    const std::vector<std::vector<int32_t>> prompts = {
        {5, 17, 300, 2, 44, 9, 100}, {8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, {700, 3, 55}};
    const int kSteps = 6;
    std::vector<std::vector<std::vector<float>>> want;
    for (const auto& p : prompts) want.push_back(alone(m, p, kSteps));

    ThreadPool pool(2);
    test_util::CpuDecoder dec(m.cfg, m.text, pool, 64);
    KvCache cache;
    ASSERT_TRUE(dec.allocate(&cache, /*num_blocks=*/24, /*block_size=*/4).ok());
    KvCacheManager kv(24, 4);
    std::vector<Seq> seqs(prompts.size());
    for (size_t s = 0; s < prompts.size(); ++s) {
      seqs[s].ids = prompts[s];
      seqs[s].pos.resize(64);
      for (int64_t i = 0; i < 64; ++i) seqs[s].pos[i] = i;
    }
    std::vector<int> step_of(prompts.size(), 0);
    std::vector<float> logits(3 * V);
    // Pass 0: A and B prefill together; C waits. Pass 1: A, B decode while C prefills in two
    // chunks (2 tokens now, 1 in pass 2). Later passes: everyone decodes together.
    for (int pass = 0; pass < kSteps + 2; ++pass) {
      std::vector<SeqChunk> chunks;
      std::vector<size_t> who;
      for (size_t s = 0; s < seqs.size(); ++s) {
        if (s == 2 && pass == 0) continue;
        if (step_of[s] >= kSteps) continue;
        Seq& q = seqs[s];
        int64_t n = static_cast<int64_t>(q.ids.size()) - q.computed;
        if (s == 2 && pass == 1) n = 2;  // first chunk of C's prompt
        ASSERT_TRUE(kv.reserve(static_cast<int64_t>(s), q.computed + n).ok());
        const auto& table = kv.block_table(static_cast<int64_t>(s));
        SeqChunk c;
        c.ids = q.ids.data() + q.computed;
        c.n = n;
        c.first = q.computed;
        c.pos = Positions3{q.pos.data() + q.computed, q.pos.data() + q.computed,
                           q.pos.data() + q.computed};
        c.block_table = table.data();
        c.num_table_blocks = static_cast<int64_t>(table.size());
        // A chunk that ends the prompt (or decodes) wants logits; a partial prefill does not.
        c.rows = q.computed + n == static_cast<int64_t>(q.ids.size()) ? LogitRows::kLast
                                                                      : LogitRows::kNone;
        chunks.push_back(c);
        who.push_back(s);
      }
      if (chunks.empty()) break;
      ASSERT_TRUE(dec.forward_batch(chunks.data(), static_cast<int64_t>(chunks.size()), cache,
                                    logits.data())
                      .ok());
      int64_t row = 0;
      for (size_t c = 0; c < chunks.size(); ++c) {
        Seq& q = seqs[who[c]];
        q.computed += chunks[c].n;
        if (chunks[c].rows == LogitRows::kNone) continue;
        const float* got = logits.data() + row * V;
        ++row;
        const int st = step_of[who[c]]++;
        EXPECT_LE(rel_err(got, want[who[c]][st]), 1e-5)
            << name << " seq " << who[c] << " step " << st;
        q.ids.push_back(argmax(got, V));
      }
    }
    for (size_t s = 0; s < seqs.size(); ++s) EXPECT_EQ(step_of[s], kSteps) << name << " seq " << s;
  }
}

// A decode step padded as a graph's bucket (the ModelRunner's CUDA graphs): extra rows over the
// cache's scratch block and block tables widened to the bucket's width give the real rows the
// same logits, bit for bit, and leave the sequences' own cache rows as the plain step does. The
// CPU backend runs this orchestration in CI, so the GPU's padding is not untested code.
TEST(Batch, PaddedDecodeStepEqualsThePlainOne) {
  Model m = load("text-f32-untied");
  const int64_t V = m.cfg.text_config.vocab_size;
  ThreadPool pool(2);
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 300, 2, 44}, {8, 9, 10}, {700, 3}};
  std::vector<std::vector<float>> got[2];
  for (int padded = 0; padded < 2; ++padded) {
    test_util::CpuDecoder dec(m.cfg, m.text, pool, 64);
    KvCache cache;
    ASSERT_TRUE(dec.allocate(&cache, 24, 4).ok());
    KvCacheManager kv(24, 4);
    std::vector<Seq> seqs(prompts.size());
    std::vector<SeqChunk> chunks;
    std::vector<float> logits(8 * V);
    // Prefill each prompt alone, then one decode step of all three together.
    for (size_t s = 0; s < prompts.size(); ++s) {
      Seq& q = seqs[s];
      q.ids = prompts[s];
      q.pos.resize(16);
      for (int64_t i = 0; i < 16; ++i) q.pos[i] = i;
      const auto n = static_cast<int64_t>(q.ids.size());
      ASSERT_TRUE(kv.reserve(static_cast<int64_t>(s), n + 1).ok());
      const auto& table = kv.block_table(static_cast<int64_t>(s));
      SeqChunk c{q.ids.data(),
                 n,
                 0,
                 Positions3{q.pos.data(), q.pos.data(), q.pos.data()},
                 table.data(),
                 static_cast<int64_t>(table.size()),
                 nullptr,
                 LogitRows::kLast};
      ASSERT_TRUE(dec.forward_batch(&c, 1, cache, logits.data()).ok());
      q.computed = n;
      q.ids.push_back(argmax(logits.data(), V));
    }
    for (size_t s = 0; s < prompts.size(); ++s) {
      Seq& q = seqs[s];
      const auto& table = kv.block_table(static_cast<int64_t>(s));
      chunks.push_back(SeqChunk{q.ids.data() + q.computed, 1, q.computed,
                                Positions3{q.pos.data() + q.computed, q.pos.data() + q.computed,
                                           q.pos.data() + q.computed},
                                table.data(), static_cast<int64_t>(table.size()), nullptr,
                                LogitRows::kLast});
    }
    Pass pass;
    const Padding pad = padded ? Padding{8, 16} : Padding{};
    ASSERT_TRUE(dec->prepare(chunks.data(), 3, cache, pad, &pass).ok());
    EXPECT_EQ(pass.rows, padded ? 8 : 3);
    EXPECT_TRUE(pass.sel_all);
    ASSERT_TRUE(
        dec->run(pass, cache, ops::Buf{logits.data(), ops::Device::kCpu, DType::kF32}).ok());
    for (int64_t r = 0; r < 3; ++r)
      got[padded].emplace_back(logits.data() + r * V, logits.data() + (r + 1) * V);
    // And one more plain step after it: the padded step wrote the sequences' K/V as the plain one.
    for (size_t s = 0; s < prompts.size(); ++s) {
      seqs[s].computed += 1;
      seqs[s].ids.push_back(argmax(got[padded][s].data(), V));
      ASSERT_TRUE(kv.reserve(static_cast<int64_t>(s), seqs[s].computed + 1).ok());
      const auto& table = kv.block_table(static_cast<int64_t>(s));
      chunks[s] = SeqChunk{
          seqs[s].ids.data() + seqs[s].computed,
          1,
          seqs[s].computed,
          Positions3{seqs[s].pos.data() + seqs[s].computed, seqs[s].pos.data() + seqs[s].computed,
                     seqs[s].pos.data() + seqs[s].computed},
          table.data(),
          static_cast<int64_t>(table.size()),
          nullptr,
          LogitRows::kLast};
    }
    ASSERT_TRUE(dec.forward_batch(chunks.data(), 3, cache, logits.data()).ok());
    for (int64_t r = 0; r < 3; ++r)
      got[padded].emplace_back(logits.data() + r * V, logits.data() + (r + 1) * V);
  }
  ASSERT_EQ(got[0].size(), got[1].size());
  for (size_t i = 0; i < got[0].size(); ++i) EXPECT_EQ(got[0][i], got[1][i]) << "row " << i;
}

}  // namespace
}  // namespace vlm

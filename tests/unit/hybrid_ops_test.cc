// Qwen3.5's hybrid-layer ops (ops.h, kernels/cpu/hybrid.h) against their scalar references
// (ops/ref/hybrid_ref.cc), on every ISA this CPU runs: the Gated DeltaNet (conv1d, gates, the
// delta rule chunked and recurrent, its state carried across calls), the gated RMSNorm, the
// sigmoid gate and the gated attention's q|gate split with partial rotary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <utility>
#include <vector>

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

#include "kernels/cpu/hybrid.h"
#include "ops/ops.h"
#include "ops/ref/ref.h"
#include "test_util.h"

namespace vlm {
namespace {

using test_util::randn;
using test_util::rel_err;

class HybridTest : public ::testing::TestWithParam<ops::Isa> {};

// A layer's weights and a batch of sequences' states for gated_delta_net.
struct DeltaCase {
  ops::DeltaNetShape s;
  std::vector<float> conv_w, a_log, dt_bias;
  explicit DeltaCase(const ops::DeltaNetShape& shape) : s(shape) {
    conv_w = randn(static_cast<size_t>(s.kernel * s.conv_dim()), 11, 0.4f);
    a_log = randn(static_cast<size_t>(s.nv), 12, 0.5f);
    for (float& a : a_log) a = std::log(0.05f + std::fabs(a));
    dt_bias = randn(static_cast<size_t>(s.nv), 13, 0.5f);
  }
};

// Sequences of several lengths (1, a partial chunk, more than two chunks) through the op in
// calls of various sizes, each carrying its state to the next call, equal the token-by-token
// reference run over the whole sequences; shapes with nv = 2·nk, dk ≠ dv, widths no vector
// divides, and more conv channels than one of the op's channel blocks (512); the delta rule in
// the op's chunks (0: kDeltaChunk), token by token (1) and in chunks of 64.
TEST_P(HybridTest, GatedDeltaNetMatchesTheRecurrentReference) {
  ThreadPool pool(2);
  for (const ops::DeltaNetShape& shape :
       {ops::DeltaNetShape{2, 4, 16, 8, 4}, ops::DeltaNetShape{1, 1, 24, 20, 4},
        ops::DeltaNetShape{2, 2, 32, 32, 3}, ops::DeltaNetShape{2, 4, 128, 96, 4}}) {
    for (int64_t chunk : {0, 1, 64}) {
      SCOPED_TRACE("nk " + std::to_string(shape.nk) + " nv " + std::to_string(shape.nv) + " dk " +
                   std::to_string(shape.dk) + " dv " + std::to_string(shape.dv) + " chunk " +
                   std::to_string(chunk));
      DeltaCase dc(shape);
      const ops::DeltaNetShape& s = dc.s;
      const std::vector<int64_t> lens = {1, 37, 150};
      // Each sequence's calls: its tokens split into these pieces, one call per round.
      const std::vector<std::vector<int64_t>> pieces = {{1}, {5, 1, 31}, {64, 1, 70, 15}};
      const int64_t od = s.nv * s.dv, pd = s.proj_dim(), sf = s.state_floats();
      std::vector<std::vector<float>> proj, want(lens.size()), got(lens.size());
      std::vector<std::vector<float>> ref_state(lens.size()), state(lens.size());
      for (size_t i = 0; i < lens.size(); ++i) {
        proj.push_back(randn(static_cast<size_t>(lens[i] * pd), 100 + static_cast<uint32_t>(i)));
        want[i].assign(static_cast<size_t>(lens[i] * od), 0.f);
        got[i].assign(want[i].size(), 0.f);
        ref_state[i].assign(static_cast<size_t>(sf), 7.f);  // fresh: must be cleared
        state[i].assign(static_cast<size_t>(sf), 7.f);
        ops::DeltaNetSeq q{0, lens[i], true, ref_state[i].data(),
                           ref_state[i].data() + s.conv_state()};
        ops::ref::gated_delta_net(proj[i].data(), pd, &q, 1, s, dc.conv_w.data(), dc.a_log.data(),
                                  dc.dt_bias.data(), want[i].data());
      }
      // Rounds: every sequence with a piece left joins the batch with it.
      std::vector<int64_t> done(lens.size(), 0);
      for (size_t round = 0; round < 4; ++round) {
        std::vector<ops::DeltaNetSeq> seqs;
        std::vector<float> batch, out;
        std::vector<size_t> who;
        int64_t rows = 0;
        for (size_t i = 0; i < lens.size(); ++i) {
          if (round >= pieces[i].size()) continue;
          const int64_t n = pieces[i][round];
          batch.insert(batch.end(), proj[i].begin() + done[i] * pd,
                       proj[i].begin() + (done[i] + n) * pd);
          seqs.push_back(
              {rows, n, done[i] == 0, state[i].data(), state[i].data() + s.conv_state()});
          who.push_back(i);
          rows += n;
        }
        std::vector<float> mixed(static_cast<size_t>(rows * s.mixed_dim()));
        out.assign(static_cast<size_t>(rows * od), 0.f);
        ops::gated_delta_net(batch.data(), pd, seqs.data(), static_cast<int64_t>(seqs.size()), s,
                             dc.conv_w.data(), dc.a_log.data(), dc.dt_bias.data(), mixed.data(),
                             out.data(), pool, GetParam(), chunk);
        for (size_t j = 0; j < seqs.size(); ++j) {
          const size_t i = who[j];
          std::copy_n(out.begin() + seqs[j].row * od, seqs[j].len * od,
                      got[i].begin() + done[i] * od);
          done[i] += seqs[j].len;
        }
      }
      for (size_t i = 0; i < lens.size(); ++i) {
        SCOPED_TRACE("sequence of " + std::to_string(lens[i]));
        ASSERT_EQ(done[i], lens[i]);
        EXPECT_LE(rel_err(got[i], want[i]), 2e-5);
        EXPECT_LE(rel_err(state[i], ref_state[i]), 2e-5);  // the carried state itself
      }
    }
  }
}

// The gated delta rule token by token in double (transformers' torch_recurrent_gated_delta_rule),
// inputs laid out as the kernel test below lays them: S [dk, dv] in place, out [n, dv].
void delta_rule_ref(const kernels::DeltaInputs& in, int64_t n, int64_t dk, int64_t dv,
                    std::vector<double>& S, std::vector<float>& out) {
  std::vector<double> kv(static_cast<size_t>(dv));
  for (int64_t t = 0; t < n; ++t) {
    const float* q = in.q + t * in.qk_stride;
    const float* k = in.k + t * in.qk_stride;
    const double decay = std::exp(static_cast<double>(in.g[t * in.gb_stride]));
    const double beta = in.beta[t * in.gb_stride];
    for (double& x : S) x *= decay;
    std::fill(kv.begin(), kv.end(), 0.0);
    for (int64_t a = 0; a < dk; ++a) {
      for (int64_t j = 0; j < dv; ++j) kv[j] += k[a] * S[a * dv + j];
    }
    for (int64_t j = 0; j < dv; ++j) kv[j] = (in.v[t * in.v_stride + j] - kv[j]) * beta;  // δ
    for (int64_t a = 0; a < dk; ++a) {
      for (int64_t j = 0; j < dv; ++j) S[a * dv + j] += k[a] * kv[j];
    }
    for (int64_t j = 0; j < dv; ++j) {
      double o = 0;
      for (int64_t a = 0; a < dk; ++a) o += q[a] * S[a * dv + j];
      out[t * dv + j] = static_cast<float>(o);
    }
  }
}

// The chunked and the recurrent kernel against the double reference over the same tokens and
// state: the op's chunk, a chunk of 128 (as `vlm bench --delta-rule` runs), 37 tokens (GEMM tiles
// of 12 rows and a tail), 9 and a single one; key and value dims below, at and past the packed
// GEMM's 32-column panels (the published 128 too); gentle decays, and fast ones (g down to about
// −12 per token) whose e^c factors pass through the subnormals that the kernels flush. The
// scratch is sized for the longest chunk and refilled with NaN before each kernel; the kernels
// leave MXCSR's control bits as they found them.
TEST_P(HybridTest, ChunkedAndRecurrentDeltaRuleMatchTheReference) {
  const kernels::HybridKernels& k = ops::hybrid_kernels(GetParam());
  for (auto [dk, dv] : {std::pair<int64_t, int64_t>{24, 20}, {32, 72}, {128, 128}}) {
    std::vector<float> scratch(static_cast<size_t>(kernels::delta_chunk_scratch(dk, dv, 128)), NAN);
    for (float decay : {0.1f, 4.f}) {
      for (int64_t n : {kernels::kDeltaChunk, int64_t{128}, int64_t{37}, int64_t{9}, int64_t{1}}) {
        SCOPED_TRACE("dk " + std::to_string(dk) + " dv " + std::to_string(dv) + ", " +
                     std::to_string(n) + " tokens, decay " + std::to_string(decay));
        auto q = randn(static_cast<size_t>(n * dk), 1), kk = randn(static_cast<size_t>(n * dk), 2);
        for (int64_t t = 0; t < n; ++t) {  // unit keys and queries, as the L2 norms leave them
          for (auto* v : {&q, &kk}) {
            float ss = 0;
            for (int64_t d = 0; d < dk; ++d) ss += (*v)[t * dk + d] * (*v)[t * dk + d];
            for (int64_t d = 0; d < dk; ++d) (*v)[t * dk + d] /= std::sqrt(ss);
          }
        }
        auto v = randn(static_cast<size_t>(n * dv), 3);
        auto g = randn(static_cast<size_t>(n), 4, decay), beta = randn(static_cast<size_t>(n), 5);
        for (float& x : g) x = -std::fabs(x);
        for (float& x : beta) x = 1.f / (1.f + std::exp(-x));
        kernels::DeltaInputs in{q.data(), kk.data(), v.data(), g.data(), beta.data(), dk, dv, 1};
        auto s0 = randn(static_cast<size_t>(dk * dv), 6, 0.3f), s1 = s0;
        std::vector<double> sref(s0.begin(), s0.end());
        std::vector<float> o0(static_cast<size_t>(n * dv)), o1(o0.size()), oref(o0.size());
        delta_rule_ref(in, n, dk, dv, sref, oref);
        std::fill(scratch.begin(), scratch.end(), NAN);
#if defined(__SSE__)
        const unsigned csr = _mm_getcsr();
#endif
        k.delta_rule_recurrent(in, n, dk, dv, s0.data(), o0.data(), dv, scratch.data());
        std::fill(scratch.begin(), scratch.end(), NAN);
        k.delta_rule_chunk(in, n, dk, dv, s1.data(), o1.data(), dv, scratch.data());
#if defined(__SSE__)
        EXPECT_EQ(_mm_getcsr() & ~0x3fu, csr & ~0x3fu);  // (bits 0-5: sticky exception flags)
#endif
        const std::vector<float> want(sref.begin(), sref.end());
        EXPECT_LE(rel_err(o0, oref), 1e-5);
        EXPECT_LE(rel_err(s0, want), 1e-5);
        EXPECT_LE(rel_err(o1, oref), 1e-5);
        EXPECT_LE(rel_err(s1, want), 1e-5);
      }
    }
  }
}

TEST_P(HybridTest, GatedRmsNormMatchesReference) {
  ThreadPool pool(2);
  const int64_t rows = 5, heads = 3, n = 20, z_stride = 71;
  auto x = randn(static_cast<size_t>(rows * heads * n), 1);
  auto z = randn(static_cast<size_t>(rows * z_stride), 2);
  auto w = randn(static_cast<size_t>(n), 3);
  std::vector<float> want(x.size()), got(x.size());
  ops::ref::gated_rms_norm(x.data(), z.data(), z_stride, rows, heads, n, w.data(), 1e-6f,
                           want.data());
  ops::gated_rms_norm(x.data(), z.data(), z_stride, rows, heads, n, w.data(), 1e-6f, got.data(),
                      pool, GetParam());
  EXPECT_LE(rel_err(got, want), 1e-6);
  ops::gated_rms_norm(x.data(), z.data(), z_stride, rows, heads, n, w.data(), 1e-6f, x.data(), pool,
                      GetParam());  // in place
  EXPECT_EQ(x, got);
}

// The attention's q|gate rows: q heads normed and partly rotated, gates copied, k into the cache,
// the gate applied with sigmoid_mul.
TEST_P(HybridTest, GatedQkvSplitPartialRotaryAndSigmoidGate) {
  ThreadPool pool(2);
  const int64_t T = 3, nh = 4, nkv = 2, hd = 24, rot = 6;
  const int64_t qd = nh * hd, kvd = nkv * hd, row = 2 * qd + 2 * kvd;
  auto qkv = randn(static_cast<size_t>(T * row), 1);
  auto qn = randn(static_cast<size_t>(hd), 2), kn = randn(static_cast<size_t>(hd), 3);
  auto cos = randn(static_cast<size_t>(T * rot / 2), 4), sin = randn(cos.size(), 5);
  std::vector<int32_t> slots = {4, 0, 2};
  std::vector<float> q(static_cast<size_t>(T * qd)), gate(q.size());
  std::vector<float> kc(static_cast<size_t>(5 * kvd)), vc(kc.size());
  ops::KvPool pool_kv;
  pool_kv.k = kc.data();
  pool_kv.v = vc.data();
  auto src = qkv;
  ops::qkv_gated_rope_store(qkv.data(), T, nh, nkv, hd, rot, qn.data(), kn.data(), 1e-6f,
                            cos.data(), sin.data(), slots.data(), q.data(), gate.data(), pool_kv,
                            pool, GetParam());
  for (int64_t t = 0; t < T; ++t) {
    float* r = src.data() + t * row;
    ops::ref::qk_norm_rope_partial(r, nh, 2 * hd, hd, rot, qn.data(), 1e-6f,
                                   cos.data() + t * rot / 2, sin.data() + t * rot / 2);
    ops::ref::qk_norm_rope_partial(r + 2 * qd, nkv, hd, hd, rot, kn.data(), 1e-6f,
                                   cos.data() + t * rot / 2, sin.data() + t * rot / 2);
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t d = 0; d < hd; ++d) {
        EXPECT_NEAR(q[(t * nh + h) * hd + d], r[2 * h * hd + d], 1e-5);
        EXPECT_EQ(gate[(t * nh + h) * hd + d], r[(2 * h + 1) * hd + d]);
      }
    }
    for (int64_t i = 0; i < kvd; ++i) {
      EXPECT_NEAR(kc[slots[t] * kvd + i], r[2 * qd + i], 1e-5);
      EXPECT_EQ(vc[slots[t] * kvd + i], r[2 * qd + kvd + i]);
    }
  }
  std::vector<float> x = randn(static_cast<size_t>(T * qd), 9), want = x;
  for (size_t i = 0; i < x.size(); ++i) want[i] = x[i] / (1.f + std::exp(-gate[i]));
  ops::sigmoid_mul(x.data(), gate.data(), qd, T, qd, pool, GetParam());
  EXPECT_LE(rel_err(x, want), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, HybridTest, ::testing::ValuesIn(ops::runnable_isas()),
                         [](const auto& info) { return std::string(ops::isa_name(info.param)); });

}  // namespace
}  // namespace vlm

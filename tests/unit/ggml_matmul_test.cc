// GGUF block weights (Q8_0, Q4_K, Q5_K, Q6_K) multiplied as stored, on every ISA this CPU runs:
// the block kernels and the byte-panel GEMM against the weights' exact values (io/gguf_quants,
// bit-identical to the gguf package: gguf_quants_test) times x as the kernels quantize it, and
// the dequantizing path against the scalar reference. K up to 2304: the GEMMs' K blocks (1024 at
// avx512vnni, 512 at the 256-bit levels) and a tail; M from 1 through the GEMMs' 32 rows and
// their tiles' tails.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "kernels/cpu/ggml_blocks.h"
#include "ops/ops.h"
#include "ops/ref/ref.h"
#include "test_util.h"

namespace vlm {
namespace {

constexpr DType kTypes[] = {DType::kQ8_0, DType::kQ4K, DType::kQ5K, DType::kQ6K};

// N rows of K values of type t from random bytes, with finite scales: a K-quant's f16 d (and
// dmin) and Q8_0's d drawn in [2^-10, 2^-4) with a random sign for d (Q6_K's d, Q8_0's) and
// positive for Q4_K / Q5_K (as quantizers write them); every other byte anything.
std::vector<uint8_t> random_blocks(DType t, int64_t N, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(dtype_nbytes(t, N * K));
  for (auto& v : b) v = static_cast<uint8_t>(rng());
  std::uniform_real_distribution<float> mag(std::ldexp(1.f, -10), std::ldexp(1.f, -4));
  const auto put_half = [&](uint8_t* p, bool sign) {
    const float v = mag(rng) * (sign && (rng() & 1) ? -1.f : 1.f);
    const uint16_t h = f32_to_f16(v);
    p[0] = static_cast<uint8_t>(h & 0xff);
    p[1] = static_cast<uint8_t>(h >> 8);
  };
  const size_t unit = dtype_size(t);
  for (size_t at = 0; at < b.size(); at += unit) {
    switch (t) {
      case DType::kQ8_0:
        put_half(&b[at], true);
        break;
      case DType::kQ4K:
      case DType::kQ5K:
        put_half(&b[at], false);
        put_half(&b[at + 2], false);
        break;
      case DType::kQ6K:
        put_half(&b[at + 208], true);
        break;
      default:
        break;
    }
  }
  return b;
}

using test_util::randn;

class GgmlMatmulTest : public ::testing::TestWithParam<ops::Isa> {};

TEST_P(GgmlMatmulTest, BlockKernelsAndDequantizedPathMatchTheExactValues) {
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  const bool has_kernel = isa != ops::Isa::kGeneric;
  for (DType t : kTypes) {
    const std::vector<int64_t> Ks = t == DType::kQ8_0 ? std::vector<int64_t>{32, 96, 192, 512, 1056}
                                                      : std::vector<int64_t>{256, 768, 2304};
    for (int64_t M : {1, 2, 3, 4, 5, 7, 9, 31, 32, 34, 35, 40, 43, 45, 257}) {
      for (int64_t K : Ks) {
        for (int64_t N : {1, 5, 17, 33}) {
          const auto seed = static_cast<uint32_t>(M * 1009 + K * 17 + N * 3 + static_cast<int>(t));
          const std::vector<uint8_t> wb = random_blocks(t, N, K, seed);
          TensorView w;
          w.dtype = t;
          w.shape = {N, K};
          w.data = wb.data();
          ASSERT_TRUE(ops::check_linear_weight(w, K).ok());
          std::vector<float> wf(static_cast<size_t>(N * K));
          kernels::dequantize_rows_ggml(t, wb.data(), K, 0, N, wf.data());
          const std::vector<float> x = randn(static_cast<size_t>(M * K), seed + 1);
          // The block kernels and the byte-panel GEMM multiply x as quantized per 32 values
          // (ref::quantize_rows_q8).
          const bool native = ops::ggml_quantizes_x(isa, t);
          EXPECT_EQ(native, has_kernel);
          std::vector<float> xv = x;
          if (native) {
            std::vector<int8_t> q(static_cast<size_t>(M * K));
            std::vector<float> s(static_cast<size_t>(M * K / 32));
            std::vector<int32_t> sum(s.size());
            ops::ref::quantize_rows_q8(x.data(), M, K, q.data(), s.data(), sum.data());
            for (int64_t i = 0; i < M * K; ++i) xv[i] = static_cast<float>(q[i]) * s[i / 32];
          }
          std::vector<float> y(static_cast<size_t>(M * N), NAN);
          ops::matmul(x.data(), M, K, w, y.data(), pool, isa);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              double want = 0, mag = 0;
              for (int64_t k = 0; k < K; ++k) {
                want += static_cast<double>(xv[m * K + k]) * wf[n * K + k];
                mag += std::fabs(static_cast<double>(xv[m * K + k]) * wf[n * K + k]);
              }
              // f32 sums of K products in some order: within a few K · eps of Σ |x w|.
              EXPECT_NEAR(y[m * N + n], want, 1e-5 * mag + 1e-6)
                  << ops::isa_name(isa) << " " << dtype_name(t) << " M=" << M << " K=" << K
                  << " N=" << N << " m=" << m << " n=" << n << (native ? " (INT8 x)" : "");
            }
          }
        }
      }
    }
  }
}

// The ggml_decode candidates (how far ahead the block kernels prefetch) change no arithmetic: one
// x row through matmul_multi under each candidate the level runs gives the default's sums bit for
// bit, for a stack of weights of every type split across the threads as a decode step runs them.
TEST_P(GgmlMatmulTest, DecodeCandidatesGiveTheDefaultsSums) {
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  const ops::DecodeFamily f = ops::DecodeFamily::kGgml;
  constexpr int64_t K = 768;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<TensorView> views;
  for (DType t : kTypes) {
    bytes.push_back(random_blocks(t, 70, K, static_cast<uint32_t>(t) + 5));
    TensorView w;
    w.dtype = t;
    w.shape = {70, K};
    w.data = bytes.back().data();
    views.push_back(w);
  }
  std::vector<const TensorView*> ws;
  for (const TensorView& w : views) ws.push_back(&w);
  const std::vector<float> x = randn(K, 3);
  std::vector<float> base;
  int ran = 0;
  for (int c = 0; c < static_cast<int>(ops::decode_candidates(f).size()); ++c) {
    if (!ops::decode_candidate_runs(f, c, isa)) continue;
    ops::DecodeKernels dk;
    dk.of(f) = c;
    std::vector<float> y(ws.size() * 70, NAN);
    std::vector<float*> ys;
    for (size_t i = 0; i < ws.size(); ++i) ys.push_back(y.data() + 70 * i);
    ops::matmul_multi(x.data(), 1, K, ws, ys, pool, isa, 0, ops::Bf16Gemm::kWidenF32, dk);
    if (c == 0) base = y;
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_EQ(y[i], base[i]) << ops::isa_name(isa) << " " << ops::decode_candidates(f)[c].name
                               << " output " << i;
    }
    ++ran;
  }
  // Every candidate at a level with block kernels, the default alone at the generic one.
  EXPECT_EQ(ran,
            isa == ops::Isa::kGeneric ? 1 : static_cast<int>(ops::decode_candidates(f).size()));
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, GgmlMatmulTest, ::testing::ValuesIn(ops::runnable_isas()),
                         [](const auto& info) { return std::string(ops::isa_name(info.param)); });

TEST(GgmlMatmul, ScalarReferenceAndEmbeddingRowsAreTheDequantizedValues) {
  for (DType t : kTypes) {
    const int64_t N = 3, K = 512, M = 2;
    const std::vector<uint8_t> wb = random_blocks(t, N, K, 7);
    TensorView w;
    w.dtype = t;
    w.shape = {N, K};
    w.data = wb.data();
    std::vector<float> wf(static_cast<size_t>(N * K));
    kernels::dequantize_rows_ggml(t, wb.data(), K, 0, N, wf.data());
    const std::vector<float> x = randn(static_cast<size_t>(M * K), 9);
    std::vector<float> y(static_cast<size_t>(M * N));
    ops::ref::matmul(x.data(), M, K, w, y.data());
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) {
        double want = 0;
        for (int64_t k = 0; k < K; ++k) want += static_cast<double>(x[m * K + k]) * wf[n * K + k];
        EXPECT_NEAR(y[m * N + n], want, 1e-4 * (1 + std::fabs(want))) << dtype_name(t);
      }
    }
    const int32_t ids[] = {2, 0};
    std::vector<float> rows(static_cast<size_t>(2 * K));
    ops::embedding_lookup(w, ids, 2, rows.data());
    for (int64_t k = 0; k < K; ++k) {
      ASSERT_EQ(rows[k], wf[2 * K + k]) << dtype_name(t);
      ASSERT_EQ(rows[K + k], wf[k]) << dtype_name(t);
    }
  }
}

// A GGUF Q4_0 table is repacked as I4 (model/gguf_checkpoint): its rows as looked up are
// (q − zero) · scale.
TEST(GgmlMatmul, Int4EmbeddingRowsAreTheValues) {
  ThreadPool pool(2);
  const int64_t N = 5, K = 96;
  const std::vector<float> f = randn(static_cast<size_t>(N * K), 3);
  TensorView src;
  src.dtype = DType::kF32;
  src.shape = {N, K};
  src.data = f.data();
  std::vector<uint8_t> q(dtype_nbytes(DType::kI4, N * K));
  std::vector<uint16_t> scale(static_cast<size_t>(N * K / 32));
  ASSERT_TRUE(ops::quantize_int4(src, 32, q.data(), scale.data(), pool).ok());
  TensorView w;
  w.dtype = DType::kI4;
  w.shape = {N, K};
  w.data = q.data();
  w.int4.scale = scale.data();
  w.int4.group = 32;
  const int32_t ids[] = {4, 1};
  std::vector<float> rows(static_cast<size_t>(2 * K));
  ops::embedding_lookup(w, ids, 2, rows.data());
  for (int i = 0; i < 2; ++i) {
    for (int64_t k = 0; k < K; ++k) {
      ASSERT_EQ(rows[i * K + k], static_cast<float>(ops::ref::int4_at(w, ids[i], k)) *
                                     ops::ref::int4_scale(w, ids[i], k))
          << "row " << ids[i] << " k " << k;
    }
  }
}

TEST(GgmlMatmul, RowLengthsThatAreNotWholeBlocksAreRefused) {
  std::vector<uint8_t> wb(dtype_nbytes(DType::kQ4K, 4 * 256));
  TensorView w;
  w.dtype = DType::kQ4K;
  w.shape = {8, 128};
  w.data = wb.data();
  const Status s = ops::check_linear_weight(w, 128);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("Q4_K"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("256"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace vlm

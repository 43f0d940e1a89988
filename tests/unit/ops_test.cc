// Every op against the scalar reference, on shapes with odd tails, on every ISA this CPU runs.
#include "ops/ops.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/eltwise.h"
#include "kernels/cpu/matmul.h"
#include "ops/autotune.h"
#include "ops/ref/ref.h"
#include "test_util.h"

namespace vlm {
namespace {

using test_util::randn;

struct WeightBuf {
  std::vector<float> f32;
  std::vector<uint16_t> u16;
  TensorView view;
};

WeightBuf make_weight(DType dt, int64_t N, int64_t K, uint32_t seed) {
  WeightBuf b;
  b.f32 = randn(N * K, seed);
  b.view.dtype = dt;
  b.view.shape = {N, K};
  if (dt == DType::kF32) {
    b.view.data = b.f32.data();
  } else {
    b.u16.resize(N * K);
    for (int64_t i = 0; i < N * K; ++i) {
      b.u16[i] = dt == DType::kBF16 ? f32_to_bf16(b.f32[i]) : f32_to_f16(b.f32[i]);
    }
    b.view.data = b.u16.data();
  }
  return b;
}

class MatmulTest : public ::testing::TestWithParam<ops::Isa> {};

TEST_P(MatmulTest, MatchesReferenceOnOddShapes) {
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    // M ≥ 32: the packed kernel (AVX-512 tiles of 12 rows: 45 = 3 tiles + 9; from 256 rows
    // K-block-major); K > 256: several K blocks of its panel, the last with a tail of the
    // 16-wide transpose.
    for (int64_t M : {1, 2, 3, 4, 5, 9, 17, 32, 38, 45, 260}) {
      for (int64_t K : {1, 15, 16, 33, 130, 300}) {
        for (int64_t N : {1, 3, 5, 17, 40, 70}) {
          auto w = make_weight(dt, N, K, static_cast<uint32_t>(M * 131 + K * 7 + N));
          auto x = randn(M * K, static_cast<uint32_t>(K + 3));
          std::vector<float> y(M * N, NAN), want(M * N);
          ops::matmul(x.data(), M, K, w.view, y.data(), pool, isa);
          ops::ref::matmul(x.data(), M, K, w.view, want.data());
          // f32 accumulation over K terms of unit-variance products: error ~ K · eps · |x||w|.
          const float tol = 1e-5f * static_cast<float>(K) + 1e-5f;
          for (int64_t i = 0; i < M * N; ++i) {
            ASSERT_NEAR(y[i], want[i], tol) << ops::isa_name(isa) << " " << dtype_name(dt)
                                            << " M=" << M << " K=" << K << " N=" << N << " i=" << i;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, MatmulTest, ::testing::ValuesIn(ops::runnable_isas()),
                         [](const auto& info) { return std::string(ops::isa_name(info.param)); });

// [N, K] normal values, row n scaled by 0.25 · (1 + n % 7) except row 1, all zeros.
std::vector<float> varied_rows(int64_t N, int64_t K, uint32_t seed) {
  std::vector<float> w = randn(N * K, seed);
  for (int64_t n = 0; n < N; ++n) {
    const float mag = n == 1 ? 0.f : 0.25f * static_cast<float>(1 + n % 7);
    for (int64_t k = 0; k < K; ++k) w[n * K + k] *= mag;
  }
  return w;
}

// An [N, K] f32 weight (f32) quantized by ops::quantize_int8 / quantize_int4 into q (Q: int8_t /
// uint8_t) and scale (S: f32 / f16 bits), and the matmul view of the result. I4: zero holds its
// zero points when it has them.
template <class Q, class S>
struct QuantBuf {
  std::vector<float> f32;
  std::vector<Q> q;
  std::vector<S> scale;
  std::vector<int8_t> zero;
  TensorView view;
};

template <class Q, class S, class Quantize>
QuantBuf<Q, S> quantized_weight(std::vector<float> f32, int64_t N, int64_t K, DType dtype,
                                size_t scales, Quantize quantize) {
  QuantBuf<Q, S> b;
  b.f32 = std::move(f32);
  b.q.resize(dtype_nbytes(dtype, N * K));
  b.scale.resize(scales);
  TensorView src{DType::kF32, {N, K}, b.f32.data()};
  ThreadPool pool(2);
  EXPECT_TRUE(quantize(src, b.q.data(), b.scale.data(), pool).ok());
  b.view.dtype = dtype;
  b.view.shape = {N, K};
  b.view.data = b.q.data();
  return b;
}

// An [N, K] weight quantized to I8. Rows get different magnitudes (so a wrong scale index
// shows), and row 1 is all zeros (scale 0) when N > 1.
QuantBuf<int8_t, float> make_int8_weight(int64_t N, int64_t K, uint32_t seed) {
  auto b = quantized_weight<int8_t, float>(varied_rows(N, K, seed), N, K, DType::kI8, N,
                                           &ops::quantize_int8);
  b.view.scale = b.scale.data();
  return b;
}

// Weight (n, k) of an I8 / I4 weight in double as the kernels multiply it: q · its scale (I4:
// without the zero point, which the op layer adds).
double quantized_weight_at(const TensorView& w, int64_t n, int64_t k) {
  const int64_t K = w.dim(1);
  if (w.dtype == DType::kI8) {
    return static_cast<const int8_t*>(w.data)[n * K + k] * static_cast<double>(w.scale[n]);
  }
  return ops::ref::int4_at(w, n, k) * static_cast<double>(ops::ref::int4_scale(w, n, k));
}

// |zero · scale| of I4 weight (n, k) (0 for I8 or without zero points).
double zero_term_at(const TensorView& w, int64_t n, int64_t k) {
  if (w.dtype != DType::kI4) return 0;
  return std::fabs(ops::ref::int4_zero(w, n, k) *
                   static_cast<double>(ops::ref::int4_scale(w, n, k)));
}

// y from a matmul that quantizes x (ops::matmul_quantizes_x): it must equal ref::matmul_q8 up to
// the f32 rounding of each block's product (·x scale ·weight scale) and of their sum, and the
// f32-activation reference up to the activation rounding Σ_k |w[n, k]| · xscale[m, k / 32] / 2.
// The INT4 decode kernel turns partial sums of 8 products into f32 before adding a group's four,
// and those carry the zero point (Σ (q_w + 8) · q_x): its rounding is relative to
// Σ (|q_w| + 16) · |q_x| per block rather than to |Σ q_w · q_x|.
void expect_q8_matmul(const std::vector<float>& x, int64_t M, int64_t K, const TensorView& w,
                      const std::vector<float>& y, const std::string& what) {
  const int64_t N = w.dim(0), blocks = K / kernels::kQ8Block;
  std::vector<int8_t> q(M * K);
  std::vector<float> xs(M * blocks);
  std::vector<int32_t> xsum(M * blocks);
  ops::ref::quantize_rows_q8(x.data(), M, K, q.data(), xs.data(), xsum.data());
  std::vector<float> want_q8(M * N), want_f32(M * N);
  ops::ref::matmul_q8(x.data(), M, K, w, want_q8.data());
  ops::ref::matmul(x.data(), M, K, w, want_f32.data());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      // Σ_b |block product| (with the zero point's share for INT4), activation error bound, Σ|x w|;
      // Σ |x · zero · scale| (the op's zero-point term: f32 group sums of x, times z · s, summed)
      double terms = 0, rounding = 0, a = 0, zterm = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        double dot = 0, offset = 0;
        for (int64_t k = b * 32; k < (b + 1) * 32; ++k) {
          const double wk = quantized_weight_at(w, n, k);
          dot += q[m * K + k] * wk;
          if (w.dtype == DType::kI4) {
            offset +=
                std::fabs(q[m * K + k] * wk) +
                16 * std::fabs(q[m * K + k] * static_cast<double>(ops::ref::int4_scale(w, n, k)));
          }
          rounding += std::fabs(wk) * xs[m * blocks + b] / 2;
          a += std::fabs(x[m * K + k] * wk);
          zterm += std::fabs(x[m * K + k]) * zero_term_at(w, n, k);
        }
        terms += (w.dtype == DType::kI4 ? offset : std::fabs(dot)) * xs[m * blocks + b];
      }
      const double ztol = static_cast<double>(K + 4) * std::ldexp(zterm, -23);
      const double q8tol = static_cast<double>(blocks + 4) * std::ldexp(terms, -22) + ztol;
      const int64_t i = m * N + n;
      ASSERT_NEAR(y[i], want_q8[i], q8tol + 1e-7) << what << " m=" << m << " n=" << n;
      // (|y − want_f32| <= |y − want_q8| + |want_q8 − want_f32|.)
      ASSERT_NEAR(y[i], want_f32[i], q8tol + rounding + K * std::ldexp(a, -22) + 1e-6)
          << what << " m=" << m << " n=" << n;
    }
  }
}

TEST_P(MatmulTest, Int8MatchesReferenceOnOddShapes) {
  // M = 1: the register kernel with the scale applied per output; 2..31: AVX-512's 4 × 6 tiles
  // over weight-row groups (elsewhere up to 5 the register kernel, from 8 rows widened to
  // q · scale in blocks); ≥ 32: the packed panel. K: tails of the 16-lane loop; N: of the 8-,
  // 6- and 4-row steps.
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  for (int64_t M : {1, 2, 3, 4, 5, 8, 9, 17, 32, 33, 38, 45, 260}) {
    for (int64_t K : {1, 15, 16, 17, 33, 64, 130, 300}) {
      for (int64_t N : {1, 3, 5, 17, 40, 70}) {
        auto w = make_int8_weight(N, K, static_cast<uint32_t>(M * 131 + K * 7 + N));
        auto x = randn(M * K, static_cast<uint32_t>(K + 3));
        std::vector<float> y(M * N, NAN), want(M * N);
        ASSERT_TRUE(ops::check_linear_weight(w.view, K).ok());
        ops::matmul(x.data(), M, K, w.view, y.data(), pool, isa);
        if (ops::matmul_quantizes_x(isa, M, K, DType::kI8)) {  // K = 64 on VNNI and AVX2
          expect_q8_matmul(x, M, K, w.view, y,
                           std::string(ops::isa_name(isa)) + " M=" + std::to_string(M) +
                               " K=" + std::to_string(K) + " N=" + std::to_string(N));
          continue;
        }
        ops::ref::matmul(x.data(), M, K, w.view, want.data());
        // As for the float types (f32 sums of K products), with weights up to 1.75× larger.
        const float tol = 2e-5f * static_cast<float>(K) + 1e-5f;
        for (int64_t i = 0; i < M * N; ++i) {
          ASSERT_NEAR(y[i], want[i], tol)
              << ops::isa_name(isa) << " M=" << M << " K=" << K << " N=" << N << " i=" << i;
        }
      }
    }
  }
}

TEST_P(MatmulTest, MultiEqualsSeparateMatmuls) {
  // Stacked weights of different heights and dtypes (a thread's share spans weight boundaries):
  // each output equals its own matmul exactly (the same kernel runs on the same rows).
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  // (K = 64 at 40 rows: the INT8 weights take quantized x on VNNI, the others f32.)
  for (auto [M, K] : {std::pair<int64_t, int64_t>{1, 70}, {3, 70}, {9, 70}, {40, 70}, {40, 64}}) {
    auto a = make_weight(DType::kBF16, 37, K, 1), b = make_weight(DType::kF32, 5, K, 2);
    auto c = make_int8_weight(50, K, 3);
    auto x = randn(M * K, 4);
    const TensorView* ws[] = {&a.view, &b.view, &c.view};
    std::vector<float> ya(M * 37, NAN), yb(M * 5, NAN), yc(M * 50, NAN);
    float* ys[] = {ya.data(), yb.data(), yc.data()};
    ops::matmul_multi(x.data(), M, K, ws, ys, pool, isa);
    for (int i = 0; i < 3; ++i) {
      std::vector<float> want(M * ws[i]->dim(0));
      ops::matmul(x.data(), M, K, *ws[i], want.data(), pool, isa);
      for (size_t j = 0; j < want.size(); ++j) {
        ASSERT_EQ(ys[i][j], want[j]) << ops::isa_name(isa) << " M=" << M << " w" << i << " " << j;
      }
    }
  }
}

struct PrepackedKernels {
  void (*pack_rows)(const float*, int64_t, int64_t, int64_t, float*);
  void (*pack_cols)(const float*, int64_t, int64_t, int64_t, float*);
  void (*matmul)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t, float*,
                 int64_t);
};

PrepackedKernels prepacked_kernels(ops::Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == ops::Isa::kAvx512 || isa == ops::Isa::kAvx512Vnni) {
    return {&kernels::avx512::pack_b_rows, &kernels::avx512::pack_b_cols,
            &kernels::avx512::matmul_prepacked};
  }
  if (isa == ops::Isa::kAvx2) {
    return {&kernels::avx2::pack_b_rows, &kernels::avx2::pack_b_cols,
            &kernels::avx2::matmul_prepacked};
  }
#endif
  (void)isa;
  return {&kernels::generic::pack_b_rows, &kernels::generic::pack_b_cols,
          &kernels::generic::matmul_prepacked};
}

TEST_P(MatmulTest, PrepackedMatchesReferenceOnOddShapesAndStrides) {
  // B packed from rows (pack_b_rows) or from Bᵀ's rows (pack_b_cols), both with a row stride
  // wider than the data; x and y with strides too; K either the packed width or a prefix of it
  // (the causal blocks); N below the packed rows. Tails: M past whole tiles, N past a 32-row
  // panel, K past a 256-wide block and the 16-wide transpose.
  const PrepackedKernels kern = prepacked_kernels(GetParam());
  for (int64_t M : {1, 5, 12, 13, 48, 50}) {
    for (int64_t packed_k : {7, 64, 300}) {
      for (int64_t K : {packed_k, packed_k / 2 + 1}) {
        for (int64_t N : {1, 17, 32, 72}) {
          for (bool from_cols : {false, true}) {
            const int64_t rows = N + 3;  // B has rows past N that the product must not use
            const int64_t ldb = (from_cols ? rows : packed_k) + 5, ldx = K + 2, ldy = N + 4;
            auto b = randn((from_cols ? packed_k : rows) * ldb, static_cast<uint32_t>(M + K));
            auto x = randn(M * ldx, static_cast<uint32_t>(N + 11));
            std::vector<float> packed(kernels::prepacked_floats(rows, packed_k), NAN);
            if (from_cols) {
              kern.pack_cols(b.data(), ldb, rows, packed_k, packed.data());
            } else {
              kern.pack_rows(b.data(), ldb, rows, packed_k, packed.data());
            }
            std::vector<float> y(M * ldy, -7.f);
            kern.matmul(x.data(), ldx, M, K, packed.data(), packed_k, N, y.data(), ldy);
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t n = 0; n < ldy; ++n) {
                if (n >= N) {  // columns past N untouched
                  ASSERT_EQ(y[m * ldy + n], -7.f) << m << " " << n;
                  continue;
                }
                double want = 0;
                for (int64_t k = 0; k < K; ++k) {
                  want += static_cast<double>(x[m * ldx + k]) *
                          (from_cols ? b[k * ldb + n] : b[n * ldb + k]);
                }
                ASSERT_NEAR(y[m * ldy + n], want, 1e-5 * K + 1e-5)
                    << ops::isa_name(GetParam()) << " M=" << M << " K=" << K << "/" << packed_k
                    << " N=" << N << " cols " << from_cols << " at " << m << "," << n;
              }
            }
          }
        }
      }
    }
  }
}

TEST(QuantizeInt8, ExactValuesAndTiesToEven) {
  // Row 0: max 127 → scale exactly 1, so q is w rounded half to even. Row 1: max 254 → scale 2.
  // Row 2: zeros → scale 0, q 0. Every value is exact in F32, BF16 and F16.
  const std::vector<float> w = {127, -127, 63.5f, 0.5f, 1.5f, -2.5f, 0, 1, 254, 1, 3, -5,
                                2,   -254, 0.5f,  100,  0,    0,     0, 0, 0,   0, 0, 0};
  const std::vector<int8_t> want_q = {127, -127, 64, 0,  2, -2, 0, 1, 127, 0, 2, -2,
                                      1,   -127, 0,  50, 0, 0,  0, 0, 0,   0, 0, 0};
  const std::vector<float> want_scale = {1.f, 2.f, 0.f};
  ThreadPool pool(2);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    std::vector<uint16_t> h(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      h[i] = dt == DType::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
    }
    TensorView v{dt, {3, 8}, dt == DType::kF32 ? static_cast<const void*>(w.data()) : h.data()};
    std::vector<int8_t> q(24, 99);
    std::vector<float> scale(3, NAN);
    ASSERT_TRUE(ops::quantize_int8(v, q.data(), scale.data(), pool).ok()) << dtype_name(dt);
    EXPECT_EQ(q, want_q) << dtype_name(dt);
    EXPECT_EQ(scale, want_scale) << dtype_name(dt);
  }
}

TEST(QuantizeInt8, RoundTripErrorIsAtMostHalfAStep) {
  ThreadPool pool(2);
  const int64_t N = 37, K = 1001;
  auto w = randn(N * K, 21);
  for (int64_t n = 0; n < N; ++n) {
    const float mag = n == 5 ? 0.f : std::ldexp(1.f, static_cast<int>(n % 13) - 6);  // 2^-6 .. 2^6
    for (int64_t k = 0; k < K; ++k) w[n * K + k] *= mag;
  }
  w[3 * K + 17] = 1e4f;  // one outlier: the rest of its row gets a coarse grid
  std::vector<int8_t> q(N * K);
  std::vector<float> scale(N);
  TensorView v{DType::kF32, {N, K}, w.data()};
  ASSERT_TRUE(ops::quantize_int8(v, q.data(), scale.data(), pool).ok());
  for (int64_t n = 0; n < N; ++n) {
    float amax = 0;
    int qmax = 0;
    for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(w[n * K + k]));
    EXPECT_EQ(scale[n], amax / 127.f) << n;
    for (int64_t k = 0; k < K; ++k) {
      const int qi = q[n * K + k];
      ASSERT_GE(qi, -127);
      ASSERT_LE(qi, 127);
      qmax = std::max(qmax, std::abs(qi));
      // w / scale carries one f32 rounding (≤ 127 · 2^-24 ≈ 7.6e-6 steps) on top of the half step.
      const double err =
          std::fabs(static_cast<double>(w[n * K + k]) - qi * static_cast<double>(scale[n]));
      ASSERT_LE(err, scale[n] * (0.5 + 1e-5)) << n << " " << k;
    }
    EXPECT_EQ(qmax, n == 5 ? 0 : 127) << n;  // the largest |w| lands on ±127
  }
}

TEST(QuantizeInt8, RefusesNonFiniteAndNonFloatWeights) {
  ThreadPool pool(2);
  std::vector<float> w(2 * 4, 1.f);
  std::vector<int8_t> q(8);
  std::vector<float> scale(2);
  w[6] = INFINITY;
  auto quantize = [&](const TensorView& v) {
    return ops::quantize_int8(v, q.data(), scale.data(), pool);
  };
  Status s = quantize(TensorView{DType::kF32, {2, 4}, w.data()});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("row 1"), std::string::npos) << s.message();
  w[6] = NAN;
  EXPECT_FALSE(quantize(TensorView{DType::kF32, {2, 4}, w.data()}).ok());
  EXPECT_FALSE(quantize(TensorView{DType::kI8, {2, 4}, q.data()}).ok());
  EXPECT_FALSE(quantize(TensorView{DType::kF32, {8}, w.data()}).ok());
  // A matmul weight in I8 needs its scales.
  EXPECT_FALSE(ops::check_linear_weight(TensorView{DType::kI8, {2, 4}, q.data()}, 4).ok());
}

// An [N, K] weight quantized to I4 in groups of `group`: as make_int8_weight, and group 0 of row 0
// has an outlier (a coarse grid there, clamping in the −w_max candidates). With `zeros`, every
// group also gets a zero point in −8..7 (a different weight, the same kernels' inputs).
QuantBuf<uint8_t, uint16_t> make_int4_weight(int64_t N, int64_t K, uint32_t seed,
                                             int64_t group = 32, bool zeros = false) {
  std::vector<float> f32 = varied_rows(N, K, seed);
  f32[5] = 8.f;
  auto b = quantized_weight<uint8_t, uint16_t>(
      std::move(f32), N, K, DType::kI4, N * K / group,
      [group](const TensorView& v, uint8_t* q, uint16_t* s, ThreadPool& pool) {
        return ops::quantize_int4(v, group, q, s, pool);
      });
  b.view.int4.scale = b.scale.data();
  b.view.int4.group = group;
  if (zeros) {
    std::mt19937 rng(seed + 1);
    b.zero.resize(N * K / group);
    for (int8_t& z : b.zero) z = static_cast<int8_t>(static_cast<int>(rng() % 16) - 8);
    b.view.int4.zero = b.zero.data();
  }
  return b;
}

// The layouts the INT4 kernels are tested on: groups of 32 (the one --quant int4 makes), 64 and
// 128 (one scale per 2 or 4 packed blocks), each without and with zero points; the K values of
// each (1, 3, 5 and 9 groups of 32; 1, 3 and 5 of 64; 1, 3 and 9 of 128 — and every tail of the
// decode kernels' 2- and 4-block chunks).
struct Int4Layout {
  int64_t group;
  bool zeros;
  std::vector<int64_t> ks;
};
const std::vector<Int4Layout>& int4_layouts() {
  static const std::vector<Int4Layout> layouts = {
      {32, false, {32, 96, 160, 288}}, {32, true, {32, 96, 160}},      {64, false, {64, 192, 320}},
      {64, true, {64, 192}},           {128, false, {128, 384, 1152}}, {128, true, {128, 384}}};
  return layouts;
}

TEST_P(MatmulTest, MultiWithInt4GroupsAndZeroPointsEqualsSeparateMatmuls) {
  // Stacked I4 weights of each group size, two with zero points (their term uses x's group sums of
  // its own group size), beside a BF16 one; a thread's share spans the boundaries. Each output
  // equals its own matmul exactly, also written side by side into one buffer (ldy).
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  const int64_t K = 256;
  for (int64_t M : {1, 9, 40}) {
    auto a = make_weight(DType::kBF16, 37, K, 1);
    auto b = make_int4_weight(20, K, 2, 32, false);
    auto c = make_int4_weight(33, K, 3, 64, true);
    auto d = make_int4_weight(17, K, 4, 128, true);
    auto x = randn(M * K, 5);
    const TensorView* ws[] = {&a.view, &b.view, &c.view, &d.view};
    const int64_t total = 37 + 20 + 33 + 17;
    std::vector<float> wide(M * total, NAN);
    std::vector<std::vector<float>> own;
    std::vector<float*> ys, cols;
    int64_t at = 0;
    for (const TensorView* w : ws) {
      own.emplace_back(M * w->dim(0), NAN);
      ys.push_back(own.back().data());
      cols.push_back(wide.data() + at);
      at += w->dim(0);
    }
    ops::matmul_multi(x.data(), M, K, ws, ys, pool, isa);
    ops::matmul_multi(x.data(), M, K, ws, cols, pool, isa, total);
    for (size_t i = 0; i < 4; ++i) {
      const int64_t N = ws[i]->dim(0);
      std::vector<float> want(M * N);
      ops::matmul(x.data(), M, K, *ws[i], want.data(), pool, isa);
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) {
          ASSERT_EQ(ys[i][m * N + n], want[m * N + n])
              << ops::isa_name(isa) << " M=" << M << " w" << i << " " << m << "," << n;
          ASSERT_EQ(cols[i][m * total + n], want[m * N + n])
              << ops::isa_name(isa) << " M=" << M << " w" << i << " " << m << "," << n << " (ldy)";
        }
      }
    }
  }
}

TEST_P(MatmulTest, Int4MatchesReferenceOnOddShapes) {
  // M = 1..7: the INT4 register kernel (4-row x steps, then 3/2/1; 8-, 4- and 1-row w steps);
  // 8..31: blocks of 32 rows widened to BF16 for the BF16 kernel; ≥ 32: the packed GEMM widens
  // I4 into its panel (K = 288: two K blocks; M = 45 and 260: several 12-row tiles and both loop
  // orders). N: tails of the 8- and 4-row steps and of the 32-row blocks. Every layout
  // (int4_layouts); the group sizes other than 32 and zero points on fewer shapes.
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  for (const Int4Layout& layout : int4_layouts()) {
    const bool all = layout.group == 32 && !layout.zeros;
    const std::vector<int64_t> ms =
        all ? std::vector<int64_t>{1, 2, 3, 4, 5, 7, 8, 9, 17, 32, 33, 38, 45, 260}
            : std::vector<int64_t>{1, 2, 5, 9, 33, 45};
    const std::vector<int64_t> ns =
        all ? std::vector<int64_t>{1, 3, 5, 9, 17, 40, 70} : std::vector<int64_t>{1, 9, 17, 40};
    for (int64_t M : ms) {
      for (int64_t K : layout.ks) {
        for (int64_t N : ns) {
          const std::string what = std::string(ops::isa_name(isa)) +
                                   " G=" + std::to_string(layout.group) +
                                   (layout.zeros ? " zeros" : "") + " M=" + std::to_string(M) +
                                   " K=" + std::to_string(K) + " N=" + std::to_string(N);
          auto w = make_int4_weight(N, K, static_cast<uint32_t>(M * 131 + K * 7 + N), layout.group,
                                    layout.zeros);
          auto x = randn(M * K, static_cast<uint32_t>(K + 3));
          std::vector<float> y(M * N, NAN), want(M * N);
          ASSERT_TRUE(ops::check_linear_weight(w.view, K).ok()) << what;
          ops::matmul(x.data(), M, K, w.view, y.data(), pool, isa);
          if (ops::matmul_quantizes_x(isa, M, K, DType::kI4)) {  // every M on VNNI
            expect_q8_matmul(x, M, K, w.view, y, what);
            continue;
          }
          ops::ref::matmul(x.data(), M, K, w.view, want.data());
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              // Bounds from a = Σ_k |x w| (w as the kernels multiply it, q · scale): f32
              // products and sums carry ≤ (K + 1) · 2^-24 · a (taken 4× for margin). Widened to
              // BF16 (M ≥ 8), each weight moves by ≤ 2^-8 of itself (round to nearest: half a unit
              // in the last of BF16's 8 bits), a bound that covers a BF16 GEMM that rounds x too.
              // The zero points' term (f32 sums of x per group, times zero · scale, summed) carries
              // ≤ (K + 4) · 2^-24 of Σ |x · zero · scale| (2× for margin).
              double a = 0, z = 0;
              for (int64_t k = 0; k < K; ++k) {
                a += std::fabs(static_cast<double>(x[m * K + k]) *
                               quantized_weight_at(w.view, n, k));
                z += std::fabs(static_cast<double>(x[m * K + k])) * zero_term_at(w.view, n, k);
              }
              const double rel = static_cast<double>(K) * std::ldexp(1.0, -22) +
                                 (M >= 8 ? std::ldexp(1.0, -8) : 0.0);
              const int64_t i = m * N + n;
              ASSERT_NEAR(y[i], want[i], rel * a + (K + 4) * std::ldexp(z, -23) + 1e-6)
                  << what << " m=" << m << " n=" << n;
            }
          }
        }
      }
    }
  }
}

TEST_P(MatmulTest, Int8ActivationsMatchReferenceOnOddShapes) {
  // The INT8-activation kernels where the level has them (else the test checks the level
  // declines). GEMM (INT8 weights from int8_activation_min_rows, INT4 from 32 rows): 6-row (VNNI)
  // and 4-row (AVX2) tiles and every tail of both (2 .. 9, 32 .. 45), K-block-major order
  // (300), K past one 1024-value panel block and an 8-run tail of a 16-run chunk (1056, 2080), N
  // tails of the 32-row panel. INT4 decode (M < 32): 8-row (M <= 2) and 4-row weight steps and
  // their 1-row tails (N = 17, 33, 70), 1..4-row x groups, chunks of 4 blocks with 1 or 3 left
  // (K = 32, 96, 1056 = 8 chunks + 1 block, 2080).
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  bool ran = false;
  for (DType dt : {DType::kI8, DType::kI4}) {
    for (int64_t M : {1, 2, 3, 5, 8, 9, 11, 31, 32, 34, 35, 37, 45, 300}) {
      for (int64_t K : {32, 96, 1056, 2080}) {
        for (int64_t N : {1, 17, 33, 70}) {
          if (!ops::matmul_quantizes_x(isa, M, K, dt)) continue;
          ran = true;
          const auto seed = static_cast<uint32_t>(M * 131 + K * 7 + N);
          auto w8 = make_int8_weight(N, K, seed);
          auto w4 = make_int4_weight(N, K, seed);
          const TensorView& w = dt == DType::kI8 ? w8.view : w4.view;
          auto x = randn(M * K, static_cast<uint32_t>(K + 5));
          for (int64_t k = 0; k < 32; ++k) x[k] = 0.f;  // a zero block (scale 0)
          if (M > 1) x[K + 3] = 40.f;                   // an outlier in row 1's first block
          std::vector<float> y(M * N, NAN);
          ops::matmul(x.data(), M, K, w, y.data(), pool, isa);
          expect_q8_matmul(x, M, K, w, y,
                           std::string(dtype_name(dt)) + " M=" + std::to_string(M) +
                               " K=" + std::to_string(K) + " N=" + std::to_string(N));
        }
      }
    }
  }
  // INT4 in groups of 64 and 128 and with zero points: the decode kernels' scale lanes (a
  // chunk's blocks sharing a scale, a chunk cut short by K) and the GEMMs' panel scales.
  for (const Int4Layout& layout : int4_layouts()) {
    if (layout.group == 32 && !layout.zeros) continue;  // above
    for (int64_t M : {1, 2, 3, 5, 34, 45}) {
      for (int64_t K : {layout.group, 3 * layout.group, int64_t{1152}}) {
        for (int64_t N : {1, 17, 33}) {
          if (!ops::matmul_quantizes_x(isa, M, K, DType::kI4)) continue;
          auto w = make_int4_weight(N, K, static_cast<uint32_t>(M * 131 + K * 7 + N), layout.group,
                                    layout.zeros);
          auto x = randn(M * K, static_cast<uint32_t>(K + 5));
          for (int64_t k = 0; k < 32; ++k) x[k] = 0.f;  // a zero block (scale 0)
          std::vector<float> y(M * N, NAN);
          ops::matmul(x.data(), M, K, w.view, y.data(), pool, isa);
          expect_q8_matmul(x, M, K, w.view, y,
                           "I4 G=" + std::to_string(layout.group) + (layout.zeros ? " zeros" : "") +
                               " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                               " N=" + std::to_string(N));
        }
      }
    }
  }
  EXPECT_EQ(ran,
            isa == ops::Isa::kAvx512Vnni || isa == ops::Isa::kAvx2 || isa == ops::Isa::kAvx2Vnni)
      << ops::isa_name(isa);
  // INT8 weights from 2 x rows on VNNI and 8 on AVX2 (one row, decode, keeps f32 x); INT4 at any M.
  const int64_t min_rows = ops::int8_activation_min_rows(isa);
  EXPECT_EQ(min_rows, isa == ops::Isa::kAvx512Vnni                           ? 2
                      : isa == ops::Isa::kAvx2 || isa == ops::Isa::kAvx2Vnni ? 8
                                                                             : 0)
      << ops::isa_name(isa);
  for (int64_t M = 1; M <= 40; ++M) {
    EXPECT_EQ(ops::matmul_quantizes_x(isa, M, 64, DType::kI8), min_rows > 0 && M >= min_rows)
        << ops::isa_name(isa) << " M=" << M;
    EXPECT_EQ(ops::matmul_quantizes_x(isa, M, 64, DType::kI4), min_rows > 0)
        << ops::isa_name(isa) << " M=" << M;
  }
  // Never for float weights or K off the 32-value blocks.
  EXPECT_FALSE(ops::matmul_quantizes_x(isa, 64, 64, DType::kBF16));
  EXPECT_FALSE(ops::matmul_quantizes_x(isa, 64, 48, DType::kI8));
}

TEST(QuantizeRowsQ8, KernelsMatchReferenceExactly) {
#if defined(VLM_HAVE_X86_DISPATCH)
  // Every level's kernel writes the same bytes (the AVX2 one packs within 128-bit lanes and
  // reorders).
  using QuantizeFn = decltype(&kernels::avx2::quantize_rows_q8);
  std::vector<std::pair<ops::Isa, QuantizeFn>> kernels_of = {
      {ops::Isa::kAvx2, &kernels::avx2::quantize_rows_q8},
      {ops::Isa::kAvx2Vnni, &kernels::avxvnni::quantize_rows_q8},
      {ops::Isa::kAvx512Vnni, &kernels::avx512vnni::quantize_rows_q8}};
  const auto isas = ops::runnable_isas();
  if (std::find(isas.begin(), isas.end(), ops::Isa::kAvx2) == isas.end()) {
    GTEST_SKIP() << "this CPU has no AVX2";
  }
  for (const auto& [isa, quantize] : kernels_of) {
    if (std::find(isas.begin(), isas.end(), isa) == isas.end()) continue;
    SCOPED_TRACE(ops::isa_name(isa));
    const int64_t M = 5, K = 160;
    auto x = randn(M * K, 9);
    for (int64_t k = 0; k < 32; ++k) x[k] = 0.f;                  // zero block
    for (int64_t k = 32; k < 64; ++k) x[k] = 1e-39f * (k % 3);    // subnormal: scale 0
    for (int64_t k = 64; k < 96; ++k) x[k] = (k % 5 - 2) * 0.5f;  // ties: 63.5 → 64, −63.5
    x[96] = 1e30f;                                                // huge, the rest round to 0
    for (int64_t k = 128; k < 160; ++k) x[k] = (k % 2 ? 1e-37f : -2e-37f);  // 127 / amax: inf
    x[K + 7] = -3.f;                                                        // the max is negative
    std::vector<int8_t> q(M * K, 99), want_q(M * K);
    std::vector<float> s(M * K / 32, NAN), want_s(M * K / 32);
    std::vector<int32_t> sum(M * K / 32, 7), want_sum(M * K / 32);
    quantize(x.data(), M, K, q.data(), s.data(), sum.data());
    ops::ref::quantize_rows_q8(x.data(), M, K, want_q.data(), want_s.data(), want_sum.data());
    EXPECT_EQ(q, want_q);
    EXPECT_EQ(s, want_s);
    EXPECT_EQ(sum, want_sum);
    EXPECT_EQ(s[0], 0.f);
    EXPECT_EQ(s[1], 0.f);
    EXPECT_EQ(q[66], -64);  // −0.5 · 127 / 1 = −63.5 → −64 (ties to even)
    EXPECT_EQ(q[68], 64);   // 63.5 → 64
    EXPECT_EQ(q[96], 127);
    EXPECT_EQ(s[4], 0.f);  // normal floats, but too small a block for a finite 127 / amax
    for (int64_t k = 128; k < 160; ++k) EXPECT_EQ(q[k], 0) << k;
    for (int64_t k = 0; k < 32; ++k) {
      const int32_t v = q[K + k];
      EXPECT_LE(std::abs(v), 127);
      EXPECT_NEAR(v * s[K / 32], x[K + k], s[K / 32] / 2 * 1.0001f) << k;  // row 1, block 0
    }
  }
#else
  GTEST_SKIP() << "no x86 dispatch in this build";
#endif
}

TEST_P(MatmulTest, Fp16ArithmeticMatchesAnExactEmulation) {
  // ops::matmul_f16 where the level runs it (else it must equal ops::matmul exactly). The
  // reference emulates the arithmetic matmul.h states: x and the weights rounded to FP16, each
  // run of 32 products accumulated by FP16 FMAs (each a*b + c exact in double, then one rounding
  // to FP16), the runs' sums added — here in double, so the kernel may differ by its f32
  // additions only. M: 9-row tiles and tails, K-block-major order (300); K: past one 512-value
  // panel block (544, 1056); N: tails of the 32-row panel.
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  bool ran = false;
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t M : {8, 32, 41, 300}) {
      for (int64_t K : {32, 64, 544, 1056}) {
        for (int64_t N : {1, 17, 33, 70}) {
          if (M * K * N > 6'000'000) continue;  // the emulation is slow; 300 × 544 × 33 stays
          auto w = make_weight(dt, N, K, static_cast<uint32_t>(M * 131 + K * 7 + N));
          auto x = randn(M * K, static_cast<uint32_t>(K + 11));
          std::vector<float> y(M * N, NAN), plain(M * N, NAN);
          ops::matmul_f16(x.data(), M, K, w.view, y.data(), pool, isa);
          if (!ops::matmul_runs_f16(isa, M, K, dt)) {
            ops::matmul(x.data(), M, K, w.view, plain.data(), pool, isa);
            ASSERT_EQ(y, plain) << ops::isa_name(isa) << " M=" << M << " K=" << K;
            continue;
          }
          ran = true;
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              double total = 0, mag = 0;
              for (int64_t r = 0; r < K; r += 32) {
                _Float16 h = 0;
                for (int64_t k = r; k < r + 32; ++k) {
                  const auto xk = static_cast<_Float16>(x[m * K + k]);
                  const float wf = dt == DType::kF32    ? w.f32[n * K + k]
                                   : dt == DType::kBF16 ? bf16_to_f32(w.u16[n * K + k])
                                                        : f16_to_f32(w.u16[n * K + k]);
                  const auto wk = static_cast<_Float16>(wf);
                  h = static_cast<_Float16>(static_cast<double>(xk) * static_cast<double>(wk) +
                                            static_cast<double>(h));
                }
                total += static_cast<double>(h);
                mag += std::fabs(static_cast<double>(h));
              }
              ASSERT_NEAR(y[m * N + n], total,
                          static_cast<double>(K / 32 + 2) * std::ldexp(mag, -23))
                  << dtype_name(dt) << " M=" << M << " K=" << K << " N=" << N << " m=" << m
                  << " n=" << n;
            }
          }
        }
      }
    }
  }
  if (ran) {
    // And FP16 arithmetic is close to f32: within ~2^-9 of Σ|x w| on these normal values.
    const int64_t M = 40, K = 1024, N = 20;
    auto w = make_weight(DType::kBF16, N, K, 5);
    auto x = randn(M * K, 6);
    std::vector<float> y(M * N), want(M * N);
    ops::matmul_f16(x.data(), M, K, w.view, y.data(), pool, isa);
    ops::ref::matmul(x.data(), M, K, w.view, want.data());
    for (int64_t i = 0; i < M * N; ++i) {
      double a = 0;
      for (int64_t k = 0; k < K; ++k) {
        a += std::fabs(x[(i / N) * K + k] *
                       static_cast<double>(bf16_to_f32(w.u16[(i % N) * K + k])));
      }
      ASSERT_NEAR(y[i], want[i], a * std::ldexp(1.0, -9)) << i;
    }
  }
}

// The BF16 GEMM candidates (AVX512_BF16 dot products, AMX tiles) against an exact emulation: x
// rounded to BF16 (to nearest even), the BF16 weights as stored, the products summed in double —
// the kernels' f32 sums may differ only by their f32 additions. Shapes: row tails of the 12-row
// tiles and 16-row padding of x (33, 47, 100), single and double 16-row weight blocks (16, 48,
// 96), K past one 32-wide step, and the outputs side by side in one row (a q|k|v stack through
// ldy).
class Bf16GemmTest : public ::testing::TestWithParam<ops::Bf16Gemm> {};

TEST_P(Bf16GemmTest, MatchesAnExactEmulationOfBf16Inputs) {
  const ops::Bf16Gemm g = GetParam();
  if (!ops::bf16_gemm_available(g)) GTEST_SKIP() << ops::bf16_gemm_name(g) << ": not on this CPU";
  ThreadPool pool(2);
  for (int64_t M : {32, 33, 47, 100}) {
    for (int64_t K : {32, 64, 320}) {
      for (int64_t N : {16, 48, 96}) {
        auto w = make_weight(DType::kBF16, N, K, static_cast<uint32_t>(M * 131 + K * 7 + N));
        auto w2 = make_weight(DType::kBF16, 32, K, static_cast<uint32_t>(M + K + N));
        auto x = randn(M * K, static_cast<uint32_t>(K + 17));
        const TensorView* ws[] = {&w.view, &w2.view};
        ASSERT_TRUE(ops::bf16_gemm_runs(g, M, K, ws));
        const int64_t ld = N + 32;
        std::vector<float> y(M * ld, NAN);
        float* ys[] = {y.data(), y.data() + N};
        ops::matmul_multi(x.data(), M, K, ws, ys, pool, ops::detected_isa(), ld, g);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t n = 0; n < ld; ++n) {
            const WeightBuf& wb = n < N ? w : w2;
            const int64_t row = n < N ? n : n - N;
            double total = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double p = static_cast<double>(bf16_to_f32(f32_to_bf16(x[m * K + k]))) *
                               bf16_to_f32(wb.u16[row * K + k]);
              total += p;
              mag += std::fabs(p);
            }
            ASSERT_NEAR(y[m * ld + n], total, static_cast<double>(K) * std::ldexp(mag, -23))
                << ops::bf16_gemm_name(g) << " M=" << M << " K=" << K << " N=" << N << " m=" << m
                << " n=" << n;
          }
        }
      }
    }
  }
  // Other weights, K or fewer rows are not theirs: the f32 path takes them.
  auto f32 = make_weight(DType::kF32, 32, 64, 1);
  auto odd = make_weight(DType::kBF16, 24, 64, 2);
  auto bf = make_weight(DType::kBF16, 32, 48, 3);
  const TensorView* a[] = {&f32.view};
  const TensorView* b[] = {&odd.view};
  const TensorView* c[] = {&bf.view};
  EXPECT_FALSE(ops::bf16_gemm_runs(g, 64, 64, a));
  EXPECT_FALSE(ops::bf16_gemm_runs(g, 64, 64, b));
  EXPECT_FALSE(ops::bf16_gemm_runs(g, 64, 48, c));
  EXPECT_FALSE(ops::bf16_gemm_runs(g, 31, 64, c));
}

INSTANTIATE_TEST_SUITE_P(Candidates, Bf16GemmTest,
                         ::testing::Values(ops::Bf16Gemm::kDotBf16, ops::Bf16Gemm::kAmx),
                         [](const auto& info) {
                           return std::string(ops::bf16_gemm_name(info.param));
                         });

// VLM_CPU_KERNELS' syntax: nothing forced by default, unknown choices refused by name, a
// candidate only where the CPU runs it.
TEST(Bf16Gemm, KernelChoicesParseAndRefuse) {
  auto none = ops::parse_cpu_kernels("");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->bf16_gemm.has_value());
  for (const auto& d : none->decode) EXPECT_FALSE(d.has_value());
  EXPECT_EQ(*ops::parse_cpu_kernels("bf16_gemm=f32")->bf16_gemm, ops::Bf16Gemm::kWidenF32);
  for (const char* bad : {"bf16_gemm=amx2", "gemm=amx", "bf16_gemm", "BF16_GEMM=amx",
                          "bf16_gemm=dp", "bf16_decode=fast", "int4_decode", "int8_decode=widen"}) {
    auto r = ops::parse_cpu_kernels(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("unknown kernel choice"), std::string::npos);
    EXPECT_NE(r.status().message().find("int4_decode=default|r8|"), std::string::npos);
  }
  for (ops::Bf16Gemm g : {ops::Bf16Gemm::kDotBf16, ops::Bf16Gemm::kAmx}) {
    auto r = ops::parse_cpu_kernels(std::string("bf16_gemm=") + ops::bf16_gemm_name(g));
    EXPECT_EQ(r.ok(), ops::bf16_gemm_available(g)) << ops::bf16_gemm_name(g);
    if (r.ok()) EXPECT_EQ(*r->bf16_gemm, g);
  }
  // Decode families: `default` is candidate 0; a candidate is accepted where it runs at the level.
  auto defaults = ops::parse_cpu_kernels(
      "bf16_gemm=f32,bf16_decode=default,int8_decode=f32,int4_decode=default,ggml_decode=default",
      ops::Isa::kGeneric);
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  for (const auto& d : defaults->decode) EXPECT_EQ(d, 0);
  for (ops::Isa isa : ops::runnable_isas()) {
    for (ops::DecodeFamily f : ops::kDecodeFamilies) {
      const auto cands = ops::decode_candidates(f);
      for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
        const std::string item = std::string(ops::decode_family_name(f)) + "=" + cands[i].name;
        auto r = ops::parse_cpu_kernels(item, isa);
        ASSERT_EQ(r.ok(), ops::decode_candidate_runs(f, i, isa))
            << item << " " << ops::isa_name(isa);
        if (r.ok()) EXPECT_EQ(r->decode[static_cast<int>(f)], i) << item;
        if (!r.ok()) EXPECT_NE(r.status().message().find("not one this CPU"), std::string::npos);
      }
      // Only the default at the generic level; every candidate is exact or says it is not.
      EXPECT_EQ(ops::decode_candidate_runs(f, 1, ops::Isa::kGeneric), false);
      EXPECT_TRUE(cands[0].exact);
      EXPECT_FALSE(ops::decode_candidate_runs(f, static_cast<int>(cands.size()), isa));
    }
  }
}

// Kernel choice by measurement: every candidate this CPU runs is timed, the fastest chosen, and
// the result cached (keyed by CPU, ISA set, build and shape) so that the next start reads it.
// Which one wins is the CPU's business: the test asserts the bookkeeping, not a timing.
TEST(Autotune, MeasuresOnceThenReadsTheCache) {
  ThreadPool pool(2);
  const std::string dir = ::testing::TempDir() + "vlm-autotune-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  auto first = ops::choose_bf16_gemm(pool, ops::detected_isa(), 64, 256, 128, dir);
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_FALSE(first->cached);
  const size_t candidates = 1 + ops::bf16_gemm_available(ops::Bf16Gemm::kDotBf16) +
                            ops::bf16_gemm_available(ops::Bf16Gemm::kAmx);
  ASSERT_EQ(first->candidates.size(), candidates);
  EXPECT_EQ(first->candidates[0].name, "f32");
  for (const auto& c : first->candidates) EXPECT_GT(c.gflops, 0) << c.name;
  auto second = ops::choose_bf16_gemm(pool, ops::detected_isa(), 64, 256, 128, dir);
  ASSERT_TRUE(second.ok());
  EXPECT_TRUE(second->cached);
  EXPECT_EQ(second->chosen, first->chosen);
  EXPECT_EQ(second->candidates.size(), first->candidates.size());
  // Another shape is measured and added beside the first.
  auto other = ops::choose_bf16_gemm(pool, ops::detected_isa(), 32, 64, 32, dir);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->cached);
  std::ifstream f(dir + "/cpu-kernels.txt");
  int lines = 0;
  for (std::string line; std::getline(f, line);) ++lines;
  EXPECT_EQ(lines, 2);
  EXPECT_NE(ops::describe(*second).find("cached"), std::string::npos);
  // Another family's entry for the same shape is its own.
  auto vision = ops::choose_bf16_gemm(pool, ops::detected_isa(), 64, 256, 128, dir, "vision_gemm");
  ASSERT_TRUE(vision.ok());
  EXPECT_EQ(vision->family, "vision_gemm");
  EXPECT_FALSE(vision->cached);
  // A BF16 candidate is chosen only when it beats f32 by 5%.
  for (const auto* r : {&*first, &*vision}) {
    for (const auto& k : r->candidates) {
      if (k.name == r->chosen && k.name != "f32") {
        EXPECT_GT(k.gflops, 1.05 * r->candidates.front().gflops);
      }
    }
  }
  // No cache folder: measured every time, nothing written.
  auto uncached = ops::choose_bf16_gemm(pool, ops::detected_isa(), 32, 64, 32, "");
  ASSERT_TRUE(uncached.ok());
  EXPECT_FALSE(uncached->cached);
  EXPECT_FALSE(ops::choose_bf16_gemm(pool, ops::detected_isa(), 0, 64, 32, "").ok());
  std::filesystem::remove_all(dir);
}

// y[n] for one x row by decode candidate c of family f, calling its kernel directly (as
// matmul_multi should): false where the candidate does not run at this level.
bool decode_directly(ops::DecodeFamily f, int c, ops::Isa isa, const std::vector<float>& x,
                     int64_t K, const TensorView& w, std::vector<float>* y) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (c == 0 || !ops::decode_candidate_runs(f, c, isa)) return false;
  const int64_t N = w.dim(0);
  const auto row_l2 =
      isa >= ops::Isa::kAvx512 ? &kernels::avx512::matmul_row_l2 : &kernels::avx2::matmul_row_l2;
  const auto* wb = static_cast<const uint16_t*>(w.data);
  std::vector<float> xp(K);
  if (f == ops::DecodeFamily::kBf16 && c == 1)
    row_l2(x.data(), K, w.dtype, w.data, nullptr, 0, N, y->data());
  if (f == ops::DecodeFamily::kBf16 && c == 2 && isa >= ops::Isa::kAvx512) {
    kernels::avx512::prepare_x_evenodd(x.data(), K, xp.data());
    kernels::avx512::matmul_row_bf16_evenodd(xp.data(), K, wb, 0, N, y->data());
  } else if (f == ops::DecodeFamily::kBf16 && c == 2) {
    kernels::avx2::prepare_x_evenodd(x.data(), K, xp.data());
    kernels::avx2::matmul_row_bf16_evenodd(xp.data(), K, wb, 0, N, y->data());
  }
#if defined(VLM_HAVE_AVX512BF16)
  if (f == ops::DecodeFamily::kBf16 && c == 3) {
    std::vector<uint16_t> xb(K);
    kernels::avx512bf16::convert_rows_bf16(x.data(), 1, K, xb.data());
    kernels::avx512bf16::matmul_row_bf16_dot(xb.data(), K, wb, 0, N, y->data());
  }
#endif
  if (f == ops::DecodeFamily::kInt8 && c == 1)
    row_l2(x.data(), K, w.dtype, w.data, w.scale, 0, N, y->data());
  if ((f == ops::DecodeFamily::kInt8 && c == 2) || f == ops::DecodeFamily::kInt4) {
    const int64_t blocks = K / kernels::kQ8Block;
    std::vector<int8_t> q(K);
    std::vector<float> xs(blocks);
    std::vector<int32_t> sum(blocks);
    kernels::avx512vnni::quantize_rows_q8(x.data(), 1, K, q.data(), xs.data(), sum.data());
    kernels::Q8Rows rows{q.data(), xs.data(), sum.data()};
    if (f == ops::DecodeFamily::kInt8) {
      kernels::avx512vnni::matmul_row_i8_decode(rows, K, static_cast<const int8_t*>(w.data),
                                                w.scale, 0, N, y->data());
    } else {
      std::vector<uint8_t> dx(kernels::q8_decode_x_bytes(1, K));
      kernels::avx512vnni::prepare_decode_x(rows, 1, K, dx.data());
      rows.decode = dx.data();
      kernels::avx512vnni::matmul_rows_q4_decode(ops::int4_decode_shape(c), rows, 1, K,
                                                 static_cast<const uint8_t*>(w.data), w.int4, 0, N,
                                                 y->data(), N);
      // (zero points: the op layer's term, not the kernel's)
      if (w.int4.zero != nullptr) return false;
    }
  }
  return true;
#else
  (void)f, (void)c, (void)isa, (void)x, (void)K, (void)w, (void)y;
  return false;
#endif
}

// Every decode candidate this level runs, against the scalar reference, through matmul_multi (a
// stack of weights split across the threads, as a decode step runs them), and equal to the
// bit to its kernel called directly (so the dispatch ran it, not the default). BF16 and INT8: K of
// one run of 32, a 64-value step's half left (96), many (1056, 2048, 2080) and off the runs (48:
// the default runs). INT4: every group layout at its own K (chunks of 4 blocks with 1..3 left:
// the 256-bit kernel's halves), and 2 and 3 x rows (the default kernel runs). N: tails of the
// 8- and 4-row steps.
TEST_P(MatmulTest, DecodeCandidatesMatchReference) {
  ThreadPool pool(2);
  const ops::Isa isa = GetParam();
  for (ops::DecodeFamily f : ops::kDecodeFamilies) {
    if (f == ops::DecodeFamily::kGgml) continue;  // GGUF blocks: ggml_matmul_test
    const auto cands = ops::decode_candidates(f);
    for (int c = 0; c <= static_cast<int>(cands.size()); ++c) {  // one past: not a candidate
      const bool exact = c == static_cast<int>(cands.size()) || cands[c].exact ||
                         !ops::decode_candidate_runs(f, c, isa);
      ops::DecodeKernels dk;
      dk.of(f) = c;
      struct Case {
        int64_t M, K;
        int layout;  // INT4: index into int4_layouts()
      };
      std::vector<Case> cases;
      if (f == ops::DecodeFamily::kInt4) {
        for (int l = 0; l < static_cast<int>(int4_layouts().size()); ++l) {
          for (int64_t K : int4_layouts()[l].ks) {
            for (int64_t M : {1, 2, 3}) cases.push_back({M, K, l});
          }
        }
      } else {
        for (int64_t K : {32, 48, 96, 1056, 2048, 2080}) {
          if (f == ops::DecodeFamily::kInt8 && K == 48) continue;  // INT8 rows: K from 32s
          cases.push_back({1, K, 0});
        }
      }
      for (const Case& cs : cases) {
        const int64_t M = cs.M, K = cs.K;
        const std::string what = std::string(ops::isa_name(isa)) + " " +
                                 ops::decode_family_name(f) + " candidate " + std::to_string(c) +
                                 " M=" + std::to_string(M) + " K=" + std::to_string(K) +
                                 " layout " + std::to_string(cs.layout);
        const auto seed = static_cast<uint32_t>(c * 17 + M * 131 + K + cs.layout);
        std::vector<WeightBuf> fw;
        std::vector<QuantBuf<int8_t, float>> w8;
        std::vector<QuantBuf<uint8_t, uint16_t>> w4;
        std::vector<const TensorView*> ws;
        for (int64_t N : {9, 17, 70}) {
          if (f == ops::DecodeFamily::kBf16)
            fw.push_back(make_weight(DType::kBF16, N, K, seed + N));
          if (f == ops::DecodeFamily::kInt8) w8.push_back(make_int8_weight(N, K, seed + N));
          if (f == ops::DecodeFamily::kInt4) {
            const Int4Layout& l = int4_layouts()[cs.layout];
            w4.push_back(make_int4_weight(N, K, seed + N, l.group, l.zeros));
          }
        }
        for (auto& b : fw) ws.push_back(&b.view);
        for (auto& b : w8) ws.push_back(&b.view);
        for (auto& b : w4) ws.push_back(&b.view);
        ASSERT_EQ(ws.size(), 3u) << what;
        auto x = randn(M * K, seed + 1);
        for (int64_t k = 0; k < 32; ++k) x[k] = 0.f;  // a zero block (scale 0)
        std::vector<std::vector<float>> ys;
        std::vector<float*> yp;
        for (const TensorView* w : ws) ys.emplace_back(M * w->dim(0), NAN);
        for (auto& y : ys) yp.push_back(y.data());
        ops::matmul_multi(x.data(), M, K, ws, yp, pool, isa, 0, ops::Bf16Gemm::kWidenF32, dk);
        for (size_t i = 0; i < ws.size(); ++i) {
          const TensorView& w = *ws[i];
          const int64_t N = w.dim(0);
          if (M == 1 && K % 32 == 0) {
            std::vector<float> direct(N, NAN);
            if (decode_directly(f, c, isa, x, K, w, &direct)) {
              for (int64_t n = 0; n < N; ++n) ASSERT_EQ(ys[i][n], direct[n]) << what << " n=" << n;
            }
          }
          if (w.dtype != DType::kBF16 && (ops::matmul_quantizes_x(isa, M, K, w.dtype) || !exact)) {
            expect_q8_matmul(x, M, K, w, ys[i], what);
            continue;
          }
          std::vector<float> want(M * N);
          ops::ref::matmul(x.data(), M, K, w, want.data());
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              // Σ|x w| bounds the f32 sums (K · 2^-22 of it); x rounded to BF16 (dpbf16) moves
              // each product by ≤ 2^-8 of itself.
              double a = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double wk = w.dtype == DType::kBF16
                                      ? bf16_to_f32(static_cast<const uint16_t*>(w.data)[n * K + k])
                                      : quantized_weight_at(w, n, k) + zero_term_at(w, n, k);
                a += std::fabs(static_cast<double>(x[m * K + k]) * wk);
              }
              const double rel = static_cast<double>(K) * std::ldexp(1.0, -22) +
                                 (exact ? 0.0 : std::ldexp(1.0, -8));
              ASSERT_NEAR(ys[i][m * N + n], want[m * N + n], rel * a + 1e-6)
                  << what << " N=" << N << " m=" << m << " n=" << n;
            }
          }
        }
      }
    }
  }
}

// The decode choice: each candidate the level runs is timed on the given weights and named with
// its rate; the fastest exact one wins unless an inexact one beats it by 5% (and never under
// exact_only); the result is cached; bad input is refused.
TEST(Autotune, DecodeChoiceMeasuresEveryCandidateAndCaches) {
  ThreadPool pool(2);
  const std::string dir = ::testing::TempDir() + "vlm-decode-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const ops::Isa isa = ops::detected_isa();
  auto bf = make_weight(DType::kBF16, 64, 256, 1);
  auto i8 = make_int8_weight(64, 256, 2);
  auto i4 = make_int4_weight(64, 256, 3, 32, false);
  // A GGUF Q8_0 weight: per 32 values an f16 scale, then 32 int8.
  std::vector<uint8_t> q8_0(dtype_nbytes(DType::kQ8_0, 64 * 256));
  for (size_t i = 0; i < q8_0.size(); ++i) q8_0[i] = static_cast<uint8_t>(i * 37 + 11);
  for (size_t b = 0; b < q8_0.size(); b += 34) q8_0[b] = 0, q8_0[b + 1] = 0x20;  // d = 2^-7
  TensorView gg;
  gg.dtype = DType::kQ8_0;
  gg.shape = {64, 256};
  gg.data = q8_0.data();
  const std::pair<ops::DecodeFamily, const TensorView*> cases[] = {
      {ops::DecodeFamily::kBf16, &bf.view},
      {ops::DecodeFamily::kInt8, &i8.view},
      {ops::DecodeFamily::kInt4, &i4.view},
      {ops::DecodeFamily::kGgml, &gg}};
  for (const auto& [f, w] : cases) {
    const TensorView* ws[] = {w, w};
    const auto cands = ops::decode_candidates(f);
    for (bool exact_only : {false, true}) {
      auto c = ops::choose_decode_kernel(pool, isa, f, ws, exact_only, dir);
      ASSERT_TRUE(c.ok()) << c.status().message();
      EXPECT_FALSE(c->cached);
      EXPECT_EQ(c->family, ops::decode_family_name(f));
      std::vector<std::string> want;
      for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
        if (ops::decode_candidate_runs(f, i, isa) && (!exact_only || cands[i].exact)) {
          want.push_back(cands[i].name);
        }
      }
      ASSERT_EQ(c->candidates.size(), want.size());
      double best_exact = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        EXPECT_EQ(c->candidates[i].name, want[i]);
        EXPECT_GT(c->candidates[i].gflops, 0) << want[i];
        for (const auto& k : cands) {
          if (k.name == want[i] && k.exact)
            best_exact = std::max(best_exact, c->candidates[i].gflops);
        }
      }
      for (const auto& k : c->candidates) {
        if (k.name != c->chosen) continue;
        bool exact = false;
        for (const auto& d : cands) exact = exact || (d.name == k.name && d.exact);
        EXPECT_TRUE(exact ? k.gflops == best_exact : k.gflops > 1.05 * best_exact) << k.name;
      }
      EXPECT_NE(ops::describe(*c).find("GB/s"), std::string::npos);
      auto again = ops::choose_decode_kernel(pool, isa, f, ws, exact_only, dir);
      ASSERT_TRUE(again.ok());
      EXPECT_TRUE(again->cached);
      EXPECT_EQ(again->chosen, c->chosen);
      EXPECT_EQ(again->candidates.size(), c->candidates.size());
    }
    // Weights of another family's dtype, or none, are refused.
    const TensorView* other[] = {f == ops::DecodeFamily::kBf16 ? &i8.view : &bf.view};
    EXPECT_FALSE(ops::choose_decode_kernel(pool, isa, f, other, false, dir).ok());
    EXPECT_FALSE(ops::choose_decode_kernel(pool, isa, f, {}, false, dir).ok());
  }
  std::filesystem::remove_all(dir);
}

TEST(MatmulInt4, RefusesBadWeights) {
  std::vector<uint8_t> q(64);
  std::vector<uint16_t> scale(4);
  TensorView w{DType::kI4, {2, 64}, q.data()};
  EXPECT_FALSE(ops::check_linear_weight(w, 64).ok());  // no scales
  w.int4.scale = scale.data();
  EXPECT_TRUE(ops::check_linear_weight(w, 64).ok());
  EXPECT_FALSE(ops::check_linear_weight(w, 32).ok());
  TensorView odd = w;
  odd.shape = {2, 48};
  Status s = ops::check_linear_weight(odd, 48);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of its group size 32"), std::string::npos) << s.message();
  w.int4.group = 128;  // 64 is not a multiple of 128
  s = ops::check_linear_weight(w, 64);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of its group size 128"), std::string::npos) << s.message();
  for (int64_t g : {0, 16, 48, 96, 256}) {
    w.int4.group = g;
    s = ops::check_linear_weight(w, 64);
    EXPECT_FALSE(s.ok()) << g;
    EXPECT_NE(s.message().find("group size " + std::to_string(g)), std::string::npos)
        << s.message();
  }
  w.int4.group = 64;
  EXPECT_TRUE(ops::check_linear_weight(w, 64).ok());
}

TEST(DequantizeInt4, EveryIsaWidensToRoundedBf16) {
  // Each kernel's BF16 rows are f32_to_bf16(q · scale) exactly (the scale of the value's group:
  // groups of 32, 64 and 128), on the rows the op layer feeds to the BF16 kernel.
  const int64_t N = 7, K = 384;
  using Fn = void (*)(const uint8_t*, const Int4Params&, int64_t, int64_t, int64_t, uint16_t*);
  std::vector<std::pair<const char*, Fn>> fns = {
      {"generic", &kernels::generic::dequantize_rows_q4_bf16}};
#if defined(VLM_HAVE_X86_DISPATCH)
  for (ops::Isa isa : ops::runnable_isas()) {
    if (isa == ops::Isa::kAvx512) {
      fns.push_back({"avx512", &kernels::avx512::dequantize_rows_q4_bf16});
    }
  }
#endif
  for (int64_t group : {32, 64, 128}) {
    auto w = make_int4_weight(N, K, 77, group);
    for (auto [name, fn] : fns) {
      std::vector<uint16_t> out((N - 2) * K, 0xffff);
      fn(w.q.data(), w.view.int4, K, 2, N, out.data());  // rows 2..6
      for (int64_t n = 2; n < N; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const float v = static_cast<float>(ops::ref::int4_at(w.view, n, k)) *
                          ops::ref::int4_scale(w.view, n, k);
          ASSERT_EQ(out[(n - 2) * K + k], f32_to_bf16(v))
              << name << " G=" << group << " n=" << n << " k=" << k;
        }
      }
    }
  }
}

// Σ_k (w − q·scale)² of group g of row n, in double.
double int4_group_sse(const std::vector<float>& w, const TensorView& q, int64_t n, int64_t g) {
  const int64_t K = q.dim(1), G = q.int4.group;
  double e = 0;
  for (int64_t k = g * G; k < (g + 1) * G; ++k) {
    const double d = w[n * K + k] - ops::ref::int4_at(q, n, k) *
                                        static_cast<double>(ops::ref::int4_scale(q, n, k));
    e += d * d;
  }
  return e;
}

TEST(QuantizeInt4, ExactOnTheGridAndZeroGroups) {
  // Every weight is q · step with q in −8..7 and a power-of-two step, exact in F32, BF16 and F16
  // (and the steps in the f16 scales). Group 0 (step 1) reaches ±7: max|w| / 7 is exact. Group 1
  // (step 2^-3) and group 2 (step 4) reach −8 and nothing past ±7 otherwise: −w_max / 8 is exact.
  // Group 3 is zeros: scale 0, q 0. Row 1 is row 0 negated, except that the −8s stay (+8 is off
  // the grid). In groups of 32, 64 and 128 (the same values: each group of G repeats them).
  ThreadPool pool(2);
  for (int64_t G : {32, 64, 128}) {
    const int64_t K = 4 * G;
    std::vector<float> w(2 * K);
    const float step[4] = {1.f, 0.125f, 4.f, 0.f};
    for (int64_t k = 0; k < K; ++k) {
      const int64_t g = k / G, j = k % 32;
      int q = static_cast<int>((j * 5 + g + (k % G) / 32) % 15) - 7;  // −7..7
      if (j == 3) q = 7;
      if (g == 1 && j == 9) q = -8;
      if (g == 1 && j == 3) q = 5;  // no +7 in group 1: its extreme is the −8
      if (g == 2 && j == 9) q = -8;
      if (g == 3) q = 0;
      w[k] = static_cast<float>(q) * step[g];
      w[K + k] = static_cast<float>(q == -8 ? -8 : -q) * step[g];
    }
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " G=" + std::to_string(G));
      std::vector<uint16_t> h(w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        h[i] = dt == DType::kBF16 ? f32_to_bf16(w[i]) : f32_to_f16(w[i]);
      }
      TensorView v{dt, {2, K}, dt == DType::kF32 ? static_cast<const void*>(w.data()) : h.data()};
      std::vector<uint8_t> q(K, 0x5a);
      std::vector<uint16_t> scale(8, 0x7e00);  // NaN until written
      ASSERT_TRUE(ops::quantize_int4(v, G, q.data(), scale.data(), pool).ok());
      TensorView qv{DType::kI4, {2, K}, q.data()};
      qv.int4 = {scale.data(), nullptr, G};
      for (int64_t n = 0; n < 2; ++n) {
        for (int64_t k = 0; k < K; ++k) {
          const double got =
              ops::ref::int4_at(qv, n, k) * static_cast<double>(ops::ref::int4_scale(qv, n, k));
          ASSERT_EQ(got, w[n * K + k]) << " n=" << n << " k=" << k;
        }
        EXPECT_EQ(f16_to_f32(scale[n * 4 + 3]), 0.f);
        for (int64_t k = 3 * G; k < K; ++k) EXPECT_EQ(ops::ref::int4_at(qv, n, k), 0);
      }
      // Exact candidates have error 0, and the first of equal errors wins.
      for (int64_t n = 0; n < 2; ++n) {
        EXPECT_EQ(f16_to_f32(scale[n * 4 + 0]), 1.f);
        EXPECT_EQ(f16_to_f32(scale[n * 4 + 1]), 0.125f);
        EXPECT_EQ(f16_to_f32(scale[n * 4 + 2]), 4.f);
      }
    }
  }
}

TEST(QuantizeInt4, RoundTripErrorIsAtMostHalfAStepAndNoWorseThanMaxOver7) {
  // The scale is one of the three candidates rounded to f16; q is chosen against the rounded
  // scale, so the half-step bound holds for the scale the kernels read. Rows of magnitudes 2^-14
  // .. 2^6 (small ones give subnormal f16 scales, coarser relative to the weights but still
  // the grid q is rounded to).
  ThreadPool pool(2);
  for (int64_t G : {32, 64, 128}) {
    SCOPED_TRACE("G=" + std::to_string(G));
    const int64_t N = 37, K = 1024;
    auto w = randn(N * K, 21);
    for (int64_t n = 0; n < N; ++n) {
      const float mag = n == 5 ? 0.f : std::ldexp(1.f, static_cast<int>(n % 21) - 14);
      for (int64_t k = 0; k < K; ++k) w[n * K + k] *= mag;
    }
    w[3 * K + 17] = 1e4f;   // one outlier: the rest of its group gets a coarse grid
    w[4 * K + 40] = -1e4f;  // and a negative one
    std::vector<uint8_t> q(N * K / 2);
    std::vector<uint16_t> scale(N * K / G);
    TensorView v{DType::kF32, {N, K}, w.data()};
    ASSERT_TRUE(ops::quantize_int4(v, G, q.data(), scale.data(), pool).ok());
    TensorView qv{DType::kI4, {N, K}, q.data()};
    qv.int4 = {scale.data(), nullptr, G};
    const int64_t groups = K / G;
    int64_t negative_scales = 0, clamped = 0;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t g = 0; g < groups; ++g) {
        const float s = f16_to_f32(scale[n * groups + g]);
        float amax = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k)
          amax = std::max(amax, std::fabs(w[n * K + k]));
        if (n == 5) {
          ASSERT_EQ(s, 0.f);
          continue;
        }
        negative_scales += s < 0;
        // The scale is one of the three candidates, rounded to f16.
        const float as = std::fabs(s);
        ASSERT_TRUE(as == f16_to_f32(f32_to_f16(amax / 7.f)) ||
                    as == f16_to_f32(f32_to_f16(amax / 8.f)) ||
                    as == f16_to_f32(f32_to_f16(amax / 8.5f)))
            << n << " " << g;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          const int qi = ops::ref::int4_at(qv, n, k);
          ASSERT_GE(qi, -8);
          ASSERT_LE(qi, 7);
          const double r = static_cast<double>(w[n * K + k]) / s;
          const double err =
              std::fabs(static_cast<double>(w[n * K + k]) - qi * static_cast<double>(s));
          if (r >= -8.5 && r <= 7.5) {
            // w / s carries one f32 rounding (≤ 8.5 · 2^-24 steps) on top of the half step.
            ASSERT_LE(err, as * (0.5 + 1e-5)) << n << " " << k;
          } else {
            ++clamped;
            ASSERT_EQ(qi, r < 0 ? -8 : 7) << n << " " << k;
          }
        }
        // The search never does worse than the plain max|w| / 7 grid with its scale rounded to
        // f16 the same way (up to f32 rounding of the errors it compares).
        const float s7 = f16_to_f32(f32_to_f16(amax / 7.f));
        double e7 = 0;
        for (int64_t k = g * G; k < (g + 1) * G; ++k) {
          const double qk =
              std::clamp(std::nearbyint(static_cast<double>(w[n * K + k] / s7)), -8.0, 7.0);
          const double d = w[n * K + k] - qk * s7;
          e7 += d * d;
        }
        ASSERT_LE(int4_group_sse(w, qv, n, g), e7 * (1 + 1e-5) + 1e-30) << n << " " << g;
      }
    }
    EXPECT_GT(negative_scales, 0);  // −w_max / 8 (or 8.5) with a positive w_max was picked
    EXPECT_GT(clamped, 0);          // and so was 8.5 with a far end to clip
  }
}

TEST(QuantizeInt4, RefusesNonFiniteBadShapesGroupsAndNonFloatWeights) {
  ThreadPool pool(2);
  std::vector<float> w(2 * 128, 1.f);
  std::vector<uint8_t> q(128);
  std::vector<uint16_t> scale(8);
  w[200] = INFINITY;
  auto quantize = [&](const TensorView& v, int64_t group = 32) {
    return ops::quantize_int4(v, group, q.data(), scale.data(), pool);
  };
  Status s = quantize(TensorView{DType::kF32, {2, 128}, w.data()});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("row 1"), std::string::npos) << s.message();
  w[200] = NAN;
  EXPECT_FALSE(quantize(TensorView{DType::kF32, {2, 128}, w.data()}).ok());
  w[200] = 1e6f;  // a scale past f16's range
  s = quantize(TensorView{DType::kF32, {2, 128}, w.data()});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("f16"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("row 1"), std::string::npos) << s.message();
  w[200] = 1.f;
  EXPECT_TRUE(quantize(TensorView{DType::kF32, {2, 128}, w.data()}).ok());
  for (int64_t g : {32, 64, 128})
    EXPECT_TRUE(quantize(TensorView{DType::kF32, {2, 128}, w.data()}, g).ok());
  s = quantize(TensorView{DType::kF32, {4, 32 + 16}, w.data()});  // K not a multiple of 32
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of 32"), std::string::npos) << s.message();
  s = quantize(TensorView{DType::kF32, {2, 96}, w.data()}, 64);  // nor of 64
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("multiple of 64"), std::string::npos) << s.message();
  for (int64_t g : {0, 16, 96, 256}) {
    s = quantize(TensorView{DType::kF32, {2, 128}, w.data()}, g);
    EXPECT_FALSE(s.ok()) << g;
    EXPECT_NE(s.message().find("32, 64 or 128"), std::string::npos) << s.message();
  }
  EXPECT_FALSE(quantize(TensorView{DType::kF32, {2, 63}, w.data()}).ok());  // odd K
  EXPECT_FALSE(quantize(TensorView{DType::kI8, {2, 64}, q.data()}).ok());
  EXPECT_FALSE(quantize(TensorView{DType::kF32, {128}, w.data()}).ok());
}

class AttentionTest : public ::testing::TestWithParam<ops::Isa> {};

TEST_P(AttentionTest, CausalGqaMatchesReference) {
  ThreadPool pool(2);
  // 12: scalar path (not a multiple of 8); 72 (the 8B vision head): odd number of 8-vectors.
  for (int64_t head_dim : {12, 16, 72, 128}) {
    for (int64_t first_pos : {0, 5, 100}) {  // 100: keys span two 64-key tiles
      const int64_t n_q = 7, n_heads = 4, n_kv = 2, total = first_pos + n_q;
      auto q = randn(n_q * n_heads * head_dim, 1);
      auto k = randn(total * n_kv * head_dim, 2);
      auto v = randn(total * n_kv * head_dim, 3);
      std::vector<float> out(q.size()), want(q.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      const int32_t one_block = 0;  // the whole cache as one block: the contiguous layout
      ops::attention_paged(q.data(), n_q, first_pos, k.data(), v.data(), &one_block, total, n_heads,
                           n_kv, head_dim, scale, out.data(), pool, GetParam());
      ops::ref::attention_causal(q.data(), n_q, first_pos, k.data(), v.data(), n_heads, n_kv,
                                 head_dim, scale, want.data());
      for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-5f) << i;
    }
  }
}

TEST_P(AttentionTest, LongPrefillChunksMatchReference) {
  // From 64 queries the chunk goes through the blocked (GEMM) path: chunks of 64, 130 (blocks of
  // 48 + 48 + 34) and 200 queries after 0 or 37 cached positions, over a shuffled paged cache,
  // with GQA (6 heads on 2 KV heads) and a head_dim on each vector path.
  ThreadPool pool(2);
  for (int64_t head_dim : {16, 72}) {
    for (int64_t n_q : {64, 130, 200}) {
      for (int64_t first_pos : {0, 37}) {
        const int64_t heads = 6, n_kv = 2, total = first_pos + n_q, block_size = 16;
        const int64_t row = n_kv * head_dim, n_blocks = (total + block_size - 1) / block_size;
        auto q = randn(n_q * heads * head_dim, 21);
        auto k = randn(total * row, 22), v = randn(total * row, 23);
        std::vector<int32_t> table(n_blocks);
        for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(n_blocks - b);
        std::vector<float> kp((n_blocks + 1) * block_size * row, NAN), vp(kp.size(), NAN);
        for (int64_t p = 0; p < total; ++p) {
          const int64_t r = table[p / block_size] * block_size + p % block_size;
          std::copy_n(k.data() + p * row, row, kp.data() + r * row);
          std::copy_n(v.data() + p * row, row, vp.data() + r * row);
        }
        std::vector<float> got(q.size(), NAN), want(q.size());
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        ops::attention_paged(q.data(), n_q, first_pos, kp.data(), vp.data(), table.data(),
                             block_size, heads, n_kv, head_dim, scale, got.data(), pool,
                             GetParam());
        ops::ref::attention_causal(q.data(), n_q, first_pos, k.data(), v.data(), heads, n_kv,
                                   head_dim, scale, want.data());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-5f)
              << "hd " << head_dim << " n_q " << n_q << " first " << first_pos << " i " << i;
        }
      }
    }
  }
}

TEST_P(AttentionTest, PagedEqualsContiguous) {
  // The same keys scattered over shuffled blocks of a pool give the same result as a contiguous
  // cache, for block sizes that do and do not divide the length, and head dims on both paths.
  ThreadPool pool(2);
  for (int64_t head_dim : {12, 32}) {
    for (int64_t block_size : {4, 16}) {
      const int64_t n_q = 5, first = 70, total = first + n_q, heads = 4, n_kv = 2;
      const int64_t row = n_kv * head_dim, n_blocks = (total + block_size - 1) / block_size;
      auto q = randn(n_q * heads * head_dim, 11);
      auto k = randn(total * row, 12), v = randn(total * row, 13);
      std::vector<int32_t> table(n_blocks);
      for (int64_t b = 0; b < n_blocks; ++b)
        table[b] = static_cast<int32_t>(n_blocks + 1 - b);  // reversed, offset
      std::vector<float> kp((n_blocks + 2) * block_size * row, NAN), vp(kp.size(), NAN);
      for (int64_t p = 0; p < total; ++p) {
        const int64_t r = table[p / block_size] * block_size + p % block_size;
        std::copy_n(k.data() + p * row, row, kp.data() + r * row);
        std::copy_n(v.data() + p * row, row, vp.data() + r * row);
      }
      std::vector<float> got(q.size()), want(q.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
      ops::attention_paged(q.data(), n_q, first, kp.data(), vp.data(), table.data(), block_size,
                           heads, n_kv, head_dim, scale, got.data(), pool, GetParam());
      ops::ref::attention_causal(q.data(), n_q, first, k.data(), v.data(), heads, n_kv, head_dim,
                                 scale, want.data());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_NEAR(got[i], want[i], 1e-5f)
            << "hd " << head_dim << " bs " << block_size << " " << i;
      }
    }
  }
}

TEST_P(AttentionTest, SplitKDecodeMatchesReference) {
  // One query over more than 1024 keys takes the split-K path: the key range in chunks of >= 256
  // (contexts with odd tails), GQA groups of 1, 2, 3 and 8, and of 12 and 14 (more than the
  // kernel's 8 at once: 8 + 4, 8 + 6), a paged cache with shuffled blocks of 16 and one
  // contiguous block.
  ThreadPool pool(3);
  struct Shape {
    int64_t heads, n_kv, hd;
  };
  for (Shape sh : {Shape{4, 4, 16}, Shape{4, 2, 72}, Shape{6, 2, 32}, Shape{8, 1, 128},
                   Shape{12, 1, 32}, Shape{14, 1, 16}}) {
    for (int64_t total : {1025, 1100, 2037, 20001}) {
      if (total > 3000 && sh.hd != 128) continue;  // the many-chunk case once is enough
      for (int64_t block_size : {int64_t{16}, total}) {
        const int64_t row = sh.n_kv * sh.hd, n_blocks = (total + block_size - 1) / block_size;
        auto q = randn(sh.heads * sh.hd, 61);
        auto k = randn(total * row, 62), v = randn(total * row, 63);
        // Scores spread over a wide range, so chunk maxima differ and the merge's rescaling shows.
        for (auto& x : q) x *= 2.f;
        std::vector<int32_t> table(n_blocks);
        for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>((b * 7) % n_blocks);
        if (n_blocks % 7 == 0) std::iota(table.begin(), table.end(), 0);  // keep it a permutation
        std::vector<float> kp(n_blocks * block_size * row, NAN), vp(kp.size(), NAN);
        for (int64_t p = 0; p < total; ++p) {
          const int64_t r = table[p / block_size] * block_size + p % block_size;
          std::copy_n(k.data() + p * row, row, kp.data() + r * row);
          std::copy_n(v.data() + p * row, row, vp.data() + r * row);
        }
        std::vector<float> got(q.size(), NAN), want(q.size());
        const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
        ops::attention_paged(q.data(), 1, total - 1, kp.data(), vp.data(), table.data(), block_size,
                             sh.heads, sh.n_kv, sh.hd, scale, got.data(), pool, GetParam());
        ops::ref::attention_causal(q.data(), 1, total - 1, k.data(), v.data(), sh.heads, sh.n_kv,
                                   sh.hd, scale, want.data());
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 1e-5f)
              << "heads " << sh.heads << " kv " << sh.n_kv << " hd " << sh.hd << " keys " << total
              << " bs " << block_size << " " << i;
        }
      }
    }
  }
}

TEST_P(AttentionTest, BidirectionalMatchesReference) {
  ThreadPool pool(2);
  // 130 keys: two full 64-key tiles and a tail; 300: P·V runs over two K blocks of the matmul.
  for (int64_t n : {1, 5, 33, 130, 300}) {
    const int64_t heads = 3, hd = 24;
    auto q = randn(n * heads * hd, 5), k = randn(n * heads * hd, 6), v = randn(n * heads * hd, 7);
    std::vector<float> out(q.size()), want(q.size());
    ops::attention_full(q.data(), k.data(), v.data(), n, heads, hd, 0.25f, out.data(), pool,
                        GetParam());
    ops::ref::attention_full(q.data(), k.data(), v.data(), n, heads, hd, 0.25f, want.data());
    for (size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], want[i], 1e-5f) << n << " " << i;
  }
}

// K/V stored as BF16 or INT8 and read by the kernels in place: for every path (per-row paged,
// split-K decode, the blocked prefill, the scalar head_dim) the result equals the double-precision
// reference on the values the cache holds (read back with load_kv_head) to 1e-5, and stays within
// the bound the format gives of the reference on the original f32 K/V: with q·k_j perturbed by at
// most δ = scale·Σ_d |q_d|·|Δk_jd| and V by at most ΔV, |Δout| ≤ ΔV + (e^(2δ) − 1)·max|v|.
TEST_P(AttentionTest, Bf16AndInt8CachesAreReadInPlace) {
  ThreadPool pool(2);
  struct Shape {
    int64_t n_q, first, heads, n_kv, hd, block_size;
  };
  for (DType type : {DType::kBF16, DType::kI8}) {
    for (Shape sh :
         {Shape{7, 40, 4, 2, 16, 16}, Shape{5, 30, 4, 2, 12, 8}, Shape{1, 2036, 8, 2, 128, 16},
          Shape{130, 37, 6, 2, 72, 16}, Shape{1, 3, 4, 4, 32, 4}}) {
      const int64_t total = sh.first + sh.n_q, row = sh.n_kv * sh.hd;
      const int64_t n_blocks = (total + sh.block_size - 1) / sh.block_size;
      auto q = randn(sh.n_q * sh.heads * sh.hd, 71);
      auto k = randn(total * row, 72), v = randn(total * row, 73);
      for (auto& x : k) x *= 1.5f;
      std::vector<int32_t> table(n_blocks);
      for (int64_t b = 0; b < n_blocks; ++b) table[b] = static_cast<int32_t>(n_blocks - 1 - b);
      const size_t rows = static_cast<size_t>(n_blocks * sh.block_size);
      std::vector<uint8_t> kp(rows * row * 4), vp(kp.size());
      std::vector<float> ks(rows * sh.n_kv, NAN), vs(ks.size(), NAN);
      std::vector<float> kd(total * row), vd(total * row);  // what the cache holds, as f32
      for (int64_t p = 0; p < total; ++p) {
        const int64_t r = table[p / sh.block_size] * sh.block_size + p % sh.block_size;
        ops::store_kv_row(k.data() + p * row, sh.n_kv, sh.hd, type, kp.data(), ks.data(), r);
        ops::store_kv_row(v.data() + p * row, sh.n_kv, sh.hd, type, vp.data(), vs.data(), r);
        for (int64_t h = 0; h < sh.n_kv; ++h) {
          ops::load_kv_head(kp.data(), ks.data(), type, sh.n_kv, sh.hd, r, h,
                            kd.data() + p * row + h * sh.hd);
          ops::load_kv_head(vp.data(), vs.data(), type, sh.n_kv, sh.hd, r, h,
                            vd.data() + p * row + h * sh.hd);
        }
      }
      ops::KvPool kv;
      kv.k = kp.data();
      kv.v = vp.data();
      kv.k_scale = ks.data();
      kv.v_scale = vs.data();
      kv.type = type;
      std::vector<float> got(q.size(), NAN), held(q.size()), exact(q.size());
      const float scale = 1.0f / std::sqrt(static_cast<float>(sh.hd));
      ops::attention_paged(q.data(), sh.n_q, sh.first, kv, table.data(), sh.block_size, sh.heads,
                           sh.n_kv, sh.hd, scale, got.data(), pool, GetParam());
      ops::ref::attention_causal(q.data(), sh.n_q, sh.first, kd.data(), vd.data(), sh.heads,
                                 sh.n_kv, sh.hd, scale, held.data());
      ops::ref::attention_causal(q.data(), sh.n_q, sh.first, k.data(), v.data(), sh.heads, sh.n_kv,
                                 sh.hd, scale, exact.data());
      double dv = 0, vmax = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        dv = std::max(dv, std::fabs(static_cast<double>(v[i]) - vd[i]));
        vmax = std::max(vmax, std::fabs(static_cast<double>(v[i])));
      }
      const std::string what = std::string(dtype_name(type)) + " hd " + std::to_string(sh.hd) +
                               " n_q " + std::to_string(sh.n_q) + " keys " + std::to_string(total);
      for (int64_t i = 0; i < sh.n_q; ++i) {
        for (int64_t h = 0; h < sh.heads; ++h) {
          const float* qv = q.data() + (i * sh.heads + h) * sh.hd;
          const int64_t kvh = h / (sh.heads / sh.n_kv);
          double delta = 0;  // the largest score perturbation of this query
          for (int64_t j = 0; j <= sh.first + i; ++j) {
            double d = 0;
            for (int64_t c = 0; c < sh.hd; ++c) {
              const int64_t at = j * row + kvh * sh.hd + c;
              d += std::fabs(qv[c]) * std::fabs(static_cast<double>(k[at]) - kd[at]);
            }
            delta = std::max(delta, scale * d);
          }
          const double bound = dv + std::expm1(2 * delta) * vmax + 1e-5;
          for (int64_t c = 0; c < sh.hd; ++c) {
            const size_t at = static_cast<size_t>((i * sh.heads + h) * sh.hd + c);
            ASSERT_NEAR(got[at], held[at], 1e-5f) << what << " at " << at;
            ASSERT_LE(std::fabs(static_cast<double>(got[at]) - exact[at]), bound)
                << what << " at " << at;
          }
        }
      }
    }
  }
}

// Storing K/V rounds BF16 to nearest even and INT8 to scale / 2 with scale = max|head| / 127.
TEST(KvStore, Bf16AndInt8RoundTripWithinTheirFormat) {
  const int64_t n_kv = 3, hd = 32;
  auto x = randn(n_kv * hd, 81);
  x[5] = 0.f;
  for (int64_t d = 0; d < hd; ++d) x[2 * hd + d] = 0.f;  // an all-zero head: scale 0, exact
  std::vector<uint16_t> b(n_kv * hd);
  std::vector<int8_t> i8(n_kv * hd);
  std::vector<float> sc(n_kv), back(hd);
  ops::store_kv_row(x.data(), n_kv, hd, DType::kBF16, b.data(), nullptr, 0);
  ops::store_kv_row(x.data(), n_kv, hd, DType::kI8, i8.data(), sc.data(), 0);
  for (int64_t h = 0; h < n_kv; ++h) {
    float amax = 0;
    for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(x[h * hd + d]));
    EXPECT_FLOAT_EQ(sc[h], amax / 127.f);
    ops::load_kv_head(b.data(), nullptr, DType::kBF16, n_kv, hd, 0, h, back.data());
    for (int64_t d = 0; d < hd; ++d) {
      EXPECT_EQ(back[d], bf16_to_f32(f32_to_bf16(x[h * hd + d])));
      EXPECT_LE(std::fabs(back[d] - x[h * hd + d]), std::fabs(x[h * hd + d]) / 256.f);
    }
    ops::load_kv_head(i8.data(), sc.data(), DType::kI8, n_kv, hd, 0, h, back.data());
    for (int64_t d = 0; d < hd; ++d) {
      EXPECT_LE(std::fabs(back[d] - x[h * hd + d]), sc[h] / 2 * (1 + 1e-6f) + 1e-30f);
      EXPECT_LE(std::abs(static_cast<int>(i8[h * hd + d])), 127);
    }
  }
  EXPECT_EQ(sc[2], 0.f);
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, AttentionTest, ::testing::ValuesIn(ops::runnable_isas()),
                         [](const auto& info) { return std::string(ops::isa_name(info.param)); });

TEST(Softmax, VectorisedExpAndSumMatchDoublePrecision) {
  // Scores spread over the whole range softmax meets, including far below the max (underflow);
  // lengths that end in every part of the kernels (16-wide body, 8-wide step, scalar tail), with
  // the row's max either anywhere or in the scalar tail.
  using Fn = float (*)(float*, int64_t, float);
  std::vector<std::pair<const char*, Fn>> fns = {{"generic", &kernels::generic::softmax_exp_row}};
#if defined(VLM_HAVE_X86_DISPATCH)
  for (ops::Isa isa : ops::runnable_isas()) {
    if (isa == ops::Isa::kAvx2) fns.push_back({"avx2", &kernels::avx2::softmax_exp_row});
    if (isa == ops::Isa::kAvx512 || isa == ops::Isa::kAvx512Vnni)
      fns.push_back({"avx512", &kernels::avx512::softmax_exp_row});
  }
#endif
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-120.f, 40.f);
  for (int64_t n : {1, 7, 8, 16, 23, 203}) {
    for (bool max_in_tail : {false, true}) {
      std::vector<float> x(n);
      for (auto& v : x) v = u(rng);
      if (max_in_tail) x[n - 1] = 45.f;
      const float scale = 0.7f;
      std::vector<double> want(x.size());
      double mx = -INFINITY, sum = 0;
      for (float v : x) mx = std::max(mx, static_cast<double>(v) * scale);
      for (size_t i = 0; i < x.size(); ++i) {
        sum += (want[i] = std::exp(x[i] * static_cast<double>(scale) - mx));
      }
      for (auto& w : want) w /= sum;
      for (auto [name, fn] : fns) {
        auto y = x;
        const double sum_got = fn(y.data(), n, scale);
        for (size_t i = 0; i < y.size(); ++i) {
          // The f32 argument scale·x − max (|·| ≤ 32 here) carries ≤ 32 · 2^-24 ≈ 1.9e-6 of
          // rounding, which exp turns into the same relative error: allow 5e-6 (and as much
          // again for the sum's).
          ASSERT_NEAR(y[i] / sum_got, want[i], 1e-5 * want[i] + 1e-12)
              << name << " n " << n << " " << i;
        }
      }
    }
  }
}

// ---- Element-wise kernels (kernels/cpu/eltwise_kernel.inc) ----

const kernels::EltwiseKernels& eltwise_table(ops::Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == ops::Isa::kAvx512 || isa == ops::Isa::kAvx512Vnni)
    return kernels::avx512::eltwise_kernels();
  if (isa == ops::Isa::kAvx2 || isa == ops::Isa::kAvx2Vnni) return kernels::avx2::eltwise_kernels();
#endif
  return kernels::generic::eltwise_kernels();
}

// Arguments for the transcendentals: a dense sweep of [lo, hi] and an odd count (a vector tail).
std::vector<float> sweep(float lo, float hi, int64_t n) {
  std::vector<float> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = lo + (hi - lo) * static_cast<float>(i) / (n - 1);
  return x;
}

// Measured errors of one function against the truth (double) and against the scalar reference
// (f32 std:: functions). rel: |got − truth| / |truth| where |truth| ≥ rel_floor (ref_rel: the same
// for the scalar reference, for comparison); abs: relative to max(1, |x|) (GELU and SiLU grow
// like x).
struct ErrStats {
  double max_rel = 0, ref_rel = 0, max_abs = 0, max_abs_vs_ref = 0;
};

ErrStats measure(const std::vector<float>& x, const std::vector<float>& got,
                 const std::vector<float>& ref, double (*truth)(double), double rel_floor) {
  ErrStats e;
  for (size_t i = 0; i < x.size(); ++i) {
    const double t = truth(x[i]);
    const double scale = std::max(1.0, std::fabs(static_cast<double>(x[i])));
    const double d = std::fabs(got[i] - t);
    if (std::fabs(t) >= rel_floor) {
      e.max_rel = std::max(e.max_rel, d / std::fabs(t));
      e.ref_rel = std::max(e.ref_rel, std::fabs(ref[i] - t) / std::fabs(t));
    }
    e.max_abs = std::max(e.max_abs, d / scale);
    e.max_abs_vs_ref = std::max(e.max_abs_vs_ref, std::fabs(got[i] - ref[i]) / scale);
  }
  return e;
}

void report(const char* what, ops::Isa isa, const ErrStats& e, bool with_abs = true) {
  std::printf("  %-9s %-7s max rel %.2e (std:: f32 %.2e)", what, ops::isa_name(isa), e.max_rel,
              e.ref_rel);
  if (with_abs) {
    std::printf("  max abs/max(1,|x|) %.2e  vs std:: f32 %.2e", e.max_abs, e.max_abs_vs_ref);
  }
  std::printf("\n");
}

double gelu_tanh_d(double v) {
  return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
}
double gelu_erf_d(double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); }
double silu_d(double v) { return v / (1 + std::exp(-v)); }
double exp_d(double v) { return std::exp(v); }

class EltwiseTest : public ::testing::TestWithParam<ops::Isa> {};

// NOTE(vlm): the bounds below are about twice the measured errors (the test prints them). 1 ulp
// of f32 is 6e-8 relative near 1 and 1.2e-7 just above a power of two. The GELUs' relative error
// peaks (~1e-6) at x ≈ −3.4, where the function's condition number (x·f'/f ≈ 12) turns the f32
// rounding of the exp argument into ~2e-6; the f32 std:: forms are worse there (1 + tanh / 1 + erf
// cancel), so against them the absolute error is what is bounded.
TEST_P(EltwiseTest, ExpIsWithinTwoUlp) {
  const auto& k = eltwise_table(GetParam());
  auto x = sweep(-87.f, 88.7f, 200003);
  std::vector<float> y(x.size()), ref(x.size());
  k.exp(x.data(), static_cast<int64_t>(x.size()), y.data());
  for (size_t i = 0; i < x.size(); ++i) ref[i] = std::exp(x[i]);
  const ErrStats e = measure(x, y, ref, &exp_d, 0);
  report("exp", GetParam(), e, /*with_abs=*/false);
  EXPECT_LE(e.max_rel, 2.4e-7);
  // Overflow to inf, gradual underflow to 0, NaN propagates (as std::exp).
  std::vector<float> edge = {88.8f, 1e30f, INFINITY, -95.f, -104.f, -1e30f, -INFINITY, NAN}, ye(8);
  k.exp(edge.data(), 8, ye.data());
  EXPECT_EQ(ye[0], INFINITY);
  EXPECT_EQ(ye[1], INFINITY);
  EXPECT_EQ(ye[2], INFINITY);
  EXPECT_NEAR(ye[3], std::exp(-95.f), 2e-45f);  // subnormal
  EXPECT_EQ(ye[4], 0.f);
  EXPECT_EQ(ye[5], 0.f);
  EXPECT_EQ(ye[6], 0.f);
  EXPECT_TRUE(std::isnan(ye[7]));
}

// The log-softmax normaliser of a vocabulary-sized row (as logprobs use it) against a double sum,
// and the count of values above a threshold against a plain loop; rows of every tail length.
TEST_P(EltwiseTest, LogsumexpAndCountMatchDouble) {
  const auto& k = eltwise_table(GetParam());
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 4.f);
  for (int64_t n : {1, 3, 17, 64, 1000, 151936}) {
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    x[n / 2] = 30.f;  // one dominant logit
    double mx = x[0];
    for (float v : x) mx = std::max<double>(mx, v);
    double sum = 0;
    for (float v : x) sum += std::exp(v - mx);
    const double want = mx + std::log(sum);
    const float at = x[n / 3];
    int64_t want_above = 0;
    for (float v : x) want_above += v > at;
    float lse = 0;
    int64_t above = -1;
    k.logsumexp_count(x.data(), n, at, &lse, &above);
    EXPECT_NEAR(lse, want, 4e-6 * std::max(1.0, std::abs(want))) << "n = " << n;
    EXPECT_EQ(above, want_above) << "n = " << n;
    // All equal: log(n) above the value, nothing above it.
    std::vector<float> flat(n, -2.f);
    k.logsumexp_count(flat.data(), n, -2.f, &lse, &above);
    EXPECT_NEAR(lse, -2.0 + std::log(static_cast<double>(n)),
                4e-6 * std::max(1.0, std::log(n) + 2));
    EXPECT_EQ(above, 0);
  }
  // -inf entries (a masked vocabulary) count for nothing; all -inf is log 0.
  std::vector<float> masked = {-INFINITY, 1.f, -INFINITY, 1.f};
  float lse = 0;
  int64_t above = 0;
  k.logsumexp_count(masked.data(), 4, -INFINITY, &lse, &above);
  EXPECT_NEAR(lse, 1.0 + std::log(2.0), 1e-6);
  EXPECT_EQ(above, 2);
  std::vector<float> none(5, -INFINITY);
  k.logsumexp_count(none.data(), 5, 0.f, &lse, &above);
  EXPECT_EQ(lse, -INFINITY);
  EXPECT_EQ(above, 0);
}

TEST_P(EltwiseTest, GeluTanhMatchesStdTanh) {
  const ops::Isa isa = GetParam();
  ThreadPool pool(2);
  auto x = sweep(-12.f, 12.f, 100001);
  auto y = x, ref = x;
  ops::gelu_tanh(y.data(), nullptr, 1, static_cast<int64_t>(y.size()), pool, isa);
  ops::ref::gelu_tanh(ref.data(), static_cast<int64_t>(ref.size()));
  const ErrStats e = measure(x, y, ref, &gelu_tanh_d, 1e-3);
  report("gelu_tanh", isa, e);
  EXPECT_LE(e.max_rel, 2.5e-6);
  EXPECT_LE(e.max_abs, 2.5e-7);
  EXPECT_LE(e.max_abs_vs_ref, 2.5e-7);
  std::vector<float> special = {NAN, INFINITY, 1e30f, -1e30f};
  ops::gelu_tanh(special.data(), nullptr, 1, 4, pool, isa);
  EXPECT_TRUE(std::isnan(special[0]));
  EXPECT_EQ(special[1], INFINITY);
  EXPECT_EQ(special[2], 1e30f);
  EXPECT_EQ(special[3], 0.f);
}

TEST_P(EltwiseTest, GeluErfMatchesStdErf) {
  const ops::Isa isa = GetParam();
  ThreadPool pool(2);
  auto x = sweep(-12.f, 12.f, 100001);
  auto y = x, ref = x;
  ops::gelu_erf(y.data(), nullptr, 1, static_cast<int64_t>(y.size()), pool, isa);
  ops::ref::gelu_erf(ref.data(), static_cast<int64_t>(ref.size()));
  const ErrStats e = measure(x, y, ref, &gelu_erf_d, 1e-3);
  report("gelu_erf", isa, e);
  EXPECT_LE(e.max_rel, 2.5e-6);
  EXPECT_LE(e.max_abs, 2.5e-7);
  EXPECT_LE(e.max_abs_vs_ref, 2.5e-7);
  std::vector<float> special = {NAN, 1e30f, -1e30f};
  ops::gelu_erf(special.data(), nullptr, 1, 3, pool, isa);
  EXPECT_TRUE(std::isnan(special[0]));
  EXPECT_EQ(special[1], 1e30f);
  EXPECT_EQ(special[2], 0.f);
}

TEST_P(EltwiseTest, SiluMulMatchesStdExp) {
  const ops::Isa isa = GetParam();
  ThreadPool pool(2);
  auto g = sweep(-90.f, 90.f, 100001);
  std::vector<float> up(g.size(), 1.f), y(g.size()), ref(g.size());
  ops::silu_mul(g.data(), up.data(), static_cast<int64_t>(g.size()), y.data(), pool, isa);
  ops::ref::silu_mul(g.data(), up.data(), static_cast<int64_t>(g.size()), ref.data());
  const ErrStats e = measure(g, y, ref, &silu_d, 1e-3);
  report("silu", isa, e);
  EXPECT_LE(e.max_rel, 5e-7);
  EXPECT_LE(e.max_abs, 2.5e-7);
  EXPECT_LE(e.max_abs_vs_ref, 2.5e-7);
}

// Shapes for the row ops: n with every tail of the 16-float vector, rows across the split.
const int64_t kRowNs[] = {1, 7, 16, 17, 33, 100, 1027};
const int64_t kRowCounts[] = {1, 3, 70};

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.f, std::fabs(want[i]))) << what << " i=" << i;
  }
}

TEST_P(EltwiseTest, BiasGeluAndSiluRowsMatchReference) {
  const ops::Isa isa = GetParam();
  ThreadPool pool(2);
  for (int64_t n : kRowNs) {
    for (int64_t rows : kRowCounts) {
      const std::string what = std::string(ops::isa_name(isa)) + " n=" + std::to_string(n) +
                               " rows=" + std::to_string(rows);
      auto y = randn(rows * n, 31), bias = randn(n, 32), up = randn(rows * n, 33);
      for (auto& v : y) v *= 3.f;
      for (int tanh_form = 0; tanh_form < 2; ++tanh_form) {
        auto got = y, want = y;
        ops::add_bias(want.data(), bias.data(), rows, n);
        if (tanh_form) {
          ops::gelu_tanh(got.data(), bias.data(), rows, n, pool, isa);
          ops::ref::gelu_tanh(want.data(), rows * n);
        } else {
          ops::gelu_erf(got.data(), bias.data(), rows, n, pool, isa);
          ops::ref::gelu_erf(want.data(), rows * n);
        }
        expect_close(got, want, 5e-7f, what + (tanh_form ? " tanh" : " erf"));
      }
      std::vector<float> got(rows * n), want(rows * n);
      ops::silu_mul(y.data(), up.data(), rows * n, got.data(), pool, isa);
      ops::ref::silu_mul(y.data(), up.data(), rows * n, want.data());
      expect_close(got, want, 5e-7f, what + " silu");
      auto inplace = y;  // out aliasing gate, as the decoder calls it
      ops::silu_mul(inplace.data(), up.data(), rows * n, inplace.data(), pool, isa);
      expect_close(inplace, want, 5e-7f, what + " silu in place");
    }
  }
}

TEST_P(EltwiseTest, NormsMatchReference) {
  const ops::Isa isa = GetParam();
  ThreadPool pool(2);
  for (int64_t n : kRowNs) {
    for (int64_t rows : kRowCounts) {
      const std::string what = std::string(ops::isa_name(isa)) + " n=" + std::to_string(n) +
                               " rows=" + std::to_string(rows);
      auto x = randn(rows * n, 41), delta = randn(rows * n, 42), w = randn(n, 43), b = randn(n, 44),
           db = randn(n, 45);
      // Row r has mean 100·r: LayerNorm must not lose the variance to a large mean.
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = 0; i < n; ++i) x[r * n + i] += 100.f * static_cast<float>(r);
      }
      // f32 sums of n squares (the reference's sum is sequential): ~n·eps relative at worst.
      const float tol = 2e-7f * static_cast<float>(std::max<int64_t>(n, 16));
      std::vector<float> got(rows * n), want(rows * n);
      ops::rms_norm(x.data(), w.data(), rows, n, 1e-6f, got.data(), pool, isa);
      ops::ref::rms_norm(x.data(), w.data(), rows, n, 1e-6f, want.data());
      expect_close(got, want, tol, what + " rms_norm");
      ops::layer_norm(x.data(), w.data(), b.data(), rows, n, 1e-6f, got.data(), pool, isa);
      ops::ref::layer_norm(x.data(), w.data(), b.data(), rows, n, 1e-6f, want.data());
      // The mean of row r (100·r) is exact in f32 to 2^-17 relative; deviations are O(1).
      expect_close(got, want, tol + 2e-5f, what + " layer_norm");

      auto xg = x, xw = x;
      ops::add_rms_norm(xg.data(), delta.data(), w.data(), rows, n, 1e-6f, got.data(), pool, isa);
      ops::ref::add_rms_norm(xw.data(), delta.data(), w.data(), rows, n, 1e-6f, want.data());
      EXPECT_EQ(xg, xw) << what << " add_rms_norm residual";
      expect_close(got, want, tol, what + " add_rms_norm");
      for (const float* bias : {static_cast<const float*>(nullptr), std::as_const(db).data()}) {
        xg = x;
        xw = x;
        ops::add_layer_norm(xg.data(), delta.data(), bias, w.data(), b.data(), rows, n, 1e-6f,
                            got.data(), pool, isa);
        ops::ref::add_layer_norm(xw.data(), delta.data(), bias, w.data(), b.data(), rows, n, 1e-6f,
                                 want.data());
        EXPECT_EQ(xg, xw) << what << " add_layer_norm residual";
        expect_close(got, want, tol + 2e-5f, what + " add_layer_norm");
        xg = x;
        xw = x;
        ops::add_residual(xg.data(), delta.data(), bias, rows, n, pool, isa);
        ops::ref::add_rows(xw.data(), delta.data(), bias, rows, n);
        EXPECT_EQ(xg, xw) << what << " add_residual";
      }
      // In place (y aliases x), as the decoder's q/k norms used to run.
      auto inplace = x;
      ops::rms_norm(inplace.data(), w.data(), rows, n, 1e-6f, inplace.data(), pool, isa);
      ops::ref::rms_norm(x.data(), w.data(), rows, n, 1e-6f, want.data());
      expect_close(inplace, want, tol, what + " rms_norm in place");
    }
  }
}

TEST_P(EltwiseTest, RopeAndFusedQkNormRopeMatchReference) {
  const ops::Isa isa = GetParam();
  ThreadPool pool(2);
  // 16: half a vector; 72: the 8B vision head (half = 36, a tail of 4); 128: the text head.
  for (int64_t hd : {4, 16, 34, 72, 128}) {
    for (int64_t tokens : {1, 5, 300}) {
      for (int64_t heads : {1, 3}) {
        const std::string what = std::string(ops::isa_name(isa)) + " hd=" + std::to_string(hd) +
                                 " tokens=" + std::to_string(tokens) +
                                 " heads=" + std::to_string(heads);
        const int64_t half = hd / 2;
        auto x = randn(tokens * heads * hd, 51), w = randn(hd, 52), ang = randn(tokens * half, 53);
        std::vector<float> c(ang.size()), s(ang.size());
        for (size_t i = 0; i < ang.size(); ++i) {
          c[i] = std::cos(3.f * ang[i]);
          s[i] = std::sin(3.f * ang[i]);
        }
        auto got = x, want = x;
        ops::rope_neox(got.data(), tokens, heads, hd, c.data(), s.data(), pool, isa);
        ops::ref::rope_neox(want.data(), tokens, heads, hd, c.data(), s.data());
        expect_close(got, want, 1e-6f, what + " rope");
        got = x;
        want = x;
        ops::qk_norm_rope(got.data(), tokens, heads, hd, w.data(), 1e-6f, c.data(), s.data(), pool,
                          isa);
        ops::ref::qk_norm_rope(want.data(), tokens, heads, hd, w.data(), 1e-6f, c.data(), s.data());
        expect_close(got, want, 2e-6f, what + " qk_norm_rope");
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryIsa, EltwiseTest, ::testing::ValuesIn(ops::runnable_isas()),
                         [](const auto& info) { return std::string(ops::isa_name(info.param)); });

// The scalar references against their formulas (the oracle's own check).
TEST(LayerNorm, MatchesFormulaWithLargeMean) {
  std::vector<float> x = randn(2 * 7, 8);
  for (auto& v : x) v += 1000.f;  // a large offset must not hurt the variance
  std::vector<float> w(7), b(7), y(14);
  for (int i = 0; i < 7; ++i) {
    w[i] = 0.5f + i;
    b[i] = -0.25f * i;
  }
  ops::ref::layer_norm(x.data(), w.data(), b.data(), 2, 7, 1e-6f, y.data());
  for (int r = 0; r < 2; ++r) {
    double mean = 0, var = 0;
    for (int i = 0; i < 7; ++i) mean += x[r * 7 + i] / 7.0;
    for (int i = 0; i < 7; ++i) var += (x[r * 7 + i] - mean) * (x[r * 7 + i] - mean) / 7.0;
    for (int i = 0; i < 7; ++i) {
      EXPECT_NEAR(y[r * 7 + i], (x[r * 7 + i] - mean) / std::sqrt(var + 1e-6) * w[i] + b[i], 1e-3);
    }
  }
}

TEST(Gelu, TanhAndErfForms) {
  std::vector<float> x = {-3.f, -0.5f, 0.f, 0.7f, 2.f};
  auto t = x, e = x;
  ops::ref::gelu_tanh(t.data(), 5);
  ops::ref::gelu_erf(e.data(), 5);
  for (size_t i = 0; i < x.size(); ++i) {
    const double v = x[i];
    EXPECT_NEAR(e[i], 0.5 * v * (1 + std::erf(v / std::sqrt(2.0))), 1e-6);
    EXPECT_NEAR(t[i], 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))),
                1e-6);
  }
  EXPECT_NE(t[3], e[3]);  // the two forms really differ
}

TEST(RmsNorm, MatchesFormula) {
  auto x = randn(3 * 10, 4);
  std::vector<float> w(10, 0.5f), y(30);
  ops::ref::rms_norm(x.data(), w.data(), 3, 10, 1e-6f, y.data());
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 10; ++i) ss += x[r * 10 + i] * x[r * 10 + i];
    double inv = 1.0 / std::sqrt(ss / 10 + 1e-6);
    for (int i = 0; i < 10; ++i) EXPECT_NEAR(y[r * 10 + i], x[r * 10 + i] * inv * 0.5, 1e-5);
  }
}

TEST(RopeNeox, RotatesHalvesAsPairs) {
  // One token, one head, head_dim 4: pairs (0,2) and (1,3) rotate by the given angles.
  std::vector<float> x = {1, 2, 3, 4};
  std::vector<float> c = {std::cos(0.5f), std::cos(1.0f)}, s = {std::sin(0.5f), std::sin(1.0f)};
  ops::ref::rope_neox(x.data(), 1, 1, 4, c.data(), s.data());
  EXPECT_NEAR(x[0], 1 * c[0] - 3 * s[0], 1e-6);
  EXPECT_NEAR(x[2], 3 * c[0] + 1 * s[0], 1e-6);
  EXPECT_NEAR(x[1], 2 * c[1] - 4 * s[1], 1e-6);
  EXPECT_NEAR(x[3], 4 * c[1] + 2 * s[1], 1e-6);
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    std::vector<int> hits(n, 0);
    pool.parallel_for(n, 4, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << n << " " << i;
  }
}

}  // namespace
}  // namespace vlm

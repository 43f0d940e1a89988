// The CPU matmuls: the one place that picks a matmul kernel, by weight dtype and ISA level
// (plain, stacked, FP16 arithmetic, INT8 activations), and the checks of a linear weight.
#include <algorithm>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/matmul.h"
#include "ops/ops.h"

namespace vlm::ops {
namespace {

// Weight rows converted per block when many x rows share them (see matmul_kernel.inc).
// 32 = the packed kernel's panel width (kernels/cpu/matmul.h).
constexpr int64_t kScratchRows = 32;

}  // namespace

Status check_linear_weight(const TensorView& w, int64_t in_features) {
  if (w.rank() != 2)
    return invalid_argument("linear weight must be 2-D, got " + shape_to_string(w.shape));
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kF16 &&
      w.dtype != DType::kI8 && w.dtype != DType::kI4 && !is_ggml_block(w.dtype)) {
    return invalid_argument(std::string("unsupported weight dtype ") + dtype_name(w.dtype));
  }
  if (is_ggml_block(w.dtype) && w.dim(1) % dtype_block(w.dtype) != 0) {
    return invalid_argument(std::string(dtype_name(w.dtype)) + " linear weight " +
                            shape_to_string(w.shape) +
                            " has a row length that is not a multiple "
                            "of its block of " +
                            std::to_string(dtype_block(w.dtype)));
  }
  if (w.dtype == DType::kI8 && w.scale == nullptr) {
    return invalid_argument("I8 linear weight " + shape_to_string(w.shape) +
                            " has no per-row scales");
  }
  if (w.dtype == DType::kI4 && w.int4.scale == nullptr) {
    return invalid_argument("I4 linear weight " + shape_to_string(w.shape) +
                            " has no group scales");
  }
  if (w.dtype == DType::kI4 && !int4_group_ok(w.int4.group)) {
    return invalid_argument("I4 linear weight " + shape_to_string(w.shape) + " has group size " +
                            std::to_string(w.int4.group) + " (32, 64 or 128 are supported)");
  }
  if (w.dtype == DType::kI4 && w.dim(1) % w.int4.group != 0) {
    return invalid_argument("I4 linear weight " + shape_to_string(w.shape) +
                            " has a row length that is not a multiple of its group size " +
                            std::to_string(w.int4.group));
  }
  if (w.dim(1) != in_features) {
    return invalid_argument("linear weight " + shape_to_string(w.shape) + " does not take " +
                            std::to_string(in_features) + " inputs");
  }
  return ok_status();
}

bool matmul_runs_f16(Isa isa, int64_t M, int64_t K, DType wtype) {
  return has_fp16_arithmetic(isa) && M >= kernels::kPackedMinRows && K % kernels::kF16Run == 0 &&
         (wtype == DType::kF32 || wtype == DType::kBF16 || wtype == DType::kF16);
}

void matmul_f16(const float* x, int64_t M, int64_t K, const TensorView& w, float* y,
                ThreadPool& pool, Isa isa) {
  if (!matmul_runs_f16(isa, M, K, w.dtype)) return matmul(x, M, K, w, y, pool, isa);
#if defined(VLM_HAVE_X86_DISPATCH)
  // x in FP16 once per call (grow-only, as the other scratch), then threads split N.
  thread_local std::vector<uint32_t> xh_tls;
  std::vector<uint32_t>& xh = xh_tls;
  const int64_t ldx = kernels::avx512fp16::f16_x_stride(K);
  if (xh.size() < static_cast<size_t>(M * ldx)) xh.resize(M * ldx);
  pool.parallel_for(M, 16, [&](int64_t m0, int64_t m1, int) {
    kernels::avx512fp16::convert_rows_f16(x + m0 * K, m1 - m0, K, xh.data() + m0 * ldx);
  });
  thread_local PerThreadBuffers scratch_tls;
  PerThreadBuffers& scratch = scratch_tls;
  scratch.reserve(pool.n_threads(), static_cast<size_t>(kernels::f16_scratch_bytes(K) + 3) / 4);
  const int64_t N = w.dim(0);
  pool.parallel_for(N, 32, [&](int64_t n0, int64_t n1, int t) {  // 32: the kernel's panel
    kernels::avx512fp16::matmul_rows_f16(xh.data(), M, K, w.dtype, w.data, n0, n1, y, N,
                                         scratch.get(t));
  });
#endif
}

int64_t int8_activation_min_rows(Isa isa) {
  // NOTE(vlm): the byte-panel GEMM against f32 x (I8 weights widened in registers below 8 rows,
  // into f32 panels from 8), one thread, K × N = 2048 × 1536 and 768 × 2048 (an MoE expert's
  // products): on AVX-512 VNNI 0.92–1.02× at 1 row, 1.07–1.37× at 2, 1.8–2.4× at 6 and 8,
  // 2.7–3.8× at 16–24; on AVX2 (int16 products) 0.5–0.6× at 1–3 rows, 0.9–1.3× at 4–6, 2–3.5× at
  // 8–24.
  if (isa == Isa::kAvx512Vnni) return 2;
  if (isa == Isa::kAvx2 || isa == Isa::kAvx2Vnni) return 8;
  return 0;
}

int64_t ggml_native_max_rows(Isa isa) {
  // The 256-bit levels' block kernels run their own byte-panel GEMM from kPackedMinRows rows;
  // avx512vnni's is matmul_rows_q8's.
  if (isa == Isa::kAvx2 || isa == Isa::kAvx2Vnni || isa == Isa::kAvx512) {
    return std::numeric_limits<int64_t>::max();
  }
  return kernels::kPackedMinRows;
}

bool ggml_quantizes_x(Isa isa, DType t) {
#if defined(VLM_HAVE_X86_DISPATCH)
  return is_ggml_block(t) && isa != Isa::kGeneric;
#else
  (void)isa, (void)t;
  return false;
#endif
}

bool matmul_quantizes_x(Isa isa, int64_t M, int64_t K, DType wtype) {
#if defined(VLM_HAVE_X86_DISPATCH)
  // I8 decode streams half of BF16's bytes and is memory-bound with f32 x already; I4 decode was
  // not (79% of the read bandwidth), and its own VNNI kernel runs from one row. On AVX2, widening
  // nibbles to f32 took ~3× the instructions per weight of the byte dot products (decode 0.64×,
  // prefill 0.6× their speed); its I8 GEMM multiplies int16 (matmul_q8_avx2_kernel.inc).
  if (K % kernels::kQ8Block != 0) return false;
  if (isa != Isa::kAvx512Vnni && isa != Isa::kAvx2 && isa != Isa::kAvx2Vnni) return false;
  return wtype == DType::kI4 || (wtype == DType::kI8 && M >= int8_activation_min_rows(isa));
#else
  (void)isa, (void)M, (void)K, (void)wtype;
  return false;
#endif
}

void matmul(const float* x, int64_t M, int64_t K, const TensorView& w, float* y, ThreadPool& pool,
            Isa isa) {
  const TensorView* ws[] = {&w};
  float* ys[] = {y};
  matmul_multi(x, M, K, ws, ys, pool, isa);
}

namespace {

using MatmulRowsFn = decltype(&kernels::generic::matmul_rows);

// What the kernels take as a weight's scales: I8 its row scales, I4 its Int4Params.
const void* kernel_quant(const TensorView& w) {
  return w.dtype == DType::kI4 ? static_cast<const void*>(&w.int4) : w.scale;
}

MatmulRowsFn matmul_kernel(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == Isa::kAvx512 || isa == Isa::kAvx512Vnni) return &kernels::avx512::matmul_rows;
  if (isa == Isa::kAvx2 || isa == Isa::kAvx2Vnni) return &kernels::avx2::matmul_rows;
#endif
  return &kernels::generic::matmul_rows;
}

bool wants_scratch(int64_t M, DType wtype) {
  return M >= kernels::kPackedMinRows || (M >= 8 && wtype != DType::kF32);
}

// From this many x rows on, I4 weights are widened to BF16 for the BF16 kernel (below).
constexpr int64_t kInt4WidenMinRows = 8;

struct Int4Kernels {
  decltype(&kernels::generic::matmul_rows_q4) matmul;
  decltype(&kernels::generic::dequantize_rows_q4_bf16) widen;
};

Int4Kernels int4_kernels(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == Isa::kAvx512 || isa == Isa::kAvx512Vnni) {
    return {&kernels::avx512::matmul_rows_q4, &kernels::avx512::dequantize_rows_q4_bf16};
  }
#endif
  // (kAvx2 and kAvx2Vnni take INT8 activations for I4: matmul_quantizes_x.)
  return {&kernels::generic::matmul_rows_q4, &kernels::generic::dequantize_rows_q4_bf16};
}

// Rows [n0, n1) of y = x · w^T for I4 weights. Few x rows (decode): the INT4 kernel streams the
// packed rows. From kPackedMinRows rows the packed GEMM takes I4 directly. In between: blocks of
// kScratchRows rows are widened to BF16 in `rows` ([32, K] BF16 bits) and run through `kernel`
// as BF16 weights.
// NOTE(vlm): BF16, not f32: rounding q · scale to BF16 moves a weight by at most 2^-8 of itself,
// far below the INT4 step (the ops tests bound it), and it lets the BF16 GEMM serve INT4 too.
void matmul_int4_rows(const float* x, int64_t M, int64_t K, const TensorView& w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, const Int4Kernels& k4, MatmulRowsFn kernel,
                      uint16_t* rows, float* scratch) {
  const auto* q = static_cast<const uint8_t*>(w.data);
  if (M < kInt4WidenMinRows) {
    k4.matmul(x, M, K, q, w.int4, n0, n1, y, ldy);
    return;
  }
  if (M >= kernels::kPackedMinRows) {  // the packed GEMM widens I4 into its panel itself
    kernel(x, M, K, DType::kI4, q, &w.int4, n0, n1, y, ldy, scratch, kScratchRows);
    return;
  }
  for (int64_t nb = n0; nb < n1; nb += kScratchRows) {
    const int64_t ne = std::min(n1, nb + kScratchRows);
    k4.widen(q, w.int4, K, nb, ne, rows);
    kernel(x, M, K, DType::kBF16, rows, nullptr, 0, ne - nb, y + nb, ldy, scratch, kScratchRows);
  }
}

// The GGUF block kernel of an ISA level that has one (kAvx512 without VNNI runs AVX2's), or null.
decltype(&kernels::avx2::matmul_rows_ggml) ggml_kernel(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == Isa::kAvx512Vnni) return &kernels::avx512vnni::matmul_rows_ggml;
  if (isa == Isa::kAvx2Vnni) return &kernels::avxvnni::matmul_rows_ggml;
  if (isa == Isa::kAvx2 || isa == Isa::kAvx512) return &kernels::avx2::matmul_rows_ggml;
#endif
  (void)isa;
  return nullptr;
}

// Rows [n0, n1) of y = x · wᵀ for a GGUF block weight without its level's kernel (the baseline
// level): blocks of kScratchRows rows dequantized exactly to f32 in `rows` ([32, K]) and
// multiplied by the level's f32 kernel.
void matmul_ggml_dequant(const float* x, int64_t M, int64_t K, const TensorView& w, int64_t n0,
                         int64_t n1, float* y, int64_t ldy, MatmulRowsFn kernel, float* rows,
                         float* scratch) {
  for (int64_t nb = n0; nb < n1; nb += kScratchRows) {
    const int64_t ne = std::min(n1, nb + kScratchRows);
    kernels::dequantize_rows_ggml(w.dtype, w.data, K, nb, ne, rows);
    kernel(x, M, K, DType::kF32, rows, nullptr, 0, ne - nb, y + nb, ldy, scratch, kScratchRows);
  }
}

// The INT8-activation kernels of an ISA level that has them (matmul_quantizes_x).
struct Q8Kernels {
  decltype(&kernels::avx2::quantize_rows_q8) quantize = nullptr;
  decltype(&kernels::avx2::prepare_decode_x) prepare_decode = nullptr;
  decltype(&kernels::avx2::matmul_rows_q8) matmul = nullptr;
};

Q8Kernels q8_kernels(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == Isa::kAvx512Vnni) {
    return {&kernels::avx512vnni::quantize_rows_q8, &kernels::avx512vnni::prepare_decode_x,
            &kernels::avx512vnni::matmul_rows_q8};
  }
  if (isa == Isa::kAvx2) {
    return {&kernels::avx2::quantize_rows_q8, &kernels::avx2::prepare_decode_x,
            &kernels::avx2::matmul_rows_q8};
  }
  if (isa == Isa::kAvx2Vnni) {
    return {&kernels::avxvnni::quantize_rows_q8, &kernels::avxvnni::prepare_decode_x,
            &kernels::avxvnni::matmul_rows_q8};
  }
#endif
  (void)isa;
  return {};
}

// Σ over each group of x's rows, for the zero points of I4 weights: sums[s][m · (K >> (5 + s)) +
// g] = Σ_{k in group g} x[m, k] for groups of 32 << s values (s = kernels::int4_group_shift),
// filled once per call for the group sizes that some weight with zero points has.
struct GroupSums {
  std::vector<float> sums[3];

  void fill(const float* x, int64_t M, int64_t K, std::span<const TensorView* const> ws,
            ThreadPool& pool) {
    bool done[3] = {};
    for (const TensorView* w : ws) {
      if (w->dtype != DType::kI4 || w->int4.zero == nullptr) continue;
      const int s = kernels::int4_group_shift(w->int4.group);
      if (done[s]) continue;
      done[s] = true;
      const int64_t G = w->int4.group, groups = K / G;
      if (sums[s].size() < static_cast<size_t>(M * groups)) sums[s].resize(M * groups);
      float* out = sums[s].data();
      pool.parallel_for(M, 16, [&](int64_t m0, int64_t m1, int) {
        for (int64_t m = m0; m < m1; ++m) {
          for (int64_t g = 0; g < groups; ++g) {
            float t = 0.f;
            for (int64_t k = g * G; k < (g + 1) * G; ++k) t += x[m * K + k];
            out[m * groups + g] = t;
          }
        }
      });
    }
  }
};

// The zero points' term of rows [n0, n1) of y = x · wᵀ for an I4 weight with w.int4.zero set: the
// kernels multiplied q · scale, so y[m, n] −= Σ_g zero[n, g] · scale[n, g] · Σ_{k in g} x[m, k].
// zs: K / 32 floats of the calling thread's (a row's zero · scale, converted once per row).
void subtract_zero_terms(const TensorView& w, const float* xsums, int64_t M, int64_t K, int64_t n0,
                         int64_t n1, float* y, int64_t ldy, float* zs) {
  const int64_t groups = K / w.int4.group;
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* s = w.int4.scale + n * groups;
    const int8_t* z = w.int4.zero + n * groups;
    for (int64_t g = 0; g < groups; ++g) zs[g] = static_cast<float>(z[g]) * f16_to_f32_finite(s[g]);
    for (int64_t m = 0; m < M; ++m) {
      const float* xs = xsums + m * groups;
      float t = 0.f;
      for (int64_t g = 0; g < groups; ++g) t += zs[g] * xs[g];
      y[m * ldy + n] -= t;
    }
  }
}

// x quantized once per call for the weights that take INT8 activations (matmul_quantizes_x).
struct QuantizedX {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  std::vector<uint8_t> decode;
  std::vector<int16_t> q16;
  std::vector<int32_t> sum16;

  kernels::Q8Rows quantize(const Q8Kernels& k8, const float* x, int64_t M, int64_t K,
                           ThreadPool& pool, bool widen16, bool int4, bool sums16) {
    const int64_t blocks = K / kernels::kQ8Block;
    // Grow only: a steady decode / prefill loop allocates nothing.
    if (q.size() < static_cast<size_t>(M * K)) q.resize(M * K);
    if (scale.size() < static_cast<size_t>(M * blocks)) {
      scale.resize(M * blocks);
      sum.resize(M * blocks);
    }
    pool.parallel_for(M, 16, [&](int64_t m0, int64_t m1, int) {
      k8.quantize(x + m0 * K, m1 - m0, K, q.data() + m0 * K, scale.data() + m0 * blocks,
                  sum.data() + m0 * blocks);
    });
    kernels::Q8Rows rows{q.data(), scale.data(), sum.data()};
    if (sums16) {  // Q6_K's GEMM: x's sums per 16 values
      if (sum16.size() < static_cast<size_t>(M * K / 16)) sum16.resize(M * K / 16);
      pool.parallel_for(M, 16, [&](int64_t m0, int64_t m1, int) {
        for (int64_t i = m0 * K / 16; i < m1 * K / 16; ++i) {
          int32_t t = 0;
          for (int j = 0; j < 16; ++j) t += q[16 * i + j];
          sum16[i] = t;
        }
      });
      rows.sum16 = sum16.data();
    }
    if (widen16) {  // the AVX2 INT8-weight GEMM's int16 x
      if (q16.size() < static_cast<size_t>(M * K)) q16.resize(M * K);
      pool.parallel_for(M, 16, [&](int64_t m0, int64_t m1, int) {
        for (int64_t i = m0 * K; i < m1 * K; ++i) q16[i] = q[i];
      });
      rows.q16 = q16.data();
    }
    if (int4 && M < kernels::kPackedMinRows) {  // the INT4 decode kernel's layout
      const auto bytes = static_cast<size_t>(kernels::q8_decode_x_bytes(M, K));
      if (decode.size() < bytes) decode.resize(bytes);
      k8.prepare_decode(rows, M, K, decode.data());
      rows.decode = decode.data();
    }
    return rows;
  }
};

}  // namespace

namespace {

constexpr DecodeCandidate kBf16Decode[] = {
    {"widen", true}, {"widen_l2", true}, {"evenodd_l2", true}, {"dpbf16_l2", false}};
constexpr DecodeCandidate kInt8Decode[] = {{"f32", true}, {"f32_l2", true}, {"q8_l2", false}};
constexpr DecodeCandidate kInt4Decode[] = {{"r8", true},      {"r8_l2", true}, {"r8_l2t2", true},
                                           {"r8_l2d2", true}, {"r4_l2", true}, {"ymm8_l2", true}};
constexpr kernels::Int4DecodeShape kInt4Shapes[] = {{8, false, 1, 3}, {8, false, 1, 2},
                                                    {8, false, 1, 1}, {8, false, 2, 2},
                                                    {4, false, 1, 2}, {8, true, 1, 2}};
static_assert(std::size(kInt4Shapes) == std::size(kInt4Decode));
// GGUF blocks: how far ahead (bytes) every line of the weights is prefetched into L2.
constexpr DecodeCandidate kGgmlDecode[] = {
    {"pf4k", true}, {"pf2k", true}, {"pf8k", true}, {"pf1k", true}, {"nopf", true}};
constexpr int64_t kGgmlPrefetches[] = {kernels::kGgmlPrefetch, 2048, 8192, 1024, 0};
static_assert(std::size(kGgmlPrefetches) == std::size(kGgmlDecode));
static_assert(kernels::kGgmlPrefetch == 4096, "candidate 0 is named pf4k");

enum Bf16DecodeIndex { kWiden = 0, kWidenL2 = 1, kEvenOdd = 2, kDotBf16Decode = 3 };
enum Int8DecodeIndex { kInt8F32 = 0, kInt8F32L2 = 1, kInt8Q8 = 2 };

#if defined(VLM_HAVE_X86_DISPATCH)
// The level's one-row kernel that prefetches into L2 (kernels::*::matmul_row_l2).
decltype(&kernels::avx2::matmul_row_l2) row_l2(Isa isa) {
  return isa >= Isa::kAvx512 ? &kernels::avx512::matmul_row_l2 : &kernels::avx2::matmul_row_l2;
}
#endif

// The prepared x of a BF16 decode candidate: evenodd's layout, or x in BF16 (in the same floats).
void prepare_bf16_decode_x(int cand, Isa isa, const float* x, int64_t K, float* out) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (cand == kEvenOdd && isa >= Isa::kAvx512) return kernels::avx512::prepare_x_evenodd(x, K, out);
  if (cand == kEvenOdd) return kernels::avx2::prepare_x_evenodd(x, K, out);
#if defined(VLM_HAVE_AVX512BF16)
  if (cand == kDotBf16Decode) {
    return kernels::avx512bf16::convert_rows_bf16(x, 1, K, reinterpret_cast<uint16_t*>(out));
  }
#endif
#endif
  (void)cand, (void)isa, (void)x, (void)K, (void)out;
}

void bf16_decode(int cand, Isa isa, const float* x, const float* xp, int64_t K, const TensorView& w,
                 int64_t n0, int64_t n1, float* y) {
  const auto* wb = static_cast<const uint16_t*>(w.data);
#if defined(VLM_HAVE_X86_DISPATCH)
  if (cand == kWidenL2) return row_l2(isa)(x, K, DType::kBF16, wb, nullptr, n0, n1, y);
  if (cand == kEvenOdd && isa >= Isa::kAvx512) {
    return kernels::avx512::matmul_row_bf16_evenodd(xp, K, wb, n0, n1, y);
  }
  if (cand == kEvenOdd) return kernels::avx2::matmul_row_bf16_evenodd(xp, K, wb, n0, n1, y);
#if defined(VLM_HAVE_AVX512BF16)
  if (cand == kDotBf16Decode) {
    return kernels::avx512bf16::matmul_row_bf16_dot(reinterpret_cast<const uint16_t*>(xp), K, wb,
                                                    n0, n1, y);
  }
#endif
#endif
  (void)cand, (void)isa, (void)x, (void)xp, (void)K, (void)wb, (void)n0, (void)n1, (void)y;
}

// Rows [n0, n1) of y for a weight that takes INT8 activations: by the level's kernel, or on
// avx512vnni by the chosen decode candidate (int8_q8: one x row of I8 weights; int4_dec: I4).
void matmul_q8(const Q8Kernels& k8, const kernels::Q8Rows& qx, int64_t M, int64_t K,
               const TensorView& w, int64_t n0, int64_t n1, float* y, int64_t ld, float* s,
               bool int8_q8, int int4_dec) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (int8_q8 && w.dtype == DType::kI8) {
    return kernels::avx512vnni::matmul_row_i8_decode(qx, K, static_cast<const int8_t*>(w.data),
                                                     w.scale, n0, n1, y);
  }
  if (int4_dec != 0 && w.dtype == DType::kI4) {
    return kernels::avx512vnni::matmul_rows_q4_decode(kInt4Shapes[int4_dec], qx, M, K,
                                                      static_cast<const uint8_t*>(w.data), w.int4,
                                                      n0, n1, y, ld);
  }
#endif
  (void)int8_q8, (void)int4_dec;
  k8.matmul(qx, M, K, w.dtype, w.data, kernel_quant(w), n0, n1, y, ld, s);
}

}  // namespace

const char* decode_family_name(DecodeFamily f) {
  switch (f) {
    case DecodeFamily::kBf16:
      return "bf16_decode";
    case DecodeFamily::kInt8:
      return "int8_decode";
    case DecodeFamily::kInt4:
      return "int4_decode";
    case DecodeFamily::kGgml:
      return "ggml_decode";
  }
  return "?";
}

bool decode_family_takes(DecodeFamily f, DType t) {
  switch (f) {
    case DecodeFamily::kBf16:
      return t == DType::kBF16;
    case DecodeFamily::kInt8:
      return t == DType::kI8;
    case DecodeFamily::kInt4:
      return t == DType::kI4;
    case DecodeFamily::kGgml:
      return is_ggml_block(t);
  }
  return false;
}

std::span<const DecodeCandidate> decode_candidates(DecodeFamily f) {
  switch (f) {
    case DecodeFamily::kBf16:
      return kBf16Decode;
    case DecodeFamily::kInt8:
      return kInt8Decode;
    case DecodeFamily::kInt4:
      return kInt4Decode;
    case DecodeFamily::kGgml:
      return kGgmlDecode;
  }
  return {};
}

const kernels::Int4DecodeShape& int4_decode_shape(int index) { return kInt4Shapes[index]; }

bool decode_candidate_runs(DecodeFamily f, int index, Isa isa) {
  if (index == 0) return true;
  if (index < 0 || index >= static_cast<int>(decode_candidates(f).size())) return false;
#if defined(VLM_HAVE_X86_DISPATCH)
  switch (f) {
    case DecodeFamily::kBf16:
      if (index == kWidenL2 || index == kEvenOdd) return isa >= Isa::kAvx2;
      return isa >= Isa::kAvx512 && bf16_gemm_available(Bf16Gemm::kDotBf16);
    case DecodeFamily::kInt8:
      return index == kInt8F32L2 ? isa >= Isa::kAvx2 : isa == Isa::kAvx512Vnni;
    case DecodeFamily::kInt4:
      return isa == Isa::kAvx512Vnni;
    case DecodeFamily::kGgml:
      return ggml_kernel(isa) != nullptr;
  }
#endif
  (void)isa;
  return false;
}

const char* bf16_gemm_name(Bf16Gemm g) {
  switch (g) {
    case Bf16Gemm::kWidenF32:
      return "f32";
    case Bf16Gemm::kDotBf16:
      return "dpbf16";
    case Bf16Gemm::kAmx:
      return "amx";
  }
  return "?";
}

bool amx_available() {
#if defined(VLM_HAVE_AMX)
  return kernels::amx::available();
#else
  return false;
#endif
}

bool bf16_gemm_available(Bf16Gemm g) {
  switch (g) {
    case Bf16Gemm::kWidenF32:
      return true;
    case Bf16Gemm::kDotBf16:
#if defined(VLM_HAVE_AVX512BF16)
      return detected_isa() >= Isa::kAvx512 && kernels::avx512bf16::available();
#else
      return false;
#endif
    case Bf16Gemm::kAmx:
      return amx_available();
  }
  return false;
}

Result<ForcedKernels> parse_cpu_kernels(std::string_view text, Isa isa) {
  ForcedKernels forced;
  size_t at = 0;
  while (at < text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item(text.substr(at, end - at));
    at = end + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string family = item.substr(0, eq),
                      choice = eq == std::string::npos ? "" : item.substr(eq + 1);
    bool known = false, runs = false;
    if (family == "bf16_gemm") {
      for (Bf16Gemm g : {Bf16Gemm::kWidenF32, Bf16Gemm::kDotBf16, Bf16Gemm::kAmx}) {
        if (choice != bf16_gemm_name(g)) continue;
        known = true;
        runs = bf16_gemm_available(g);
        forced.bf16_gemm = g;
      }
    }
    for (DecodeFamily f : kDecodeFamilies) {
      if (family != decode_family_name(f)) continue;
      const auto cands = decode_candidates(f);
      for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
        if (choice != cands[i].name && !(i == 0 && choice == "default")) continue;
        known = true;
        runs = decode_candidate_runs(f, i, isa);
        forced.decode[static_cast<int>(f)] = i;
      }
    }
    if (!known) {
      std::string names = "bf16_gemm=f32|dpbf16|amx";
      for (DecodeFamily f : kDecodeFamilies) {
        names += std::string(", ") + decode_family_name(f) + "=default";
        for (const DecodeCandidate& c : decode_candidates(f)) names += std::string("|") + c.name;
      }
      return invalid_argument("unknown kernel choice '" + item + "' (known: " + names + ")");
    }
    if (!runs) {
      return invalid_argument("the CPU kernel choice " + item +
                              " is not one this CPU, OS or ISA level runs");
    }
  }
  return forced;
}

Result<ForcedKernels> cpu_kernels_from_env() {
  static const Result<ForcedKernels> r = [] {
    const char* env = std::getenv("VLM_CPU_KERNELS");
    return parse_cpu_kernels(env == nullptr ? "" : env);
  }();
  return r;
}

bool bf16_gemm_runs(Bf16Gemm g, int64_t M, int64_t K, std::span<const TensorView* const> ws) {
  if (g == Bf16Gemm::kWidenF32) return true;
  if (M < kernels::kPackedMinRows || K % 32 != 0 || !bf16_gemm_available(g)) return false;
  for (const TensorView* w : ws) {
    if (w->dtype != DType::kBF16 || w->dim(0) % 16 != 0) return false;
  }
  return true;
}

void matmul_multi_bf16(Bf16Gemm g, const float* x, int64_t M, int64_t K,
                       std::span<const TensorView* const> ws, std::span<float* const> ys,
                       ThreadPool& pool, int64_t ldy) {
#if defined(VLM_HAVE_AVX512BF16)
  // Both candidates take x and the weights as avx512bf16 converts and packs them.
  using Rows = void (*)(const uint16_t*, int64_t, int64_t, const uint16_t*, int64_t, int64_t,
                        float*, int64_t, void*);
  Rows rows = g == Bf16Gemm::kDotBf16 ? &kernels::avx512bf16::matmul_rows_bf16 : nullptr;
#if defined(VLM_HAVE_AMX)
  if (g == Bf16Gemm::kAmx) rows = &kernels::amx::matmul_rows_bf16;
#endif
  if (rows == nullptr) {  // not built in: the exact path
    matmul_multi(x, M, K, ws, ys, pool, detected_isa(), ldy, Bf16Gemm::kWidenF32);
    return;
  }
  // x in BF16 once per call (grow-only, as the other scratch; rows padded to 16 with zeros for
  // the tiles), then threads split the stacked weight rows in blocks of 32 (each weight's rows
  // are a multiple of 16).
  thread_local std::vector<uint16_t> xb_tls;
  std::vector<uint16_t>& xb = xb_tls;
  const int64_t padded = (M + 15) / 16 * 16;
  if (xb.size() < static_cast<size_t>(padded * K)) xb.resize(padded * K);
  std::fill(xb.begin() + M * K, xb.begin() + padded * K, uint16_t{0});
  pool.parallel_for(M, 16, [&](int64_t m0, int64_t m1, int) {
    kernels::avx512bf16::convert_rows_bf16(x + m0 * K, m1 - m0, K, xb.data() + m0 * K);
  });
  thread_local PerThreadBuffers scratch_tls;
  PerThreadBuffers& scratch = scratch_tls;
  scratch.reserve(pool.n_threads(),
                  static_cast<size_t>(kernels::avx512bf16::scratch_bytes(K) + 3) / 4);
  int64_t total = 0;
  for (const TensorView* w : ws) total += w->dim(0);
  pool.parallel_for(total, 32, [&](int64_t n0, int64_t n1, int t) {
    int64_t off = 0;
    for (size_t i = 0; i < ws.size() && off < n1; ++i) {
      const int64_t N = ws[i]->dim(0), ld = ldy > 0 ? ldy : N;
      const int64_t b = std::max(n0, off), e = std::min(n1, off + N);
      if (b < e) {
        rows(xb.data(), M, K, static_cast<const uint16_t*>(ws[i]->data), b - off, e - off, ys[i],
             ld, scratch.get(t));
      }
      off += N;
    }
  });
#else
  (void)g;  // not built in: the exact path
  matmul_multi(x, M, K, ws, ys, pool, detected_isa(), ldy, Bf16Gemm::kWidenF32);
#endif
}

void matmul_multi(const float* x, int64_t M, int64_t K, std::span<const TensorView* const> ws,
                  std::span<float* const> ys, ThreadPool& pool, Isa isa, int64_t ldy, Bf16Gemm gemm,
                  const DecodeKernels& decode) {
  if (gemm != Bf16Gemm::kWidenF32 && bf16_gemm_runs(gemm, M, K, ws)) {
    matmul_multi_bf16(gemm, x, M, K, ws, ys, pool, ldy);
    return;
  }
  // The decode candidates that apply here (DecodeKernels; the defaults otherwise).
  const bool one_row = M == 1 && K % 32 == 0;
  const auto chosen = [&](DecodeFamily f) {
    return one_row && decode_candidate_runs(f, decode.of(f), isa) ? decode.of(f) : 0;
  };
  const int bf16_dec = chosen(DecodeFamily::kBf16), int8_dec = chosen(DecodeFamily::kInt8);
  const int int4_dec = chosen(DecodeFamily::kInt4);
  const int64_t ggml_prefetch = kGgmlPrefetches[chosen(DecodeFamily::kGgml)];
  const bool int8_q8 = int8_dec == kInt8Q8;
  const auto quantizes_x = [&](DType t) {
    return matmul_quantizes_x(isa, M, K, t) || (int8_q8 && t == DType::kI8);
  };
  const MatmulRowsFn kernel = matmul_kernel(isa);
  const Int4Kernels k4 = int4_kernels(isa);
  int64_t total = 0;
  bool want_scratch = false, widen_int4 = false, quantize_x = false, widen16 = false;
  bool int4_x = false;  // an I4 weight takes quantized x
  bool bf16_x = false;  // a BF16 weight takes x prepared for its decode candidate
  // GGUF block weights: the level's kernel over INT8 x (ggml_x), or dequantized rows.
  const auto ggml_k = ggml_kernel(isa);
  const bool ggml_native = ggml_k != nullptr && M < ggml_native_max_rows(isa);
  bool ggml_x = false, ggml_dequant = false, ggml_sum16 = false;
  // From ggml_native_max_rows on, avx512vnni's byte-panel GEMM takes them.
  const auto ggml_gemm = [&](DType t) { return !ggml_native && ggml_quantizes_x(isa, t); };
  for (const TensorView* w : ws) {
    total += w->dim(0);
    bf16_x = bf16_x || (bf16_dec != 0 && bf16_dec != kWidenL2 && w->dtype == DType::kBF16);
    const bool quantizes = quantizes_x(w->dtype);
    quantize_x = quantize_x || quantizes;
    int4_x = int4_x || (quantizes && w->dtype == DType::kI4);
    // The AVX2 INT8-weight GEMM takes x widened to int16.
    widen16 = widen16 ||
              (quantizes && w->dtype == DType::kI8 && (isa == Isa::kAvx2 || isa == Isa::kAvx2Vnni));
    // (The INT8-weight GEMM builds its byte panels in the scratch at any M.)
    want_scratch =
        want_scratch || wants_scratch(M, w->dtype) || (quantizes && w->dtype == DType::kI8);
    widen_int4 = widen_int4 || (w->dtype == DType::kI4 && M >= kInt4WidenMinRows &&
                                M < kernels::kPackedMinRows && !quantizes);
    if (is_ggml_block(w->dtype) && ggml_gemm(w->dtype)) {
      quantize_x = want_scratch = true;
      ggml_sum16 = ggml_sum16 || w->dtype == DType::kQ6K;
    } else if (is_ggml_block(w->dtype)) {
      (ggml_native ? ggml_x : ggml_dequant) = true;
    }
  }
  quantize_x = quantize_x || ggml_x;
  want_scratch = want_scratch || ggml_dequant;
  // Per thread: the kernels' scratch, then (I4 prefill) kScratchRows BF16 rows of K.
  const int64_t scratch_floats = kScratchRows * K;
  static_assert(
      kernels::q8_scratch_bytes(kernels::kQ8Block) <= kScratchRows * kernels::kQ8Block * 4,
      "the INT8-activation panel fits the kernels' scratch (and grows slower with K)");
  // (A named reference: inside the lambda, the thread_local itself would name each worker's own.)
  thread_local PerThreadBuffers scratch_tls;
  PerThreadBuffers& scratch = scratch_tls;
  if (want_scratch || widen_int4) {
    const int64_t rows_floats = ggml_dequant ? kScratchRows * K
                                : widen_int4 ? (kScratchRows * K + 1) / 2
                                             : 0;
    scratch.reserve(pool.n_threads(), static_cast<size_t>(scratch_floats + rows_floats));
  }
  thread_local GroupSums xsums_tls;
  GroupSums& xsums = xsums_tls;
  xsums.fill(x, M, K, ws, pool);
  thread_local QuantizedX qx_tls;
  kernels::Q8Rows qx{};
  Q8Kernels k8 = quantize_x ? q8_kernels(isa) : Q8Kernels{};
#if defined(VLM_HAVE_X86_DISPATCH)
  if (ggml_x && k8.quantize == nullptr) k8.quantize = &kernels::avx2::quantize_rows_q8;  // kAvx512
#endif
  if (quantize_x) qx = qx_tls.quantize(k8, x, M, K, pool, widen16, int4_x, ggml_sum16);
  thread_local std::vector<float> gx_tls;
  thread_local std::vector<int32_t> gx_offs_tls;
  kernels::GgmlRows gx{};
  if (ggml_x) {
    if (gx_tls.size() < static_cast<size_t>(M * kernels::ggml_x_floats(K))) {
      gx_tls.resize(M * kernels::ggml_x_floats(K));
    }
    // x's sums of 4 times −32 and −128: only avx512vnni's block kernel starts from them.
    const bool offsets = isa == Isa::kAvx512Vnni;
    if (offsets && gx_offs_tls.size() < static_cast<size_t>(M * kernels::ggml_x_offsets(K))) {
      gx_offs_tls.resize(M * kernels::ggml_x_offsets(K));
    }
    // (The calling thread's buffers: on a pool thread gx_tls names that thread's own.)
    float* gout = gx_tls.data();
    int32_t* goffs = offsets ? gx_offs_tls.data() : nullptr;
    pool.parallel_for(M, 16, [&](int64_t m0, int64_t m1, int) {
      kernels::prepare_ggml_x(qx.q, qx.scale, M, K, m0, m1, gout, goffs);
    });
    gx = kernels::ggml_x_views(qx.q, M, K, gout, goffs);
  }
  thread_local std::vector<float> xdec_tls;
  std::vector<float>& xdec = xdec_tls;
  if (bf16_x) {
    if (xdec.size() < static_cast<size_t>(K)) xdec.resize(K);
    prepare_bf16_decode_x(bf16_dec, isa, x, K, xdec.data());
  }
  // Grain: 16 rows of w keeps the 4-row micro-kernel busy and spreads N over the threads. A
  // thread's range of the stacked rows may span several weights: each part runs on its own.
  pool.parallel_for(total, 16, [&](int64_t n0, int64_t n1, int t) {
    float* s = want_scratch ? scratch.get(t) : nullptr;
    int64_t off = 0;
    for (size_t i = 0; i < ws.size() && off < n1; ++i) {
      const TensorView& w = *ws[i];
      const int64_t N = w.dim(0), ld = ldy > 0 ? ldy : N;
      const int64_t b = std::max(n0, off), e = std::min(n1, off + N);
      if (b < e && is_ggml_block(w.dtype) && ggml_native) {
        ggml_k(gx, M, K, w.dtype, w.data, b - off, e - off, ys[i], ld, ggml_prefetch);
      } else if (b < e && is_ggml_block(w.dtype) && ggml_gemm(w.dtype)) {
        k8.matmul(qx, M, K, w.dtype, w.data, nullptr, b - off, e - off, ys[i], ld, s);
      } else if (b < e && is_ggml_block(w.dtype)) {
        matmul_ggml_dequant(x, M, K, w, b - off, e - off, ys[i], ld, kernel, s + scratch_floats, s);
      } else if (b < e && bf16_dec != 0 && w.dtype == DType::kBF16) {
        bf16_decode(bf16_dec, isa, x, xdec.data(), K, w, b - off, e - off, ys[i]);
      } else if (b < e && int8_dec == kInt8F32L2 && w.dtype == DType::kI8) {
#if defined(VLM_HAVE_X86_DISPATCH)
        row_l2(isa)(x, K, DType::kI8, w.data, w.scale, b - off, e - off, ys[i]);
#else  // (not reached: the candidate runs on x86 levels only)
        kernel(x, M, K, w.dtype, w.data, kernel_quant(w), b - off, e - off, ys[i], ld, s,
               kScratchRows);
#endif
      } else if (b < e && quantize_x && quantizes_x(w.dtype)) {
        matmul_q8(k8, qx, M, K, w, b - off, e - off, ys[i], ld, s, int8_q8, int4_dec);
      } else if (b < e && w.dtype == DType::kI4) {
        auto* rows = widen_int4 ? reinterpret_cast<uint16_t*>(s + scratch_floats) : nullptr;
        matmul_int4_rows(x, M, K, w, b - off, e - off, ys[i], ld, k4, kernel, rows, s);
      } else if (b < e) {
        kernel(x, M, K, w.dtype, w.data, kernel_quant(w), b - off, e - off, ys[i], ld, s,
               kScratchRows);
      }
      if (b < e && w.dtype == DType::kI4 && w.int4.zero != nullptr) {
        const int shift = kernels::int4_group_shift(w.int4.group);
        thread_local std::vector<float> zs;  // this worker's (see subtract_zero_terms)
        if (zs.size() < static_cast<size_t>(K / kInt4Block)) zs.resize(K / kInt4Block);
        subtract_zero_terms(w, xsums.sums[shift].data(), M, K, b - off, e - off, ys[i], ld,
                            zs.data());
      }
      off += N;
    }
  });
}

}  // namespace vlm::ops

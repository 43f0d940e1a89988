// GGUF block weights × INT8 x on AVX-512 VNNI (semantics and block layouts in
// kernels/cpu/ggml_blocks.h). Each weight row is read once per group of up to 4 x rows, block by
// block as stored: a K-quant super-block of 256 values becomes four 64-byte vectors of its
// unsigned integers (two 32-value sub-blocks each, in x's order) and four vectors of lane scales
// (the sub-block's d · sc over the 8 lanes vpdpbusd sums its 32 products into); Q8_0 goes two
// blocks at a time (two vectors of two). Per vector: one vpdpbusd against 64 bytes of x, its int32
// lanes to f32, times the weight's and x's lane scales, into an f32 accumulator. Q6_K's −32 and
// Q8_0's offset of 128 come out in the integers (the vpdpbusd starts from −32 or −128 times x's
// sums of 4, GgmlRows::off32 / off128); the mins of Q4_K and Q5_K are a second product, of the
// super-block's per-sub-block coefficients with x's scaled block sums (GgmlRows::sum32).

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/ggml_block_fields.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/hsum_avx512.h"

namespace vlm::kernels::avx512vnni {
namespace {

// (The maskz forms with every lane set are the plain instructions; they spare GCC 12's
// -Wmaybe-uninitialized on the plain forms' _mm512_undefined_* pass-through operand.)

constexpr int kMaxRows = 4;  // x rows per pass over a weight row

// Lanes 0-7 take element a of v, lanes 8-15 element b.
inline __m512 pick2(__m512 v, int a, int b) {
  const __m512i idx = _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(_mm256_set1_epi32(a)),
                                               _mm256_set1_epi32(b), 1);
  return _mm512_maskz_permutexvar_ps(0xffff, idx, v);
}

// Lanes 4t .. 4t + 3 take element first + t of v (t < 4).
inline __m512 pick4(__m512 v, int first) {
  const __m512i idx = _mm512_add_epi32(
      _mm512_set1_epi32(first), _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
  return _mm512_maskz_permutexvar_ps(0xffff, idx, v);
}

// One stored unit of a weight row decoded for the dot products: kChunks vectors of 64 unsigned
// weight bytes in x's order with their lane scales, and the correction's coefficients `cw`
// against `kSumLanes` of x's scaled sums (sum32 when kSum16 is false, else sum16) from the
// unit's first value on.
template <int kChunks>
struct Unit {
  __m512i q[kChunks];
  __m512 s[kChunks];
  __m512 cw;
};

struct Q4K {
  static constexpr DType kType = DType::kQ4K;
  static constexpr int kValues = 256, kBytes = 144, kChunks = 4, kSumLanes = 8;
  static constexpr bool kSum16 = false;
  static constexpr int kOffset = 0;
  template <bool kFive = false>
  static void decode(const uint8_t* b, Unit<kChunks>& u) {
    const __m512 d = _mm512_set1_ps(f16_at(b)), dmin = _mm512_set1_ps(f16_at(b + 2));
    const __m512 both = _mm512_maskz_cvtepi32_ps(
        0xffff, _mm512_maskz_cvtepu8_epi32(0xffff, k4_scales(b + 4)));  // sc[0..7], m[0..7]
    const __m512 dsc = _mm512_mul_ps(d, both);                          // lanes 0-7: d · sc
    const __m512 m1 = _mm512_mul_ps(dmin, both);                        // lanes 8-15: dmin · m
    u.cw = _mm512_maskz_sub_ps(0xff, _mm512_setzero_ps(),               // −dmin · m in lanes 0-7
                               _mm512_maskz_shuffle_f32x4(0xffff, m1, m1, 0xee));
    const uint8_t* qs = b + (kFive ? 48 : 16);
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFive) qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
    for (int c = 0; c < 4; ++c) {
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c));
      __m256i lo = _mm256_and_si256(raw, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if constexpr (kFive) {
        const __m256i one = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(
            lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(
            hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      u.q[c] = _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(lo), hi, 1);
      u.s[c] = pick2(dsc, 2 * c, 2 * c + 1);
    }
  }
};

struct Q5K : Q4K {
  static constexpr DType kType = DType::kQ5K;
  static constexpr int kBytes = 176;
  static void decode(const uint8_t* b, Unit<kChunks>& u) { Q4K::decode<true>(b, u); }
};

struct Q6K {
  static constexpr DType kType = DType::kQ6K;
  static constexpr int kValues = 256, kBytes = 210, kChunks = 4, kSumLanes = 0;
  static constexpr bool kSum16 = false;
  static constexpr int kOffset = 32;  // q − 32: the dot products start from −32 · Σ x
  static void decode(const uint8_t* b, Unit<kChunks>& u) {
    const __m512 dsc = _mm512_mul_ps(
        _mm512_set1_ps(f16_at(b + 208)),
        _mm512_maskz_cvtepi32_ps(
            0xffff, _mm512_maskz_cvtepi8_epi32(0xffff,
                                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                                   b + 192)))));  // d · sc[0..15]
    const __m512i low4 = _mm512_set1_epi8(0x0f), low2 = _mm512_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const __m512i ql = _mm512_loadu_si512(b + 64 * h);
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
      // Bits 2s .. 2s + 1 for s = 0, 1 (values 0-63 of the half) and s = 2, 3 (64-127).
      const __m512i h01 =
          _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
      const __m512i h23 = _mm512_srli_epi16(h01, 4);
      u.q[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                   _mm512_slli_epi16(_mm512_and_si512(h01, low2), 4));
      u.q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                       _mm512_slli_epi16(_mm512_and_si512(h23, low2), 4));
      u.s[2 * h] = pick4(dsc, 8 * h);
      u.s[2 * h + 1] = pick4(dsc, 8 * h + 4);
    }
  }
};

// Four Q8_0 blocks (128 values) as two vectors of two: q + 128 as bytes (the dot products start
// from −128 · Σ x), the scales per block.
struct Q80 {
  static constexpr DType kType = DType::kQ8_0;
  static constexpr int kValues = 128, kBytes = 136, kChunks = 2, kSumLanes = 0;
  static constexpr bool kSum16 = false;
  static constexpr int kOffset = 128;
  static void decode(const uint8_t* b, Unit<kChunks>& u) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int c = 0; c < 2; ++c) {
      const uint8_t* p = b + 68 * c;
      const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
      const __m256i q1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 36));
      u.q[c] = _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(_mm256_xor_si256(q0, flip)),
                                        _mm256_xor_si256(q1, flip), 1);
      uint16_t h0, h1;
      std::memcpy(&h0, p, 2);
      std::memcpy(&h1, p + 34, 2);
      const __m256i hh =
          _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<short>(h0))),
                                  _mm_set1_epi16(static_cast<short>(h1)), 1);
      u.s[c] = _mm512_maskz_cvtph_ps(0xffff, hh);  // d0 in lanes 0-7, d1 in 8-15
    }
  }
};

// Rows [n0, n1) of y for x rows [m0, m0 + R): the whole units of each weight row, then (Q8_0
// with a block count not a multiple of 4) its last blocks.
template <class T, int R>
void rows_of(const GgmlRows& x, int64_t m0, int64_t K, const uint8_t* w, int64_t n0, int64_t n1,
             float* y, int64_t ldy, int64_t prefetch) {
  const int64_t units = K / T::kValues;
  const auto row_bytes = static_cast<int64_t>(dtype_nbytes(T::kType, K));
  [[maybe_unused]] const int64_t sum_stride = T::kSum16 ? K / 16 : K / 32;
  [[maybe_unused]] const float* sums = T::kSum16 ? x.sum16 : x.sum32;
  [[maybe_unused]] const __mmask16 sum_mask = static_cast<__mmask16>((1u << T::kSumLanes) - 1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    // Two accumulators per x row (chunks alternate): a K-quant super-block's four FMAs into one
    // would chain their latencies.
    __m512 acc[R][2], corr[R];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = corr[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < units; ++i) {
      const uint8_t* b = row + i * T::kBytes;
      // Every line of the unit `prefetch` bytes ahead, into L2 (the hardware's streamer alone
      // left this loop waiting on memory; ggml_blocks.h).
      for (int64_t p = 0; prefetch > 0 && p < T::kBytes; p += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(b) + prefetch + p, _MM_HINT_T1);
      }
      Unit<T::kChunks> u;
      T::decode(b, u);
      const int64_t k0 = i * T::kValues;
      for (int r = 0; r < R; ++r) {
        const int64_t m = m0 + r;
        const int8_t* xq = x.q + m * K + k0;
        const float* xl = x.lane + m * (K / 4) + k0 / 4;
        const int32_t* o32 = x.off32 + m * (K / 4) + k0 / 4;
        const int32_t* o128 = x.off128 + m * (K / 4) + k0 / 4;
        for (int c = 0; c < T::kChunks; ++c) {
          const __m512i start = T::kOffset == 0    ? _mm512_setzero_si512()
                                : T::kOffset == 32 ? _mm512_loadu_si512(o32 + 16 * c)
                                                   : _mm512_loadu_si512(o128 + 16 * c);
          const __m512i dot = _mm512_dpbusd_epi32(start, u.q[c], _mm512_loadu_si512(xq + 64 * c));
          acc[r][c % 2] =
              _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, dot),
                              _mm512_mul_ps(u.s[c], _mm512_loadu_ps(xl + 16 * c)), acc[r][c % 2]);
        }
        if constexpr (T::kSumLanes > 0) {
          const float* xs = sums + m * sum_stride + k0 / (T::kSum16 ? 16 : 32);
          corr[r] = _mm512_fmadd_ps(u.cw, _mm512_maskz_loadu_ps(sum_mask, xs), corr[r]);
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      float t = hsum(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), corr[r]));
      for (int64_t k0 = units * T::kValues; k0 < K; k0 += 32) {  // Q8_0's last 1 to 3 blocks
        const int64_t m = m0 + r;
        const uint8_t* b = row + k0 / 32 * 34;
        // |w| times x with w's sign (vpdpbusd multiplies unsigned by signed bytes). (A plain
        // loop here was auto-vectorised wrongly by GCC 12: a dot product 13× too small.)
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
        const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + m * K + k0));
        const __m256i dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q, q),
                                                _mm256_sign_epi8(xq, q));
        t += f16_at(b) * x.lane[m * (K / 4) + k0 / 4] * hsum(_mm256_cvtepi32_ps(dot));
      }
      y[(m0 + r) * ldy + n] = t;
    }
  }
}

template <class T>
void rows_by_group(const GgmlRows& x, int64_t M, int64_t K, const uint8_t* w, int64_t n0,
                   int64_t n1, float* y, int64_t ldy, int64_t prefetch) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) rows_of<T, 4>(x, m, K, w, n0, n1, y, ldy, prefetch);
  if (M - m == 3) rows_of<T, 3>(x, m, K, w, n0, n1, y, ldy, prefetch);
  if (M - m == 2) rows_of<T, 2>(x, m, K, w, n0, n1, y, ldy, prefetch);
  if (M - m == 1) rows_of<T, 1>(x, m, K, w, n0, n1, y, ldy, prefetch);
}

}  // namespace

void matmul_rows_ggml(const GgmlRows& x, int64_t M, int64_t K, DType t, const void* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, int64_t prefetch) {
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (t) {
    case DType::kQ8_0:
      return rows_by_group<Q80>(x, M, K, wb, n0, n1, y, ldy, prefetch);
    case DType::kQ4K:
      return rows_by_group<Q4K>(x, M, K, wb, n0, n1, y, ldy, prefetch);
    case DType::kQ5K:
      return rows_by_group<Q5K>(x, M, K, wb, n0, n1, y, ldy, prefetch);
    case DType::kQ6K:
      return rows_by_group<Q6K>(x, M, K, wb, n0, n1, y, ldy, prefetch);
    default:
      return;
  }
}

}  // namespace vlm::kernels::avx512vnni

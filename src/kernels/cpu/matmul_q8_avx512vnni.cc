// INT8 / INT4 weights × INT8 activations on AVX-512 VNNI (semantics in kernels/cpu/matmul.h).
// Compiled for that level only (CMake gives *_avx512vnni.cc -mavx512vnni on top of AVX-512).
//
// Many x rows (prefill; INT4 with few rows has the decode kernel further down): 32 weight rows
// at a time are widened to bytes (plus their zero point) and transposed into a panel whose 128
// bytes per 4 values of K are 32 columns × 4 consecutive weights, the layout vpdpbusd takes:
// each 4-byte run of an x row, broadcast to 16 lanes, multiplies 16 columns × 4 weights into 16
// int32 sums. A tile of kTileRows x rows × 32 columns keeps its int32 block sums and its f32
// totals in registers; at the end of each 32-value block the int32 sums turn into f32, times the
// block's x scale (and for INT4 the block's group scales, f16 widened to f32 in the panel), and
// add into the totals.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/ggml_block_fields.h"
#include "kernels/cpu/hsum_avx512.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/panel_blocks.h"
#include "kernels/cpu/transpose_avx512.h"

namespace vlm::kernels::avx512vnni {
namespace {

constexpr int64_t kPanel = 32;     // weight rows (output columns) per panel: 2 zmm of lanes
constexpr int64_t kBlockK = 1024;  // values of K per panel block: 32 KiB of bytes, in L1
constexpr int64_t kPanelStep = kPanel * 4;                      // panel bytes per 4 values of K
constexpr int kStepsPerBlock = static_cast<int>(kQ8Block / 4);  // vpdpbusd steps per x block
static_assert(q8_scratch_bytes(kBlockK) >=
                  kPanel * kBlockK + 2 * kPanel * (kBlockK / kQ8Block) * 4 + 64,
              "matmul.h's scratch size is this kernel's panel, its scales, its mins and an "
              "alignment");
// NOTE(vlm): 6 rows × 2 vectors of int32 block sums + as many f32 totals + 2 panel vectors + 2
// INT4 scale vectors = 28 of the 32 zmm. vpdpbusd issues 2 per cycle here (~700 GOPS per core,
// 4× the f32 FMA's multiply-adds); the block's conversion (cvt + mul + FMA per accumulator)
// adds 3 instructions to its 8 vpdpbusd.
constexpr int kTileRows = 6;

// The two weight types: I8 rows of K bytes (zero point 128: byte ^ 0x80 = q + 128) and one scale
// per row; I4 rows of K / 2 bytes (layout in core/tensor.h; zero point 8: nibble ^ 8 = q + 8)
// and one f16 scale per group (Int4Params; the panel holds them per 32-value block as f32).
struct I8 {
  static constexpr int32_t kZero = 128;
  static constexpr bool kGroupScales = false, kMins = false;
  static constexpr int kHalves = 1;  // scales per 32-value block
  static constexpr int64_t row_bytes(int64_t K) { return K; }
};
struct I4 {
  static constexpr int32_t kZero = 8;
  static constexpr bool kGroupScales = true, kMins = false;
  static constexpr int kHalves = 1;
  static constexpr int64_t row_bytes(int64_t K) { return K / 2; }
};
// GGUF block weights (layouts in kernels/cpu/ggml_blocks.h): Q8_0 as q + 128 with each block's d
// as its group scale; Q4_K and Q5_K as stored (0..15, 0..31: zero point 0) with d · sc as the
// group scale and dmin · m as the block's min, whose term (min times x's scaled block sum) each
// block takes off; Q6_K as stored (0..63, zero point 32) with a scale d · sc per 16 values
// (kHalves 2: each 32-value block's dot products end after 16, and start from −32 times x's sum
// over those 16, Q8Rows::sum16).
struct GQ80 {
  static constexpr int32_t kZero = 128;
  static constexpr bool kGroupScales = true, kMins = false;
  static constexpr int kHalves = 1;
  static constexpr int64_t row_bytes(int64_t K) { return K / 32 * 34; }
};
struct GQ4K {
  static constexpr int32_t kZero = 0;
  static constexpr bool kGroupScales = true, kMins = true, kFive = false;
  static constexpr int kHalves = 1;
  static constexpr int64_t kBytes = 144;
  static constexpr int64_t row_bytes(int64_t K) { return K / 256 * kBytes; }
};
struct GQ5K : GQ4K {
  static constexpr bool kFive = true;
  static constexpr int64_t kBytes = 176;
  static constexpr int64_t row_bytes(int64_t K) { return K / 256 * kBytes; }
};
struct GQ6K {
  static constexpr int32_t kZero = 32;
  static constexpr bool kGroupScales = true, kMins = false;
  static constexpr int kHalves = 2;
  static constexpr int64_t row_bytes(int64_t K) { return K / 256 * 210; }
};
template <class W>
constexpr bool kIsKQuant = std::is_same_v<W, GQ4K> || std::is_same_v<W, GQ5K>;
template <class W>
constexpr bool kIsGgml = std::is_same_v<W, GQ80> || kIsKQuant<W> || std::is_same_v<W, GQ6K>;

// The offset bytes of one weight row for K values [k, k + 4·nd) (nd = 16 or 8 runs of 4), as 16
// int32 lanes (run j in lane j; lanes >= nd unspecified).
template <class W>
inline __m512i weight_runs(const uint8_t* row, int64_t k, int nd) {
  if constexpr (std::is_same_v<W, GQ6K>) {
    // Values 64c .. 64c + 63 of super-block k / 256 (c = k % 256 / 64): half h = c / 2, its low
    // nibbles (c even: s = 0, 1) or high ones (s = 2, 3), the qh bits 2s .. 2s + 1 above them.
    const uint8_t* b = row + k / 256 * 210;
    const int c = static_cast<int>(k % 256 / 64), h = c / 2;
    const __m512i ql = _mm512_loadu_si512(b + 64 * h);
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    const __m512i h01 =
        _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(qh), _mm256_srli_epi16(qh, 2), 1);
    const __m512i hb = c % 2 == 0 ? h01 : _mm512_srli_epi16(h01, 4);
    const __m512i nib = c % 2 == 0 ? ql : _mm512_srli_epi16(ql, 4);
    (void)nd;
    return _mm512_or_si512(_mm512_and_si512(nib, _mm512_set1_epi8(0x0f)),
                           _mm512_slli_epi16(_mm512_and_si512(hb, _mm512_set1_epi8(0x03)), 4));
  } else if constexpr (std::is_same_v<W, GQ80>) {
    // Blocks k / 32 (and k / 32 + 1 when nd is 16): 32 bytes each after their f16 d.
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    const uint8_t* b = row + k / 32 * 34;
    const __m256i q0 =
        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), flip);
    const __m256i q1 =
        nd == 16
            ? _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 36)), flip)
            : _mm256_setzero_si256();
    return _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(q0), q1, 1);
  } else if constexpr (kIsKQuant<W>) {
    // Sub-blocks 2c and 2c + 1 of super-block k / 256 (c = k % 256 / 64; k is a multiple of 64
    // and nd 16, K being a multiple of 256): the low and high nibbles of the same 32 bytes.
    const uint8_t* b = row + k / 256 * W::kBytes;
    const int c = static_cast<int>(k % 256 / 64);
    const __m256i raw =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + (W::kFive ? 48 : 16) + 32 * c));
    __m256i lo = _mm256_and_si256(raw, _mm256_set1_epi8(0x0f));
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(0x0f));
    if constexpr (W::kFive) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16));
      const __m256i one = _mm256_set1_epi8(1);
      lo = _mm256_or_si256(
          lo, _mm256_slli_epi16(
                  _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)), one), 4));
      hi = _mm256_or_si256(
          hi, _mm256_slli_epi16(
                  _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c + 1)), one), 4));
    }
    (void)nd;
    return _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(lo), hi, 1);
  } else if constexpr (std::is_same_v<W, I8>) {
    const __m512i b = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << nd) - 1), row + k);
    return _mm512_xor_si512(b, _mm512_set1_epi8(static_cast<char>(0x80)));
  } else {
    // 2·nd packed bytes hold groups k / 32 (and k / 32 + 1): byte j of a group is element j
    // (low nibble) and j + 16 (high). Widened: [lo(g), hi(g), lo(g + 1), hi(g + 1)] per 16 bytes.
    const __mmask32 m = nd == 16 ? 0xffffffffu : 0xffffu;
    const __m256i b = _mm256_xor_si256(_mm256_maskz_loadu_epi8(m, row + k / 2),
                                       _mm256_set1_epi8(static_cast<char>(0x88)));
    const __m256i lo = _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0f));
    // (The all-lanes maskz forms compile to the plain instructions; the unmasked intrinsics trip
    // GCC 12's -Wmaybe-uninitialized on their _mm512_undefined_* pass-through operand.)
    const __m512i z = _mm512_maskz_inserti64x4(0xff, _mm512_castsi256_si512(lo), hi, 1);
    return _mm512_maskz_shuffle_i64x2(0xff, z, z, 0xd8);  // 128-bit lanes 0, 2, 1, 3
  }
}

// The GGUF block weights' group scales (and K-quants' mins) as build_panel lays them out.
template <class W>
void ggml_panel_scales(const uint8_t* w, int64_t K, int64_t nb, int64_t cols, int64_t k0,
                       int64_t kc, float* scales, float* mins) {
  const int64_t rb = W::row_bytes(K);
  if constexpr (std::is_same_v<W, GQ6K>) {  // d · sc per 16 values
    for (int64_t j = 0; j < kPanel; ++j) {
      const uint8_t* row = w + (nb + j) * rb;
      for (int64_t t = 0; t < kc / 16; ++t) {
        const int64_t g = k0 / 16 + t;
        const uint8_t* sb = row + g / 16 * 210;
        scales[t * kPanel + j] =
            j < cols ? f16_at(sb + 208) * static_cast<float>(static_cast<int8_t>(sb[192 + g % 16]))
                     : 0.f;
      }
    }
    return;
  }
  const int64_t blocks = kc / kQ8Block;
  for (int64_t j = 0; j < kPanel; ++j) {
    const uint8_t* row = w + (nb + j) * rb;
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t g = k0 / kQ8Block + b;  // the block's index in the row
      float s = 0.f, m = 0.f;
      if (j < cols) {
        if constexpr (std::is_same_v<W, GQ80>) {
          s = f16_at(row + g * 34);
        } else if constexpr (kIsKQuant<W>) {
          const uint8_t* sb = row + g / 8 * W::kBytes;
          alignas(16) uint8_t sm[16];  // sc[0..7], m[0..7]
          _mm_store_si128(reinterpret_cast<__m128i*>(sm), k4_scales(sb + 4));
          s = f16_at(sb) * static_cast<float>(sm[g % 8]);
          m = f16_at(sb + 2) * static_cast<float>(sm[8 + g % 8]);
        }
      }
      scales[b * kPanel + j] = s;
      if constexpr (W::kMins) mins[b * kPanel + j] = m;
    }
  }
}

// panel[(k - k0) / 4 · 128 + j · 4 + r] = offset weight (nb + j, k + r) for k in [k0, k0 + kc),
// j < 32 (rows >= cols: zero); scales (I4, GGUF blocks): [kc / 32][32] the blocks' group scales,
// (I8) [32] row scales, zero past cols; mins (Q4_K, Q5_K): [kc / 32][32] the blocks' mins. quant
// as matmul_rows_q8 takes it.
template <class W>
void build_panel(const uint8_t* w, const void* quant, int64_t K, int64_t nb, int64_t cols,
                 int64_t k0, int64_t kc, uint8_t* panel, float* scales, float* mins) {
  const int64_t rb = W::row_bytes(K);
  for (int64_t half = 0; half < kPanel; half += 16) {
    for (int64_t kk = 0; kk < kc; kk += 64) {
      const int nd = static_cast<int>(std::min<int64_t>(16, (kc - kk) / 4));
      __m512i v[16];
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t n = half + j;
        if (n < cols) {
          const uint8_t* row = w + (nb + n) * rb;
          __builtin_prefetch(row + W::row_bytes(k0 + kk + 128), 0, 3);
          v[j] = weight_runs<W>(row, k0 + kk, nd);
        } else {
          v[j] = _mm512_setzero_si512();
        }
      }
      transpose16x16_epi32(v);
      for (int i = 0; i < nd; ++i) {
        _mm512_storeu_si512(panel + (kk / 4 + i) * kPanelStep + half * 4, v[i]);
      }
    }
  }
  if constexpr (kIsGgml<W>) {
    (void)quant;
    ggml_panel_scales<W>(w, K, nb, cols, k0, kc, scales, mins);
  } else if constexpr (W::kGroupScales) {
    (void)mins;
    int4_panel_scales(*static_cast<const Int4Params*>(quant), K, nb, cols, k0, kc, kPanel, scales);
  } else {
    (void)mins;
    const auto* wscale = static_cast<const float*>(quant);
    for (int64_t j = 0; j < kPanel; ++j) scales[j] = j < cols ? wscale[nb + j] : 0.f;
  }
}

inline __mmask16 column_mask(int64_t cols, int v) {
  const int64_t c = std::clamp<int64_t>(cols - 16 * v, 0, 16);
  return static_cast<__mmask16>((1u << c) - 1);
}

// MR x rows (q at xq, row stride ldx, from the block's first value; their block scales / sums at
// xs / xsum, row stride ldg) × the panel's 32 columns over `blocks` x blocks. y (row stride ldy)
// gets the result (first) or adds it; only its first cols columns are touched.
template <class W, int MR>
inline void micro(const int8_t* xq, int64_t ldx, const float* xs, const int32_t* xsum, int64_t ldg,
                  const uint8_t* panel, const float* scales, const float* mins, int64_t blocks,
                  bool first, float* y, int64_t ldy, int64_t cols) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  constexpr int kSteps = kStepsPerBlock / W::kHalves;  // vpdpbusd steps per scale
  for (int64_t b = 0; b < blocks; ++b) {
    for (int h = 0; h < W::kHalves; ++h) {
      __m512i dot[MR][2];
      for (int i = 0; i < MR; ++i) {
        // Σ (q_w + zero) · q_x = Σ q_w · q_x + zero · Σ q_x: start from −zero · Σ q_x (x's sums
        // per 32 values, or with halves per 16).
        const int32_t sx = W::kHalves == 1 ? xsum[i * ldg + b] : xsum[i * 2 * ldg + 2 * b + h];
        dot[i][0] = dot[i][1] = _mm512_set1_epi32(-W::kZero * sx);
      }
      const uint8_t* pb = panel + b * kStepsPerBlock * kPanelStep;
      const int8_t* xb = xq + b * kQ8Block;
      for (int s = h * kSteps; s < (h + 1) * kSteps; ++s) {
        const __m512i p0 = _mm512_loadu_si512(pb + s * kPanelStep);
        const __m512i p1 = _mm512_loadu_si512(pb + s * kPanelStep + 64);
        for (int i = 0; i < MR; ++i) {
          int32_t run;
          std::memcpy(&run, xb + i * ldx + 4 * s, 4);
          const __m512i xr = _mm512_set1_epi32(run);
          dot[i][0] = _mm512_dpbusd_epi32(dot[i][0], p0, xr);
          dot[i][1] = _mm512_dpbusd_epi32(dot[i][1], p1, xr);
        }
      }
      if constexpr (W::kGroupScales) {
        const float* sg = scales + (b * W::kHalves + h) * kPanel;
        const __m512 s0 = _mm512_loadu_ps(sg);
        const __m512 s1 = _mm512_loadu_ps(sg + 16);
        for (int i = 0; i < MR; ++i) {
          const __m512 sx = _mm512_set1_ps(xs[i * ldg + b]);
          acc[i][0] = _mm512_fmadd_ps(
              _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, dot[i][0]), sx), s0, acc[i][0]);
          acc[i][1] = _mm512_fmadd_ps(
              _mm512_mul_ps(_mm512_maskz_cvtepi32_ps(0xffff, dot[i][1]), sx), s1, acc[i][1]);
        }
        if constexpr (W::kMins) {  // − min · xs · Σ q_x
          const __m512 m0 = _mm512_loadu_ps(mins + b * kPanel);
          const __m512 m1 = _mm512_loadu_ps(mins + b * kPanel + 16);
          for (int i = 0; i < MR; ++i) {
            const __m512 t =
                _mm512_set1_ps(xs[i * ldg + b] * static_cast<float>(xsum[i * ldg + b]));
            acc[i][0] = _mm512_fnmadd_ps(t, m0, acc[i][0]);
            acc[i][1] = _mm512_fnmadd_ps(t, m1, acc[i][1]);
          }
        }
      } else {
        for (int i = 0; i < MR; ++i) {
          const __m512 sx = _mm512_set1_ps(xs[i * ldg + b]);
          acc[i][0] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, dot[i][0]), sx, acc[i][0]);
          acc[i][1] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, dot[i][1]), sx, acc[i][1]);
        }
      }
    }
  }
  for (int v = 0; v < 2; ++v) {
    const __mmask16 m = column_mask(cols, v);
    const __m512 rs = W::kGroupScales ? _mm512_set1_ps(1.f) : _mm512_loadu_ps(scales + 16 * v);
    for (int i = 0; i < MR; ++i) {
      __m512 out = W::kGroupScales ? acc[i][v] : _mm512_mul_ps(acc[i][v], rs);
      if (!first) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, y + i * ldy + 16 * v));
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, m, out);
    }
  }
}

// The M % kTileRows x rows after the full tiles.
template <class W, int MR = kTileRows - 1>
inline void tail_rows(int64_t r, const int8_t* xq, int64_t ldx, const float* xs,
                      const int32_t* xsum, int64_t ldg, const uint8_t* panel, const float* scales,
                      const float* mins, int64_t blocks, bool first, float* y, int64_t ldy,
                      int64_t cols) {
  if constexpr (MR > 0) {
    if (r == MR) {
      micro<W, MR>(xq, ldx, xs, xsum, ldg, panel, scales, mins, blocks, first, y, ldy, cols);
    } else {
      tail_rows<W, MR - 1>(r, xq, ldx, xs, xsum, ldg, panel, scales, mins, blocks, first, y, ldy,
                           cols);
    }
  }
}

// Prefetches (into L2) part `part` of `parts` of the weight lines block b will read.
template <class W>
inline void prefetch_block(const uint8_t* w, int64_t K, const PanelBlock& b, int64_t part,
                           int64_t parts) {
  prefetch_panel_block(reinterpret_cast<const char*>(w), W::row_bytes(K), b, W::row_bytes(b.k0),
                       W::row_bytes(std::min(kBlockK, K - b.k0)), part, parts);
}

template <class W>
void run(const Q8Rows& x, int64_t M, int64_t K, const uint8_t* w, const void* quant, int64_t n0,
         int64_t n1, float* y, int64_t ldy, void* scratch) {
  auto* panel =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t{63});
  auto* scales = reinterpret_cast<float*>(panel + kPanel * std::min(K, kBlockK));
  float* mins = scales + kPanel * (std::min(K, kBlockK) / kQ8Block);
  const int64_t ldg = K / kQ8Block;
  const PanelBlocks order(M, n0, n1, K, kPanel, kBlockK);
  const int64_t count = order.count(), tiles = (M + kTileRows - 1) / kTileRows;
  for (int64_t i = 0; i < count; ++i) {
    const PanelBlock b = order[i];
    const int64_t kc = std::min(kBlockK, K - b.k0), blocks = kc / kQ8Block;
    build_panel<W>(w, quant, K, b.nb, b.cols, b.k0, kc, panel, scales, mins);
    const bool first = b.k0 == 0;
    const int64_t g0 = b.k0 / kQ8Block;
    // x's sums from row m and this K block on: per 32 values, or per 16 (Q6_K).
    const auto sums = [&](int64_t m) {
      return W::kHalves == 1 ? x.sum + m * ldg + g0 : x.sum16 + m * 2 * ldg + 2 * g0;
    };
    int64_t m = 0;
    for (int64_t t = 0; m + kTileRows <= M; m += kTileRows, ++t) {
      if (i + 1 < count) prefetch_block<W>(w, K, order[i + 1], t, tiles);
      micro<W, kTileRows>(x.q + m * K + b.k0, K, x.scale + m * ldg + g0, sums(m), ldg, panel,
                          scales, mins, blocks, first, y + m * ldy + b.nb, ldy, b.cols);
    }
    if (m < M && i + 1 < count) prefetch_block<W>(w, K, order[i + 1], tiles - 1, tiles);
    tail_rows<W>(M - m, x.q + m * K + b.k0, K, x.scale + m * ldg + g0, sums(m), ldg, panel, scales,
                 mins, blocks, first, y + m * ldy + b.nb, ldy, b.cols);
  }
}

// ---- INT4 weights, few x rows (decode, batched decode) ----
// No panel: weight rows stream as stored, 64 packed bytes (4 blocks, 128 values of K) per step.
// One zmm of them splits into lo (byte 16b + j = q[32b + j] + 8) and hi (q[32b + 16 + j] + 8), so
// vpdpbusd against x bytes laid out the same way leaves block b's sum in lanes 4b .. 4b + 3.
// prepare_decode_x lays x out so (once per call, in ops/matmul_cpu.cc): per row and 128-value
// chunk, kDecodeChunkBytes = [lo-ordered x 64 B][hi-ordered x 64 B][−8 · Σq_x of block b in lane 4b
// (int32) 64 B] [block b's x scale in lanes 4b .. 4b + 3 (f32) 64 B], zero past K. The weights'
// f16 group scales (a group is 1, 2 or 4 blocks) widen to f32 in the same lanes.
constexpr int64_t kChunk = 4 * kQ8Block;
constexpr int64_t kDecodeChunkBytes = 256;
static_assert(q8_decode_x_bytes(1, kChunk) == kDecodeChunkBytes, "matmul.h's decode x size");

// The lanes' scale index within a chunk: lane 4b + r takes scale b >> shift of the chunk's.
inline __m512i lanes_of_group(int shift) {
  return _mm512_maskz_srlv_epi32(0xffff,
                                 _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                 _mm512_set1_epi32(shift));
}

// Chunk c of a decode kernel (4 blocks, 64 packed bytes of each of NR weight rows): its blocks
// (rem, up to 4), its first scale group g0 and the mask of its (up to 4) scales' f16 loads —
// groups b0 >> shift .. (b0 + rem − 1) >> shift, b0 = 4c a multiple of 4. Also prefetches the
// same column of the rows PF groups of NR ahead, one line per chunk, and their scales every 8
// chunks (one 64-byte line of f16 scales at groups of 32; at 64 and 128 the same line twice or
// four times, which costs nothing).
struct DecodeChunk {
  int64_t rem, g0;
  __mmask8 smask;
};
template <int NR, int PF, int Loc>
inline DecodeChunk decode_chunk(const uint8_t* w, const uint16_t* wscale, int64_t rb,
                                int64_t groups, int64_t blocks, int shift, int64_t c) {
  const int64_t b0 = 4 * c, rem = std::min<int64_t>(4, blocks - b0);
  const int64_t g0 = b0 >> shift, ng = ((b0 + rem - 1) >> shift) - g0 + 1;
  for (int j = 0; j < NR; ++j) __builtin_prefetch(w + (j + PF * NR) * rb + c * 64, 0, Loc);
  if ((c & 7) == 0) {
    for (int j = 0; j < NR; ++j) __builtin_prefetch(wscale + (j + PF * NR) * groups + g0, 0, 3);
  }
  return {rem, g0, static_cast<__mmask8>((1u << ng) - 1)};
}

// MR x rows (decode layout at dx, row stride dstride bytes) × NR weight rows of K / 2 bytes and
// their f16 scales (row stride K / G; block b takes scale b >> shift; lanes: lanes_of_group).
template <int MR, int NR, int PF, int Loc>
inline void decode_micro(const uint8_t* dx, int64_t dstride, const uint8_t* w,
                         const uint16_t* wscale, int shift, __m512i lanes, int64_t K, float* y,
                         int64_t ldy) {
  static_assert(MR * NR <= 16, "accumulators stay in registers");
  const int64_t rb = K / 2, blocks = K / kQ8Block, chunks = (blocks + 3) / 4;
  const int64_t groups = blocks >> shift;
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const auto [rem, g0, smask] =
        decode_chunk<NR, PF, Loc>(w, wscale, rb, groups, blocks, shift, c);
    const __mmask64 bmask = rem == 4 ? ~__mmask64{0} : (__mmask64{1} << (16 * rem)) - 1;
    for (int j = 0; j < NR; ++j) {
      const __m512i b = _mm512_xor_si512(_mm512_maskz_loadu_epi8(bmask, w + j * rb + c * 64),
                                         _mm512_set1_epi8(static_cast<char>(0x88)));
      const __m512i lo = _mm512_and_si512(b, _mm512_set1_epi8(0x0f));
      const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(b, 4), _mm512_set1_epi8(0x0f));
      // The chunk's (up to 4) group scales in lanes 0..3, then each in its blocks' lanes.
      const __m128 s4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(smask, wscale + j * groups + g0));
      const __m512 sw = _mm512_maskz_permutexvar_ps(0xffff, lanes, _mm512_zextps128_ps512(s4));
      for (int i = 0; i < MR; ++i) {
        const uint8_t* xc = dx + i * dstride + c * kDecodeChunkBytes;
        __m512i d = _mm512_loadu_si512(xc + 128);
        d = _mm512_dpbusd_epi32(d, lo, _mm512_loadu_si512(xc));
        d = _mm512_dpbusd_epi32(d, hi, _mm512_loadu_si512(xc + 64));
        acc[i][j] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, d),
                                    _mm512_mul_ps(sw, _mm512_loadu_ps(xc + 192)), acc[i][j]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum(acc[i][j]);
}

// The same on 256-bit vectors: each 128-value chunk in two halves of 2 blocks (bytes 32h .. 32h +
// 32 of the chunk's weights and of each part of its x layout), block b's sum in lanes 4(b − 2h) ..
// 4(b − 2h) + 3. On CPUs that split 512-bit instructions in two, or lower their clock for them,
// this may run faster (ops/autotune.cc measures it).
template <int MR, int NR, int PF, int Loc>
inline void decode_micro_ymm(const uint8_t* dx, int64_t dstride, const uint8_t* w,
                             const uint16_t* wscale, int shift, int64_t K, float* y, int64_t ldy) {
  static_assert(MR * NR <= 16, "accumulators stay in registers");
  const int64_t rb = K / 2, blocks = K / kQ8Block, chunks = (blocks + 3) / 4;
  const int64_t groups = blocks >> shift;
  const __m256i lanes0 =
      _mm256_srlv_epi32(_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_set1_epi32(shift));
  const __m256i lanes1 =
      _mm256_srlv_epi32(_mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3), _mm256_set1_epi32(shift));
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    const auto [rem, g0, smask] =
        decode_chunk<NR, PF, Loc>(w, wscale, rb, groups, blocks, shift, c);
    for (int j = 0; j < NR; ++j) {
      const __m128 s4 = _mm_cvtph_ps(_mm_maskz_loadu_epi16(smask, wscale + j * groups + g0));
      const __m256 s8 = _mm256_insertf128_ps(_mm256_castps128_ps256(s4), s4, 1);
      for (int h = 0; h < 2 && 2 * h < rem; ++h) {
        const __mmask32 bmask = 2 * h + 1 < rem ? ~__mmask32{0} : __mmask32{0xffff};
        const __m256i b =
            _mm256_xor_si256(_mm256_maskz_loadu_epi8(bmask, w + j * rb + c * 64 + 32 * h),
                             _mm256_set1_epi8(static_cast<char>(0x88)));
        const __m256i lo = _mm256_and_si256(b, _mm256_set1_epi8(0x0f));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(b, 4), _mm256_set1_epi8(0x0f));
        const __m256 sw = _mm256_permutevar8x32_ps(s8, h == 0 ? lanes0 : lanes1);
        for (int i = 0; i < MR; ++i) {
          const uint8_t* xc = dx + i * dstride + c * kDecodeChunkBytes + 32 * h;
          __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + 128));
          d = _mm256_dpbusd_epi32(d, lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc)));
          d = _mm256_dpbusd_epi32(d, hi,
                                  _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xc + 64)));
          acc[i][j] = _mm256_fmadd_ps(
              _mm256_cvtepi32_ps(d),
              _mm256_mul_ps(sw, _mm256_loadu_ps(reinterpret_cast<const float*>(xc + 192))),
              acc[i][j]);
        }
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) y[i * ldy + j] = hsum(acc[i][j]);
}

// Weight rows outermost (each group of NR rows is read from memory once and stays in L1 while
// every 4-row group of x runs over it), x rows inner.
template <int NR, bool kYmm, int PF, int Loc>
void run_decode(const uint8_t* dx, int64_t M, int64_t K, const uint8_t* w, const Int4Params& p,
                int64_t n0, int64_t n1, float* y, int64_t ldy) {
  constexpr int kMaxMR = 16 / NR;
  const int shift = int4_group_shift(p.group);
  const __m512i lanes = lanes_of_group(shift);
  const int64_t rb = K / 2, blocks = K / kQ8Block, groups = K / p.group;
  const int64_t dstride = (blocks + 3) / 4 * kDecodeChunkBytes;
  const auto step = [&]<int R>(int64_t n) {
    for (int64_t m = 0; m < M; m += kMaxMR) {
      const uint8_t* xm = dx + m * dstride;
      const uint8_t* wn = w + n * rb;
      const uint16_t* sn = p.scale + n * groups;
      float* ym = y + m * ldy + n;
      const auto micro = [&]<int MR>() {
        if constexpr (kYmm) {
          decode_micro_ymm<MR, R, PF, Loc>(xm, dstride, wn, sn, shift, K, ym, ldy);
        } else {
          decode_micro<MR, R, PF, Loc>(xm, dstride, wn, sn, shift, lanes, K, ym, ldy);
        }
      };
      switch (std::min<int64_t>(kMaxMR, M - m)) {
        case 1:
          micro.template operator()<1>();
          break;
        case 2:
          if constexpr (kMaxMR >= 2) micro.template operator()<2>();
          break;
        case 3:
          if constexpr (kMaxMR >= 3) micro.template operator()<3>();
          break;
        case 4:
          if constexpr (kMaxMR >= 4) micro.template operator()<4>();
          break;
        default:
          break;
      }
    }
  };
  int64_t n = n0;
  for (; n + NR <= n1; n += NR) step.template operator()<NR>(n);
  for (; n < n1; ++n) step.template operator()<1>(n);
}

}  // namespace

void prepare_decode_x(const Q8Rows& x, int64_t M, int64_t K, uint8_t* out) {
  const int64_t groups = K / kQ8Block, chunks = (groups + 3) / 4;
  std::memset(out, 0, M * chunks * kDecodeChunkBytes);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t g = 0; g < groups; ++g) {
      uint8_t* c = out + (m * chunks + g / 4) * kDecodeChunkBytes;
      const int64_t slot = g % 4;
      std::memcpy(c + 16 * slot, x.q + m * K + g * kQ8Block, 16);
      std::memcpy(c + 64 + 16 * slot, x.q + m * K + g * kQ8Block + 16, 16);
      const int32_t corr = -I4::kZero * x.sum[m * groups + g];
      std::memcpy(c + 128 + 16 * slot, &corr, 4);
      for (int l = 0; l < 4; ++l)
        std::memcpy(c + 192 + 16 * slot + 4 * l, &x.scale[m * groups + g], 4);
    }
  }
}

void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* sum) {
  const int64_t blocks = K / kQ8Block;
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + m * K + b * kQ8Block;
      const __m512 a = _mm512_loadu_ps(xb), c = _mm512_loadu_ps(xb + 16);
      float lanes[16];
      _mm512_storeu_ps(lanes, _mm512_maskz_max_ps(0xffff, _mm512_and_ps(a, abs_mask),
                                                  _mm512_and_ps(c, abs_mask)));
      float amax = 0.f;
      for (float l : lanes) amax = std::max(amax, l);
      // (Written so that a NaN amax also takes the zero branch.)
      const bool normal = amax >= kQ8MinAmax;
      const float inv = normal ? 127.f / amax : 0.f;
      // vcvtps2dq rounds to nearest even (the default MXCSR mode).
      const __m512i qa = _mm512_maskz_cvtps_epi32(0xffff, _mm512_mul_ps(a, _mm512_set1_ps(inv)));
      const __m512i qc = _mm512_maskz_cvtps_epi32(0xffff, _mm512_mul_ps(c, _mm512_set1_ps(inv)));
      int8_t* qb = q + m * K + b * kQ8Block;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm512_maskz_cvtsepi32_epi8(0xffff, qa));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 16),
                       _mm512_maskz_cvtsepi32_epi8(0xffff, qc));
      scale[m * blocks + b] = normal ? amax / 127.f : 0.f;
      int32_t parts[16];
      _mm512_storeu_si512(parts, _mm512_add_epi32(qa, qc));
      int32_t total = 0;
      for (int32_t p : parts) total += p;
      sum[m * blocks + b] = total;
    }
  }
}

void matmul_rows_q4_decode(const Int4DecodeShape& s, const Q8Rows& x, int64_t M, int64_t K,
                           const uint8_t* w, const Int4Params& p, int64_t n0, int64_t n1, float* y,
                           int64_t ldy) {
  const auto run = [&]<int NR, bool kYmm>() {
    if (s.prefetch == 2) {
      run_decode<NR, kYmm, 2, 2>(x.decode, M, K, w, p, n0, n1, y, ldy);
    } else if (s.locality == 1) {
      run_decode<NR, kYmm, 1, 1>(x.decode, M, K, w, p, n0, n1, y, ldy);
    } else if (s.locality == 2) {
      run_decode<NR, kYmm, 1, 2>(x.decode, M, K, w, p, n0, n1, y, ldy);
    } else {
      run_decode<NR, kYmm, 1, 3>(x.decode, M, K, w, p, n0, n1, y, ldy);
    }
  };
  const bool eight = M <= 2 && s.rows == 8;  // 8 rows × up to 2 x rows of accumulators
  if (s.ymm) {
    eight ? run.template operator()<8, true>() : run.template operator()<4, true>();
  } else {
    eight ? run.template operator()<8, false>() : run.template operator()<4, false>();
  }
}

namespace {

// NR INT8 weight rows (row stride K, offset to unsigned by ^ 0x80) against one row of INT8 x:
// 64 values per step, vpdpbusd leaving block 2t's sum in lanes 0..7 and block 2t + 1's in 8..15,
// started from −128 · Σq of each block in lanes 0 and 8 (the offset's term, so each block's sum is
// exact in int32), times the blocks' x scales; the row scale applies once at the end.
template <int NR>
inline void i8_rows(const int8_t* xq, const float* xs, const int32_t* xsum, int64_t K,
                    const int8_t* w, const float* wscale, float* y) {
  __m512 acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t k = 0; k < K; k += 64) {
    const int64_t b = k / kQ8Block;
    const bool full = k + 64 <= K;  // else one 32-value block is left
    const __mmask64 m = full ? ~__mmask64{0} : (__mmask64{1} << 32) - 1;
    for (int j = 0; j < NR; ++j) __builtin_prefetch(w + (j + NR) * K + k, 0, 2);
    const __m512i xv = _mm512_maskz_loadu_epi8(m, xq + k);
    const float s1 = full ? xs[b + 1] : 0.f;
    const __m512 sv = _mm512_insertf32x8(_mm512_set1_ps(xs[b]), _mm256_set1_ps(s1), 1);
    const __m512i corr =
        _mm512_mask_set1_epi32(_mm512_maskz_set1_epi32(0x0001, -I8::kZero * xsum[b]), 0x0100,
                               full ? -I8::kZero * xsum[b + 1] : 0);
    for (int j = 0; j < NR; ++j) {
      const __m512i wv = _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, w + j * K + k), flip);
      const __m512i d = _mm512_dpbusd_epi32(corr, wv, xv);
      acc[j] = _mm512_fmadd_ps(_mm512_maskz_cvtepi32_ps(0xffff, d), sv, acc[j]);
    }
  }
  for (int j = 0; j < NR; ++j) y[j] = wscale[j] * hsum(acc[j]);
}

}  // namespace

void matmul_row_i8_decode(const Q8Rows& x, int64_t K, const int8_t* w, const float* scale,
                          int64_t n0, int64_t n1, float* y) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) i8_rows<8>(x.q, x.scale, x.sum, K, w + n * K, scale + n, y + n);
  for (; n < n1; ++n) i8_rows<1>(x.q, x.scale, x.sum, K, w + n * K, scale + n, y + n);
}

void matmul_rows_q8(const Q8Rows& x, int64_t M, int64_t K, DType wtype, const void* w,
                    const void* quant, int64_t n0, int64_t n1, float* y, int64_t ldy,
                    void* scratch) {
  const auto* wb = static_cast<const uint8_t*>(w);
  if (wtype == DType::kI4 && M < kPackedMinRows) {
    matmul_rows_q4_decode(Int4DecodeShape{}, x, M, K, wb, *static_cast<const Int4Params*>(quant),
                          n0, n1, y, ldy);
    return;
  }
  if (wtype == DType::kI8) {
    run<I8>(x, M, K, wb, quant, n0, n1, y, ldy, scratch);
  } else if (wtype == DType::kI4) {
    run<I4>(x, M, K, wb, quant, n0, n1, y, ldy, scratch);
  } else if (wtype == DType::kQ8_0) {
    run<GQ80>(x, M, K, wb, quant, n0, n1, y, ldy, scratch);
  } else if (wtype == DType::kQ4K) {
    run<GQ4K>(x, M, K, wb, quant, n0, n1, y, ldy, scratch);
  } else if (wtype == DType::kQ5K) {
    run<GQ5K>(x, M, K, wb, quant, n0, n1, y, ldy, scratch);
  } else if (wtype == DType::kQ6K) {
    run<GQ6K>(x, M, K, wb, quant, n0, n1, y, ldy, scratch);
  }
}

}  // namespace vlm::kernels::avx512vnni

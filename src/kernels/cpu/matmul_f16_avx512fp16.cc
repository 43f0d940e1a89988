// F32 / BF16 / F16 weights × activations rounded to FP16, multiplied with AVX-512 FP16 FMAs
// (semantics in kernels/cpu/matmul.h). Compiled for that level only (CMake gives
// *_avx512fp16.cc -mavx512fp16 on top of AVX-512).
//
// Many x rows only: 32 weight rows at a time are converted to FP16 and transposed into a panel of
// one zmm (32 halves) per value of K, one block of kBlockK values at a time. A tile of kTileRows
// x rows × those 32 columns keeps a half-precision sum per row for the current run of kF16Run
// values of K (one vfmadd231ph per row and k) and an f32 total per row (2 zmm); at the end of
// each run the half sums widen to f32 and add into the totals.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/panel_blocks.h"
#include "kernels/cpu/transpose_avx512.h"

namespace vlm::kernels::avx512fp16 {
namespace {

constexpr int64_t kPanel = 32;    // weight rows (output columns) per panel: one zmm of halves
constexpr int64_t kBlockK = 512;  // values of K per panel block: 32 KiB of halves, in L1
static_assert(f16_scratch_bytes(kBlockK) == kPanel * kBlockK * 2 + 64,
              "matmul.h's scratch size is this kernel's panel and an alignment");
// NOTE(vlm): 9 half sums + 18 f32 totals + the panel vector = 28 of the 32 zmm. vfmadd231ph
// issues 2 per cycle here (364 GFLOP/s per core against 171 for vfmadd231ps); this kernel runs
// [784, 1024 | 4096] × [4096 | 1024, 1024]ᵀ at 340–400 GFLOP/s on 2 threads (f32: 200–245),
// about half the FP16 peak. Tried, slower: 12 rows × 64 columns (24 half sums, totals in y),
// 14 rows × 32 (totals in y).
constexpr int kTileRows = 9;

// 16 weights of row n from k as f32 (F32: as stored; BF16: the bits shifted up; F16: converted).
inline __m512 load16(const void* w, DType wtype, int64_t K, int64_t n, int64_t k) {
  if (wtype == DType::kF32) return _mm512_loadu_ps(static_cast<const float*>(w) + n * K + k);
  const __m256i h = _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + n * K + k));
  if (wtype == DType::kBF16) {
    return _mm512_castsi512_ps(
        _mm512_maskz_slli_epi32(0xffff, _mm512_maskz_cvtepu16_epi32(0xffff, h), 16));
  }
  return _mm512_maskz_cvtph_ps(0xffff, h);
}

inline const char* row_at(const void* w, DType wtype, int64_t K, int64_t n, int64_t k) {
  return static_cast<const char*>(w) + (n * K + k) * (wtype == DType::kF32 ? 4 : 2);
}

// panel[(k - k0) · 64 + j] = fp16(w[nb + j][k]) for k in [k0, k0 + kc) (kc a multiple of 16),
// j < 64 (zero for j >= cols).
void build_panel(const void* w, DType wtype, int64_t K, int64_t nb, int64_t cols, int64_t k0,
                 int64_t kc, _Float16* panel) {
  for (int64_t half = 0; half < kPanel; half += 16) {
    for (int64_t kk = 0; kk < kc; kk += 16) {
      __m512i v[16];
      for (int64_t j = 0; j < 16; ++j) {
        const int64_t n = half + j;
        if (n < cols) {
          if (kk % 32 == 0) __builtin_prefetch(row_at(w, wtype, K, nb + n, k0 + kk + 64), 0, 3);
          v[j] = _mm512_castps_si512(load16(w, wtype, K, nb + n, k0 + kk));
        } else {
          v[j] = _mm512_setzero_si512();
        }
      }
      transpose16x16_epi32(v);
      for (int i = 0; i < 16; ++i) {
        const __m256h h = _mm512_cvtxps_ph(_mm512_castsi512_ps(v[i]));
        std::memcpy(panel + (kk + i) * kPanel + half, &h, sizeof(h));
      }
    }
  }
}

inline __mmask16 column_mask(int64_t cols, int64_t c0) {
  const int64_t c = std::clamp<int64_t>(cols - c0, 0, 16);
  return static_cast<__mmask16>((1u << c) - 1);
}

// MR rows of xh (row stride ldx, from the block's first value) × the panel's 64 columns over kc
// values. y (row stride ldy) gets the result (first) or adds it; only its first cols columns.
template <int MR>
inline void micro(const uint32_t* x2, int64_t ldx, const _Float16* panel, int64_t kc, bool first,
                  float* y, int64_t ldy, int64_t cols) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t r = 0; r < kc; r += kF16Run) {
    __m512h h[MR];
    for (int i = 0; i < MR; ++i) h[i] = _mm512_setzero_ph();
    for (int64_t k = r; k < r + kF16Run; ++k) {
      const __m512h p = _mm512_loadu_ph(panel + k * kPanel);
      for (int i = 0; i < MR; ++i) {
        // x2 holds each half twice in 32 bits: a 32-bit broadcast is a plain load, while
        // vpbroadcastw from memory takes a port-5 uop, which the FMAs need.
        float pair;
        std::memcpy(&pair, x2 + i * ldx + k, 4);
        h[i] = _mm512_fmadd_ph(_mm512_castps_ph(_mm512_set1_ps(pair)), p, h[i]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m512i bits = _mm512_castph_si512(h[i]);
      acc[i][0] = _mm512_add_ps(
          acc[i][0], _mm512_maskz_cvtph_ps(0xffff, _mm512_maskz_extracti64x4_epi64(0xf, bits, 0)));
      acc[i][1] = _mm512_add_ps(
          acc[i][1], _mm512_maskz_cvtph_ps(0xffff, _mm512_maskz_extracti64x4_epi64(0xf, bits, 1)));
    }
  }
  for (int v = 0; v < 2; ++v) {
    const __mmask16 m = column_mask(cols, 16 * v);
    for (int i = 0; i < MR; ++i) {
      __m512 out = acc[i][v];
      if (!first) out = _mm512_add_ps(out, _mm512_maskz_loadu_ps(m, y + i * ldy + 16 * v));
      _mm512_mask_storeu_ps(y + i * ldy + 16 * v, m, out);
    }
  }
}

template <int MR = kTileRows - 1>
inline void tail_rows(int64_t r, const uint32_t* xh, int64_t ldx, const _Float16* panel, int64_t kc,
                      bool first, float* y, int64_t ldy, int64_t cols) {
  if constexpr (MR > 0) {
    if (r == MR) {
      micro<MR>(xh, ldx, panel, kc, first, y, ldy, cols);
    } else {
      tail_rows<MR - 1>(r, xh, ldx, panel, kc, first, y, ldy, cols);
    }
  }
}

// Prefetches (into L2) part `part` of `parts` of the weight lines block b will read.
inline void prefetch_block(const void* w, DType wtype, int64_t K, const PanelBlock& b, int64_t part,
                           int64_t parts) {
  const int64_t bytes = wtype == DType::kF32 ? 4 : 2;
  prefetch_panel_block(static_cast<const char*>(w), K * bytes, b, b.k0 * bytes,
                       std::min(kBlockK, K - b.k0) * bytes, part, parts);
}

}  // namespace

void convert_rows_f16(const float* x, int64_t M, int64_t K, uint32_t* out) {
  const int64_t ld = f16_x_stride(K);
  for (int64_t m = 0; m < M; ++m) {
    int64_t i = 0;
    for (; i + 16 <= K; i += 16) {
      const __m256i h = _mm256_castph_si256(_mm512_cvtxps_ph(_mm512_loadu_ps(x + m * K + i)));
      const __m512i w = _mm512_maskz_cvtepu16_epi32(0xffff, h);
      _mm512_storeu_si512(out + m * ld + i,
                          _mm512_or_si512(w, _mm512_maskz_slli_epi32(0xffff, w, 16)));
    }
    for (; i < K; ++i) {
      const _Float16 h = static_cast<_Float16>(x[m * K + i]);
      uint16_t b;
      std::memcpy(&b, &h, 2);
      out[m * ld + i] = b | static_cast<uint32_t>(b) << 16;
    }
  }
}

void matmul_rows_f16(const uint32_t* xh, int64_t M, int64_t K, DType wtype, const void* w,
                     int64_t n0, int64_t n1, float* y, int64_t ldy, void* scratch) {
  auto* panel =
      reinterpret_cast<_Float16*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t{63});
  const int64_t ldx = f16_x_stride(K);
  const PanelBlocks blocks(M, n0, n1, K, kPanel, kBlockK);
  const int64_t count = blocks.count(), tiles = (M + kTileRows - 1) / kTileRows;
  for (int64_t i = 0; i < count; ++i) {
    const PanelBlock b = blocks[i];
    const int64_t kc = std::min(kBlockK, K - b.k0);
    build_panel(w, wtype, K, b.nb, b.cols, b.k0, kc, panel);
    const bool first = b.k0 == 0;
    int64_t m = 0;
    for (int64_t t = 0; m + kTileRows <= M; m += kTileRows, ++t) {
      if (i + 1 < count) prefetch_block(w, wtype, K, blocks[i + 1], t, tiles);
      micro<kTileRows>(xh + m * ldx + b.k0, ldx, panel, kc, first, y + m * ldy + b.nb, ldy, b.cols);
    }
    if (m < M && i + 1 < count) prefetch_block(w, wtype, K, blocks[i + 1], tiles - 1, tiles);
    tail_rows(M - m, xh + m * ldx + b.k0, ldx, panel, kc, first, y + m * ldy + b.nb, ldy, b.cols);
  }
}

}  // namespace vlm::kernels::avx512fp16

// BF16 dot products (AVX512_BF16 `vdpbf16ps`) for the prefill GEMM (kernels/cpu/matmul.h,
// namespace avx512bf16): x rounded to BF16 once per call, 32 weight rows packed as pairs of K (the
// layout AMX's B tiles use), 12-row × 32-column register tiles accumulating in f32. Compiled with
// -mavx512bf16; run only where available() says so.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/hsum_avx512.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/transpose_avx512.h"

namespace vlm::kernels::avx512bf16 {
namespace {

bool detect() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(1));
  return (eax >> 5) & 1;  // AVX512_BF16
}

}  // namespace

void pack_pairs(const uint16_t* w, int64_t K, int64_t n, int blocks, uint32_t* out) {
  const int64_t cols = 16 * blocks;
  for (int g = 0; g < blocks; ++g) {
    const uint16_t* rows = w + (n + 16 * g) * K;
    for (int64_t kp = 0; kp < K / 2; kp += 16) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(rows + i * K + 2 * kp);
      transpose16x16_epi32(r);
      for (int p = 0; p < 16; ++p) _mm512_storeu_si512(out + (kp + p) * cols + 16 * g, r[p]);
    }
  }
}

namespace {

// R x rows × 16 · B columns over all K: each k-pair of x broadcast against the panel's row.
template <int R, int B>
void tile(const uint16_t* xb, int64_t K, const uint32_t* panel, float* y, int64_t ldy) {
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) acc[r][b] = _mm512_setzero_ps();
  }
  for (int64_t kp = 0; kp < K / 2; ++kp) {
    __m512bh wv[B];
    for (int b = 0; b < B; ++b) {
      wv[b] = (__m512bh)_mm512_loadu_si512(panel + kp * 16 * B + 16 * b);
    }
    for (int r = 0; r < R; ++r) {
      uint32_t pair;
      std::memcpy(&pair, xb + r * K + 2 * kp, 4);
      const __m512i xv = _mm512_set1_epi32(static_cast<int>(pair));
      for (int b = 0; b < B; ++b) {
        acc[r][b] = _mm512_dpbf16_ps(acc[r][b], (__m512bh)xv, wv[b]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int b = 0; b < B; ++b) _mm512_storeu_ps(y + r * ldy + 16 * b, acc[r][b]);
  }
}

template <int B>
void rows_tail(int64_t rows, const uint16_t* xb, int64_t K, const uint32_t* panel, float* y,
               int64_t ldy) {
  switch (rows) {
    case 1:
      return tile<1, B>(xb, K, panel, y, ldy);
    case 2:
      return tile<2, B>(xb, K, panel, y, ldy);
    case 3:
      return tile<3, B>(xb, K, panel, y, ldy);
    case 4:
      return tile<4, B>(xb, K, panel, y, ldy);
    case 5:
      return tile<5, B>(xb, K, panel, y, ldy);
    case 6:
      return tile<6, B>(xb, K, panel, y, ldy);
    case 7:
      return tile<7, B>(xb, K, panel, y, ldy);
    case 8:
      return tile<8, B>(xb, K, panel, y, ldy);
    case 9:
      return tile<9, B>(xb, K, panel, y, ldy);
    case 10:
      return tile<10, B>(xb, K, panel, y, ldy);
    case 11:
      return tile<11, B>(xb, K, panel, y, ldy);
    default:
      return tile<12, B>(xb, K, panel, y, ldy);
  }
}

// NR weight rows (row stride K) against one x row in BF16: lane i of a step sums the products of
// the pair (2i, 2i + 1), which vdpbf16ps takes from x and the weights as both are stored.
template <int NR>
inline void dot_rows(const uint16_t* xb, int64_t K, const uint16_t* w, float* y) {
  __m512 acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    // The same column of the next NR rows, one line per step, into L2 (see matmul_row_l2).
    for (int j = 0; j < NR; ++j) __builtin_prefetch(w + (j + NR) * K + k, 0, 2);
    const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + k);
    for (int j = 0; j < NR; ++j) {
      acc[j] = _mm512_dpbf16_ps(acc[j], (__m512bh)_mm512_loadu_si512(w + j * K + k), xv);
    }
  }
  for (int j = 0; j < NR; ++j) y[j] = hsum(acc[j]);
}

}  // namespace

bool available() {
  static const bool ok = detect();
  return ok;
}

void convert_rows_bf16(const float* x, int64_t M, int64_t K, uint16_t* xb) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; k += 32) {
      const __m512bh v =
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + m * K + k + 16), _mm512_loadu_ps(x + m * K + k));
      _mm512_storeu_si512(xb + m * K + k, reinterpret_cast<const __m512i&>(v));
    }
  }
}

void matmul_rows_bf16(const uint16_t* xb, int64_t M, int64_t K, const uint16_t* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, void* scratch) {
  auto* panel = static_cast<uint32_t*>(scratch);
  for (int64_t n = n0; n < n1; n += 32) {
    const int blocks = n + 32 <= n1 ? 2 : 1;
    pack_pairs(w, K, n, blocks, panel);
    for (int64_t m = 0; m < M; m += 12) {
      const int64_t rows = std::min<int64_t>(12, M - m);
      if (blocks == 2) {
        rows_tail<2>(rows, xb + m * K, K, panel, y + m * ldy + n, ldy);
      } else {
        rows_tail<1>(rows, xb + m * K, K, panel, y + m * ldy + n, ldy);
      }
    }
  }
}

void matmul_row_bf16_dot(const uint16_t* xb, int64_t K, const uint16_t* w, int64_t n0, int64_t n1,
                         float* y) {
  int64_t n = n0;
  for (; n + 8 <= n1; n += 8) dot_rows<8>(xb, K, w + n * K, y + n);
  for (; n < n1; ++n) dot_rows<1>(xb, K, w + n * K, y + n);
}

}  // namespace vlm::kernels::avx512bf16

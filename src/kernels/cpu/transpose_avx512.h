// In-register transpose of a 16 × 16 block of 32-bit elements, for translation units compiled
// with AVX-512 (F) enabled; include it only from those.
#pragma once

#include <immintrin.h>

namespace vlm::kernels {

// r[i] holds row i in, column i out. (The all-lanes maskz forms compile to the plain
// instructions; the unmasked intrinsics trip GCC 12's -Wmaybe-uninitialized on their
// _mm512_undefined_* pass-through operand.)
inline void transpose16x16_epi32(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(0xffff, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_maskz_unpacklo_epi64(0xff, t[i], t[i + 2]);
    r[i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[i], t[i + 2]);
    r[i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[i + 1], t[i + 3]);
  }
  // r[4b + c] now holds, in its 128-bit lane L, rows 4b..4b+3 of column 4L + c: a 4 × 4
  // transpose of 128-bit blocks (two rounds of lane shuffles) leaves column c in r[c].
  for (int c = 0; c < 4; ++c) {
    for (int b = 0; b < 4; b += 2) {
      t[4 * b + c] = _mm512_maskz_shuffle_i32x4(0xffff, r[4 * b + c], r[4 * (b + 1) + c], 0x88);
      t[4 * (b + 1) + c] =
          _mm512_maskz_shuffle_i32x4(0xffff, r[4 * b + c], r[4 * (b + 1) + c], 0xdd);
    }
  }
  for (int c = 0; c < 4; ++c) {
    for (int b = 0; b < 2; ++b) {
      r[4 * b + c] = _mm512_maskz_shuffle_i32x4(0xffff, t[4 * b + c], t[4 * (b + 2) + c], 0x88);
      r[4 * (b + 2) + c] =
          _mm512_maskz_shuffle_i32x4(0xffff, t[4 * b + c], t[4 * (b + 2) + c], 0xdd);
    }
  }
}

}  // namespace vlm::kernels

// Horizontal sums of f32 vectors, for translation units compiled with AVX-512 (F, DQ) enabled;
// include it only from those.
#pragma once

#include <immintrin.h>

namespace vlm::kernels {

// The lanes' sum: halves added, then quarters, then pairs. (Spelled out: _mm512_reduce_add_ps
// trips GCC 12's -Wuninitialized; the all-lanes maskz forms compile to the plain instructions.)
inline float hsum(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_movehdup_ps(d)));
}

inline float hsum(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, v, 0),
                            _mm512_maskz_extractf32x8_ps(0xff, v, 1)));
}

}  // namespace vlm::kernels

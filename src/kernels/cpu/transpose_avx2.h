// In-register transpose of an 8 × 8 block of 32-bit elements, for translation units compiled
// with AVX2 enabled; include it only from those.
#pragma once

#include <immintrin.h>

namespace vlm::kernels {

// v[i] holds row i in, column i out.
inline void transpose8x8_epi32(__m256i v[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(_mm256_castsi256_ps(v[i]), _mm256_castsi256_ps(v[i + 1]));
    t[i + 1] = _mm256_unpackhi_ps(_mm256_castsi256_ps(v[i]), _mm256_castsi256_ps(v[i + 1]));
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
    v[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
  }
}

}  // namespace vlm::kernels

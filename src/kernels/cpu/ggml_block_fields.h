// Fields of GGUF blocks (layouts in kernels/cpu/ggml_blocks.h) read inside the block kernels. For
// translation units compiled with AVX2 and up (k4_scales uses vpsrlvd); in an unnamed namespace
// as f16_scale.h is, so each ISA level's unit compiles its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/f16_scale.h"

namespace vlm::kernels {
namespace {

// The f16 at p (a block's d or dmin), as f32.
inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_scale(h);
}

// Q4_K's and Q5_K's 6-bit scales sc[0..7] in bytes 0-7 and mins m[0..7] in bytes 8-15, from
// their 12 bytes at s12 (the bit layout io/gguf_quants' scale_min_k4 reads one at a time), in
// 128-bit lanes: of the dwords u0, u1, u2 read there, sc[0..3] = u0 & 63s, m[0..3] = u1 & 63s,
// sc[4..7] = (u2 & 15s) | (u0 >> 6 & 3s) << 4, m[4..7] = (u2 >> 4 & 15s) | (u1 >> 6 & 3s) << 4.
// Built in registers (bytes stored and reloaded as one vector would stall on store forwarding).
// Reads 16 bytes: the super-block goes on after its scales.
inline __m128i k4_scales(const uint8_t* s12) {
  const __m128i u = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s12));
  const __m128i low6 = _mm_and_si128(u, _mm_set1_epi8(0x3f));  // sc[0..3], m[0..3]
  const __m128i top2 = _mm_slli_epi32(_mm_and_si128(_mm_srli_epi32(u, 6), _mm_set1_epi8(3)), 4);
  const __m128i u22 = _mm_shuffle_epi32(u, 0x0a);  // u2, u2, ...
  const __m128i nib = _mm_and_si128(_mm_srlv_epi32(u22, _mm_set_epi32(0, 0, 4, 0)),
                                    _mm_set1_epi8(0x0f));  // u2 & 15s, u2 >> 4 & 15s
  const __m128i high = _mm_or_si128(nib, top2);            // sc[4..7], m[4..7]
  return _mm_unpacklo_epi32(low6, high);                   // sc[0..3], sc[4..7], m[0..3], m[4..7]
}

}  // namespace
}  // namespace vlm::kernels

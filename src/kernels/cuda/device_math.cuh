#pragma once
// Device-side helpers shared by the kernels of src/kernels/cuda: F32 / BF16 loads and stores
// through f32 (stores round to nearest even once), a launch over either activation type, and grid
// sizes.
#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/cuda/cuda_ops.h"

namespace vlm::cuda {

__device__ inline float load(const float* p, int64_t i) { return p[i]; }
__device__ inline float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

// Calls f with a value of the activation type: float or __nv_bfloat16.
template <typename F>
void with_act(DType t, F&& f) {
  if (t == DType::kF32) {
    f(float{});
  } else {
    f(__nv_bfloat16{});
  }
}

// Calls f with values of two activation types (float or __nv_bfloat16 each): mixed-type ops.
template <typename F>
void with_acts(DType t, DType u, F&& f) {
  with_act(t, [&](auto a) { with_act(u, [&](auto b) { f(a, b); }); });
}

// Blocks of `threads` for a grid-stride loop over count values (at least 1, at most `cap`).
inline unsigned grid_for(int64_t count, int threads, int64_t cap = 65535) {
  const int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned>(blocks < cap ? (blocks > 0 ? blocks : 1) : cap);
}

}  // namespace vlm::cuda

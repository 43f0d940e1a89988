// E4M3 quantization kernels (src/kernels/cuda/fp8.h).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/runtime.h"

namespace vlm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4M3Max = 448.f;

// *amax = max |x| (non-negative floats order as their bit patterns, so an integer max works).
template <typename T>
__global__ void amax_kernel(const T* x, int64_t count, float* amax) {
  __shared__ float part[kThreads / 32];
  float m = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(load(x, i)));
  }
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, part[w]);
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(m));
  }
}

__global__ void scale_kernel(const float* amax, float* scale) {
  *scale = *amax > 0.f ? *amax / kE4M3Max : 1.f;
}

template <typename T>
__global__ void to_fp8_kernel(const T* x, int64_t count, const float* scale,
                              __nv_fp8_storage_t* out) {
  const float inv = 1.f / *scale;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __nv_cvt_float_to_fp8(load(x, i) * inv, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

Status quantize_fp8(const void* x, DType x_t, int64_t count, float* amax, float* scale, void* out) {
  if (count <= 0) return ok_status();
  VLM_RETURN_IF_ERROR(
      cuda_status(cudaMemsetAsync(amax, 0, sizeof(float), launch_stream()), "fp8 amax reset"));
  const unsigned grid = grid_for(count, kThreads, 4096);
  auto* q = static_cast<__nv_fp8_storage_t*>(out);
  if (x_t == DType::kF32) {
    amax_kernel<<<grid, kThreads, 0, launch_stream()>>>(static_cast<const float*>(x), count, amax);
    scale_kernel<<<1, 1, 0, launch_stream()>>>(amax, scale);
    to_fp8_kernel<<<grid, kThreads, 0, launch_stream()>>>(static_cast<const float*>(x), count,
                                                          scale, q);
  } else {
    const auto* xb = static_cast<const __nv_bfloat16*>(x);
    amax_kernel<<<grid, kThreads, 0, launch_stream()>>>(xb, count, amax);
    scale_kernel<<<1, 1, 0, launch_stream()>>>(amax, scale);
    to_fp8_kernel<<<grid, kThreads, 0, launch_stream()>>>(xb, count, scale, q);
  }
  return cuda_status(cudaGetLastError(), "quantize_fp8 launch");
}

}  // namespace vlm::cuda

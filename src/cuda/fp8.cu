// E4M3 quantization kernels (src/cuda/fp8.h).
#include "cuda/fp8.h"

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string>

namespace vlm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kE4M3Max = 448.f;

Status from(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

cudaStream_t stream() { return static_cast<cudaStream_t>(current_stream()); }

__device__ inline float ld(const float* p, int64_t i) { return p[i]; }
__device__ inline float ld(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

unsigned grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// *amax = max |x| (non-negative floats order as their bit patterns, so an integer max works).
template <typename T>
__global__ void amax_kernel(const T* x, int64_t count, float* amax) {
  __shared__ float part[kThreads / 32];
  float m = 0.f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = fmaxf(m, fabsf(ld(x, i)));
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
    out[i] = __nv_cvt_float_to_fp8(ld(x, i) * inv, __NV_SATFINITE, __NV_E4M3);
  }
}

}  // namespace

Status quantize_fp8(const void* x, DType x_t, int64_t count, float* amax, float* scale, void* out) {
  if (count <= 0) return ok_status();
  VLM_RETURN_IF_ERROR(from(cudaMemsetAsync(amax, 0, sizeof(float), stream()), "fp8 amax reset"));
  const unsigned grid = grid_for(count);
  auto* q = static_cast<__nv_fp8_storage_t*>(out);
  if (x_t == DType::kF32) {
    amax_kernel<<<grid, kThreads, 0, stream()>>>(static_cast<const float*>(x), count, amax);
    scale_kernel<<<1, 1, 0, stream()>>>(amax, scale);
    to_fp8_kernel<<<grid, kThreads, 0, stream()>>>(static_cast<const float*>(x), count, scale, q);
  } else {
    const auto* xb = static_cast<const __nv_bfloat16*>(x);
    amax_kernel<<<grid, kThreads, 0, stream()>>>(xb, count, amax);
    scale_kernel<<<1, 1, 0, stream()>>>(amax, scale);
    to_fp8_kernel<<<grid, kThreads, 0, stream()>>>(xb, count, scale, q);
  }
  return from(cudaGetLastError(), "quantize_fp8 launch");
}

}  // namespace vlm::cuda

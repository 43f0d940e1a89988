// Weight-only INT8 products (src/kernels/cuda/int8_gemm.h).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/int8_gemm.h"
#include "kernels/cuda/runtime.h"

namespace vlm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// One warp per output column n: each lane takes runs of 16 INT8 weights (one 16-byte load) and
// the matching 16 values of every x row; the warp's sums are scaled once.
template <typename X, typename Y>
__global__ void int8_direct_kernel(const X* x, const int8_t* q, const float* scale, int M,
                                   int64_t N, int64_t K, Y* y) {
  const int64_t n = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (n >= N) return;
  const int lane = threadIdx.x & 31;
  float acc[kInt8DirectRows];
  for (int m = 0; m < kInt8DirectRows; ++m) acc[m] = 0.f;
  const int8_t* row = q + n * K;
  for (int64_t k = static_cast<int64_t>(lane) * 16; k < K; k += 32 * 16) {
    const int4 packed = *reinterpret_cast<const int4*>(row + k);
    const int8_t* w = reinterpret_cast<const int8_t*>(&packed);
#pragma unroll
    for (int m = 0; m < kInt8DirectRows; ++m) {  // unrolled: acc stays in registers
      if (m >= M) break;
      const X* xr = x + m * K + k;
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) s += static_cast<float>(w[j]) * load(xr, j);
      acc[m] += s;
    }
  }
#pragma unroll
  for (int m = 0; m < kInt8DirectRows; ++m) {
    if (m >= M) break;
    float v = acc[m];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) store(y, m * N + n, v * scale[n]);
  }
}

// w[r][k] = q[r][k] · scale[r] for rows [0, rows), rounded once to T.
template <typename T>
__global__ void dequant_kernel(const int8_t* q, const float* scale, int64_t rows, int64_t K, T* w) {
  const int64_t count = rows * K;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store(w, e, static_cast<float>(q[e]) * scale[e / K]);
  }
}

}  // namespace

Status int8_matmul_direct(const void* x, DType x_t, const int8_t* q, const float* scale, int64_t M,
                          int64_t N, int64_t K, void* y, DType y_t) {
  if (M < 1 || M > kInt8DirectRows || K % 16 != 0 || N < 1) {
    return invalid_argument("int8_matmul_direct: M must be 1.." + std::to_string(kInt8DirectRows) +
                            " and K a multiple of 16");
  }
  const unsigned blocks = static_cast<unsigned>((N + kWarps - 1) / kWarps);
  with_acts(x_t, y_t, [&](auto xa, auto ya) {
    using X = decltype(xa);
    using Y = decltype(ya);
    int8_direct_kernel<<<blocks, kThreads, 0, launch_stream()>>>(
        static_cast<const X*>(x), q, scale, static_cast<int>(M), N, K, static_cast<Y*>(y));
  });
  return cuda_status(cudaGetLastError(), "int8_matmul_direct launch");
}

Status int8_matmul(Gemm& gemm, const void* x, DType x_t, const int8_t* q, const float* scale,
                   int64_t M, int64_t N, int64_t K, void* y, DType y_t, void* scratch) {
  if (M == 0 || N == 0) return ok_status();
  if (M <= kInt8DirectRows && K % 16 == 0) {
    return int8_matmul_direct(x, x_t, q, scale, M, N, K, y, y_t);
  }
  if (K > kInt8ScratchElems) return invalid_argument("int8_matmul: K larger than the scratch");
  const int64_t block_rows = kInt8ScratchElems / K;
  const size_t y_elem = y_t == DType::kF32 ? 4 : 2;
  for (int64_t n0 = 0; n0 < N; n0 += block_rows) {
    const int64_t rows = N - n0 < block_rows ? N - n0 : block_rows;
    const int64_t count = rows * K;
    const unsigned grid =
        static_cast<unsigned>(count / kThreads + 1 < 65535 ? count / kThreads + 1 : 65535);
    with_act(x_t, [&](auto a) {
      using T = decltype(a);
      dequant_kernel<<<grid, kThreads, 0, launch_stream()>>>(q + n0 * K, scale + n0, rows, K,
                                                             static_cast<T*>(scratch));
    });
    VLM_RETURN_IF_ERROR(cuda_status(cudaGetLastError(), "int8 dequantize launch"));
    // Columns n0 .. n0 + rows of y: row stride N.
    VLM_RETURN_IF_ERROR(gemm.matmul(x, scratch, x_t, M, rows, K,
                                    static_cast<char*>(y) + n0 * static_cast<int64_t>(y_elem), y_t,
                                    N));
  }
  return ok_status();
}

}  // namespace vlm::cuda

#pragma once
// Weight-only INT8 products on the GPU: y[M, N] = x[M, K] · (q[N, K] · s[N])ᵀ with the
// CPU's INT8 layout (ops::quantize_int8: one f32 scale per output row), activations in F32 or
// BF16 and f32 sums. Decode-sized M reads the INT8 rows straight (half the bytes of BF16);
// larger M dequantizes row blocks of W into a scratch buffer for cuBLAS.
#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/gemm.h"
#include "vlm/status.h"

namespace vlm::cuda {

// Up to this many rows of x go through the direct INT8 kernel.
inline constexpr int64_t kInt8DirectRows = 8;
// Elements of the dequantization scratch Int8Gemm needs.
inline constexpr int64_t kInt8ScratchElems = int64_t{16} << 20;

// The direct kernel: one warp per output column, K a multiple of 16 and M ≤ kInt8DirectRows.
// y in y_t, rounded once from (Σ x·q) · s.
Status int8_matmul_direct(const void* x, DType x_t, const int8_t* q, const float* scale, int64_t M,
                          int64_t N, int64_t K, void* y, DType y_t);

// Either path: the direct kernel where it applies, else blocks of W dequantized into `scratch`
// (kInt8ScratchElems values of x_t) and multiplied by `gemm`.
Status int8_matmul(Gemm& gemm, const void* x, DType x_t, const int8_t* q, const float* scale,
                   int64_t M, int64_t N, int64_t K, void* y, DType y_t, void* scratch);

}  // namespace vlm::cuda

// CPU matmul kernels, one namespace per ISA level. Only src/ops/ calls these.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace vlm::kernels {

// y[m, n] (row stride ldy) = sum_k x[m, k] * w[n, k] for m in [0, M), n in [n0, n1).
// x: [M, K] f32 contiguous; w: [N, K] in wtype (F32, BF16, F16 or I8; I4 on the packed path
// only, i.e. from kPackedMinRows rows with scratch). scale: [N] f32 per-row scales when wtype is
// I8 (row n of w is w[n, :] · scale[n]); I4: [N, K / 32] group scales; else null.
// scratch: optional f32 buffer of scratch_rows * K floats (per calling thread) used to convert a
// block of weight rows once when M is large; may be null.
// From this many x rows on, matmul_rows uses a packed outer-product kernel; it then needs
// scratch_rows >= 32.
constexpr int64_t kPackedMinRows = 32;

// A right-hand side packed once and multiplied many times (attention's K and V, reused by every
// block of queries of a head): B [N, K] f32 as the packed GEMM's panels of 32 rows, K-major —
// packed[(n / 32) · 32 · K + k · 32 + n % 32] = B[n, k], zero for n >= N; prepacked_floats(N, K)
// floats.
//   pack_b_rows: B[n, k] = b[n · ldb + k] (B given as N rows, e.g. keys × head_dim);
//   pack_b_cols: B[n, k] = b[k · ldb + n] (Bᵀ given as K rows, e.g. V for P·V);
//   matmul_prepacked: y[m, n] (row stride ldy) = Σ_{k < K} x[m · ldx + k] · B[n, k] for m < M,
//     n < N, with B packed for packed_k >= K columns (so K may be a prefix: causal blocks) and
//     N <= the packed rows. On the calling thread; writes only y's N columns.
constexpr int64_t prepacked_floats(int64_t N, int64_t K) { return (N + 31) / 32 * 32 * K; }

namespace generic {
void matmul_rows(const float* x, int64_t M, int64_t K, DType wtype, const void* w,
                 const float* scale, int64_t n0, int64_t n1, float* y, int64_t ldy, float* scratch,
                 int64_t scratch_rows);
void pack_b_rows(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void pack_b_cols(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void matmul_prepacked(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed,
                      int64_t packed_k, int64_t N, float* y, int64_t ldy);
}  // namespace generic
namespace avx2 {
void matmul_rows(const float* x, int64_t M, int64_t K, DType wtype, const void* w,
                 const float* scale, int64_t n0, int64_t n1, float* y, int64_t ldy, float* scratch,
                 int64_t scratch_rows);
void pack_b_rows(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void pack_b_cols(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void matmul_prepacked(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed,
                      int64_t packed_k, int64_t N, float* y, int64_t ldy);
}  // namespace avx2
namespace avx512 {
void matmul_rows(const float* x, int64_t M, int64_t K, DType wtype, const void* w,
                 const float* scale, int64_t n0, int64_t n1, float* y, int64_t ldy, float* scratch,
                 int64_t scratch_rows);
void pack_b_rows(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void pack_b_cols(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void matmul_prepacked(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed,
                      int64_t packed_k, int64_t N, float* y, int64_t ldy);
}  // namespace avx512

// INT4 weights (DType::kI4), for few x rows (decode): y[m, n] (row stride ldy) =
// sum_k x[m, k] · q[n, k] · scale[n, k / 32] for m in [0, M), n in [n0, n1). x: [M, K] f32
// contiguous, K a multiple of kInt4Group; w: [N, K / 2] packed bytes (layout in core/tensor.h);
// scale: [N, K / 32] f32. Kernel body: matmul_q4_kernel.inc.
//
// dequantize_rows_q4_bf16: out[n - n0, k] = bf16(q[n, k] · scale[n, k / 32]) (the f32 product,
// rounded to nearest even) for n in [n0, n1); out: [n1 - n0, K]. The op layer feeds blocks of
// rows widened this way to matmul_rows (BF16) for 8 .. kPackedMinRows - 1 x rows; from
// kPackedMinRows on, matmul_rows widens I4 straight into its f32 panel.
namespace generic {
void matmul_rows_q4(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* scale,
                    int64_t n0, int64_t n1, float* y, int64_t ldy);
void dequantize_rows_q4_bf16(const uint8_t* w, const float* scale, int64_t K, int64_t n0,
                             int64_t n1, uint16_t* out);
}  // namespace generic
namespace avx2 {
void matmul_rows_q4(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* scale,
                    int64_t n0, int64_t n1, float* y, int64_t ldy);
void dequantize_rows_q4_bf16(const uint8_t* w, const float* scale, int64_t K, int64_t n0,
                             int64_t n1, uint16_t* out);
}  // namespace avx2
namespace avx512 {
void matmul_rows_q4(const float* x, int64_t M, int64_t K, const uint8_t* w, const float* scale,
                    int64_t n0, int64_t n1, float* y, int64_t ldy);
void dequantize_rows_q4_bf16(const uint8_t* w, const float* scale, int64_t K, int64_t n0,
                             int64_t n1, uint16_t* out);
}  // namespace avx512

}  // namespace vlm::kernels

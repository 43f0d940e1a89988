// GGUF's block types as linear weights, read as the file stores them (DType::kQ8_0, kQ4K, kQ5K,
// kQ6K; a weight [N, K] is N rows of K / block blocks, K a multiple of the block). Only src/ops/
// calls these.
//
// The blocks (ggml's, little-endian; "f16" an IEEE half):
//   Q8_0 (32 values, 34 bytes): f16 d, 32 int8 q; w = d · q.
//   Q4_K (256 values, 144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales sc[8] and mins m[8],
//     128 bytes of nibbles; sub-block j (values 32j ..) reads the low nibbles of bytes 32 (j / 2)
//     .. + 32 when j is even, the high ones when odd; w = (d · sc[j]) · q − (dmin · m[j]).
//   Q5_K (256 values, 176 bytes): as Q4_K with 32 bytes of fifth bits before the nibbles (bit j
//     of qh[l] is value 32j + l's bit 4).
//   Q6_K (256 values, 210 bytes): 128 bytes of low nibbles ql, 64 bytes of 2-bit highs qh, int8
//     sc[16], f16 d; in half h (128 values), value 32s + l (s 0-3) is the low (s < 2) or high
//     nibble of ql[64h + 32 (s % 2) + l] with bits 2s .. 2s + 1 of qh[32h + l] above it;
//     w = (d · sc[value / 16]) · (q − 32).
//
// The kernels take x quantized per row as the INT8-activation kernels do (Q8Rows in
// kernels/cpu/matmul.h: blocks of 32, scale xs[b], q in −127..127) and multiply the stored
// integers in int32, block by block, times the block's f32 scale as ggml computes it (d or
// d · sc), and take Q4_K's and Q5_K's mins off:
//   y[m, n] = Σ_b xs[b] · (wscale_b · Σ_{k in b} qx[k] · qw[k] − (dmin · m)_b · Σ_{k in b} qx[k])
// with qw the weights' integers: Q4_K / Q5_K as stored (0..15 / 0..31); Q6_K's q − 32 and Q8_0's
// signed q, which the kernels reach from unsigned bytes either in the integers (AVX-512: the dot
// products start from −32 or −128 times x's sums of 4; AVX2: Q8_0 as |q| times x with q's sign)
// or as one more product against x's scaled sums (AVX2's Q6_K: −32 · d · sc per 16 values; the
// 256-bit levels' byte-panel GEMM: Q6_K so, and AVX-VNNI's Q8_0 as q + 128 with −128 · d per
// block). What the weights' dequantized values give with x's quantized values, up to the order
// of f32 additions.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace vlm::kernels {

// x prepared for the block kernels from its Q8Rows (prepare_ggml_x): q [M, K] int8 as quantized;
// lane [M, K / 4] f32, the scale of x's block b repeated over the 8 four-value lanes of b
// (lane[m, k / 4] = xs[m, k / 32]); sum16 [M, K / 16], xs[b] · Σ q over each 16 values;
// sum32 [M, K / 32], xs[b] · Σ q over block b; off32 and off128 [M, K / 4] int32, −32 and −128
// times Σ q over each 4 values (where a dot product of offset weights starts).
struct GgmlRows {
  const int8_t* q;
  const float* lane;
  const float* sum16;
  const float* sum32;
  const int32_t* off32;
  const int32_t* off128;
};
// Floats of prepare_ggml_x's `out` per row of K (lane, sum16, sum32), and int32 of its `offs`
// (off32, off128).
constexpr int64_t ggml_x_floats(int64_t K) { return K / 4 + K / 16 + K / 32; }
constexpr int64_t ggml_x_offsets(int64_t K) { return K / 2; }
// The views of x's M rows laid out in `out` (M · ggml_x_floats(K) floats: all rows' lane, then
// sum16, then sum32) and `offs` (M · ggml_x_offsets(K) int32: off32, then off128; null for
// none: off32 and off128 then null).
GgmlRows ggml_x_views(const int8_t* q, int64_t M, int64_t K, float* out, int32_t* offs);
// Fills rows [m0, m1) of `out` and `offs` (laid out as ggml_x_views reads them; offs null: none)
// from x's quantized q and scale (kernels/cpu/matmul.h's Q8Rows fields); rows apart, so threads
// may fill disjoint slices. Baseline code.
void prepare_ggml_x(const int8_t* q, const float* scale, int64_t M, int64_t K, int64_t m0,
                    int64_t m1, float* out, int32_t* offs);

// out[(n − n0) · K + k] = w[n, k] in f32 for n in [n0, n1): the exact values (bit-identical to
// ggml's and the gguf package's dequantizers; io/gguf_quants). Baseline code.
void dequantize_rows_ggml(DType t, const void* w, int64_t K, int64_t n0, int64_t n1, float* out);

// y[m, n] (row stride ldy) for m < M, n in [n0, n1) as above; w [N, K] of type t. Any M (the
// weights are read once per group of up to 4 x rows; at the 256-bit levels from kPackedMinRows
// rows through a byte-panel GEMM instead); K a multiple of the block (Q8_0: 32,
// K-quants: 256). Every cache line of the weights is prefetched into L2 `prefetch` bytes ahead of
// its use (0: none; the decode candidates of ops.h choose among distances).
// NOTE(vlm): the default, 4 KiB: 2B decode went from 10.2 to 16.5 tok/s (Q4_K_M) and from 11.0 to
// 14.5-15.3 (Q6_K) against none on the Xeon of docs/benchmarks.md; 2 KiB measured 14.1-16.0,
// 8 KiB 14.2-14.7, 1 KiB 10.7-13.2.
inline constexpr int64_t kGgmlPrefetch = 4096;
namespace avx512vnni {
void matmul_rows_ggml(const GgmlRows& x, int64_t M, int64_t K, DType t, const void* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, int64_t prefetch);
}  // namespace avx512vnni
// The same on AVX2 (vpmaddubsw + vpmaddwd: pairs of byte products summed in int16, which the
// weights' ranges keep from saturating; Q8_0 multiplies |w| by x with w's sign), and built with
// AVX-VNNI (vpdpbusd on 256 bits; its byte-panel GEMM takes Q8_0 as q + 128). Both run a
// byte-panel GEMM from kPackedMinRows x rows.
namespace avx2 {
void matmul_rows_ggml(const GgmlRows& x, int64_t M, int64_t K, DType t, const void* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, int64_t prefetch);
}  // namespace avx2
namespace avxvnni {
void matmul_rows_ggml(const GgmlRows& x, int64_t M, int64_t K, DType t, const void* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, int64_t prefetch);
}  // namespace avxvnni

}  // namespace vlm::kernels

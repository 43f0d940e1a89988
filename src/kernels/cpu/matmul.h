// CPU matmul kernels, one namespace per ISA level. Only src/ops/ calls these.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace vlm::kernels {

// y[m, n] (row stride ldy) = sum_k x[m, k] * w[n, k] for m in [0, M), n in [n0, n1).
// x: [M, K] f32 contiguous; w: [N, K] in wtype (F32, BF16, F16 or I8; I4 on the packed path
// only, i.e. from kPackedMinRows rows with scratch). quant: I8 → const float [N] per-row scales
// (row n of w is w[n, :] · scale[n]); I4 → const Int4Params* (w[n, k] = q[n, k] · scale[n, g];
// the kernels here never read zero points: ops/matmul_cpu.cc adds their term); else null.
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
// Panels are packed_k · 32 floats apart and column k of a panel starts at k · 32, so
// `packed + k0 · 32` with the same packed_k is B's columns from k0 on, and a matrix stacked from
// two along K can be packed one 32-row panel at a time (pack_b_* with N ≤ 32 at panel p's
// column offset).
constexpr int64_t kPrepackedPanel = 32;
constexpr int64_t prepacked_floats(int64_t N, int64_t K) {
  return (N + kPrepackedPanel - 1) / kPrepackedPanel * kPrepackedPanel * K;
}

// matmul_row_l2 (avx2, avx512; a decode candidate): matmul_rows' one-row kernel for BF16 and I8
// weights (other types: nothing written), its prefetches of the next rows into L2 instead of L1.
// Weight rows of 1 to 4 KiB read 8 at a time are too short for the hardware prefetchers;
// prefetched into L1, the lines in flight are capped by L1's miss buffers, and one Zen 4 core
// streamed INT4 rows at half the rate it reached with them prefetched into L2.
namespace generic {
void matmul_rows(const float* x, int64_t M, int64_t K, DType wtype, const void* w,
                 const void* quant, int64_t n0, int64_t n1, float* y, int64_t ldy, float* scratch,
                 int64_t scratch_rows);
void pack_b_rows(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void pack_b_cols(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void matmul_prepacked(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed,
                      int64_t packed_k, int64_t N, float* y, int64_t ldy);
}  // namespace generic
namespace avx2 {
void matmul_rows(const float* x, int64_t M, int64_t K, DType wtype, const void* w,
                 const void* quant, int64_t n0, int64_t n1, float* y, int64_t ldy, float* scratch,
                 int64_t scratch_rows);
void matmul_row_l2(const float* x, int64_t K, DType wtype, const void* w, const void* quant,
                   int64_t n0, int64_t n1, float* y);
void pack_b_rows(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void pack_b_cols(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void matmul_prepacked(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed,
                      int64_t packed_k, int64_t N, float* y, int64_t ldy);
}  // namespace avx2
namespace avx512 {
void matmul_rows(const float* x, int64_t M, int64_t K, DType wtype, const void* w,
                 const void* quant, int64_t n0, int64_t n1, float* y, int64_t ldy, float* scratch,
                 int64_t scratch_rows);
void matmul_row_l2(const float* x, int64_t K, DType wtype, const void* w, const void* quant,
                   int64_t n0, int64_t n1, float* y);
void pack_b_rows(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void pack_b_cols(const float* b, int64_t ldb, int64_t N, int64_t K, float* packed);
void matmul_prepacked(const float* x, int64_t ldx, int64_t M, int64_t K, const float* packed,
                      int64_t packed_k, int64_t N, float* y, int64_t ldy);
}  // namespace avx512

// BF16 dot products (AVX512_BF16, `vdpbf16ps`: two BF16 products per f32 lane): x rounded to
// BF16 once per call, the BF16 weights as stored, f32 sums. A candidate of the BF16 GEMM (see
// ops::Bf16Gemm), where the CPU has the instruction.
namespace avx512bf16 {
bool available();
// One x row (decode; a candidate of the BF16 decode family): y[n] = Σ_k xb[k] · w[n, k] for n in
// [n0, n1), xb from convert_rows_bf16, w BF16 rows as stored, K a multiple of 32.
void matmul_row_bf16_dot(const uint16_t* xb, int64_t K, const uint16_t* w, int64_t n0, int64_t n1,
                         float* y);
// xb [M, K] BF16 (round to nearest even) from x [M, K] f32; K a multiple of 32.
void convert_rows_bf16(const float* x, int64_t M, int64_t K, uint16_t* xb);
// Weight rows [n, n + 16 · blocks) (blocks 1 or 2) of w BF16 [N, K] in pairs of K: the 32-bit
// word holding (w[n + j, k], w[n + j, k + 1]) goes to word (k / 2) · 16 · blocks + j of out, as
// `vdpbf16ps` and AMX's B tiles read them. K a multiple of 32.
void pack_pairs(const uint16_t* w, int64_t K, int64_t n, int blocks, uint32_t* out);
// Bytes of the per-thread scratch matmul_rows_bf16 needs (32 weight rows packed in pairs of K; the
// same for amx::matmul_rows_bf16).
constexpr int64_t scratch_bytes(int64_t K) { return K * 32 * 2; }
// y[m, n] (row stride ldy) = Σ_k xb[m, k] · w[n, k] for m < M, n in [n0, n1): w BF16 [N, K]
// rows as stored, K a multiple of 32, n1 − n0 a multiple of 16. On the calling thread.
void matmul_rows_bf16(const uint16_t* xb, int64_t M, int64_t K, const uint16_t* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, void* scratch);
}  // namespace avx512bf16

// AMX BF16 tiles (Sapphire Rapids and later with amx_bf16): x rounded to BF16 once per call,
// BF16 weights as stored, f32 sums in the tile accumulators. A candidate of the BF16 GEMM (see
// ops::Bf16Gemm): rounding x to BF16 moves each product by up to 2^-8 of itself where the f32
// path is exact.
namespace amx {
// Whether this CPU has AMX-BF16 (and AVX512_BF16) and the OS lets this process use the tile
// state (asked once; Linux needs arch_prctl(ARCH_REQ_XCOMP_PERM) before the first tile
// instruction).
bool available();
// y[m, n] (row stride ldy) = Σ_k xb[m, k] · w[n, k] for m < M, n in [n0, n1): w BF16 [N, K]
// rows as stored, K a multiple of 32, n1 − n0 a multiple of 16; xb from
// avx512bf16::convert_rows_bf16, padded by the caller to round_up(M, 16) rows of zeros; scratch
// avx512bf16::scratch_bytes(K). On the calling thread.
void matmul_rows_bf16(const uint16_t* xb, int64_t M, int64_t K, const uint16_t* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, void* scratch);
}  // namespace amx

// BF16 decode without widening (decode_kernel.inc, a candidate of the BF16 decode family): one x
// row, exact products. prepare_x_evenodd lays x out in runs of 16 values on avx2, 32 on avx512 (K
// a multiple of 32): the run's even-indexed values, then its odd-indexed ones.
// matmul_row_bf16_evenodd: y[n] = Σ_k x[k] · w[n, k] for n in [n0, n1), w BF16 [N, K] as stored.
namespace avx2 {
void prepare_x_evenodd(const float* x, int64_t K, float* out);
void matmul_row_bf16_evenodd(const float* xeo, int64_t K, const uint16_t* w, int64_t n0, int64_t n1,
                             float* y);
}  // namespace avx2
namespace avx512 {
void prepare_x_evenodd(const float* x, int64_t K, float* out);
void matmul_row_bf16_evenodd(const float* xeo, int64_t K, const uint16_t* w, int64_t n0, int64_t n1,
                             float* y);
}  // namespace avx512

// INT4 weights (DType::kI4), for few x rows (decode): y[m, n] (row stride ldy) =
// sum_k x[m, k] · q[n, k] · scale[n, k / G] for m in [0, M), n in [n0, n1). x: [M, K] f32
// contiguous, K a multiple of G = p.group (32, 64 or 128); w: [N, K / 2] packed bytes (layout in
// core/tensor.h); p.scale: [N, K / G] f16; p.zero is not read (see matmul_rows). Kernel body:
// matmul_q4_kernel.inc.
//
// dequantize_rows_q4_bf16: out[n - n0, k] = bf16(q[n, k] · scale[n, k / G]) (the f32 product,
// rounded to nearest even) for n in [n0, n1); out: [n1 - n0, K]. The op layer feeds blocks of
// rows widened this way to matmul_rows (BF16) for 8 .. kPackedMinRows - 1 x rows; from
// kPackedMinRows on, matmul_rows widens I4 straight into its f32 panel.
// log2(G / 32) for an I4 group size G: block b of a row (values 32b .. 32b + 32) takes scale
// b >> int4_group_shift(G) of the row.
// (Callers have checked the group: check_linear_weight / quantize_int4.)
constexpr int int4_group_shift(int64_t group) { return group == 32 ? 0 : group == 64 ? 1 : 2; }
// scales[b · panel + j] = the f32 value of the f16 scale of block k0 / 32 + b of weight row nb + j,
// for b < kc / 32 and j < cols; 0 for cols <= j < panel. (For the INT8-activation GEMMs' panels:
// the weights' group scales, one per 32-value x block.) Baseline code: any ISA level calls it.
void int4_panel_scales(const Int4Params& p, int64_t K, int64_t nb, int64_t cols, int64_t k0,
                       int64_t kc, int64_t panel, float* scales);
namespace generic {
void matmul_rows_q4(const float* x, int64_t M, int64_t K, const uint8_t* w, const Int4Params& p,
                    int64_t n0, int64_t n1, float* y, int64_t ldy);
void dequantize_rows_q4_bf16(const uint8_t* w, const Int4Params& p, int64_t K, int64_t n0,
                             int64_t n1, uint16_t* out);
}  // namespace generic
namespace avx512 {
void matmul_rows_q4(const float* x, int64_t M, int64_t K, const uint8_t* w, const Int4Params& p,
                    int64_t n0, int64_t n1, float* y, int64_t ldy);
void dequantize_rows_q4_bf16(const uint8_t* w, const Int4Params& p, int64_t K, int64_t n0,
                             int64_t n1, uint16_t* out);
}  // namespace avx512

// INT8 activations for INT8 / INT4 weights (the AVX-512 VNNI level: vpdpbusd multiplies 64 byte
// pairs per instruction, 4× the multiply-adds of an f32 FMA). x is quantized per row in blocks
// of kQ8Block values, as llama.cpp's Q8_0:
//   scale[m, b] = amax / 127 (amax = max |x[m, 32b .. 32b + 32)|), q[m, k] = round_half_even(
//   x[m, k] · (127 / amax)) in −127..127, sum[m, b] = Σ q over the block;
// a block whose amax is below kQ8MinAmax (or zero, or NaN) gets scale 0 and q 0.
// Then y[m, n] = Σ_b scale[m, b] · Σ_{k in b} q[m, k] · wq[n, k] · wscale, with the block's dot
// product exact in int32 and wscale = scale[n] (I8) or scale[n, 32b / G] (I4: kQ8Block =
// kInt4Block, so an activation block is one packed block of weights, inside one group). The weights
// go into the VNNI unsigned operand offset by their zero point (I8: q + 128, I4: q + 8); the
// block's Σ q of x takes the offset back out.
constexpr int64_t kQ8Block = 32;
// Smaller blocks would overflow 127 / amax (past FLT_MAX below ~3.7e-37) and quantize to −128.
constexpr float kQ8MinAmax = 1e-36f;
static_assert(kQ8Block == kInt4Block, "an activation block is one packed INT4 block");
// x quantized as above: q [M, K] (row stride K), scale and sum [M, K / kQ8Block]; below
// kPackedMinRows rows also `decode`, the same x as prepare_decode_x lays it out for the INT4
// decode kernel (null otherwise); for the AVX2 INT8-weight GEMM also q16, q widened to int16
// (null otherwise).
struct Q8Rows {
  const int8_t* q;
  const float* scale;
  const int32_t* sum;
  const uint8_t* decode = nullptr;
  const int16_t* q16 = nullptr;
  const int32_t* sum16 = nullptr;  // [M, K / 16]: Σ q over each 16 values (for Q6_K weights)
};
// Bytes of x as the INT4 decode kernel lays it out (M rows of K, in 256-byte chunks of 128).
constexpr int64_t q8_decode_x_bytes(int64_t M, int64_t K) { return M * ((K + 127) / 128) * 256; }
// Per-thread scratch bytes matmul_rows_q8 needs for a row length K (the GEMM's panel: the VNNI
// kernel's bytes for up to 1024 values of K with its block scales and mins, or the AVX2
// INT8-weight kernel's int16 for up to 256, whichever is larger).
constexpr int64_t q8_scratch_bytes(int64_t K) {
  const int64_t kc = K < 1024 ? K : 1024;  // the VNNI GEMM's K block
  const int64_t kc16 = K < 256 ? K : 256;  // the AVX2 INT8-weight GEMM's
  const int64_t bytes = 32 * kc + 2 * 32 * (kc / kQ8Block) * 4, bytes16 = 64 * kc16 + 32 * 4;
  return (bytes > bytes16 ? bytes : bytes16) + 64;
}
// How the VNNI level's INT4 decode kernel (few x rows, over Q8Rows::decode) streams the weights,
// a decode candidate (ops/autotune.h): weight rows per step with up to 2 x rows (8 or 4; 4 from 3
// x rows on), 512- or 256-bit vectors, the prefetch distance in groups of rows (1: the next
// group's rows, 2: the group after it) and the level of cache prefetched into. The sums are the
// same up to the order of f32 additions.
struct Int4DecodeShape {
  int rows = 8;
  bool ymm = false;
  int prefetch = 1;  // 1 or 2
  int locality = 3;  // the prefetches' (__builtin_prefetch): 3 into L1, 2 or 1 into L2 (see
                     // matmul_row_l2); with prefetch 2 always 2
};
namespace avx512vnni {
// x: [M, K] f32 contiguous, K a multiple of kQ8Block; q / scale / sum as Q8Rows.
void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* sum);
// out: q8_decode_x_bytes(M, K) bytes, x (q, scale, sum of M rows) in the INT4 decode kernel's
// layout; once per matmul call, shared by every thread and weight.
void prepare_decode_x(const Q8Rows& x, int64_t M, int64_t K, uint8_t* out);
// y[m, n] (row stride ldy) for m < M, n in [n0, n1) as above; wtype kI8 or kI4 (w, quant as
// for matmul_rows), or the GGUF block types kQ8_0, kQ4K, kQ5K, kQ6K (quant null; layouts in
// kernels/cpu/ggml_blocks.h: their blocks' d and d · sc are the group scales, Q4_K's and
// Q5_K's dmin · m take min · x scale · Σ q_x off each block, Q6_K needs x.sum16); scratch:
// q8_scratch_bytes(K) bytes on the calling thread. I8 and the block types take any M (the
// byte-panel GEMM); I4 too (below kPackedMinRows it streams the packed rows instead, over
// x.decode).
void matmul_rows_q8(const Q8Rows& x, int64_t M, int64_t K, DType wtype, const void* w,
                    const void* quant, int64_t n0, int64_t n1, float* y, int64_t ldy,
                    void* scratch);
// The INT4 decode kernel shaped as s (matmul_rows_q8 runs it with Int4DecodeShape{} below
// kPackedMinRows rows): y and the weights as for matmul_rows_q8; M < kPackedMinRows, x.decode
// set.
void matmul_rows_q4_decode(const Int4DecodeShape& s, const Q8Rows& x, int64_t M, int64_t K,
                           const uint8_t* w, const Int4Params& p, int64_t n0, int64_t n1, float* y,
                           int64_t ldy);
// INT8 weights × one row of INT8 x (a decode candidate; by default one x row stays f32): y[n] =
// scale[n] · Σ_b x.scale[b] · Σ_{k in b} x.q[k] · w[n, k] for n in [n0, n1), the block sums exact
// in int32. K a multiple of kQ8Block.
void matmul_row_i8_decode(const Q8Rows& x, int64_t K, const int8_t* w, const float* scale,
                          int64_t n0, int64_t n1, float* y);
}  // namespace avx512vnni

// The same INT8 activations on AVX2 (matmul_q8_avx2_kernel.inc): INT4 weights through
// vpmaddubsw + vpmaddwd at any M, INT8 weights through vpmaddwd on int16 at any M (x.q16 set).
// quantize_rows_q8 as above (the same bytes); prepare_decode_x lays x out for this level's decode
// kernel (at most q8_decode_x_bytes(M, K) bytes); matmul_rows_q8 needs q8_scratch_bytes(K) of
// scratch for INT8 weights, and for INT4 from kPackedMinRows rows.
namespace avx2 {
void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* sum);
void prepare_decode_x(const Q8Rows& x, int64_t M, int64_t K, uint8_t* out);
void matmul_rows_q8(const Q8Rows& x, int64_t M, int64_t K, DType wtype, const void* w,
                    const void* quant, int64_t n0, int64_t n1, float* y, int64_t ldy,
                    void* scratch);
}  // namespace avx2
// The same built with AVX-VNNI: the INT4 kernels' byte products through the VEX vpdpbusd and
// the INT8 GEMM's int16 products through vpdpwssd (int32 sums in one instruction).
namespace avxvnni {
void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* sum);
void prepare_decode_x(const Q8Rows& x, int64_t M, int64_t K, uint8_t* out);
void matmul_rows_q8(const Q8Rows& x, int64_t M, int64_t K, DType wtype, const void* w,
                    const void* quant, int64_t n0, int64_t n1, float* y, int64_t ldy,
                    void* scratch);
}  // namespace avxvnni

// FP16 arithmetic for F32 / BF16 / F16 weights (AVX-512 FP16; opt-in through ops::matmul_f16): x
// and the weights are rounded to FP16, each run of kF16Run consecutive products of a dot product
// is summed in FP16 (vfmadd231ph: twice the multiply-adds of an f32 FMA), and the runs' sums are
// added in f32. BF16 weights convert exactly (8 significant bits; FP16 has 11) unless below
// FP16's normal range (|w| < 6.1e-5, kept to 2^-24) or above 65504.
constexpr int64_t kF16Run = 32;
// Per-thread scratch bytes matmul_rows_f16 needs for a row length K.
constexpr int64_t f16_scratch_bytes(int64_t K) { return 32 * (K < 512 ? K : 512) * 2 + 64; }
namespace avx512fp16 {
// Row stride of convert_rows_f16's output: rows K values (4 bytes each) apart would put the rows
// a tile broadcasts from into one L1 set when K · 4 is a multiple of 4 KiB.
constexpr int64_t f16_x_stride(int64_t K) { return K + 16; }
// out[m · f16_x_stride(K) + k] = the FP16 bits of x[m, k] (round to nearest even), twice (low and
// high 16 bits), for m < M, k < K.
void convert_rows_f16(const float* x, int64_t M, int64_t K, uint32_t* out);
// y[m, n] (row stride ldy) = Σ_k x[m, k] · w[n, k] as above, for m < M, n in [n0, n1). xh: M
// rows as convert_rows_f16 writes them; w: [N, K] F32, BF16 or F16 (wtype); K a multiple of
// kF16Run; scratch: f16_scratch_bytes(K) bytes on the calling thread.
void matmul_rows_f16(const uint32_t* xh, int64_t M, int64_t K, DType wtype, const void* w,
                     int64_t n0, int64_t n1, float* y, int64_t ldy, void* scratch);
}  // namespace avx512fp16

}  // namespace vlm::kernels

// The CPU op API: what CpuBackend (cpu_backend.h) runs the model with, and what the quantizer and
// the sampler's logprobs call. Every op has a scalar reference in ops/ref/ (the test oracle);
// dispatch to per-ISA kernels happens here in ops/ only (matmul_cpu.cc, ops_cpu.cc; the ISA
// level: isa.cc).
//
// Activations are f32, row-major, contiguous. Weights are TensorViews in their stored dtype.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "core/thread_pool.h"
#include "ops/backend.h"
#include "vlm/status.h"

namespace vlm::kernels {
struct Int4DecodeShape;  // kernels/cpu/matmul.h
struct HybridKernels;    // kernels/cpu/hybrid.h
}  // namespace vlm::kernels

namespace vlm::ops {

// kAvx512Vnni runs the kAvx512 kernels, except that matmuls with I8 weights (prefill) and I4
// weights (prefill and decode) quantize x to INT8 and use vpdpbusd; kAvx2 does so for I4 weights
// (vpmaddubsw) and I8 prefill (vpmaddwd); kAvx2Vnni (AVX2 with AVX-VNNI, the VEX vpdpbusd of
// Alder Lake and later) runs the kAvx2 kernels with vpdpbusd for the INT4 ones
// (matmul_quantizes_x). The levels are ordered, but a CPU need not have every level below its
// best (AVX-512 CPUs before Sapphire Rapids have no AVX-VNNI): runnable_isas says which.
enum class Isa { kGeneric, kAvx2, kAvx2Vnni, kAvx512, kAvx512Vnni };

const char* isa_name(Isa isa);
// Best ISA level this CPU supports, capped by the VLM_CPU_ISA environment variable
// (generic | avx2 | avx2vnni | avx512 | avx512vnni: the best level at or below it that the CPU
// runs), read once.
Isa detected_isa();
// All ISA levels this CPU can run (for tests and the cap), lowest first.
std::vector<Isa> runnable_isas();

// Checks that w is a 2-D F32/BF16/F16 matrix, or I8 with per-row scales, or I4 with group
// scales, a group size of 32, 64 or 128 and a row length that is a multiple of it, with
// `in_features` columns.
Status check_linear_weight(const TensorView& w, int64_t in_features);

// How the GEMMs of BF16 weights from kernels::kPackedMinRows x rows (prefill, the vision tower)
// multiply: widening the weights to f32 (the default: x stays exact), or with x rounded to BF16
// once per call and f32 sums, by AVX512_BF16 dot products (kDotBf16) or AMX BF16 tiles (kAmx),
// where the CPU has them (bf16_gemm_available).
enum class Bf16Gemm { kWidenF32, kDotBf16, kAmx };

// The decode kernels (one x row, K a multiple of 32), one family per weight type, chosen by
// measurement at load (autotune.h). Candidate 0 of each family is the default, what runs when
// nothing was measured; the others compute the same product a different way (kernels/cpu/matmul.h):
//   bf16_decode: widen (the weights widened to f32; every level), widen_l2 (the same, the next rows
//     prefetched into L2 rather than L1; avx2 and up), evenodd_l2 (a 32-bit word's two BF16 as f32
//     by a shift and an and; avx2 and up), dpbf16_l2 (x rounded to BF16, AVX512_BF16 dot products:
//     not exact);
//   int8_decode: f32 (x stays f32), f32_l2 (avx2 and up), q8_l2 (x as INT8 blocks, vpdpbusd;
//     avx512vnni; not exact);
//   int4_decode: r8 (the level's own kernel), and on avx512vnni r8_l2, r8_l2t2, r8_l2d2, r4_l2,
//     ymm8_l2 (kernels::Int4DecodeShape: rows per step, prefetch level and distance, vector
//     width);
//   ggml_decode (GGUF Q8_0 and K-quant blocks, kernels/cpu/ggml_blocks.h; avx2 and up): pf4k,
//     pf2k, pf8k, pf1k, nopf (every line of the weights prefetched into L2 that many bytes ahead,
//     or not at all).
enum class DecodeFamily { kBf16, kInt8, kInt4, kGgml };
inline constexpr DecodeFamily kDecodeFamilies[] = {DecodeFamily::kBf16, DecodeFamily::kInt8,
                                                   DecodeFamily::kInt4, DecodeFamily::kGgml};
struct DecodeKernels {
  int index[std::size(kDecodeFamilies)] = {};  // candidate indexes by family; 0: the default
  int& of(DecodeFamily f) { return index[static_cast<int>(f)]; }
  int of(DecodeFamily f) const { return index[static_cast<int>(f)]; }
};
struct DecodeCandidate {
  const char* name;
  bool exact;  // the default's arithmetic (only the order of f32 sums may differ)
};
// "bf16_decode", "int8_decode", "int4_decode", "ggml_decode"
const char* decode_family_name(DecodeFamily f);
// Whether the family's kernels take weights of type t: kBF16, kI8, kI4, the GGUF block types.
bool decode_family_takes(DecodeFamily f, DType t);
std::span<const DecodeCandidate> decode_candidates(DecodeFamily f);
// Whether candidate `index` of the family runs at this level on this CPU (the default always).
bool decode_candidate_runs(DecodeFamily f, int index, Isa isa);
// The kernel shape of int4_decode candidate `index` on avx512vnni (for the tests, which call that
// kernel directly).
const kernels::Int4DecodeShape& int4_decode_shape(int index);

// y[M, N] = x[M, K] · w[N, K]^T. w dtype F32, BF16, F16, I8 with w.scale set (row n of w is
// w[n, :] · scale[n]), or I4 with w.int4 set (w[n, k] = (q[n, k] − zero[n, g]) · scale[n, g],
// g = k / group; from 8 x rows on, blocks of 32 I4 rows are widened to BF16 and run by the BF16
// kernel). The kernels multiply q · scale; zero points enter once, as −Σ_g zero · scale · Σ_{k in
// g} x[m, k] per output (matmul_cpu.cc). Threads split N.
void matmul(const float* x, int64_t M, int64_t K, const TensorView& w, float* y, ThreadPool& pool,
            Isa isa = detected_isa());

// ys[i][M, N_i] = x[M, K] · ws[i][N_i, K]^T for every i (by `gemm` where bf16_gemm_runs): one
// pass of the threads over the stacked
// rows of all the weights (q/k/v, gate/up), so a decode step streams them as one matrix, with one
// fork/join instead of one per weight. Each ws[i] as for matmul; ys[i] has row stride ldy, or
// N_i when ldy is 0 (ys[i] = y + Σ_{j<i} N_j with ldy = Σ N_j: the outputs side by side).
// `decode` picks the decode kernels (above) where they apply.
void matmul_multi(const float* x, int64_t M, int64_t K, std::span<const TensorView* const> ws,
                  std::span<float* const> ys, ThreadPool& pool, Isa isa = detected_isa(),
                  int64_t ldy = 0, Bf16Gemm gemm = Bf16Gemm::kWidenF32,
                  const DecodeKernels& decode = {});

const char* bf16_gemm_name(Bf16Gemm g);  // "f32", "dpbf16", "amx"
// Whether this CPU (and OS, for AMX's tile state) runs the candidate; kWidenF32 everywhere.
bool bf16_gemm_available(Bf16Gemm g);
bool amx_available();
// Forced choices, "family=choice,...": bf16_gemm=f32|dpbf16|amx, and per decode family one of
// its candidates' names or `default` (candidate 0), e.g.
// "bf16_decode=evenodd_l2,int4_decode=r8_l2". A family the text does not name stays unset. An error
// names an unknown family or choice, or one this CPU cannot run (decode candidates: at level
// `isa`).
struct ForcedKernels {
  std::optional<Bf16Gemm> bf16_gemm;
  std::optional<int> decode[std::size(kDecodeFamilies)];  // by DecodeFamily
};
Result<ForcedKernels> parse_cpu_kernels(std::string_view text, Isa isa = detected_isa());
// The same for the VLM_CPU_KERNELS environment variable, read once.
Result<ForcedKernels> cpu_kernels_from_env();
// Whether candidate g takes this product: kWidenF32 always; the others BF16 weights with rows a
// multiple of 16, K a multiple of 32, from kernels::kPackedMinRows x rows, where available.
bool bf16_gemm_runs(Bf16Gemm g, int64_t M, int64_t K, std::span<const TensorView* const> ws);
// matmul_multi by candidate g (kDotBf16 or kAmx, where bf16_gemm_runs).
void matmul_multi_bf16(Bf16Gemm g, const float* x, int64_t M, int64_t K,
                       std::span<const TensorView* const> ws, std::span<float* const> ys,
                       ThreadPool& pool, int64_t ldy = 0);

// Whether this level can run FP16 arithmetic (kernels/cpu/matmul.h): a CPU with AVX-512 FP16, at
// level kAvx512 or above.
bool has_fp16_arithmetic(Isa isa);
// Whether matmul_f16 runs FP16 arithmetic for these shapes: where has_fp16_arithmetic, for F32 /
// BF16 / F16 weights, from kPackedMinRows x rows, with K a multiple of 32.
bool matmul_runs_f16(Isa isa, int64_t M, int64_t K, DType wtype);
// matmul with FP16 arithmetic where matmul_runs_f16 says so, else exactly matmul. Opt-in (the
// vision encoder's --vision-fp16): x, the weights and each run of 32 products are rounded to
// FP16.
void matmul_f16(const float* x, int64_t M, int64_t K, const TensorView& w, float* y,
                ThreadPool& pool, Isa isa = detected_isa());

// Whether matmul at this level quantizes x (Q8_0-like blocks of 32 per row, then INT8 dot
// products; see kernels/cpu/matmul.h) for a weight of dtype wtype, with K a multiple of 32: I4
// weights at any M (decode too) on kAvx512Vnni, kAvx2 and kAvx2Vnni; I8 weights from
// int8_activation_min_rows(isa) x rows (batched decode, prefill) on those levels. Elsewhere x
// stays f32.
bool matmul_quantizes_x(Isa isa, int64_t M, int64_t K, DType wtype);
// GGUF block weights (DType::kQ8_0, kQ4K, kQ5K, kQ6K; kernels/cpu/ggml_blocks.h): below this
// many x rows, on the levels with a block kernel (avx2 and up), x is quantized to INT8 and the
// blocks are multiplied as stored by that kernel (at the 256-bit levels, avx2, avx2vnni and
// avx512 without VNNI, at every M: from kernels::kPackedMinRows rows it runs a byte-panel GEMM
// of its own); from it on avx512vnni takes them into its INT8-activation byte-panel GEMM (x
// quantized as below). At the generic level blocks of 32 rows are dequantized exactly to f32
// and multiplied by the f32 kernel.
int64_t ggml_native_max_rows(Isa isa);
// Whether matmul quantizes x per 32 values for a GGUF block weight of type t (either way above:
// at every M on the levels with a block kernel).
bool ggml_quantizes_x(Isa isa, DType t);
// The least x rows from which I8 weights take INT8 activations at this level (0: never). One x
// row (decode) keeps f32 x: the step streams the weights and is memory-bound either way.
int64_t int8_activation_min_rows(Isa isa);

// Weight-only INT8, symmetric, one scale per output row (channel) of an nn.Linear weight:
//   scale[n] = max_k |w[n, k]| / 127,  q[n, k] = clamp(round_half_even(w[n, k] / scale[n]), ±127)
// (all f32 arithmetic), so |w[n, k] - q[n, k] · scale[n]| <= scale[n] / 2. A row of zeros (or of
// values too small for a normal scale) gets scale 0 and q 0. w: [N, K] F32/BF16/F16; q: [N, K];
// scale: [N]. Fails on a non-finite weight or another dtype. Threads split N.
Status quantize_int8(const TensorView& w, int8_t* q, float* scale, ThreadPool& pool);

// Weight-only INT4, symmetric (no zero point), one f16 scale per group of `group` (32, 64 or 128)
// consecutive inputs of a row: for group g of row n, scale[n, g] is the candidate among
//   max|w| / 7,  −w_max / 8,  −w_max / 8.5   (w_max: the group's largest-|w| weight, signed),
// each rounded to f16, whose q[n, k] = clamp(round_half_even(w[n, k] / scale[n, g]), −8, 7) has
// the smallest Σ_k (w − q·scale)² (f32; see the NOTE in quantize.cc), so |w − q·scale| <=
// |scale| / 2 for every w with w / scale in [−8.5, 7.5] (the others are clamped). A scale may be
// negative; a group of zeros (or of values too small for a nonzero f16 scale) gets scale 0 and
// q 0. w: [N, K] F32/BF16/F16 with K a multiple of group; q: [N, K / 2] bytes packed as
// TensorView documents for kI4; scale: [N, K / group] f16 bits (Int4Params). Fails on a
// non-finite weight, a scale beyond f16's range, another dtype, group or K. Threads split N.
Status quantize_int4(const TensorView& w, int64_t group, uint8_t* q, uint16_t* scale,
                     ThreadPool& pool);

// y[r, :] += bias for every row r. y: [rows, n].
void add_bias(float* y, const float* bias, int64_t rows, int64_t n);

// out[i, :] = table[ids[i], :] converted to f32. table: [vocab, n] F32/BF16/F16.
void embedding_lookup(const TensorView& table, const int32_t* ids, int64_t count, float* out);

// ---- Small ops: norms, activations, rotary ----
// Per-ISA vector kernels (kernels/cpu/eltwise_kernel.inc), each tested against its scalar loop in
// ops/ref/. Rows (or, for the element-wise ops, runs of elements) are split over the pool's
// threads once there is enough work; a decode step's single row runs on the calling thread.
// Accuracy against std::exp / std::tanh / std::erf: tests/unit/ops_test.cc (Eltwise*).

// Per row: y = x / sqrt(mean(x²) + eps) * w.  x, y: [rows, n] (may alias); w: [n] f32.
void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y,
              ThreadPool& pool, Isa isa = detected_isa());
// The residual add fused into the norm after it: per row, x += delta, then y = rms_norm(x).
// x: [rows, n] updated in place; delta, y: [rows, n].
void add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t n, float eps,
                  float* y, ThreadPool& pool, Isa isa = detected_isa());

// Per row: y = (x - mean) / sqrt(var + eps) * w + b (nn.LayerNorm). x, y: [rows, n] (may alias).
void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t n, float eps,
                float* y, ThreadPool& pool, Isa isa = detected_isa());
// Per row: x += delta + delta_bias (delta_bias [n] may be null), then y = layer_norm(x).
void add_layer_norm(float* x, const float* delta, const float* delta_bias, const float* w,
                    const float* b, int64_t rows, int64_t n, float eps, float* y, ThreadPool& pool,
                    Isa isa = detected_isa());
// The residual add alone: x[rows, n] += delta + delta_bias (delta_bias [n] may be null).
void add_residual(float* x, const float* delta, const float* delta_bias, int64_t rows, int64_t n,
                  ThreadPool& pool, Isa isa = detected_isa());

// In place on y[rows, n]: y = gelu(y + bias) with bias [n] (null: none): the bias add of the
// linear layer before it, fused. gelu_tanh is gelu_pytorch_tanh,
// 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))); gelu_erf is nn.GELU(), 0.5·x·(1 + erf(x / √2)).
void gelu_tanh(float* y, const float* bias, int64_t rows, int64_t n, ThreadPool& pool,
               Isa isa = detected_isa());
void gelu_erf(float* y, const float* bias, int64_t rows, int64_t n, ThreadPool& pool,
              Isa isa = detected_isa());

// out[i] = silu(gate[i]) * up[i] = gate / (1 + e^−gate) * up for i < count (SwiGLU; out may
// alias gate or up).
void silu_mul(const float* gate, const float* up, int64_t count, float* out, ThreadPool& pool,
              Isa isa = detected_isa());

// log Σ_i e^x[i] over x[0, n), n >= 1 (the normaliser of a log-softmax: a logit row's log-
// probabilities are x − lse), and in *above the number of values greater than `at` (a token's
// rank − 1 when `at` is its logit). One vector pass for the max and the count, one for the sum.
float logsumexp(const float* x, int64_t n, float at, int64_t* above, Isa isa = detected_isa());

// Rotates x [tokens, n_heads, head_dim] in place with NeoX (rotate-half) pairing (d, d + half).
// cos, sin: [tokens, head_dim / 2] angles for the first half (the second half repeats them).
void rope_neox(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* cos,
               const float* sin, ThreadPool& pool, Isa isa = detected_isa());
// Qwen3's per-head q/k RMSNorm (weight w [head_dim], over each head's head_dim values) followed
// by rope_neox, in one pass over x [tokens, n_heads, head_dim] (in place).
void qk_norm_rope(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                  float eps, const float* cos, const float* sin, ThreadPool& pool,
                  Isa isa = detected_isa());

// One layer's paged K and V cache as stored: rows of n_kv_heads · head_dim values of `type` —
// kF32, kBF16 (f32 rounded to nearest even) or kI8 (one f32 scale per row and KV head in
// k_scale / v_scale, [rows, n_kv_heads]: the head's max |x| / 127, values rounded half to even).
struct KvPool {
  void* k = nullptr;
  void* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  DType type = DType::kF32;
};
// The KV types a CPU cache can hold.
bool kv_type_supported(DType type);

// Stores the n_kv_heads · head_dim values of src as row `row` of one side (K or V) of a pool.
void store_kv_row(const float* src, int64_t n_kv_heads, int64_t head_dim, DType type, void* data,
                  float* scale, int64_t row);
// Reads head `kvh` of row `row` of one side of a pool back as f32 (head_dim values).
void load_kv_head(const void* data, const float* scale, DType type, int64_t n_kv_heads,
                  int64_t head_dim, int64_t row, int64_t kvh, float* out);

// A decoder layer's attention input from one q|k|v product, qkv [tokens, (n_heads + 2·n_kv)·hd]
// (row-major, q heads then k heads then v heads): q heads get q_norm + rotary (as qk_norm_rope)
// into q [tokens, n_heads, hd]; k heads k_norm + rotary, and v heads as they are, into rows
// slots[i] of the cache, in its type. The q and k parts of qkv are rotated in place (each
// token's own row), so that rows sharing a slot (a graph's padding) only copy into it. Threads
// split the tokens.
void qkv_rope_store(float* qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                    int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                    const float* cos, const float* sin, const int32_t* slots, float* q,
                    const KvPool& cache, ThreadPool& pool, Isa isa = detected_isa());

// ---- Qwen3.5's hybrid layers (kernels/cpu/hybrid.h per ISA; scalar versions in ops/ref) ----
// (DeltaNetShape: ops/backend.h.)

// The hybrid-layer kernel table of one ISA level (the one place that picks it).
const kernels::HybridKernels& hybrid_kernels(Isa isa);

// One sequence of a Gated DeltaNet batch: rows [row, row + len), its state (the conv window
// [kernel − 1, conv_dim], oldest first, and the recurrent state [nv, dk, dv], f32), and whether
// it starts from zero state (its first chunk).
struct DeltaNetSeq {
  int64_t row = 0, len = 0;
  bool fresh = false;
  float* conv = nullptr;
  float* state = nullptr;
  // Speculative decoding's verify chunk (null otherwise): the sequence runs token by token (the
  // conv1d and the recurrent rule, as one-token chunks do), and its state after each token t but
  // the last is written to token_states + t · state_floats (a slot's layout: conv window, then the
  // recurrent state), so that a rejected proposal's state can be dropped.
  float* token_states = nullptr;
};

// A Gated DeltaNet layer's token mixing over a batch of sequences (transformers'
// Qwen3_5GatedDeltaNet between its input products and its gated norm): per sequence, the causal
// depthwise conv1d + SiLU over q|k|v (weights conv_w [kernel, conv_dim], tap-major), q and k
// L2-normalised (q scaled by 1/√dk), β = sigmoid(b), g = −e^{a_log}·softplus(a + dt_bias), then
// the gated delta rule: recurrent for a one-token chunk, chunks of `chunk` tokens otherwise
// (≤ 0: kernels::kDeltaChunk; 1: recurrent for every token; at most the batch's rows), carrying
// each sequence's state. proj: [rows, proj_stride] rows as DeltaNetShape::proj_dim lays them out;
// mixed: scratch [rows, mixed_dim]; out: [rows, nv·dv]. Threads split the conv1d by sequence and
// block of channels, and the delta rule by (sequence, value head).
void gated_delta_net(const float* proj, int64_t proj_stride, const DeltaNetSeq* seqs,
                     int64_t n_seqs, const DeltaNetShape& s, const float* conv_w,
                     const float* a_log, const float* dt_bias, float* mixed, float* out,
                     ThreadPool& pool, Isa isa = detected_isa(), int64_t chunk = 0);
// Qwen3.5's gated RMSNorm: per value head of each row, y = rms_norm(x) · w · silu(z). x, y:
// [rows, heads, n]; z: row r's heads at z + r·z_stride (n values each); w: [n].
void gated_rms_norm(const float* x, const float* z, int64_t z_stride, int64_t rows, int64_t heads,
                    int64_t n, const float* w, float eps, float* y, ThreadPool& pool,
                    Isa isa = detected_isa());
// x [rows, n] ← x · sigmoid(g), g's rows g_stride apart (the attention's output gate).
void sigmoid_mul(float* x, const float* g, int64_t g_stride, int64_t rows, int64_t n,
                 ThreadPool& pool, Isa isa = detected_isa());
// qkv_rope_store for Qwen3.5's gated attention: q_proj's rows hold, per head, [q | gate]
// (qkv row: n_heads · 2·head_dim, then the k and v heads); q heads go to q [tokens, n_heads, hd]
// and gates to gate [tokens, n_heads, hd]; q and k get their RMSNorm over all head_dim values and
// NeoX rotary over the first rotary_dim (cos, sin [tokens, rotary_dim / 2]); k and v go to the
// cache rows slots[i].
void qkv_gated_rope_store(float* qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, int64_t rotary_dim, const float* q_norm,
                          const float* k_norm, float eps, const float* cos, const float* sin,
                          const int32_t* slots, float* q, float* gate, const KvPool& cache,
                          ThreadPool& pool, Isa isa = detected_isa());

// SwiGLU from one gate|up product: out[r, :] = silu(gu[r, 0:n]) · gu[r, n:2n] for r < rows.
void silu_mul_rows(const float* gu, int64_t rows, int64_t n, float* out, ThreadPool& pool,
                   Isa isa = detected_isa());

// Causal GQA attention of one sequence's chunk against a PAGED KV cache of one layer.
// q: [n_q, n_heads, head_dim] for positions first_pos .. first_pos + n_q - 1; position p's K/V
// row lives at row (block_table[p / block_size] · block_size + p % block_size) of the pool, read
// in its stored type (the chunk's own K/V too: a chunk computes the same whether or not the
// positions before it were computed in this pass). out: [n_q, n_heads, head_dim].
void attention_paged(const float* q, int64_t n_q, int64_t first_pos, const KvPool& kv,
                     const int32_t* block_table, int64_t block_size, int64_t n_heads,
                     int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                     ThreadPool& pool, Isa isa = detected_isa());
// The same over an f32 pool (rows n_kv_heads · head_dim floats wide).
inline void attention_paged(const float* q, int64_t n_q, int64_t first_pos, const float* k_pool,
                            const float* v_pool, const int32_t* block_table, int64_t block_size,
                            int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                            float* out, ThreadPool& pool, Isa isa = detected_isa()) {
  KvPool kv;
  kv.k = const_cast<float*>(k_pool);
  kv.v = const_cast<float*>(v_pool);
  attention_paged(q, n_q, first_pos, kv, block_table, block_size, n_heads, n_kv_heads, head_dim,
                  scale, out, pool, isa);
}

// Bidirectional multi-head attention within one segment (one image): every query sees every key.
// q, k, v: [n, n_heads, head_dim] contiguous; out: [n, n_heads, head_dim].
void attention_full(const float* q, const float* k, const float* v, int64_t n, int64_t n_heads,
                    int64_t head_dim, float scale, float* out, ThreadPool& pool,
                    Isa isa = detected_isa());
// The same for query rows [q0, q1) only (every key still seen; out's other rows untouched). Rows
// split at multiples of kAttentionRowGrain get bit for bit what the whole call gives them.
inline constexpr int64_t kAttentionRowGrain = 48;
void attention_full_rows(const float* q, const float* k, const float* v, int64_t n, int64_t q0,
                         int64_t q1, int64_t n_heads, int64_t head_dim, float scale, float* out,
                         ThreadPool& pool, Isa isa = detected_isa());

}  // namespace vlm::ops

// Scalar reference implementations: the oracle the kernels are tested against. Never optimised.
#pragma once

#include <cstdint>

#include "core/tensor.h"
#include "ops/ops.h"

namespace vlm::ops::ref {

// y[M, N] = x[M, K] · w[N, K]^T, accumulated in double. I8 weights: w[n, k] = q · scale[n];
// I4 weights: w[n, k] = (int4_at(w, n, k) − zero[n, g]) · scale[n, g], g = k / group.
void matmul(const float* x, int64_t M, int64_t K, const TensorView& w, float* y);

// x [M, K] (K a multiple of 32) quantized per row in blocks of 32 as kernels/cpu/matmul.h
// defines for INT8 activations: q [M, K], scale and sum [M, K / 32]. Scalar, in the same f32
// operations, so the kernels must match it exactly.
void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* sum);

// y = x · w^T with x quantized by quantize_rows_q8 (I8 / I4 weights only): each block's integer
// dot product exact, times its x scale and weight scale, summed in double; an I4 weight's zero
// points enter as −Σ_g zero · scale · Σ_{k in g} x (x as given, not quantized), as the op does.
void matmul_q8(const float* x, int64_t M, int64_t K, const TensorView& w, float* y);

// q[n, k] (−8..7) of an I4 weight [N, K], read from its packed bytes (layout in core/tensor.h).
int int4_at(const TensorView& w, int64_t n, int64_t k);
// The f32 value of an I4 weight's scale and its zero point (0 without zero points) for (n, k).
float int4_scale(const TensorView& w, int64_t n, int64_t k);
int int4_zero(const TensorView& w, int64_t n, int64_t k);

// Causal attention with an explicit softmax over the whole score row (double precision).
void attention_causal(const float* q, int64_t n_q, int64_t first_pos, const float* k_cache,
                      const float* v_cache, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      float scale, float* out);

// Bidirectional attention over n tokens, explicit softmax in double. q, k, v, out: [n, heads, hd].
void attention_full(const float* q, const float* k, const float* v, int64_t n, int64_t n_heads,
                    int64_t head_dim, float scale, float* out);

// The small ops as plain scalar loops over f32 with std::exp / std::erf / std::tanh (LayerNorm
// accumulates in double). Shapes and aliasing as in ops.h.
void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);
void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t n, float eps,
                float* y);
void gelu_tanh(float* x, int64_t count);
void gelu_erf(float* x, int64_t count);
void silu_mul(const float* gate, const float* up, int64_t count, float* out);
void rope_neox(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* cos,
               const float* sin);
// x[rows, n] += delta (+ bias[n] when not null).
void add_rows(float* x, const float* delta, const float* bias, int64_t rows, int64_t n);
// The fused ops, composed from the ones above in the order the model used to call them.
void add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t n, float eps,
                  float* y);
void add_layer_norm(float* x, const float* delta, const float* delta_bias, const float* w,
                    const float* b, int64_t rows, int64_t n, float eps, float* y);
void qk_norm_rope(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                  float eps, const float* cos, const float* sin);

// Qwen3.5's hybrid layers, token by token in double (ref/hybrid_ref.cc): the Gated DeltaNet as
// ops::gated_delta_net defines it (conv1d + SiLU, L2 norms, gates, then the recurrent delta rule
// for every token, whatever the chunk), its gated RMSNorm, and the gated attention's per-head
// RMSNorm + partial NeoX rotary (one token: heads head_stride apart, cos / sin [rotary_dim / 2]).
void gated_delta_net(const float* proj, int64_t proj_stride, const DeltaNetSeq* seqs,
                     int64_t n_seqs, const DeltaNetShape& s, const float* conv_w,
                     const float* a_log, const float* dt_bias, float* out);
void gated_rms_norm(const float* x, const float* z, int64_t z_stride, int64_t rows, int64_t heads,
                    int64_t n, const float* w, float eps, float* y);
void qk_norm_rope_partial(float* x, int64_t n_heads, int64_t head_stride, int64_t head_dim,
                          int64_t rotary_dim, const float* w, float eps, const float* cos,
                          const float* sin);

}  // namespace vlm::ops::ref

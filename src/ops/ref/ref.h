// Scalar reference implementations: the oracle the kernels are tested against. Never optimised.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace vlm::ops::ref {

// y[M, N] = x[M, K] · w[N, K]^T, accumulated in double. I8 weights: w[n, k] = q · scale[n];
// I4 weights: w[n, k] = int4_at(w, n, k) · scale[n, k / 32].
void matmul(const float* x, int64_t M, int64_t K, const TensorView& w, float* y);

// q[n, k] (−8..7) of an I4 weight [N, K], read from its packed bytes (layout in core/tensor.h).
int int4_at(const TensorView& w, int64_t n, int64_t k);

// Causal attention with an explicit softmax over the whole score row (double precision).
void attention_causal(const float* q, int64_t n_q, int64_t first_pos, const float* k_cache,
                      const float* v_cache, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      float scale, float* out);

// Bidirectional attention over n tokens, explicit softmax in double. q, k, v, out: [n, heads, hd].
void attention_full(const float* q, const float* k, const float* v, int64_t n, int64_t n_heads,
                    int64_t head_dim, float scale, float* out);

}  // namespace vlm::ops::ref

// CPU element-wise and row kernels (activations, norms, rotary), one table per ISA level. Only
// src/ops/ calls these; src/ops/ref/ holds the scalar versions they are tested against.
//
// All arrays are f32, row-major, contiguous; rows are n floats apart. `bias` / `delta_bias`
// arguments may be null (no bias). Outputs may alias inputs where noted.
#pragma once

#include <cstdint>

namespace vlm::kernels {

struct EltwiseKernels {
  // y[i] = e^x[i] for i < n (may alias). The vector exp behind silu_mul and the GELUs.
  void (*exp)(const float* x, int64_t n, float* y);
  // Over x[0, n), n >= 1: *lse = log Σ e^x[i] (the max, then Σ e^(x − max) in f32 lanes over
  // blocks of 64 values per lane, the blocks summed in double) and *above = #{i : x[i] > at}.
  void (*logsumexp_count)(const float* x, int64_t n, float at, float* lse, int64_t* above);
  // In place on y[rows, n]: y = gelu_tanh(y + bias) (gelu_pytorch_tanh), bias: [n] or null.
  void (*gelu_tanh)(float* y, const float* bias, int64_t rows, int64_t n);
  // In place on y[rows, n]: y = gelu_erf(y + bias) (nn.GELU(), exact erf form).
  void (*gelu_erf)(float* y, const float* bias, int64_t rows, int64_t n);
  // out[i] = silu(gate[i]) · up[i] for i < n (out may alias gate or up).
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out);
  // Per row: y = x / sqrt(mean(x²) + eps) · w. x, y: [rows, n] (may alias); w: [n].
  void (*rms_norm)(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);
  // Per row: x += delta, then y = rms_norm(x). x: [rows, n] updated in place; delta, y: [rows, n].
  void (*add_rms_norm)(float* x, const float* delta, const float* w, int64_t rows, int64_t n,
                       float eps, float* y);
  // Per row: y = (x − mean) / sqrt(var + eps) · w + b (nn.LayerNorm). x, y may alias.
  void (*layer_norm)(const float* x, const float* w, const float* b, int64_t rows, int64_t n,
                     float eps, float* y);
  // Per row: x += delta + delta_bias, then y = layer_norm(x). x updated in place.
  void (*add_layer_norm)(float* x, const float* delta, const float* delta_bias, const float* w,
                         const float* b, int64_t rows, int64_t n, float eps, float* y);
  // Per row: x += delta + delta_bias (the residual add when no norm follows).
  void (*add_rows)(float* x, const float* delta, const float* delta_bias, int64_t rows, int64_t n);
  // NeoX rotary in place on x [tokens, n_heads, head_dim]; cos, sin: [tokens, head_dim / 2].
  void (*rope_neox)(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* cos,
                    const float* sin);
  // Per head: x = rope_neox(rms_norm(x, w)) (Qwen3's q_norm / k_norm, then rotary) in one pass.
  // x: [tokens, n_heads, head_dim] in place; w: [head_dim].
  void (*qk_norm_rope)(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                       float eps, const float* cos, const float* sin);
};

namespace generic {
const EltwiseKernels& eltwise_kernels();
}  // namespace generic
namespace avx2 {
const EltwiseKernels& eltwise_kernels();
}  // namespace avx2
namespace avx512 {
const EltwiseKernels& eltwise_kernels();
}  // namespace avx512

}  // namespace vlm::kernels

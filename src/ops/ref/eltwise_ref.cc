// Scalar references of the small ops (ref.h): the loops the model ran before the per-ISA
// kernels (kernels/cpu/eltwise_kernel.inc). Never optimised.
#include <cmath>

#include "ops/ref/ref.h"

namespace vlm::ops::ref {

void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    float ss = 0.f;
    for (int64_t i = 0; i < n; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * inv) * w[i];
  }
}

void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t n, float eps,
                float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    // Two passes (mean, then variance of the centred values), as torch's CPU kernel is accurate
    // for rows with a large mean.
    double mean = 0;
    for (int64_t i = 0; i < n; ++i) mean += xr[i];
    mean /= static_cast<double>(n);
    double var = 0;
    for (int64_t i = 0; i < n; ++i) var += (xr[i] - mean) * (xr[i] - mean);
    var /= static_cast<double>(n);
    const float mu = static_cast<float>(mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] - mu) * inv * w[i] + b[i];
  }
}

void gelu_tanh(float* x, int64_t count) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < count; ++i) {
    const float v = x[i];
    x[i] = 0.5f * v * (1.f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
}

void gelu_erf(float* x, int64_t count) {
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  for (int64_t i = 0; i < count; ++i) x[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * kInvSqrt2));
}

void silu_mul(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void rope_neox(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* cos,
               const float* sin) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (int64_t h = 0; h < n_heads; ++h) {
      float* v = x + (t * n_heads + h) * head_dim;
      for (int64_t d = 0; d < half; ++d) {
        const float a = v[d];
        const float b = v[d + half];
        v[d] = a * c[d] - b * s[d];
        v[d + half] = b * c[d] + a * s[d];
      }
    }
  }
}

void add_rows(float* x, const float* delta, const float* bias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      x[r * n + i] += bias != nullptr ? delta[r * n + i] + bias[i] : delta[r * n + i];
    }
  }
}

void add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t n, float eps,
                  float* y) {
  add_rows(x, delta, nullptr, rows, n);
  rms_norm(x, w, rows, n, eps, y);
}

void add_layer_norm(float* x, const float* delta, const float* delta_bias, const float* w,
                    const float* b, int64_t rows, int64_t n, float eps, float* y) {
  add_rows(x, delta, delta_bias, rows, n);
  layer_norm(x, w, b, rows, n, eps, y);
}

void qk_norm_rope(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                  float eps, const float* cos, const float* sin) {
  rms_norm(x, w, tokens * n_heads, head_dim, eps, x);
  rope_neox(x, tokens, n_heads, head_dim, cos, sin);
}

}  // namespace vlm::ops::ref

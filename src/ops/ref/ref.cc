#include "ops/ref/ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/matmul.h"

namespace vlm::ops::ref {
namespace {

// Element (n, k) of an [N, K] weight; I8 is q · scale[n], I4 (q − zero) · scale of its group,
// exact in double.
double weight_at(const TensorView& w, int64_t n, int64_t k) {
  const int64_t i = n * w.dim(1) + k;
  switch (w.dtype) {
    case DType::kF32:
      return static_cast<const float*>(w.data)[i];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(w.data)[i]);
    case DType::kI8:
      return static_cast<double>(static_cast<const int8_t*>(w.data)[i]) * w.scale[n];
    case DType::kI4:
      return (int4_at(w, n, k) - int4_zero(w, n, k)) * static_cast<double>(int4_scale(w, n, k));
    default:
      return NAN;
  }
}

}  // namespace

float int4_scale(const TensorView& w, int64_t n, int64_t k) {
  const int64_t G = w.int4.group;
  return f16_to_f32(w.int4.scale[n * (w.dim(1) / G) + k / G]);
}

int int4_zero(const TensorView& w, int64_t n, int64_t k) {
  const int64_t G = w.int4.group;
  return w.int4.zero == nullptr ? 0 : w.int4.zero[n * (w.dim(1) / G) + k / G];
}

int int4_at(const TensorView& w, int64_t n, int64_t k) {
  // Block g = k / 32 is 16 bytes; its byte j holds element j (low nibble) and j + 16 (high).
  const int64_t half = kInt4Block / 2;
  const int64_t g = k / kInt4Block, j = k % kInt4Block;
  const auto* row = static_cast<const uint8_t*>(w.data) + n * (w.dim(1) / 2);
  const uint8_t byte = row[g * half + j % half];
  const int nibble = j < half ? (byte & 0xf) : (byte >> 4);
  return nibble >= 8 ? nibble - 16 : nibble;
}

void quantize_rows_q8(const float* x, int64_t M, int64_t K, int8_t* q, float* scale, int32_t* sum) {
  constexpr int64_t kBlock = 32;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < K / kBlock; ++b) {
      const float* xb = x + m * K + b * kBlock;
      float amax = 0.f;
      for (int64_t k = 0; k < kBlock; ++k) amax = std::max(amax, std::fabs(xb[k]));
      const bool normal = amax >= kernels::kQ8MinAmax;
      const float inv = normal ? 127.f / amax : 0.f;
      int32_t s = 0;
      for (int64_t k = 0; k < kBlock; ++k) {
        const auto v = static_cast<int32_t>(std::nearbyint(xb[k] * inv));  // ties to even
        q[m * K + b * kBlock + k] = static_cast<int8_t>(std::clamp(v, -127, 127));
        s += q[m * K + b * kBlock + k];
      }
      scale[m * (K / kBlock) + b] = normal ? amax / 127.f : 0.f;
      sum[m * (K / kBlock) + b] = s;
    }
  }
}

void matmul_q8(const float* x, int64_t M, int64_t K, const TensorView& w, float* y) {
  constexpr int64_t kBlock = 32;
  const int64_t N = w.dim(0), blocks = K / kBlock;
  std::vector<int8_t> q(M * K);
  std::vector<float> scale(M * blocks);
  std::vector<int32_t> sum(M * blocks);
  quantize_rows_q8(x, M, K, q.data(), scale.data(), sum.data());
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t b = 0; b < blocks; ++b) {
        int64_t dot = 0;
        for (int64_t k = b * kBlock; k < (b + 1) * kBlock; ++k) {
          const int wq = w.dtype == DType::kI8 ? static_cast<const int8_t*>(w.data)[n * K + k]
                                               : int4_at(w, n, k);
          dot += static_cast<int64_t>(q[m * K + k]) * wq;
        }
        const double ws = w.dtype == DType::kI8 ? w.scale[n] : int4_scale(w, n, b * kBlock);
        acc += static_cast<double>(dot) * scale[m * blocks + b] * ws;
      }
      if (w.dtype == DType::kI4) {
        for (int64_t k = 0; k < K; ++k) {
          acc -= int4_zero(w, n, k) * static_cast<double>(int4_scale(w, n, k)) * x[m * K + k];
        }
      }
      y[m * N + n] = static_cast<float>(acc);
    }
  }
}

void matmul(const float* x, int64_t M, int64_t K, const TensorView& w, float* y) {
  const int64_t N = w.dim(0);
  std::vector<float> row;  // a GGUF block weight's row, dequantized exactly
  for (int64_t n = 0; n < N; ++n) {
    if (is_ggml_block(w.dtype)) {
      row.resize(static_cast<size_t>(K));
      kernels::dequantize_rows_ggml(w.dtype, w.data, K, n, n + 1, row.data());
    }
    for (int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        s += static_cast<double>(x[m * K + k]) * (row.empty() ? weight_at(w, n, k) : row[k]);
      }
      y[m * N + n] = static_cast<float>(s);
    }
  }
}

namespace {

// One query row against keys [0, n_keys) at k + j·stride / v + j·stride, explicit softmax in
// double precision.
void attend_row(const float* q, const float* k, const float* v, int64_t stride, int64_t n_keys,
                int64_t head_dim, float scale, float* out) {
  std::vector<double> p(n_keys);
  double mx = -INFINITY;
  for (int64_t j = 0; j < n_keys; ++j) {
    double s = 0;
    for (int64_t d = 0; d < head_dim; ++d) s += static_cast<double>(q[d]) * k[j * stride + d];
    p[j] = s * scale;
    mx = std::max(mx, p[j]);
  }
  double sum = 0;
  for (auto& x : p) sum += (x = std::exp(x - mx));
  for (int64_t d = 0; d < head_dim; ++d) {
    double acc = 0;
    for (int64_t j = 0; j < n_keys; ++j) acc += p[j] * v[j * stride + d];
    out[d] = static_cast<float>(acc / sum);
  }
}

}  // namespace

void attention_causal(const float* q, int64_t n_q, int64_t first_pos, const float* k_cache,
                      const float* v_cache, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                      float scale, float* out) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  for (int64_t i = 0; i < n_q; ++i) {
    for (int64_t h = 0; h < n_heads; ++h) {
      const int64_t off = (h / group) * head_dim;
      attend_row(q + (i * n_heads + h) * head_dim, k_cache + off, v_cache + off, kv_stride,
                 first_pos + i + 1, head_dim, scale, out + (i * n_heads + h) * head_dim);
    }
  }
}

void attention_full(const float* q, const float* k, const float* v, int64_t n, int64_t n_heads,
                    int64_t head_dim, float scale, float* out) {
  const int64_t stride = n_heads * head_dim;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t h = 0; h < n_heads; ++h) {
      attend_row(q + i * stride + h * head_dim, k + h * head_dim, v + h * head_dim, stride, n,
                 head_dim, scale, out + i * stride + h * head_dim);
    }
  }
}

}  // namespace vlm::ops::ref

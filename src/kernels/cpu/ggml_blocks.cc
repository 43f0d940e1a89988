// The block kernels' baseline parts (kernels/cpu/ggml_blocks.h): x's lane scales and sums, and
// exact dequantization through io/gguf_quants.

#include "kernels/cpu/ggml_blocks.h"

#include <span>

#include "io/gguf_quants.h"

namespace vlm::kernels {

GgmlRows ggml_x_views(const int8_t* q, int64_t M, int64_t K, float* out, int32_t* offs) {
  float* sum16 = out + M * (K / 4);
  return {
      q, out, sum16, sum16 + M * (K / 16), offs, offs != nullptr ? offs + M * (K / 4) : nullptr};
}

void prepare_ggml_x(const int8_t* q, const float* scale, int64_t M, int64_t K, int64_t m0,
                    int64_t m1, float* out, int32_t* offs) {
  // ggml_x_views' layout, on the writable buffers.
  const GgmlRows v = ggml_x_views(q, M, K, out, offs);
  float* lane = out;
  float* sum16 = out + (v.sum16 - v.lane);
  float* sum32 = out + (v.sum32 - v.lane);
  for (int64_t m = m0; m < m1; ++m) {
    const int8_t* qm = q + m * K;
    if (offs != nullptr) {
      int32_t* off128 = offs + (v.off128 - v.off32);
      for (int64_t l = 0; l < K / 4; ++l) {
        const int32_t s4 = qm[4 * l] + qm[4 * l + 1] + qm[4 * l + 2] + qm[4 * l + 3];
        offs[m * (K / 4) + l] = -32 * s4;
        off128[m * (K / 4) + l] = -128 * s4;
      }
    }
    for (int64_t b = 0; b < K / 32; ++b) {
      const float s = scale[m * (K / 32) + b];
      for (int j = 0; j < 8; ++j) lane[m * (K / 4) + 8 * b + j] = s;
      int32_t t[2] = {0, 0};
      for (int j = 0; j < 32; ++j) t[j / 16] += qm[32 * b + j];
      sum16[m * (K / 16) + 2 * b] = s * static_cast<float>(t[0]);
      sum16[m * (K / 16) + 2 * b + 1] = s * static_cast<float>(t[1]);
      sum32[m * (K / 32) + b] = s * static_cast<float>(t[0] + t[1]);
    }
  }
}

void dequantize_rows_ggml(DType t, const void* w, int64_t K, int64_t n0, int64_t n1, float* out) {
  const GgmlType g = t == DType::kQ8_0  ? GgmlType::kQ8_0
                     : t == DType::kQ4K ? GgmlType::kQ4_K
                     : t == DType::kQ5K ? GgmlType::kQ5_K
                                        : GgmlType::kQ6_K;
  const size_t row = dtype_nbytes(t, K);
  const auto* base = static_cast<const uint8_t*>(w);
  for (int64_t n = n0; n < n1; ++n) {
    // (The shapes were checked when the weight was loaded: the sizes match.)
    (void)dequantize(g, std::span<const uint8_t>(base + static_cast<size_t>(n) * row, row),
                     std::span<float>(out + (n - n0) * K, static_cast<size_t>(K)));
  }
}

}  // namespace vlm::kernels

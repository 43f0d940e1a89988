// CPU attention kernels, one namespace per ISA level. Only src/ops/ calls these.
#pragma once

#include <cstdint>

namespace vlm::kernels {

// Largest head_dim the vectorised kernel takes (it also needs head_dim % 8 == 0).
constexpr int64_t kMaxHeadDim = 256;

// attend_row_paged: as attend_row with key j at row (block_table[j / block_size] · block_size +
// j % block_size) of k / v (rows kv_stride floats apart): a paged KV cache.
// softmax_row: x[i] ← exp(scale·x[i] − max) / Σ, in place over n values.
// attend_row: out[head_dim] = softmax(scale · q·kᵀ) · v over keys j ∈ [0, n_keys), key j at k + j·kv_stride
// (same for v). q, out: [head_dim].
namespace generic {
void softmax_row(float* x, int64_t n, float scale);
void attend_row_paged(const float* q, const float* k, const float* v, const int32_t* block_table,
                      int64_t block_size, int64_t kv_stride, int64_t n_keys, int64_t head_dim,
                      float scale, float* out);
void attend_row(const float* q, const float* k, const float* v, int64_t kv_stride, int64_t n_keys,
                int64_t head_dim, float scale, float* out);
}  // namespace generic
namespace avx2 {
void softmax_row(float* x, int64_t n, float scale);
void attend_row_paged(const float* q, const float* k, const float* v, const int32_t* block_table,
                      int64_t block_size, int64_t kv_stride, int64_t n_keys, int64_t head_dim,
                      float scale, float* out);
void attend_row(const float* q, const float* k, const float* v, int64_t kv_stride, int64_t n_keys,
                int64_t head_dim, float scale, float* out);
}  // namespace avx2
namespace avx512 {
void softmax_row(float* x, int64_t n, float scale);
void attend_row_paged(const float* q, const float* k, const float* v, const int32_t* block_table,
                      int64_t block_size, int64_t kv_stride, int64_t n_keys, int64_t head_dim,
                      float scale, float* out);
void attend_row(const float* q, const float* k, const float* v, int64_t kv_stride, int64_t n_keys,
                int64_t head_dim, float scale, float* out);
}  // namespace avx512

}  // namespace vlm::kernels

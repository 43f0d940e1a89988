// CPU attention kernels, one namespace per ISA level. Only src/ops/ calls these.
#pragma once

#include <cstdint>

namespace vlm::kernels {

// Largest head_dim the vectorised kernel takes (it also needs head_dim % 8 == 0).
constexpr int64_t kMaxHeadDim = 256;
// Most query heads attend_group_partial takes at once (larger GQA groups go in several calls).
constexpr int64_t kMaxGroup = 8;

// How a paged KV cache stores its rows.
enum class KvType : uint8_t {
  kF32,
  kBF16,  // the upper half of the f32 (round to nearest even when stored)
  kI8,    // int8 with one f32 scale per (row, KV head): value = q · scale
};

// One KV head's K (or V) rows in a paged cache: row r's head_dim values start `r · stride`
// elements of `type` after `data`; with kI8 they are scaled by scale[r · scale_stride].
struct KvRows {
  const void* data = nullptr;
  const float* scale = nullptr;
  int64_t stride = 0, scale_stride = 0;
  KvType type = KvType::kF32;
};

// attend_row_paged: as attend_row with key j at row (block_table[j / block_size] · block_size +
// j % block_size) of k / v: a paged KV cache, read in its stored type (converted in registers).
// softmax_exp_row: x[i] ← exp(scale·x[i] − max) in place over n values; returns their sum Σ
// (the caller scales by 1 / Σ where it is cheapest: after P·V, per output row).
// attend_row: out[head_dim] = softmax(scale · q·kᵀ) · v over keys j ∈ [0, n_keys), key j at k +
// j·kv_stride (same for v). q, out: [head_dim]. attend_group_partial: split-K decode. n_q_heads ≤
// kMaxGroup query rows (q, head_dim apart) sharing one KV head, against keys [j0, j1) of a paged
// cache (as attend_row_paged). For query i, with s_j = scale·q_i·k_j: part[i] = [acc (head_dim
// floats) = Σ_j e^(s_j − m)·v_j, m = max_j s_j, l = Σ_j e^(s_j − m)], part_stride floats apart; the
// caller merges the key ranges.
namespace generic {
float softmax_exp_row(float* x, int64_t n, float scale);
void attend_row_paged(const float* q, const KvRows& k, const KvRows& v, const int32_t* block_table,
                      int64_t block_size, int64_t n_keys, int64_t head_dim, float scale,
                      float* out);
void attend_row(const float* q, const float* k, const float* v, int64_t kv_stride, int64_t n_keys,
                int64_t head_dim, float scale, float* out);
void attend_group_partial(const float* q, int64_t n_q_heads, const KvRows& k, const KvRows& v,
                          const int32_t* block_table, int64_t block_size, int64_t j0, int64_t j1,
                          int64_t head_dim, float scale, float* part, int64_t part_stride);
}  // namespace generic
namespace avx2 {
float softmax_exp_row(float* x, int64_t n, float scale);
void attend_row_paged(const float* q, const KvRows& k, const KvRows& v, const int32_t* block_table,
                      int64_t block_size, int64_t n_keys, int64_t head_dim, float scale,
                      float* out);
void attend_row(const float* q, const float* k, const float* v, int64_t kv_stride, int64_t n_keys,
                int64_t head_dim, float scale, float* out);
void attend_group_partial(const float* q, int64_t n_q_heads, const KvRows& k, const KvRows& v,
                          const int32_t* block_table, int64_t block_size, int64_t j0, int64_t j1,
                          int64_t head_dim, float scale, float* part, int64_t part_stride);
}  // namespace avx2
namespace avx512 {
float softmax_exp_row(float* x, int64_t n, float scale);
void attend_row_paged(const float* q, const KvRows& k, const KvRows& v, const int32_t* block_table,
                      int64_t block_size, int64_t n_keys, int64_t head_dim, float scale,
                      float* out);
void attend_row(const float* q, const float* k, const float* v, int64_t kv_stride, int64_t n_keys,
                int64_t head_dim, float scale, float* out);
void attend_group_partial(const float* q, int64_t n_q_heads, const KvRows& k, const KvRows& v,
                          const int32_t* block_table, int64_t block_size, int64_t j0, int64_t j1,
                          int64_t head_dim, float scale, float* part, int64_t part_stride);
}  // namespace avx512

}  // namespace vlm::kernels

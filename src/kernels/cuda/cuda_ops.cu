// CUDA kernels for src/kernels/cuda/cuda_ops.h. One block per row for the per-row ops (256 threads,
// f32 sums reduced through shared memory); grid-stride loops for the element-wise ones.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/runtime.h"

namespace vlm::cuda {
namespace {

thread_local cudaStream_t t_stream = nullptr;  // set_stream(); null: the legacy default stream

constexpr int kRowThreads = 256;
constexpr int kWarpsPerBlock = kRowThreads / 32;

// The warp's sum of v (every lane gets it).
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The block's sum of v (every thread gets it).
__device__ float block_sum(float v) {
  __shared__ float part[kWarpsPerBlock];
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < kWarpsPerBlock; ++i) s += part[i];
  __syncthreads();  // part is reused by the next call
  return s;
}

template <typename T>
__global__ void rms_norm_kernel(const T* x, const float* w, int64_t n, float eps, T* y) {
  const T* xr = x + blockIdx.x * n;
  T* yr = y + blockIdx.x * n;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load(xr, i);
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(yr, i, load(xr, i) * inv * w[i]);
}

template <typename T>
__global__ void add_rms_norm_kernel(T* x, const T* delta, const float* w, int64_t n, float eps,
                                    T* y) {
  T* xr = x + blockIdx.x * n;
  const T* dr = delta + blockIdx.x * n;
  T* yr = y + blockIdx.x * n;
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    store(xr, i, load(xr, i) + load(dr, i));
    const float v = load(xr, i);  // the stored (rounded) residual, as the next layer reads it
    ss += v * v;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(yr, i, load(xr, i) * inv * w[i]);
}

// Per-head RMSNorm (w null: none) then NeoX rotary of one head of head_dim values, src → dst
// (may alias), by one warp.
template <typename T>
__device__ void norm_rope_head(const T* src, T* dst, int64_t head_dim, const float* w, float eps,
                               const float* c, const float* s, int lane) {
  const int64_t half = head_dim / 2;
  float inv = 1.f;
  if (w != nullptr) {
    float ss = 0.f;
    for (int64_t d = lane; d < head_dim; d += 32) {
      const float a = load(src, d);
      ss += a * a;
    }
    inv = rsqrtf(warp_sum(ss) / static_cast<float>(head_dim) + eps);
  }
  for (int64_t d = lane; d < half; d += 32) {
    const float a = w != nullptr ? load(src, d) * inv * w[d] : load(src, d);
    const float b = w != nullptr ? load(src, d + half) * inv * w[d + half] : load(src, d + half);
    store(dst, d, a * c[d] - b * s[d]);
    store(dst, d + half, b * c[d] + a * s[d]);
  }
}

template <typename T>
__global__ void qk_norm_rope_kernel(T* x, int64_t rows, int64_t n_heads, int64_t head_dim,
                                    const float* w, float eps, const float* cos, const float* sin) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int64_t half = head_dim / 2;
  T* v = x + row * head_dim;
  norm_rope_head(v, v, head_dim, w, eps, cos + (row / n_heads) * half, sin + (row / n_heads) * half,
                 threadIdx.x & 31);
}

template <typename T>
__global__ void qkv_rope_store_kernel(const T* qkv, int64_t tokens, int64_t n_heads, int64_t n_kv,
                                      int64_t head_dim, const float* q_norm, const float* k_norm,
                                      float eps, const float* cos, const float* sin,
                                      const int32_t* slots, T* q, T* kc, T* vc) {
  const int64_t heads = n_heads + 2 * n_kv;
  const int64_t warp = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (warp >= tokens * heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t i = warp / heads, j = warp % heads, half = head_dim / 2;
  const T* src = qkv + (i * heads + j) * head_dim;
  const float* c = cos + i * half;
  const float* s = sin + i * half;
  const int64_t kvd = n_kv * head_dim;
  if (j < n_heads) {
    norm_rope_head(src, q + (i * n_heads + j) * head_dim, head_dim, q_norm, eps, c, s, lane);
  } else if (j < n_heads + n_kv) {
    T* dst = kc + static_cast<int64_t>(slots[i]) * kvd + (j - n_heads) * head_dim;
    norm_rope_head(src, dst, head_dim, k_norm, eps, c, s, lane);
  } else {
    T* dst = vc + static_cast<int64_t>(slots[i]) * kvd + (j - n_heads - n_kv) * head_dim;
    for (int64_t d = lane; d < head_dim; d += 32) dst[d] = src[d];
  }
}

template <typename T>
__global__ void silu_mul_rows_kernel(const T* gu, int64_t rows, int64_t n, T* out) {
  const int64_t count = rows * n;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / n, i = e % n;
    const float g = load(gu, r * 2 * n + i);
    store(out, e, g / (1.f + expf(-g)) * load(gu, r * 2 * n + n + i));
  }
}

template <typename T, typename D>
__global__ void add_rows_at_kernel(T* x, const int32_t* rows, const D* delta, int64_t n) {
  T* xr = x + static_cast<int64_t>(rows[blockIdx.x]) * n;
  const D* dr = delta + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(xr, i, load(xr, i) + load(dr, i));
}

template <typename T, typename S>
__global__ void set_rows_at_kernel(T* x, const int32_t* rows, const S* src, int64_t n) {
  T* xr = x + static_cast<int64_t>(rows[blockIdx.x]) * n;
  const S* sr = src + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(xr, i, load(sr, i));
}

template <typename T, typename D>
__global__ void add_inplace_kernel(T* x, const D* delta, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store(x, i, load(x, i) + load(delta, i));
  }
}

template <typename T>
__global__ void patchify_kernel(const uint8_t* rgb, const float* lut, int64_t grid_w, int64_t P,
                                int64_t M, int64_t TP, int64_t count, T* out) {
  const int64_t cols = 3 * TP * P * P, width = grid_w * P;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = e / cols, col = e % cols;
    const int64_t px = col % P, py = (col / P) % P, c = col / (P * P * TP);  // slot: any
    const int64_t block = r / (M * M), in_block = r % (M * M);
    const int64_t bh = block / (grid_w / M), bw = block % (grid_w / M);
    const int64_t y = (bh * M + in_block / M) * P + py, x = (bw * M + in_block % M) * P + px;
    store(out, e, lut[c * 256 + rgb[(y * width + x) * 3 + c]]);
  }
}

template <typename S, typename D>
__global__ void convert_kernel(const S* src, int64_t count, D* dst) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    store(dst, i, load(src, i));
  }
}

template <typename T>
__global__ void add_bias_kernel(T* x, const float* bias, int64_t n) {
  T* xr = x + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(xr, i, load(xr, i) + bias[i]);
}

// LayerNorm of one row already summed in place: mean, then the biased variance, both f32.
template <typename T>
__device__ void layer_norm_row(const T* xr, const float* w, const float* b, int64_t n, float eps,
                               T* yr) {
  float s = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += load(xr, i);
  const float mean = block_sum(s) / static_cast<float>(n);
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float d = load(xr, i) - mean;
    ss += d * d;
  }
  const float inv = rsqrtf(block_sum(ss) / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    store(yr, i, (load(xr, i) - mean) * inv * w[i] + b[i]);
  }
}

template <typename T>
__global__ void layer_norm_kernel(const T* x, const float* w, const float* b, int64_t n, float eps,
                                  T* y) {
  layer_norm_row(x + blockIdx.x * n, w, b, n, eps, y + blockIdx.x * n);
}

template <typename T>
__global__ void add_layer_norm_kernel(T* x, const T* delta, const float* bias, const float* w,
                                      const float* b, int64_t n, float eps, T* y) {
  T* xr = x + blockIdx.x * n;
  const T* dr = delta + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    store(xr, i, load(xr, i) + (load(dr, i) + (bias != nullptr ? bias[i] : 0.f)));
  }
  if (y == nullptr) return;
  __syncthreads();  // the row's stored values, written by other threads, are read below
  layer_norm_row(xr, w, b, n, eps, y + blockIdx.x * n);
}

template <typename T>
__global__ void bias_gelu_kernel(T* x, const float* bias, int64_t n, bool tanh_form) {
  T* xr = x + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = load(xr, i) + (bias != nullptr ? bias[i] : 0.f);
    float g;
    if (tanh_form) {
      g = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    } else {
      g = 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    }
    store(xr, i, g);
  }
}

constexpr int kMaxHeadDim = 256;

template <typename T>
__global__ void attention_kernel(const T* q, int64_t n_q, const T* k, const T* v, int64_t n_kv,
                                 int64_t n_heads, int64_t group, int64_t head_dim, float scale,
                                 T* out) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= n_q * n_heads) return;
  const int lane = threadIdx.x & 31;
  const int64_t h = row % n_heads;
  const int64_t kv_stride = (n_heads / group) * head_dim;
  const int64_t kv_off = (h / group) * head_dim;
  const int per =
      static_cast<int>((head_dim + 31) / 32);  // values per lane: lane + 32·j < head_dim
  float qr[kMaxHeadDim / 32], acc[kMaxHeadDim / 32];
  for (int j = 0; j < per; ++j) {  // lanes past head_dim hold zeros and store nothing
    const int64_t d = lane + 32 * j;
    qr[j] = d < head_dim ? load(q, row * head_dim + d) * scale : 0.f;
    acc[j] = 0.f;
  }
  const int64_t seen = n_kv;
  float m = -INFINITY, l = 0.f;
  for (int64_t p = 0; p < seen; ++p) {
    const int64_t base = p * kv_stride + kv_off;
    float s = 0.f;
    for (int j = 0; j < per; ++j) {
      if (lane + 32 * j < head_dim) s += qr[j] * load(k, base + lane + 32 * j);
    }
    s = warp_sum(s);
    const float m_new = fmaxf(m, s);
    const float keep = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float e = expf(s - m_new);
    l = l * keep + e;
    for (int j = 0; j < per; ++j) {
      if (lane + 32 * j < head_dim) acc[j] = acc[j] * keep + e * load(v, base + lane + 32 * j);
    }
    m = m_new;
  }
  const float inv = seen > 0 ? 1.f / l : 0.f;
  for (int j = 0; j < per; ++j) {
    if (lane + 32 * j < head_dim) store(out, row * head_dim + lane + 32 * j, acc[j] * inv);
  }
}

// Paged attention: one warp per (query, G heads that share a KV head, split); see
// paged_attention() in cuda_ops.h. Each K and V row is read once for the G heads (GQA). PER:
// values per lane (head_dim ≤ 32·PER). Split `sp` covers keys [sp·split_len, min((sp + 1)·
// split_len, seen)), split_len = ⌈seen / splits⌉ for this query's own `seen` (so a captured
// launch serves every context length). With one split the warp writes the normalised outputs;
// otherwise each head's running max m, sum l and unnormalised accumulator go to
// partial[(row · splits + sp) · (head_dim + 2)] = {m, l, acc[head_dim]}, row = query · n_heads +
// head.
// This lane's run of PER consecutive values at p (d0 = lane · PER < head_dim): one vector load
// when the whole run is inside head_dim and aligned (head_dim a multiple of PER), else value by
// value with zeros past head_dim.
template <int PER>
__device__ inline void load_run(const __nv_bfloat16* p, int64_t d0, int64_t head_dim, float* o) {
  if (head_dim % PER == 0 && d0 + PER <= head_dim) {
    if constexpr (PER == 8) {
      const uint4 v = *reinterpret_cast<const uint4*>(p);
      const auto* b = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
      for (int j = 0; j < 8; ++j) o[j] = __bfloat162float(b[j]);
      return;
    } else if constexpr (PER == 4) {
      const uint2 v = *reinterpret_cast<const uint2*>(p);
      const auto* b = reinterpret_cast<const __nv_bfloat16*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) o[j] = __bfloat162float(b[j]);
      return;
    } else if constexpr (PER == 2) {
      const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(p);
      o[0] = __low2float(v);
      o[1] = __high2float(v);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < PER; ++j) o[j] = d0 + j < head_dim ? __bfloat162float(p[j]) : 0.f;
}

template <int PER>
__device__ inline void load_run(const float* p, int64_t d0, int64_t head_dim, float* o) {
#pragma unroll
  for (int j = 0; j < PER; ++j) o[j] = d0 + j < head_dim ? p[j] : 0.f;
}

template <typename T, int G, int PER>
__global__ void paged_attention_kernel(const T* q, int64_t tokens, const int32_t* tok_seq,
                                       const int32_t* tok_pos, const int32_t* tables,
                                       int64_t table_stride, int64_t bs, const T* kc, const T* vc,
                                       int64_t n_heads, int64_t group, int64_t head_dim,
                                       float scale, int64_t splits, float* partial, T* out) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  const int64_t slots = n_heads / G;  // head groups per query
  const int64_t unit = warp / splits, sp = warp % splits;
  if (unit >= tokens * slots) return;
  const int lane = threadIdx.x & 31;
  const int64_t d0 = static_cast<int64_t>(lane) * PER;  // this lane's values: d0 .. d0 + PER
  const bool active = d0 < head_dim;
  const int64_t i = unit / slots, h0 = (unit % slots) * G;
  const int64_t kvd = (n_heads / group) * head_dim;
  const int64_t kv_off = (h0 / group) * head_dim;  // G divides group: one KV head for all G
  const int32_t* table = tables + static_cast<int64_t>(tok_seq[i]) * table_stride;
  const int64_t seen = static_cast<int64_t>(tok_pos[i]) + 1;
  const int64_t split_len = (seen + splits - 1) / splits;
  const int64_t begin = sp * split_len;
  const int64_t end = begin + split_len < seen ? begin + split_len : seen;
  float qr[G][PER], acc[G][PER], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
    if (active) {
      load_run<PER>(q + ((i * n_heads) + h0 + g) * head_dim + d0, d0, head_dim, qr[g]);
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {  // lanes past head_dim hold zeros and store nothing
      qr[g][j] = active ? qr[g][j] * scale : 0.f;
      acc[g][j] = 0.f;
    }
  }
  for (int64_t p = begin; p < end; ++p) {
    const int64_t base = (static_cast<int64_t>(table[p / bs]) * bs + p % bs) * kvd + kv_off;
    float kr[PER], vr[PER];
    if (active) {
      load_run<PER>(kc + base + d0, d0, head_dim, kr);
      load_run<PER>(vc + base + d0, d0, head_dim, vr);
    } else {
#pragma unroll
      for (int j = 0; j < PER; ++j) kr[j] = vr[j] = 0.f;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < PER; ++j) s += qr[g][j] * kr[j];
      s = warp_sum(s);
      const float m_new = fmaxf(m[g], s);
      const float keep = expf(m[g] - m_new);
      const float e = expf(s - m_new);
      l[g] = l[g] * keep + e;
#pragma unroll
      for (int j = 0; j < PER; ++j) acc[g][j] = acc[g][j] * keep + e * vr[j];
      m[g] = m_new;
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    const int64_t row = i * n_heads + h0 + g;
    if (splits == 1) {
      const float inv = l[g] > 0.f ? 1.f / l[g] : 0.f;
#pragma unroll
      for (int j = 0; j < PER; ++j) {
        if (d0 + j < head_dim) store(out, row * head_dim + d0 + j, acc[g][j] * inv);
      }
      continue;
    }
    float* part = partial + (row * splits + sp) * (head_dim + 2);
    if (lane == 0) {
      part[0] = m[g];
      part[1] = l[g];
    }
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      if (d0 + j < head_dim) part[2 + d0 + j] = acc[g][j];
    }
  }
}

// Merges the splits of each (query, head) row: one warp per row.
template <typename T>
__global__ void attention_combine_kernel(const float* partial, int64_t rows, int64_t splits,
                                         int64_t head_dim, T* out) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const float* part = partial + row * splits * (head_dim + 2);
  float M = -INFINITY;
  for (int64_t sp = 0; sp < splits; ++sp) M = fmaxf(M, part[sp * (head_dim + 2)]);
  float l = 0.f;
  for (int64_t sp = 0; sp < splits; ++sp) {
    const float* p = part + sp * (head_dim + 2);
    if (p[1] > 0.f) l += p[1] * expf(p[0] - M);
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  for (int64_t d = lane; d < head_dim; d += 32) {
    float a = 0.f;
    for (int64_t sp = 0; sp < splits; ++sp) {
      const float* p = part + sp * (head_dim + 2);
      if (p[1] > 0.f) a += p[2 + d] * expf(p[0] - M);
    }
    store(out, row * head_dim + d, a * inv);
  }
}

constexpr int64_t kMaxSplits = 32;
constexpr int64_t kSplitMinKeys = 256;
// Warps (query × KV-head group) from which one split each already keeps the GPU busy; below,
// splits are added up to about this many warps.
constexpr int64_t kSplitRowLimit = 1024;

// (value, index) pairs: the larger value wins, the lower index among equals; NaN loses.
__device__ inline bool better(float v, int32_t i, float bv, int32_t bi) {
  if (isnan(v)) return false;
  if (isnan(bv)) return true;
  return v > bv || (v == bv && i < bi);
}

__global__ void argmax_kernel(const float* logits, int64_t n, int32_t* ids) {
  __shared__ float best_v[kRowThreads];
  __shared__ int32_t best_i[kRowThreads];
  const float* row = logits + blockIdx.x * n;
  float bv = NAN;
  int32_t bi = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (better(row[i], static_cast<int32_t>(i), bv, bi)) {
      bv = row[i];
      bi = static_cast<int32_t>(i);
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int stride = kRowThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride && better(best_v[threadIdx.x + stride], best_i[threadIdx.x + stride],
                                       best_v[threadIdx.x], best_i[threadIdx.x])) {
      best_v[threadIdx.x] = best_v[threadIdx.x + stride];
      best_i[threadIdx.x] = best_i[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = best_i[0];
}

template <typename Tt, typename To>
__global__ void gather_kernel(const Tt* table, const int32_t* ids, int64_t n, To* out) {
  const Tt* row = table + static_cast<int64_t>(ids[blockIdx.x]) * n;
  To* o = out + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(o, i, load(row, i));
}

// Blocks for one warp per row.
unsigned warp_row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

unsigned grid_for(int64_t count) { return cuda::grid_for(count, kRowThreads); }

Status check_rows(int64_t rows, const char* op) {
  if (rows < 0 || rows > 0x7fffffff) return invalid_argument(std::string(op) + ": bad row count");
  return ok_status();
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string device_description(int index) {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) return "unknown CUDA device";
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1ull << 30));
  return buf;
}

Status memory_info(int64_t* free_bytes, int64_t* total_bytes) {
  size_t f = 0, t = 0;
  if (Status s = cuda_status(cudaMemGetInfo(&f, &t), "cudaMemGetInfo"); !s.ok()) return s;
  *free_bytes = static_cast<int64_t>(f);
  *total_bytes = static_cast<int64_t>(t);
  return ok_status();
}

Status DeviceBuffer::allocate(size_t bytes, DeviceBuffer* out) {
  DeviceBuffer b;
  if (bytes > 0) {
    if (Status s = cuda_status(cudaMalloc(&b.ptr_, bytes), "cudaMalloc"); !s.ok()) return s;
  }
  b.bytes_ = bytes;
  *out = std::move(b);
  return ok_status();
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

Status DeviceBuffer::reserve(size_t bytes) {
  if (bytes_ >= bytes) return ok_status();
  return allocate(bytes, this);
}

Status DeviceBuffer::upload_f32(const std::vector<float>& v, DeviceBuffer* out) {
  VLM_RETURN_IF_ERROR(allocate(v.size() * 4, out));
  return out->upload(v.data(), v.size() * 4);
}

Status DeviceBuffer::upload(const void* host, size_t bytes) {
  if (bytes > bytes_) return invalid_argument("upload larger than the device buffer");
  return cuda_status(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "upload");
}

Status DeviceBuffer::download(void* host, size_t bytes) const {
  if (bytes > bytes_) return invalid_argument("download larger than the device buffer");
  return cuda_status(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost), "download");
}

Status copy_to_device(void* device, const void* host, size_t bytes) {
  return cuda_status(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice), "copy to device");
}

Status copy_to_host(void* host, const void* device, size_t bytes) {
  return cuda_status(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost), "copy to host");
}

void set_stream(void* s) { t_stream = static_cast<cudaStream_t>(s); }
void* current_stream() { return t_stream; }

Status synchronize() { return cuda_status(cudaDeviceSynchronize(), "synchronize"); }

Status rms_norm(const void* x, const float* w, int64_t rows, int64_t n, float eps, void* y,
                DType t) {
  if (Status s = check_rows(rows, "rms_norm"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    rms_norm_kernel<<<rows, kRowThreads, 0, launch_stream()>>>(static_cast<const T*>(x), w, n, eps,
                                                               static_cast<T*>(y));
  });
  return cuda_status(cudaGetLastError(), "rms_norm launch");
}

Status add_rms_norm(void* x, const void* delta, const float* w, int64_t rows, int64_t n, float eps,
                    void* y, DType t) {
  if (Status s = check_rows(rows, "add_rms_norm"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    add_rms_norm_kernel<<<rows, kRowThreads, 0, launch_stream()>>>(
        static_cast<T*>(x), static_cast<const T*>(delta), w, n, eps, static_cast<T*>(y));
  });
  return cuda_status(cudaGetLastError(), "add_rms_norm launch");
}

Status qk_norm_rope(void* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                    float eps, const float* cos, const float* sin, DType t) {
  if (head_dim % 2 != 0) return invalid_argument("qk_norm_rope: odd head_dim");
  const int64_t rows = tokens * n_heads;
  if (Status s = check_rows(rows, "qk_norm_rope"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    qk_norm_rope_kernel<<<warp_row_blocks(rows), kRowThreads, 0, launch_stream()>>>(
        static_cast<T*>(x), rows, n_heads, head_dim, w, eps, cos, sin);
  });
  return cuda_status(cudaGetLastError(), "qk_norm_rope launch");
}

Status qkv_rope_store(const void* qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                      const float* cos, const float* sin, const int32_t* slots, void* q,
                      void* k_cache, void* v_cache, DType t) {
  if (head_dim % 2 != 0) return invalid_argument("qkv_rope_store: odd head_dim");
  const int64_t warps = tokens * (n_heads + 2 * n_kv_heads);
  if (Status s = check_rows(warps, "qkv_rope_store"); !s.ok()) return s;
  if (warps == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    qkv_rope_store_kernel<<<warp_row_blocks(warps), kRowThreads, 0, launch_stream()>>>(
        static_cast<const T*>(qkv), tokens, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, cos,
        sin, slots, static_cast<T*>(q), static_cast<T*>(k_cache), static_cast<T*>(v_cache));
  });
  return cuda_status(cudaGetLastError(), "qkv_rope_store launch");
}

Status silu_mul_rows(const void* gu, int64_t rows, int64_t n, void* out, DType t) {
  if (rows <= 0 || n <= 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    silu_mul_rows_kernel<<<grid_for(rows * n), kRowThreads, 0, launch_stream()>>>(
        static_cast<const T*>(gu), rows, n, static_cast<T*>(out));
  });
  return cuda_status(cudaGetLastError(), "silu_mul_rows launch");
}

Status add_rows_at(void* x, const int32_t* rows, const void* delta, DType delta_t, int64_t count,
                   int64_t n, DType t) {
  if (Status s = check_rows(count, "add_rows_at"); !s.ok()) return s;
  if (count == 0) return ok_status();
  with_acts(t, delta_t, [&](auto a, auto b) {
    using T = decltype(a);
    using D = decltype(b);
    add_rows_at_kernel<<<count, kRowThreads, 0, launch_stream()>>>(static_cast<T*>(x), rows,
                                                                   static_cast<const D*>(delta), n);
  });
  return cuda_status(cudaGetLastError(), "add_rows_at launch");
}

Status set_rows_at(void* x, const int32_t* rows, const void* src, DType src_t, int64_t count,
                   int64_t n, DType t) {
  if (Status s = check_rows(count, "set_rows_at"); !s.ok()) return s;
  if (count == 0) return ok_status();
  with_acts(t, src_t, [&](auto a, auto b) {
    using T = decltype(a);
    using S = decltype(b);
    set_rows_at_kernel<<<count, kRowThreads, 0, launch_stream()>>>(static_cast<T*>(x), rows,
                                                                   static_cast<const S*>(src), n);
  });
  return cuda_status(cudaGetLastError(), "set_rows_at launch");
}

Status add_inplace(void* x, const void* delta, DType delta_t, int64_t count, DType t) {
  if (count <= 0) return ok_status();
  with_acts(t, delta_t, [&](auto a, auto d) {
    using T = decltype(a);
    using D = decltype(d);
    add_inplace_kernel<<<grid_for(count), kRowThreads, 0, launch_stream()>>>(
        static_cast<T*>(x), static_cast<const D*>(delta), count);
  });
  return cuda_status(cudaGetLastError(), "add_inplace launch");
}

Status patchify_rgb(const uint8_t* rgb, const float* lut, int64_t grid_h, int64_t grid_w,
                    int64_t patch, int64_t merge, int64_t temporal, void* out, DType t) {
  if (grid_h % merge != 0 || grid_w % merge != 0 || patch <= 0 || temporal <= 0) {
    return invalid_argument("patchify_rgb: bad grid");
  }
  const int64_t count = grid_h * grid_w * 3 * temporal * patch * patch;
  if (count <= 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    patchify_kernel<<<grid_for(count), kRowThreads, 0, launch_stream()>>>(
        rgb, lut, grid_w, patch, merge, temporal, count, static_cast<T*>(out));
  });
  return cuda_status(cudaGetLastError(), "patchify_rgb launch");
}

Status convert(const void* src, DType src_t, int64_t count, void* dst, DType dst_t) {
  if (count <= 0) return ok_status();
  with_acts(src_t, dst_t, [&](auto a, auto b) {
    using S = decltype(a);
    using D = decltype(b);
    convert_kernel<<<grid_for(count), kRowThreads, 0, launch_stream()>>>(
        static_cast<const S*>(src), count, static_cast<D*>(dst));
  });
  return cuda_status(cudaGetLastError(), "convert launch");
}

Status add_bias(void* x, const float* bias, int64_t rows, int64_t n, DType t) {
  if (Status s = check_rows(rows, "add_bias"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    add_bias_kernel<<<rows, kRowThreads, 0, launch_stream()>>>(static_cast<T*>(x), bias, n);
  });
  return cuda_status(cudaGetLastError(), "add_bias launch");
}

Status layer_norm(const void* x, const float* w, const float* b, int64_t rows, int64_t n, float eps,
                  void* y, DType t) {
  if (Status s = check_rows(rows, "layer_norm"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    layer_norm_kernel<<<rows, kRowThreads, 0, launch_stream()>>>(static_cast<const T*>(x), w, b, n,
                                                                 eps, static_cast<T*>(y));
  });
  return cuda_status(cudaGetLastError(), "layer_norm launch");
}

Status add_layer_norm(void* x, const void* delta, const float* bias, const float* w, const float* b,
                      int64_t rows, int64_t n, float eps, void* y, DType t) {
  if (Status s = check_rows(rows, "add_layer_norm"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    add_layer_norm_kernel<<<rows, kRowThreads, 0, launch_stream()>>>(
        static_cast<T*>(x), static_cast<const T*>(delta), bias, w, b, n, eps, static_cast<T*>(y));
  });
  return cuda_status(cudaGetLastError(), "add_layer_norm launch");
}

Status bias_gelu(void* x, const float* bias, int64_t rows, int64_t n, bool tanh, DType t) {
  if (Status s = check_rows(rows, "bias_gelu"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  with_act(t, [&](auto a) {
    using T = decltype(a);
    bias_gelu_kernel<<<rows, kRowThreads, 0, launch_stream()>>>(static_cast<T*>(x), bias, n, tanh);
  });
  return cuda_status(cudaGetLastError(), "bias_gelu launch");
}

Status attention_full(const void* q, const void* k, const void* v, int64_t n, int64_t n_heads,
                      int64_t n_kv_heads, int64_t head_dim, float scale, void* out, DType t) {
  if (head_dim <= 0 || head_dim > kMaxHeadDim) {
    return invalid_argument("attention: head_dim must be in 1..256");
  }
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) {
    return invalid_argument("attention: n_heads must be a multiple of n_kv_heads");
  }
  const int64_t rows = n * n_heads;
  if (Status s = check_rows(rows, "attention"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  const int64_t group = n_heads / n_kv_heads;
  with_act(t, [&](auto a) {
    using T = decltype(a);
    attention_kernel<<<warp_row_blocks(rows), kRowThreads, 0, launch_stream()>>>(
        static_cast<const T*>(q), n, static_cast<const T*>(k), static_cast<const T*>(v), n, n_heads,
        group, head_dim, scale, static_cast<T*>(out));
  });
  return cuda_status(cudaGetLastError(), "attention launch");
}

int64_t attention_splits(int64_t units, int64_t max_seen) {
  if (units >= kSplitRowLimit || max_seen <= 2 * kSplitMinKeys) return 1;
  const int64_t by_keys = (max_seen + kSplitMinKeys - 1) / kSplitMinKeys;
  const int64_t by_warps = (kSplitRowLimit + units - 1) / units;
  return std::min({by_keys, by_warps, kMaxSplits});
}

int64_t paged_attention_scratch_floats(int64_t head_dim) {
  return kSplitRowLimit * kMaxSplits * (head_dim + 2);
}

// Calls f with integral constants G ∈ {1, 2, 4, 8} and PER ∈ {1, 2, 4, 8} (values per lane:
// head_dim up to 32, 64, 128, 256), the smallest PER that holds `per`.
template <typename F>
void with_group_per(int g, int per, F&& f) {
  auto with_per = [&](auto gc) {
    if (per <= 1) return f(gc, std::integral_constant<int, 1>{});
    if (per <= 2) return f(gc, std::integral_constant<int, 2>{});
    if (per <= 4) return f(gc, std::integral_constant<int, 4>{});
    return f(gc, std::integral_constant<int, 8>{});
  };
  if (g == 8) return with_per(std::integral_constant<int, 8>{});
  if (g == 4) return with_per(std::integral_constant<int, 4>{});
  if (g == 2) return with_per(std::integral_constant<int, 2>{});
  return with_per(std::integral_constant<int, 1>{});
}

Status paged_attention(const void* q, int64_t tokens, const int32_t* tok_seq,
                       const int32_t* tok_pos, const int32_t* block_tables, int64_t table_stride,
                       int64_t block_size, const void* k_cache, const void* v_cache,
                       int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                       int64_t max_seen, float* partial, void* out, DType t) {
  if (head_dim <= 0 || head_dim > kMaxHeadDim) {
    return invalid_argument("paged_attention: head_dim must be in 1..256");
  }
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0) {
    return invalid_argument("paged_attention: n_heads must be a multiple of n_kv_heads");
  }
  if (block_size <= 0) return invalid_argument("paged_attention: block_size must be positive");
  const int64_t rows = tokens * n_heads;
  if (Status s = check_rows(rows * kMaxSplits, "paged_attention"); !s.ok()) return s;
  if (rows == 0) return ok_status();
  const int64_t group = n_heads / n_kv_heads;
  // G heads per warp: the whole GQA group when it is 2, 4 or 8 (K/V read once for all), else 1.
  const int g = group == 2 || group == 4 || group == 8 ? static_cast<int>(group) : 1;
  const int64_t splits = attention_splits(tokens * (n_heads / g), max_seen);
  if (splits > 1 && partial == nullptr) return invalid_argument("paged_attention: no scratch");
  const int per = static_cast<int>((head_dim + 31) / 32);
  with_act(t, [&](auto a) {
    using T = decltype(a);
    auto launch = [&](auto kernel, int gg) {
      kernel<<<warp_row_blocks(tokens * (n_heads / gg) * splits), kRowThreads, 0,
               launch_stream()>>>(static_cast<const T*>(q), tokens, tok_seq, tok_pos, block_tables,
                                  table_stride, block_size, static_cast<const T*>(k_cache),
                                  static_cast<const T*>(v_cache), n_heads, group, head_dim, scale,
                                  splits, partial, static_cast<T*>(out));
    };
    with_group_per(g, per, [&](auto gc, auto pc) {
      launch(paged_attention_kernel<T, decltype(gc)::value, decltype(pc)::value>,
             decltype(gc)::value);
    });
    if (splits > 1) {
      attention_combine_kernel<<<warp_row_blocks(rows), kRowThreads, 0, launch_stream()>>>(
          partial, rows, splits, head_dim, static_cast<T*>(out));
    }
  });
  return cuda_status(cudaGetLastError(), "paged_attention launch");
}

Status argmax_rows(const float* logits, int64_t rows, int64_t n, int32_t* ids) {
  if (Status s = check_rows(rows, "argmax_rows"); !s.ok()) return s;
  if (n <= 0 || n > 0x7fffffff) return invalid_argument("argmax_rows: bad row length");
  if (rows == 0) return ok_status();
  argmax_kernel<<<rows, kRowThreads, 0, launch_stream()>>>(logits, n, ids);
  return cuda_status(cudaGetLastError(), "argmax_rows launch");
}

Status embedding_gather(const void* table, DType table_t, const int32_t* ids, int64_t count,
                        int64_t n, void* out, DType out_t) {
  if (Status s = check_rows(count, "embedding_gather"); !s.ok()) return s;
  if (count == 0) return ok_status();
  with_acts(table_t, out_t, [&](auto a, auto b) {
    using Tt = decltype(a);
    using To = decltype(b);
    gather_kernel<<<count, kRowThreads, 0, launch_stream()>>>(static_cast<const Tt*>(table), ids, n,
                                                              static_cast<To*>(out));
  });
  return cuda_status(cudaGetLastError(), "embedding_gather launch");
}

}  // namespace vlm::cuda

// CUDA kernels for src/kernels/cuda/moe.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/runtime.h"

namespace vlm::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Whether (v, i) ranks before (u, j): the larger value, of equal values the lower index.
__device__ inline bool before(float v, int i, float u, int j) { return v > u || (v == u && i < j); }

// One warp per row: k passes of a warp-wide arg-max over the experts not yet taken.
__global__ void route_kernel(const float* logits, int64_t rows, int E, int k, bool renormalize,
                             int32_t* ids, float* weights) {
  __shared__ uint32_t taken[kWarps][kMoeMaxExperts / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (r >= rows) return;  // (whole warps leave together: no block-wide barrier follows)
  const float* l = logits + r * E;
  for (int w = lane; w < (E + 31) / 32; w += 32) taken[warp][w] = 0;
  __syncwarp();
  int my_id = 0;  // lane j keeps pick j
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int at = E;
    for (int e = lane; e < E; e += 32) {
      if (taken[warp][e >> 5] & (1u << (e & 31))) continue;
      const float v = isnan(l[e]) ? -INFINITY : l[e];
      if (at == E || before(v, e, best, at)) best = v, at = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_xor_sync(0xffffffffu, best, o);
      const int i = __shfl_xor_sync(0xffffffffu, at, o);
      if (i != E && (at == E || before(v, i, best, at))) best = v, at = i;
    }
    if (lane == 0) taken[warp][at >> 5] |= 1u << (at & 31);
    __syncwarp();
    if (lane == j) my_id = at;
  }
  // Softmax over all E (f32, the largest subtracted), then the chosen ones (renormalised).
  const float m = l[__shfl_sync(0xffffffffu, my_id, 0)];
  float part = 0.f;
  for (int e = lane; e < E; e += 32) part += expf(l[e] - m);
  const float sum = warp_sum(part);
  const float p = lane < k ? expf(l[my_id] - m) / sum : 0.f;
  const float chosen = warp_sum(p);
  if (lane < k) {
    ids[r * k + lane] = my_id;
    weights[r * k + lane] = renormalize ? p / chosen : p;
  }
}

__global__ void group_kernel(const int32_t* ids, int64_t pairs, int E, MoeGroups g) {
  __shared__ int count[kMoeMaxExperts];
  __shared__ int offset[kMoeMaxExperts + 1];
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int o = 0, t = 0;
    for (int e = 0; e < E; ++e) {
      offset[e] = o;
      g.offsets[e] = o;
      g.tile_start[e] = t;
      o += count[e];
      t += (count[e] + static_cast<int>(kMoeTileRows) - 1) / static_cast<int>(kMoeTileRows);
    }
    offset[E] = o;
    g.offsets[E] = o;
    g.tile_start[E] = t;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) count[e] = 0;  // now: filled so far
  __syncthreads();
  for (int64_t p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int e = ids[p];
    if (e >= 0 && e < E) g.order[offset[e] + atomicAdd(&count[e], 1)] = static_cast<int32_t>(p);
  }
}

__device__ inline float weight_at(const int8_t* w, int64_t i) { return static_cast<float>(w[i]); }
__device__ inline float weight_at(const float* w, int64_t i) { return w[i]; }
__device__ inline float weight_at(const __nv_bfloat16* w, int64_t i) {
  return __bfloat162float(w[i]);
}

// Block (tile, column block): warp w computes column n = blockIdx.y · kWarps + w of the tile's
// pairs. Each lane sums K products k = lane, lane + 32, … in order, then the warp adds its lanes
// in a fixed tree: a pair's value is the same in any tile.
template <typename X, typename W, typename Y>
__global__ void grouped_product_kernel(const X* x, bool gather, int k, MoeGroups g, int E,
                                       const void* const* wptr, const float* const* sptr, int64_t N,
                                       int64_t K, Y* y) {
  const int tile = static_cast<int>(blockIdx.x);
  if (tile >= g.tile_start[E]) return;
  int lo = 0, hi = E - 1;  // the expert e with tile_start[e] <= tile < tile_start[e + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (g.tile_start[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const int e = lo;
  const int i0 = g.offsets[e] + (tile - g.tile_start[e]) * static_cast<int>(kMoeTileRows);
  const int cnt = min(static_cast<int>(kMoeTileRows), g.offsets[e + 1] - i0);
  const int64_t n = static_cast<int64_t>(blockIdx.y) * kWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const int lane = threadIdx.x & 31;
  const W* wr = static_cast<const W*>(wptr[e]) + n * K;
  const X* xr[kMoeTileRows];
  int32_t pair[kMoeTileRows];
  for (int m = 0; m < static_cast<int>(kMoeTileRows); ++m) {
    pair[m] = m < cnt ? g.order[i0 + m] : g.order[i0];
    xr[m] = x + static_cast<int64_t>(gather ? pair[m] / k : pair[m]) * K;
  }
  float acc[kMoeTileRows] = {};
  for (int64_t c = lane; c < K; c += 32) {
    const float wv = weight_at(wr, c);
#pragma unroll
    for (int m = 0; m < static_cast<int>(kMoeTileRows); ++m) acc[m] += wv * load(xr[m], c);
  }
  const float s = sptr != nullptr ? sptr[e][n] : 1.f;
#pragma unroll
  for (int m = 0; m < static_cast<int>(kMoeTileRows); ++m) {
    const float v = warp_sum(acc[m]);
    if (lane == 0 && m < cnt) store(y, static_cast<int64_t>(pair[m]) * N + n, v * s);
  }
}

template <typename T>
__global__ void combine_kernel(const float* y, const int32_t* ids, const float* weights, int k,
                               int E, int64_t n, T* out) {
  const int64_t r = blockIdx.x;
  int order[32];
  for (int j = 0; j < k; ++j) {  // the row's experts in increasing index (insertion sort)
    int at = j;
    for (; at > 0 && ids[r * k + order[at - 1]] > ids[r * k + j]; --at) order[at] = order[at - 1];
    order[at] = j;
  }
  for (int64_t d = threadIdx.x; d < n; d += blockDim.x) {
    float s = 0.f;
    for (int i = 0; i < k; ++i) {
      const int j = order[i];
      if (ids[r * k + j] < 0 || ids[r * k + j] >= E) continue;  // (not grouped: y never written)
      s += weights[r * k + j] * y[(r * k + j) * n + d];
    }
    store(out, r * n + d, s);
  }
}

int64_t align256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

Status moe_route(const float* logits, int64_t rows, int64_t E, int64_t k, bool renormalize,
                 int32_t* ids, float* weights) {
  if (E <= 0 || E > kMoeMaxExperts) return invalid_argument("moe_route: experts outside [1, 1024]");
  if (k <= 0 || k > std::min<int64_t>(E, 32)) {
    return invalid_argument("moe_route: top_k outside [1, min(experts, 32)]");
  }
  if (rows <= 0) return ok_status();
  const auto blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  route_kernel<<<blocks, kThreads, 0, launch_stream()>>>(
      logits, rows, static_cast<int>(E), static_cast<int>(k), renormalize, ids, weights);
  return cuda_status(cudaGetLastError(), "moe_route launch");
}

int64_t moe_groups_bytes(int64_t E, int64_t pairs) {
  return 2 * align256((E + 1) * 4) + align256(pairs * 4);
}

MoeGroups moe_groups_at(void* mem, int64_t E, int64_t pairs) {
  (void)pairs;
  auto* b = static_cast<char*>(mem);
  MoeGroups g{};
  g.offsets = reinterpret_cast<int32_t*>(b);
  g.tile_start = reinterpret_cast<int32_t*>(b + align256((E + 1) * 4));
  g.order = reinterpret_cast<int32_t*>(b + 2 * align256((E + 1) * 4));
  return g;
}

Status moe_group(const int32_t* ids, int64_t pairs, int64_t E, const MoeGroups& g) {
  if (E <= 0 || E > kMoeMaxExperts) return invalid_argument("moe_group: experts outside [1, 1024]");
  if (pairs > (int64_t{1} << 30)) return invalid_argument("moe_group: too many pairs");
  group_kernel<<<1, 1024, 0, launch_stream()>>>(ids, pairs, static_cast<int>(E), g);
  return cuda_status(cudaGetLastError(), "moe_group launch");
}

Status moe_grouped_product(const void* x, DType x_t, bool gather, int64_t k, const MoeGroups& g,
                           int64_t E, int64_t pairs, const MoeWeights& w, int64_t N, int64_t K,
                           void* y, DType y_t) {
  if (pairs <= 0 || N <= 0 || K <= 0) return ok_status();
  if (E <= 0 || E > kMoeMaxExperts)
    return invalid_argument("moe product: experts outside [1, 1024]");
  // At most one partial tile per expert beyond the full ones.
  const int64_t tiles = pairs / kMoeTileRows + std::min(E, pairs);
  const int64_t column_blocks = (N + kWarps - 1) / kWarps;
  if (column_blocks > 65535) return invalid_argument("moe product: N past one grid's columns");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(column_blocks));
  with_acts(x_t, y_t, [&](auto a, auto b) {
    using X = decltype(a);
    using Y = decltype(b);
    const auto* xs = static_cast<const X*>(x);
    auto* ys = static_cast<Y*>(y);
    const int ki = static_cast<int>(k), Ei = static_cast<int>(E);
    if (w.int8) {
      grouped_product_kernel<X, int8_t, Y>
          <<<grid, kThreads, 0, launch_stream()>>>(xs, gather, ki, g, Ei, w.w, w.scale, N, K, ys);
    } else {
      grouped_product_kernel<X, X, Y>
          <<<grid, kThreads, 0, launch_stream()>>>(xs, gather, ki, g, Ei, w.w, nullptr, N, K, ys);
    }
  });
  return cuda_status(cudaGetLastError(), "moe product launch");
}

Status moe_combine(const float* y, const int32_t* ids, const float* weights, int64_t rows,
                   int64_t k, int64_t E, int64_t n, void* out, DType t) {
  if (k <= 0 || k > 32) return invalid_argument("moe_combine: top_k outside [1, 32]");
  if (rows <= 0) return ok_status();
  if (rows > 2147483647) return invalid_argument("moe_combine: too many rows");
  with_act(t, [&](auto a) {
    using T = decltype(a);
    combine_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, launch_stream()>>>(
        y, ids, weights, static_cast<int>(k), static_cast<int>(E), n, static_cast<T*>(out));
  });
  return cuda_status(cudaGetLastError(), "moe_combine launch");
}

}  // namespace vlm::cuda

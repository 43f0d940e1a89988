// Sampling kernels (src/kernels/cuda/sampling.h). One CTA of 1024 threads per row: block reductions
// for the max and the sums, a radix select for the top-k threshold, a bit-by-bit search for the
// top-p threshold, and a block scan over contiguous id ranges for the draw.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/sampling.h"

namespace vlm::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// Order-preserving map of floats to unsigned keys (larger float, larger key).
__device__ inline uint32_t key_of(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

struct Shared {
  float f[kWarps];
  int32_t i[kWarps];
  uint32_t hist[256];
  float scan[kThreads];
  uint32_t value;
  int32_t chosen;
};

__device__ float block_sum(Shared& sh, float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) sh.f[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int w = 0; w < kWarps; ++w) s += sh.f[w];
  return s;
}

// The largest value and its lowest index.
__device__ void block_argmax(Shared& sh, float* v, int32_t* idx) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, *idx, o);
    if (ov > *v || (ov == *v && oi < *idx)) {
      *v = ov;
      *idx = oi;
    }
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    sh.f[threadIdx.x >> 5] = *v;
    sh.i[threadIdx.x >> 5] = *idx;
  }
  __syncthreads();
  *v = sh.f[0];
  *idx = sh.i[0];
  for (int w = 1; w < kWarps; ++w) {
    if (sh.f[w] > *v || (sh.f[w] == *v && sh.i[w] < *idx)) {
      *v = sh.f[w];
      *idx = sh.i[w];
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(float* logits, int64_t V, const SampleParams* params,
                  const PenaltyEntry* penalties, int32_t* ids) {
  __shared__ Shared sh;
  const SampleParams p = params[blockIdx.x];
  float* l = logits + static_cast<int64_t>(p.row) * V;
  const int tid = threadIdx.x;

  // 1. Penalties (distinct ids: no two threads touch one logit); NaN never wins.
  for (int32_t e = p.penalty_begin + tid; e < p.penalty_end; e += kThreads) {
    const PenaltyEntry pe = penalties[e];
    float x = l[pe.id];
    x = x < 0 ? x * pe.repetition : x / pe.repetition;
    l[pe.id] = x - pe.subtract;
  }
  __syncthreads();
  auto logit = [&](int64_t i) {
    const float x = l[i];
    return isnan(x) ? -INFINITY : x;
  };

  // 2. The largest logit (the fallback pick) and the top-k threshold (the k-th largest logit,
  //    by a radix select over the keys, 8 bits a pass).
  float mx = -INFINITY;
  int32_t arg = 0x7fffffff;
  for (int64_t i = tid; i < V; i += kThreads) {
    const float x = logit(i);
    if (x > mx || (x == mx && i < arg)) {
      mx = x;
      arg = static_cast<int32_t>(i);
    }
  }
  block_argmax(sh, &mx, &arg);
  uint32_t kth_key = 0;  // keep logits whose key >= kth_key
  if (p.top_k > 0 && p.top_k < V) {
    uint32_t prefix = 0, mask = 0;
    int32_t remaining = p.top_k;
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = tid; b < 256; b += kThreads) sh.hist[b] = 0;
      __syncthreads();
      for (int64_t i = tid; i < V; i += kThreads) {
        const uint32_t k = key_of(logit(i));
        if ((k & mask) == prefix) atomicAdd(&sh.hist[(k >> shift) & 255u], 1u);
      }
      __syncthreads();
      if (tid == 0) {
        uint32_t acc = 0, pick = 0;
        for (int b = 255; b >= 0; --b) {
          if (acc + sh.hist[b] >= static_cast<uint32_t>(remaining)) {
            pick = static_cast<uint32_t>(b);
            break;
          }
          acc += sh.hist[b];
        }
        sh.value = pick;
        sh.chosen = remaining - static_cast<int32_t>(acc);
      }
      __syncthreads();
      prefix |= sh.value << shift;
      mask |= 255u << shift;
      remaining = sh.chosen;
      __syncthreads();
    }
    kth_key = prefix;
  }
  const float smax = mx * p.inv_temperature;
  auto weight = [&](int64_t i, uint32_t min_key) {  // exp(s − s_max) of a kept token, else 0
    const float x = logit(i);
    if (key_of(x) < min_key || x == -INFINITY) return 0.f;
    return expf(x * p.inv_temperature - smax);
  };

  // 3. Top-p: the largest key t whose tokens (key >= t, within top-k) hold at least top_p of the
  //    mass, built bit by bit from the top.
  uint32_t min_key = kth_key;
  if (p.top_p < 1.f) {
    float z = 0.f;
    for (int64_t i = tid; i < V; i += kThreads) z += weight(i, kth_key);
    z = block_sum(sh, z);
    const float need = p.top_p * z;
    uint32_t t = 0;
    for (int bit = 31; bit >= 0; --bit) {
      const uint32_t cand = t | (1u << bit);
      if (cand < kth_key) {  // below the top-k threshold the mass does not grow
        t = cand;
        continue;
      }
      float m = 0.f;
      for (int64_t i = tid; i < V; i += kThreads) m += weight(i, cand);
      m = block_sum(sh, m);
      if (m >= need) t = cand;
    }
    min_key = t > kth_key ? t : kth_key;
  }

  // 4. Min-p (relative to the best token) and the draw, walking contiguous id ranges in order.
  const int64_t per = (V + kThreads - 1) / kThreads;
  const int64_t lo = tid * per, hi = lo + per < V ? lo + per : V;
  auto final_weight = [&](int64_t i) {
    const float w = weight(i, min_key);
    return w >= p.min_p ? w : 0.f;
  };
  float local = 0.f;
  for (int64_t i = lo; i < hi; ++i) local += final_weight(i);
  sh.scan[tid] = local;
  __syncthreads();
  for (int o = 1; o < kThreads; o <<= 1) {  // inclusive scan (Hillis–Steele)
    const float add = tid >= o ? sh.scan[tid - o] : 0.f;
    __syncthreads();
    sh.scan[tid] += add;
    __syncthreads();
  }
  const float total = sh.scan[kThreads - 1];
  if (tid == 0) sh.chosen = 0x7fffffff;
  __syncthreads();
  float r = p.u * total - (sh.scan[tid] - local);  // what is left of the draw at this range
  if (r >= 0.f && r < local) {
    for (int64_t i = lo; i < hi; ++i) {
      const float w = final_weight(i);
      if (w == 0.f) continue;
      r -= w;
      if (r < 0.f) {
        atomicMin(&sh.chosen, static_cast<int32_t>(i));
        break;
      }
    }
  }
  __syncthreads();
  if (tid == 0) ids[blockIdx.x] = sh.chosen != 0x7fffffff ? sh.chosen : arg;
}

}  // namespace

Status sample_rows(float* logits, int64_t vocab, const SampleParams* params, int64_t n,
                   const PenaltyEntry* penalties, int32_t* ids) {
  if (n <= 0) return ok_status();
  if (vocab <= 0 || vocab > 0x7fffffff || n > 0x7fffffff) {
    return invalid_argument("sample_rows: bad shape");
  }
  sample_kernel<<<static_cast<unsigned>(n), kThreads, 0, launch_stream()>>>(logits, vocab, params,
                                                                            penalties, ids);
  return cuda_status(cudaGetLastError(), "sample_rows launch");
}

}  // namespace vlm::cuda

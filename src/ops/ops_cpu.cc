// CPU implementations of the small ops and attention: the per-ISA kernel tables are picked here
// (kernels/cpu/eltwise.h, attention.h); embedding lookup and bias add stay plain loops.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/eltwise.h"
#include "kernels/cpu/ggml_blocks.h"
#include "kernels/cpu/hybrid.h"
#include "kernels/cpu/matmul.h"
#include "ops/ops.h"
#include "ops/ref/ref.h"

namespace vlm::ops {
namespace {

// The element-wise kernels of one ISA level: the one place that picks them.
const kernels::EltwiseKernels& eltwise(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Vnni:
      return kernels::avx512::eltwise_kernels();
    case Isa::kAvx2:
    case Isa::kAvx2Vnni:
      return kernels::avx2::eltwise_kernels();
    case Isa::kGeneric:
      break;
  }
#endif
  return kernels::generic::eltwise_kernels();
}

// NOTE(vlm): below ~32 K floats per thread, waking the pool costs more than the work saves, so
// a decode step's single rows (and small prefill chunks) run on the calling thread.
constexpr int64_t kMinFloatsPerThread = 32 * 1024;

// fn(r0, r1) over row ranges of [0, rows) of n floats each, split over the pool.
template <class F>
void for_rows(ThreadPool& pool, int64_t rows, int64_t n, const F& fn) {
  const int64_t grain = std::max<int64_t>(1, kMinFloatsPerThread / std::max<int64_t>(n, 1));
  if (rows <= grain) {
    fn(0, rows);
    return;
  }
  pool.parallel_for(rows, grain, [&](int64_t r0, int64_t r1, int) { fn(r0, r1); });
}

}  // namespace

// Qwen3.5's hybrid-layer kernels of one ISA level.
const kernels::HybridKernels& hybrid_kernels(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Vnni:
      return kernels::avx512::hybrid_kernels();
    case Isa::kAvx2:
    case Isa::kAvx2Vnni:
      return kernels::avx2::hybrid_kernels();
    case Isa::kGeneric:
      break;
  }
#endif
  return kernels::generic::hybrid_kernels();
}

float logsumexp(const float* x, int64_t n, float at, int64_t* above, Isa isa) {
  float lse = 0;
  eltwise(isa).logsumexp_count(x, n, at, &lse, above);
  return lse;
}

void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y,
              ThreadPool& pool, Isa isa) {
  const auto k = eltwise(isa).rms_norm;
  for_rows(pool, rows, n,
           [&](int64_t r0, int64_t r1) { k(x + r0 * n, w, r1 - r0, n, eps, y + r0 * n); });
}

void add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t n, float eps,
                  float* y, ThreadPool& pool, Isa isa) {
  const auto k = eltwise(isa).add_rms_norm;
  for_rows(pool, rows, n, [&](int64_t r0, int64_t r1) {
    k(x + r0 * n, delta + r0 * n, w, r1 - r0, n, eps, y + r0 * n);
  });
}

void layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t n, float eps,
                float* y, ThreadPool& pool, Isa isa) {
  const auto k = eltwise(isa).layer_norm;
  for_rows(pool, rows, n,
           [&](int64_t r0, int64_t r1) { k(x + r0 * n, w, b, r1 - r0, n, eps, y + r0 * n); });
}

void add_layer_norm(float* x, const float* delta, const float* delta_bias, const float* w,
                    const float* b, int64_t rows, int64_t n, float eps, float* y, ThreadPool& pool,
                    Isa isa) {
  const auto k = eltwise(isa).add_layer_norm;
  for_rows(pool, rows, n, [&](int64_t r0, int64_t r1) {
    k(x + r0 * n, delta + r0 * n, delta_bias, w, b, r1 - r0, n, eps, y + r0 * n);
  });
}

void add_residual(float* x, const float* delta, const float* delta_bias, int64_t rows, int64_t n,
                  ThreadPool& pool, Isa isa) {
  const auto k = eltwise(isa).add_rows;
  for_rows(pool, rows, n,
           [&](int64_t r0, int64_t r1) { k(x + r0 * n, delta + r0 * n, delta_bias, r1 - r0, n); });
}

void gelu_tanh(float* y, const float* bias, int64_t rows, int64_t n, ThreadPool& pool, Isa isa) {
  const auto k = eltwise(isa).gelu_tanh;
  for_rows(pool, rows, n, [&](int64_t r0, int64_t r1) { k(y + r0 * n, bias, r1 - r0, n); });
}

void gelu_erf(float* y, const float* bias, int64_t rows, int64_t n, ThreadPool& pool, Isa isa) {
  const auto k = eltwise(isa).gelu_erf;
  for_rows(pool, rows, n, [&](int64_t r0, int64_t r1) { k(y + r0 * n, bias, r1 - r0, n); });
}

void silu_mul(const float* gate, const float* up, int64_t count, float* out, ThreadPool& pool,
              Isa isa) {
  // Split in runs of 1024 (a multiple of every vector width) treated as rows.
  constexpr int64_t kRun = 1024;
  const auto k = eltwise(isa).silu_mul;
  for_rows(pool, (count + kRun - 1) / kRun, kRun, [&](int64_t r0, int64_t r1) {
    const int64_t i0 = r0 * kRun, i1 = std::min(count, r1 * kRun);
    k(gate + i0, up + i0, i1 - i0, out + i0);
  });
}

void rope_neox(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* cos,
               const float* sin, ThreadPool& pool, Isa isa) {
  const int64_t half = head_dim / 2, row = n_heads * head_dim;
  const auto k = eltwise(isa).rope_neox;
  for_rows(pool, tokens, row, [&](int64_t t0, int64_t t1) {
    k(x + t0 * row, t1 - t0, n_heads, head_dim, cos + t0 * half, sin + t0 * half);
  });
}

void qk_norm_rope(float* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                  float eps, const float* cos, const float* sin, ThreadPool& pool, Isa isa) {
  const int64_t half = head_dim / 2, row = n_heads * head_dim;
  const auto k = eltwise(isa).qk_norm_rope;
  for_rows(pool, tokens, row, [&](int64_t t0, int64_t t1) {
    k(x + t0 * row, t1 - t0, n_heads, head_dim, w, eps, cos + t0 * half, sin + t0 * half);
  });
}

bool kv_type_supported(DType type) {
  return type == DType::kF32 || type == DType::kBF16 || type == DType::kI8;
}

// NOTE(vlm): INT8 K/V take one scale per row and KV head (max |x| / 127, round half to even, as
// the weights' INT8): a head's values share a rotary-normed scale, and a per-token scale is set
// once, when the token is stored, so a block never needs requantizing as it fills.
void store_kv_row(const float* src, int64_t n_kv_heads, int64_t head_dim, DType type, void* data,
                  float* scale, int64_t row) {
  const int64_t n = n_kv_heads * head_dim;
  switch (type) {
    case DType::kF32:
      std::copy_n(src, n, static_cast<float*>(data) + row * n);
      return;
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(data) + row * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::kI8: {
      int8_t* dst = static_cast<int8_t*>(data) + row * n;
      for (int64_t h = 0; h < n_kv_heads; ++h) {
        const float* x = src + h * head_dim;
        float amax = 0.f;
        for (int64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::abs(x[d]));
        const float s = amax / 127.f;
        scale[row * n_kv_heads + h] = s;
        const float inv = s > 0 ? 1.f / s : 0.f;
        for (int64_t d = 0; d < head_dim; ++d) {
          const float v = std::nearbyint(x[d] * inv);  // half to even (default rounding mode)
          dst[h * head_dim + d] = static_cast<int8_t>(std::clamp(v, -127.f, 127.f));
        }
      }
      return;
    }
    default:
      return;
  }
}

void load_kv_head(const void* data, const float* scale, DType type, int64_t n_kv_heads,
                  int64_t head_dim, int64_t row, int64_t kvh, float* out) {
  const int64_t off = row * n_kv_heads * head_dim + kvh * head_dim;
  switch (type) {
    case DType::kF32:
      std::copy_n(static_cast<const float*>(data) + off, head_dim, out);
      return;
    case DType::kBF16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + off;
      for (int64_t d = 0; d < head_dim; ++d) out[d] = bf16_to_f32(p[d]);
      return;
    }
    case DType::kI8: {
      const int8_t* p = static_cast<const int8_t*>(data) + off;
      const float s = scale[row * n_kv_heads + kvh];
      for (int64_t d = 0; d < head_dim; ++d) out[d] = static_cast<float>(p[d]) * s;
      return;
    }
    default:
      return;
  }
}

void qkv_rope_store(float* qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                    int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                    const float* cos, const float* sin, const int32_t* slots, float* q,
                    const KvPool& cache, ThreadPool& pool, Isa isa) {
  const int64_t half = head_dim / 2, qd = n_heads * head_dim, kvd = n_kv_heads * head_dim;
  const int64_t row = qd + 2 * kvd;
  const auto k = eltwise(isa).qk_norm_rope;
  for_rows(pool, tokens, row, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* src = qkv + t * row;
      k(src, 1, n_heads, head_dim, q_norm, eps, cos + t * half, sin + t * half);
      k(src + qd, 1, n_kv_heads, head_dim, k_norm, eps, cos + t * half, sin + t * half);
      const int64_t slot = slots[t];
      std::copy_n(src, qd, q + t * qd);
      store_kv_row(src + qd, n_kv_heads, head_dim, cache.type, cache.k, cache.k_scale, slot);
      store_kv_row(src + qd + kvd, n_kv_heads, head_dim, cache.type, cache.v, cache.v_scale, slot);
    }
  });
}

void qkv_gated_rope_store(float* qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                          int64_t head_dim, int64_t rotary_dim, const float* q_norm,
                          const float* k_norm, float eps, const float* cos, const float* sin,
                          const int32_t* slots, float* q, float* gate, const KvPool& cache,
                          ThreadPool& pool, Isa isa) {
  const int64_t half = rotary_dim / 2, qd = n_heads * head_dim, kvd = n_kv_heads * head_dim;
  const int64_t row = 2 * qd + 2 * kvd;
  const auto k = hybrid_kernels(isa).qk_norm_rope_partial;
  for_rows(pool, tokens, row, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* src = qkv + t * row;
      float* qt = q + t * qd;
      for (int64_t h = 0; h < n_heads; ++h) {
        std::copy_n(src + 2 * h * head_dim, head_dim, qt + h * head_dim);
        std::copy_n(src + (2 * h + 1) * head_dim, head_dim, gate + t * qd + h * head_dim);
      }
      k(qt, n_heads, head_dim, head_dim, rotary_dim, q_norm, eps, cos + t * half, sin + t * half);
      float* kv = src + 2 * qd;
      k(kv, n_kv_heads, head_dim, head_dim, rotary_dim, k_norm, eps, cos + t * half,
        sin + t * half);
      store_kv_row(kv, n_kv_heads, head_dim, cache.type, cache.k, cache.k_scale, slots[t]);
      store_kv_row(kv + kvd, n_kv_heads, head_dim, cache.type, cache.v, cache.v_scale, slots[t]);
    }
  });
}

namespace {

// softplus as torch computes it (threshold 20: x itself above).
float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// Per row of a Gated DeltaNet batch: q and k L2-normalised in place in mixed (q times 1/√dk), and
// g, β of each value head after the conv output.
void delta_gates(const float* proj, int64_t proj_stride, int64_t rows, const DeltaNetShape& s,
                 const float* a_log, const float* dt_bias, float* mixed, ThreadPool& pool,
                 Isa isa) {
  const int64_t C = s.conv_dim(), ms = s.mixed_dim(), zb = C + s.nv * s.dv;
  const auto l2 = hybrid_kernels(isa).l2norm_rows;
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(s.dk));
  for_rows(pool, rows, ms, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* m = mixed + r * ms;
      l2(m, s.nk, s.dk, s.dk, q_scale);
      l2(m + s.nk * s.dk, s.nk, s.dk, s.dk, 1.0f);
      const float* b = proj + r * proj_stride + zb;
      const float* a = b + s.nv;
      for (int64_t h = 0; h < s.nv; ++h) {
        m[C + h] = -std::exp(a_log[h]) * softplus(a[h] + dt_bias[h]);
        m[C + s.nv + h] = 1.0f / (1.0f + std::exp(-b[h]));
      }
    }
  });
}

}  // namespace

void gated_delta_net(const float* proj, int64_t proj_stride, const DeltaNetSeq* seqs,
                     int64_t n_seqs, const DeltaNetShape& s, const float* conv_w,
                     const float* a_log, const float* dt_bias, float* mixed, float* out,
                     ThreadPool& pool, Isa isa, int64_t chunk) {
  const kernels::HybridKernels& k = hybrid_kernels(isa);
  const int64_t C = s.conv_dim(), ms = s.mixed_dim(), od = s.nv * s.dv;
  int64_t rows = 0;
  for (int64_t i = 0; i < n_seqs; ++i) rows = std::max(rows, seqs[i].row + seqs[i].len);
  // (A chunk longer than the batch would only size the scratch for tokens that are not there.)
  chunk =
      std::clamp<int64_t>(chunk <= 0 ? kernels::kDeltaChunk : chunk, 1, std::max<int64_t>(rows, 1));
  // The conv1d per sequence and block of channels (a fresh sequence from a zero window), so that
  // one sequence's prefill runs on every thread.
  constexpr int64_t kConvBlock = 512;
  const int64_t blocks = (C + kConvBlock - 1) / kConvBlock;
  pool.parallel_for(n_seqs * blocks, 1, [&](int64_t j0, int64_t j1, int) {
    for (int64_t j = j0; j < j1; ++j) {
      const DeltaNetSeq& q = seqs[j / blocks];
      const int64_t c0 = (j % blocks) * kConvBlock, c1 = std::min(C, c0 + kConvBlock);
      if (q.fresh) {
        for (int64_t r = 0; r + 1 < s.kernel; ++r)
          std::fill(q.conv + r * C + c0, q.conv + r * C + c1, 0.f);
      }
      if (q.token_states == nullptr) {
        k.conv1d_silu(proj + q.row * proj_stride, proj_stride, q.len, C, c0, c1, s.kernel, conv_w,
                      q.conv, mixed + q.row * ms, ms);
        continue;
      }
      for (int64_t t = 0; t < q.len; ++t) {  // token by token, each window kept but the last
        k.conv1d_silu(proj + (q.row + t) * proj_stride, proj_stride, 1, C, c0, c1, s.kernel, conv_w,
                      q.conv, mixed + (q.row + t) * ms, ms);
        if (t + 1 == q.len) break;
        float* dst = q.token_states + t * s.state_floats();
        for (int64_t r = 0; r + 1 < s.kernel; ++r) {
          std::copy(q.conv + r * C + c0, q.conv + r * C + c1, dst + r * C + c0);
        }
      }
    }
  });
  delta_gates(proj, proj_stride, rows, s, a_log, dt_bias, mixed, pool, isa);
  // The delta rule per (sequence, value head).
  thread_local PerThreadBuffers scratch_tls;
  PerThreadBuffers& scratch = scratch_tls;
  scratch.reserve(pool.n_threads(),
                  static_cast<size_t>(kernels::delta_chunk_scratch(s.dk, s.dv, chunk) + s.dv));
  pool.parallel_for(n_seqs * s.nv, 1, [&](int64_t j0, int64_t j1, int thread) {
    float* buf = scratch.get(thread);
    for (int64_t j = j0; j < j1; ++j) {
      const DeltaNetSeq& q = seqs[j / s.nv];
      const int64_t h = j % s.nv;
      const float* m = mixed + q.row * ms;
      kernels::DeltaInputs in;
      in.q = m + s.key_head(h) * s.dk;
      in.k = in.q + s.nk * s.dk;
      in.v = m + 2 * s.nk * s.dk + h * s.dv;
      in.g = m + C + h;
      in.beta = m + C + s.nv + h;
      in.qk_stride = in.v_stride = in.gb_stride = ms;
      float* S = q.state + h * s.dk * s.dv;
      if (q.fresh) std::fill_n(S, s.dk * s.dv, 0.f);
      float* o = out + q.row * od + h * s.dv;
      if (q.token_states != nullptr) {  // token by token, each state kept but the last
        for (int64_t t = 0; t < q.len; ++t) {
          kernels::DeltaInputs c = in;
          for (const float** p : {&c.q, &c.k, &c.v, &c.g, &c.beta}) *p += t * ms;
          k.delta_rule_recurrent(c, 1, s.dk, s.dv, S, o + t * od, od, buf);
          if (t + 1 < q.len) {
            std::copy_n(S, s.dk * s.dv,
                        q.token_states + t * s.state_floats() + s.conv_state() + h * s.dk * s.dv);
          }
        }
        continue;
      }
      if (q.len == 1 || chunk == 1) {
        k.delta_rule_recurrent(in, q.len, s.dk, s.dv, S, o, od, buf);
        continue;
      }
      for (int64_t t0 = 0; t0 < q.len; t0 += chunk) {
        const int64_t n = std::min(chunk, q.len - t0);
        kernels::DeltaInputs c = in;
        for (const float** p : {&c.q, &c.k, &c.v, &c.g, &c.beta}) *p += t0 * ms;
        k.delta_rule_chunk(c, n, s.dk, s.dv, S, o + t0 * od, od, buf);
      }
    }
  });
}

void gated_rms_norm(const float* x, const float* z, int64_t z_stride, int64_t rows, int64_t heads,
                    int64_t n, const float* w, float eps, float* y, ThreadPool& pool, Isa isa) {
  const auto k = hybrid_kernels(isa).gated_rms_norm;
  for_rows(pool, rows, heads * n, [&](int64_t r0, int64_t r1) {
    k(x + r0 * heads * n, z + r0 * z_stride, z_stride, heads, (r1 - r0) * heads, n, w, eps,
      y + r0 * heads * n);
  });
}

void sigmoid_mul(float* x, const float* g, int64_t g_stride, int64_t rows, int64_t n,
                 ThreadPool& pool, Isa isa) {
  const auto k = hybrid_kernels(isa).sigmoid_mul;
  for_rows(pool, rows, n,
           [&](int64_t r0, int64_t r1) { k(x + r0 * n, g + r0 * g_stride, g_stride, r1 - r0, n); });
}

void silu_mul_rows(const float* gu, int64_t rows, int64_t n, float* out, ThreadPool& pool,
                   Isa isa) {
  const auto k = eltwise(isa).silu_mul;
  for_rows(pool, rows, 2 * n, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) k(gu + r * 2 * n, gu + r * 2 * n + n, n, out + r * n);
  });
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * n;
    for (int64_t i = 0; i < n; ++i) yr[i] += bias[i];
  }
}

void embedding_lookup(const TensorView& table, const int32_t* ids, int64_t count, float* out) {
  const int64_t n = table.dim(1);
  for (int64_t i = 0; i < count; ++i) {
    float* o = out + i * n;
    const int64_t row = ids[i];
    switch (table.dtype) {
      case DType::kF32: {
        const float* src = static_cast<const float*>(table.data) + row * n;
        std::copy(src, src + n, o);
        break;
      }
      case DType::kBF16: {
        const uint16_t* src = static_cast<const uint16_t*>(table.data) + row * n;
        for (int64_t j = 0; j < n; ++j) o[j] = bf16_to_f32(src[j]);
        break;
      }
      case DType::kF16: {
        const uint16_t* src = static_cast<const uint16_t*>(table.data) + row * n;
        for (int64_t j = 0; j < n; ++j) o[j] = f16_to_f32(src[j]);
        break;
      }
      case DType::kI4:  // a GGUF Q4_0 table repacked: (q - zero) * scale, exactly
        for (int64_t j = 0; j < n; ++j) {
          o[j] = static_cast<float>(ref::int4_at(table, row, j) - ref::int4_zero(table, row, j)) *
                 ref::int4_scale(table, row, j);
        }
        break;
      case DType::kQ8_0:
      case DType::kQ4K:
      case DType::kQ5K:
      case DType::kQ6K:
        kernels::dequantize_rows_ggml(table.dtype, table.data, n, row, row + 1, o);
        break;
      default:
        std::fill(o, o + n, 0.f);  // rejected at load time; never reached
        break;
    }
  }
}

namespace {

using AttendFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t,
                          float, float*);

// Scalar online-softmax attention of one query row against keys [0, n_keys): running max m, running
// sum l and an f32 accumulator o, so memory stays O(head_dim) whatever the context length.
inline void attend_row(const float* qv, const float* k, const float* v, int64_t kv_stride,
                       int64_t n_keys, int64_t head_dim, float scale, float* o) {
  std::fill(o, o + head_dim, 0.f);
  float m = -INFINITY;
  float l = 0.f;
  for (int64_t j = 0; j < n_keys; ++j) {
    const float* kv = k + j * kv_stride;
    float s = 0.f;
    for (int64_t d = 0; d < head_dim; ++d) s += qv[d] * kv[d];
    s *= scale;
    const float* vv = v + j * kv_stride;
    if (s > m) {
      const float corr = std::exp(m - s);  // exp(-inf) = 0 on the first key
      l = l * corr + 1.f;
      for (int64_t d = 0; d < head_dim; ++d) o[d] = o[d] * corr + vv[d];
      m = s;
    } else {
      const float p = std::exp(s - m);
      l += p;
      for (int64_t d = 0; d < head_dim; ++d) o[d] += p * vv[d];
    }
  }
  const float inv = 1.f / l;
  for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
}

// The attention kernels of one ISA level: the one place that picks them.
struct AttentionKernels {
  AttendFn attend_row;
  void (*attend_row_paged)(const float*, const kernels::KvRows&, const kernels::KvRows&,
                           const int32_t*, int64_t, int64_t, int64_t, float, float*);
  float (*softmax_exp_row)(float*, int64_t, float);
  void (*attend_group_partial)(const float*, int64_t, const kernels::KvRows&,
                               const kernels::KvRows&, const int32_t*, int64_t, int64_t, int64_t,
                               int64_t, float, float*, int64_t);
  // The blocked paths' GEMMs against K and V packed once per head (kernels/cpu/matmul.h).
  void (*pack_b_rows)(const float*, int64_t, int64_t, int64_t, float*);
  void (*pack_b_cols)(const float*, int64_t, int64_t, int64_t, float*);
  void (*matmul_prepacked)(const float*, int64_t, int64_t, int64_t, const float*, int64_t, int64_t,
                           float*, int64_t);
};

const AttentionKernels& attention_kernels(Isa isa) {
  static const AttentionKernels kGeneric = {
      &kernels::generic::attend_row,      &kernels::generic::attend_row_paged,
      &kernels::generic::softmax_exp_row, &kernels::generic::attend_group_partial,
      &kernels::generic::pack_b_rows,     &kernels::generic::pack_b_cols,
      &kernels::generic::matmul_prepacked};
#if defined(VLM_HAVE_X86_DISPATCH)
  static const AttentionKernels kAvx2 = {
      &kernels::avx2::attend_row,      &kernels::avx2::attend_row_paged,
      &kernels::avx2::softmax_exp_row, &kernels::avx2::attend_group_partial,
      &kernels::avx2::pack_b_rows,     &kernels::avx2::pack_b_cols,
      &kernels::avx2::matmul_prepacked};
  static const AttentionKernels kAvx512 = {
      &kernels::avx512::attend_row,      &kernels::avx512::attend_row_paged,
      &kernels::avx512::softmax_exp_row, &kernels::avx512::attend_group_partial,
      &kernels::avx512::pack_b_rows,     &kernels::avx512::pack_b_cols,
      &kernels::avx512::matmul_prepacked};
  switch (isa) {
    case Isa::kAvx512:
    case Isa::kAvx512Vnni:
      return kAvx512;
    case Isa::kAvx2:
    case Isa::kAvx2Vnni:
      return kAvx2;
    case Isa::kGeneric:
      break;
  }
#endif
  return kGeneric;
}

// KV head kvh's rows of one side of a pool, as the kernels read them.
kernels::KvRows kv_rows(const void* data, const float* scale, DType type, int64_t n_kv_heads,
                        int64_t head_dim, int64_t kvh) {
  kernels::KvRows r;
  r.stride = n_kv_heads * head_dim;
  r.scale_stride = n_kv_heads;
  switch (type) {
    case DType::kBF16:
      r.type = kernels::KvType::kBF16;
      r.data = static_cast<const uint16_t*>(data) + kvh * head_dim;
      break;
    case DType::kI8:
      r.type = kernels::KvType::kI8;
      r.data = static_cast<const int8_t*>(data) + kvh * head_dim;
      r.scale = scale + kvh;
      break;
    default:
      r.type = kernels::KvType::kF32;
      r.data = static_cast<const float*>(data) + kvh * head_dim;
      break;
  }
  return r;
}

// The vectorised kernels need head_dim a multiple of 8 (and not above kMaxHeadDim).
bool vector_head_dim(int64_t head_dim) {
  return head_dim % 8 == 0 && head_dim <= kernels::kMaxHeadDim;
}

// Below this many tokens per segment the per-row tile kernel is used.
constexpr int64_t kBlockedMinTokens = 64;
// Query rows per block of the blocked (GEMM) attention paths: a multiple of every ISA's tile
// height (12 / 3 / 2 rows), so no block but a segment's last one runs a short tile; its scores
// (48 · keys floats) stay in L2 up to several thousand keys.
constexpr int64_t kQueryBlock = kAttentionRowGrain;

// One block of m query rows of one head through the matmul kernels, on the calling thread:
// scores [m, nk] = Q·Kᵀ with Q's rows at qh (ldq floats apart) and K packed (pack_b_rows) as
// kp; row r's exp(scale·s − max) over its first min(nk, visible0 + r) keys, the rest of the row
// zeroed (visible0 >= nk: every key, else a causal prefix); then P·V against V packed
// (pack_b_cols, for vp_keys >= nk keys) as vp, written to out (row stride out_stride) and each
// row scaled by 1 / its Σ — hd multiplies a row instead of nk. scores: m · nk floats.
void attend_query_block(const float* qh, int64_t ldq, int64_t m, const float* kp, const float* vp,
                        int64_t vp_keys, int64_t nk, int64_t head_dim, float scale,
                        int64_t visible0, float* scores, float* out, int64_t out_stride, Isa isa) {
  const AttentionKernels& kern = attention_kernels(isa);
  kern.matmul_prepacked(qh, ldq, m, head_dim, kp, head_dim, nk, scores, nk);
  float inv[kQueryBlock];
  for (int64_t r = 0; r < m; ++r) {
    const int64_t visible = std::min(nk, visible0 + r);
    inv[r] = 1.f / kern.softmax_exp_row(scores + r * nk, visible, scale);
    std::fill(scores + r * nk + visible, scores + (r + 1) * nk, 0.f);
  }
  kern.matmul_prepacked(scores, nk, m, nk, vp, vp_keys, head_dim, out, out_stride);
  for (int64_t r = 0; r < m; ++r) {
    float* o = out + r * out_stride;
    for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv[r];
  }
}

// Causal attention of a long prefill chunk through the matmul kernels, as attention_full does
// for images: the heads are split over the threads; per head the keys 0 .. first_pos + n_q are
// gathered from the paged cache and packed once (K and V), then per block of kQueryBlock
// queries: scores = Q·Kᵀ over the keys the block's last query sees, each row's softmax over its
// own causal prefix (the rest of the row zeroed), out = P·V. The per-row kernel streams every
// key once per query at vector-FMA speed on one row; here each key is reused by a block of
// queries in registers.
void attention_causal_blocked(const float* q, int64_t n_q, int64_t first_pos, const KvPool& kv,
                              const int32_t* block_table, int64_t block_size, int64_t n_heads,
                              int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                              ThreadPool& pool, Isa isa) {
  const AttentionKernels& kern = attention_kernels(isa);
  const int64_t group = n_heads / n_kv_heads;
  const int64_t q_stride = n_heads * head_dim, n_keys = first_pos + n_q;
  // Per thread: the gathered K and V rows [n_keys, hd], both packed, and a block's scores.
  const int64_t packed_k = kernels::prepacked_floats(n_keys, head_dim);
  const int64_t packed_v = kernels::prepacked_floats(head_dim, n_keys);
  const int64_t per_thread = 2 * n_keys * head_dim + packed_k + packed_v + kQueryBlock * n_keys;
  thread_local PerThreadBuffers bufs_tls;
  PerThreadBuffers& bufs = bufs_tls;  // the caller's, also inside the lambda
  bufs.reserve(pool.n_threads(), static_cast<size_t>(per_thread));
  pool.parallel_for(n_heads, 1, [&](int64_t h0, int64_t h1, int t) {
    float* const kh = bufs.get(t);
    float* const vh = kh + n_keys * head_dim;
    float* const kp = vh + n_keys * head_dim;
    float* const vp = kp + packed_k;
    float* const scores = vp + packed_v;
    int64_t gathered = -1;  // the KV head now in kp / vp
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kvh = h / group;
      if (kvh != gathered) {
        for (int64_t j = 0; j < n_keys; ++j) {
          const int64_t row =
              static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
          load_kv_head(kv.k, kv.k_scale, kv.type, n_kv_heads, head_dim, row, kvh,
                       kh + j * head_dim);
          load_kv_head(kv.v, kv.v_scale, kv.type, n_kv_heads, head_dim, row, kvh,
                       vh + j * head_dim);
        }
        kern.pack_b_rows(kh, head_dim, n_keys, head_dim, kp);
        kern.pack_b_cols(vh, head_dim, head_dim, n_keys, vp);
        gathered = kvh;
      }
      for (int64_t q0 = 0; q0 < n_q; q0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, n_q - q0);
        const int64_t nk = first_pos + q0 + m;  // keys the block's last query sees
        attend_query_block(q + q0 * q_stride + h * head_dim, q_stride, m, kp, vp, n_keys, nk,
                           head_dim, scale, first_pos + q0 + 1, scores,
                           out + q0 * q_stride + h * head_dim, q_stride, isa);
      }
    }
  });
}

// Split-K decode: a single query row over more than kSplitMinKeys keys has its key range cut into
// chunks of at least kSplitMinChunk keys (a multiple of the kernel's 64-key tile), at most
// kMaxSplits of them.
constexpr int64_t kSplitMinKeys = 1024;
constexpr int64_t kSplitMinChunk = 256;
constexpr int64_t kMaxSplits = 64;

// NOTE(vlm): decode attention of one long sequence has only n_heads independent rows, too few to
// keep many threads busy, and reads the whole KV cache of the layer. Split-K (FlashDecoding)
// gives every (GQA group, key chunk) pair to a thread: each computes the unnormalised partial
// state (acc, max m, sum l) of its chunk for all query heads of the group, loading each K/V row
// once for the group; the caller then merges the chunks per head:
//   M = max_c m_c,  out = Σ_c e^(m_c − M)·acc_c / Σ_c e^(m_c − M)·l_c.
// The chunking depends only on the context length, never on the thread count, so results are
// the same on any machine.
void attention_decode_split(const float* q, int64_t n_keys, const KvPool& kv,
                            const int32_t* block_table, int64_t block_size, int64_t n_heads,
                            int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                            ThreadPool& pool, Isa isa) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t part_row = head_dim + 2;
  constexpr int64_t kTile = 64;
  const int64_t per_split = (n_keys + kMaxSplits - 1) / kMaxSplits;
  const int64_t chunk = std::max(kSplitMinChunk, (per_split + kTile - 1) / kTile * kTile);
  const int64_t n_split = (n_keys + chunk - 1) / chunk;
  const int64_t sub_groups = (group + kernels::kMaxGroup - 1) / kernels::kMaxGroup;
  // Partial states [n_heads, n_split, head_dim + 2] of the calling thread: sized once per model
  // shape for the most chunks, so steady-state decoding allocates nothing.
  thread_local std::vector<float> parts;
  const size_t need = static_cast<size_t>(n_heads * kMaxSplits * part_row);
  if (parts.size() < need) parts.resize(need);
  float* part = parts.data();
  const auto kernel = attention_kernels(isa).attend_group_partial;
  pool.parallel_for(n_kv_heads * sub_groups * n_split, 1, [&](int64_t begin, int64_t end, int) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t c = item % n_split, gi = item / n_split;
      const int64_t kvh = gi / sub_groups;
      const int64_t h0 = kvh * group + (gi % sub_groups) * kernels::kMaxGroup;
      const int64_t nq = std::min(kernels::kMaxGroup, (kvh + 1) * group - h0);
      const int64_t j0 = c * chunk, j1 = std::min(n_keys, j0 + chunk);
      kernel(q + h0 * head_dim, nq, kv_rows(kv.k, kv.k_scale, kv.type, n_kv_heads, head_dim, kvh),
             kv_rows(kv.v, kv.v_scale, kv.type, n_kv_heads, head_dim, kvh), block_table, block_size,
             j0, j1, head_dim, scale, part + (h0 * n_split + c) * part_row, n_split * part_row);
    }
  });
  for (int64_t h = 0; h < n_heads; ++h) {
    const float* ph = part + h * n_split * part_row;
    float M = -INFINITY;
    for (int64_t c = 0; c < n_split; ++c) M = std::max(M, ph[c * part_row + head_dim]);
    float* o = out + h * head_dim;
    std::fill(o, o + head_dim, 0.f);
    float L = 0.f;
    for (int64_t c = 0; c < n_split; ++c) {
      const float* pc = ph + c * part_row;
      const float w = std::exp(pc[head_dim] - M);
      L += w * pc[head_dim + 1];
      for (int64_t d = 0; d < head_dim; ++d) o[d] += w * pc[d];
    }
    const float inv = 1.f / L;
    for (int64_t d = 0; d < head_dim; ++d) o[d] *= inv;
  }
}

}  // namespace

void attention_paged(const float* q, int64_t n_q, int64_t first_pos, const KvPool& kv,
                     const int32_t* block_table, int64_t block_size, int64_t n_heads,
                     int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                     ThreadPool& pool, Isa isa) {
  const int64_t group = n_heads / n_kv_heads;
  const auto paged = attention_kernels(isa).attend_row_paged;
  const bool vector_ok = vector_head_dim(head_dim);
  if (n_q >= kBlockedMinTokens && vector_ok) {
    attention_causal_blocked(q, n_q, first_pos, kv, block_table, block_size, n_heads, n_kv_heads,
                             head_dim, scale, out, pool, isa);
    return;
  }
  if (n_q == 1 && first_pos + 1 > kSplitMinKeys && vector_ok) {
    attention_decode_split(q, first_pos + 1, kv, block_table, block_size, n_heads, n_kv_heads,
                           head_dim, scale, out, pool, isa);
    return;
  }
  // Rare shapes (head_dim not a multiple of 8) gather each thread's keys as f32 (from an f32
  // pool held in one block, the rows are read in place).
  const bool in_place = kv.type == DType::kF32 && first_pos + n_q <= block_size;
  thread_local PerThreadBuffers gather_tls;
  PerThreadBuffers& gather = gather_tls;  // the caller's, also inside the lambda
  if (!vector_ok && !in_place) {
    gather.reserve(pool.n_threads(), static_cast<size_t>(2 * (first_pos + n_q) * head_dim));
  }
  pool.parallel_for(n_q * n_heads, 1, [&](int64_t begin, int64_t end, int t) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / n_heads;
      const int64_t h = item % n_heads;
      const int64_t kvh = h / group;
      const float* qv = q + (i * n_heads + h) * head_dim;
      float* o = out + (i * n_heads + h) * head_dim;
      const int64_t n_keys = first_pos + i + 1;
      if (vector_ok) {
        paged(qv, kv_rows(kv.k, kv.k_scale, kv.type, n_kv_heads, head_dim, kvh),
              kv_rows(kv.v, kv.v_scale, kv.type, n_kv_heads, head_dim, kvh), block_table,
              block_size, n_keys, head_dim, scale, o);
      } else if (in_place) {  // one block holds every key: contiguous
        const int64_t kv_stride = n_kv_heads * head_dim;
        const int64_t base = static_cast<int64_t>(block_table[0]) * block_size * kv_stride;
        attend_row(qv, static_cast<const float*>(kv.k) + base + kvh * head_dim,
                   static_cast<const float*>(kv.v) + base + kvh * head_dim, kv_stride, n_keys,
                   head_dim, scale, o);
      } else {
        float* const kg = gather.get(t);
        float* const vg = kg + n_keys * head_dim;
        for (int64_t j = 0; j < n_keys; ++j) {
          const int64_t row =
              static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
          load_kv_head(kv.k, kv.k_scale, kv.type, n_kv_heads, head_dim, row, kvh,
                       kg + j * head_dim);
          load_kv_head(kv.v, kv.v_scale, kv.type, n_kv_heads, head_dim, row, kvh,
                       vg + j * head_dim);
        }
        attend_row(qv, kg, vg, head_dim, n_keys, head_dim, scale, o);
      }
    }
  });
}

void attention_full(const float* q, const float* k, const float* v, int64_t n, int64_t n_heads,
                    int64_t head_dim, float scale, float* out, ThreadPool& pool, Isa isa) {
  attention_full_rows(q, k, v, n, 0, n, n_heads, head_dim, scale, out, pool, isa);
}

void attention_full_rows(const float* q, const float* k, const float* v, int64_t n, int64_t q0,
                         int64_t q1, int64_t n_heads, int64_t head_dim, float scale, float* out,
                         ThreadPool& pool, Isa isa) {
  const int64_t stride = n_heads * head_dim;
  if (q1 <= q0) return;
  if (n < kBlockedMinTokens || head_dim % 8 != 0) {  // per row: any split is exact
    const AttendFn attend =
        vector_head_dim(head_dim) ? attention_kernels(isa).attend_row : &attend_row;
    pool.parallel_for((q1 - q0) * n_heads, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = q0 + item / n_heads;
        const int64_t h = item % n_heads;
        attend(q + i * stride + h * head_dim, k + h * head_dim, v + h * head_dim, stride, n,
               head_dim, scale, out + i * stride + h * head_dim);
      }
    });
    return;
  }
  // Long segments (a whole image): the heads are split over the threads; per head, K and V are
  // packed once, then blocks of kQueryBlock queries go through the matmul kernels on that
  // thread — scores [block, n] = Q·Kᵀ, a row softmax, then out = P·V — so the work runs at GEMM
  // speed with one fork/join per call. Memory is O(block · n) per thread: the n × n score matrix
  // is never built. The blocks start at q0 (a multiple of kQueryBlock when a call covers part of
  // the rows), so a part runs the whole call's blocks.
  const AttentionKernels& kern = attention_kernels(isa);
  const int64_t packed_k = kernels::prepacked_floats(n, head_dim);
  const int64_t packed_v = kernels::prepacked_floats(head_dim, n);
  const int64_t per_thread = packed_k + packed_v + kQueryBlock * n;
  thread_local PerThreadBuffers bufs_tls;
  PerThreadBuffers& bufs = bufs_tls;  // the caller's, also inside the lambda
  bufs.reserve(pool.n_threads(), static_cast<size_t>(per_thread));
  pool.parallel_for(n_heads, 1, [&](int64_t h0, int64_t h1, int t) {
    float* const kp = bufs.get(t);
    float* const vp = kp + packed_k;
    float* const scores = vp + packed_v;
    for (int64_t h = h0; h < h1; ++h) {
      kern.pack_b_rows(k + h * head_dim, stride, n, head_dim, kp);
      kern.pack_b_cols(v + h * head_dim, stride, head_dim, n, vp);
      for (int64_t b = q0; b < q1; b += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, q1 - b);
        attend_query_block(q + b * stride + h * head_dim, stride, m, kp, vp, n, n, head_dim, scale,
                           /*visible0=*/n, scores, out + b * stride + h * head_dim, stride, isa);
      }
    }
  });
}

}  // namespace vlm::ops

// CPU implementations of the small ops (plain loops the compiler vectorises at the baseline ISA;
// they are a few percent of the time next to matmul).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/half.h"
#include "kernels/cpu/attention.h"
#include "ops/ops.h"

namespace vlm::ops {

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

void add_bias(float* y, const float* bias, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * n;
    for (int64_t i = 0; i < n; ++i) yr[i] += bias[i];
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
      default:
        std::fill(o, o + n, 0.f);  // rejected at load time; never reached
        break;
    }
  }
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

namespace {

using AttendFn = void (*)(const float*, const float*, const float*, int64_t, int64_t, int64_t, float,
                          float*);

// Scalar online-softmax attention of one query row against keys [0, n_keys): running max m, running sum
// l and an f32 accumulator o, so memory stays O(head_dim) whatever the context length.
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
  void (*attend_row_paged)(const float*, const float*, const float*, const int32_t*, int64_t,
                           int64_t, int64_t, int64_t, float, float*);
  void (*softmax_row)(float*, int64_t, float);
};

const AttentionKernels& attention_kernels(Isa isa) {
  static const AttentionKernels kGeneric = {&kernels::generic::attend_row,
                                            &kernels::generic::attend_row_paged,
                                            &kernels::generic::softmax_row};
#if defined(VLM_HAVE_X86_DISPATCH)
  static const AttentionKernels kAvx2 = {&kernels::avx2::attend_row,
                                         &kernels::avx2::attend_row_paged,
                                         &kernels::avx2::softmax_row};
  static const AttentionKernels kAvx512 = {&kernels::avx512::attend_row,
                                           &kernels::avx512::attend_row_paged,
                                           &kernels::avx512::softmax_row};
  switch (isa) {
    case Isa::kAvx512: return kAvx512;
    case Isa::kAvx2: return kAvx2;
    case Isa::kGeneric: break;
  }
#endif
  return kGeneric;
}

// The vectorised kernels need head_dim a multiple of 8 (and not above kMaxHeadDim).
bool vector_head_dim(int64_t head_dim) {
  return head_dim % 8 == 0 && head_dim <= kernels::kMaxHeadDim;
}

// Below this many tokens per segment the per-row tile kernel is used.
constexpr int64_t kBlockedMinTokens = 64;
// Query rows per block of the blocked (GEMM) attention paths.
constexpr int64_t kQueryBlock = 64;

// Causal attention of a long prefill chunk through the matmul kernels, as attention_full does
// for images: the heads are split over the threads; per head the keys 0 .. first_pos + n_q are
// gathered from the paged cache once (K as rows, V transposed), then per block of kQueryBlock
// queries: scores = Q·Kᵀ over the keys the block's last query sees, each row's softmax over its
// own causal prefix (the rest of the row zeroed), out = P·V. The per-row kernel streams every
// key once per query at vector-FMA speed on one row; here each key is reused by 64 queries in
// registers.
void attention_causal_blocked(const float* q, int64_t n_q, int64_t first_pos, const float* k_pool,
                              const float* v_pool, const int32_t* block_table, int64_t block_size,
                              int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                              float* out, ThreadPool& pool, Isa isa) {
  const int64_t group = n_heads / n_kv_heads, kv_stride = n_kv_heads * head_dim;
  const int64_t q_stride = n_heads * head_dim, n_keys = first_pos + n_q;
  const auto softmax = attention_kernels(isa).softmax_row;
  // Per thread: K [n_keys, hd], Vᵀ [hd, n_keys], a block's Vᵀ [hd, nk], Q block, scores, output
  // block and the matmul scratch.
  const int64_t mm_scratch =
      std::max(matmul_scratch_floats(head_dim), matmul_scratch_floats(n_keys));
  const int64_t per_thread = 3 * n_keys * head_dim + 2 * kQueryBlock * head_dim +
                             kQueryBlock * n_keys + mm_scratch;
  thread_local PerThreadBuffers bufs_tls;
  PerThreadBuffers& bufs = bufs_tls;  // the caller's, also inside the lambda
  bufs.reserve(pool.n_threads(), static_cast<size_t>(per_thread));
  pool.parallel_for(n_heads, 1, [&](int64_t h0, int64_t h1, int t) {
    float* const kh = bufs.get(t);
    float* const vt = kh + n_keys * head_dim;
    float* const vtb = vt + n_keys * head_dim;
    float* const qh = vtb + n_keys * head_dim;
    float* const oh = qh + kQueryBlock * head_dim;
    float* const scores = oh + kQueryBlock * head_dim;
    float* const scratch = scores + kQueryBlock * n_keys;
    int64_t gathered = -1;  // the KV head now in kh / vt
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kvh = h / group;
      if (kvh != gathered) {
        for (int64_t j = 0; j < n_keys; ++j) {
          const int64_t row =
              static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
          const float* kr = k_pool + row * kv_stride + kvh * head_dim;
          const float* vr = v_pool + row * kv_stride + kvh * head_dim;
          std::copy_n(kr, head_dim, kh + j * head_dim);
          for (int64_t d = 0; d < head_dim; ++d) vt[d * n_keys + j] = vr[d];
        }
        gathered = kvh;
      }
      for (int64_t q0 = 0; q0 < n_q; q0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, n_q - q0);
        const int64_t nk = first_pos + q0 + m;  // keys the block's last query sees
        for (int64_t r = 0; r < m; ++r) {
          std::copy_n(q + (q0 + r) * q_stride + h * head_dim, head_dim, qh + r * head_dim);
        }
        const TensorView k_view{DType::kF32, {nk, head_dim}, kh};
        matmul_on_this_thread(qh, m, head_dim, k_view, scores, scratch, isa);
        for (int64_t r = 0; r < m; ++r) {
          const int64_t visible = first_pos + q0 + r + 1;
          softmax(scores + r * nk, visible, scale);
          std::fill(scores + r * nk + visible, scores + (r + 1) * nk, 0.f);
        }
        for (int64_t d = 0; d < head_dim; ++d) std::copy_n(vt + d * n_keys, nk, vtb + d * nk);
        const TensorView vt_view{DType::kF32, {head_dim, nk}, vtb};
        matmul_on_this_thread(scores, m, nk, vt_view, oh, scratch, isa);
        for (int64_t r = 0; r < m; ++r) {
          std::copy_n(oh + r * head_dim, head_dim, out + (q0 + r) * q_stride + h * head_dim);
        }
      }
    }
  });
}

}  // namespace

void attention_paged(const float* q, int64_t n_q, int64_t first_pos, const float* k_pool,
                     const float* v_pool, const int32_t* block_table, int64_t block_size,
                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                     ThreadPool& pool, Isa isa) {
  const int64_t group = n_heads / n_kv_heads;
  const int64_t kv_stride = n_kv_heads * head_dim;
  const auto paged = attention_kernels(isa).attend_row_paged;
  const bool vector_ok = vector_head_dim(head_dim);
  if (n_q >= kBlockedMinTokens && vector_ok) {
    attention_causal_blocked(q, n_q, first_pos, k_pool, v_pool, block_table, block_size, n_heads,
                             n_kv_heads, head_dim, scale, out, pool, isa);
    return;
  }
  // Rare shapes (head_dim not a multiple of 8) across several blocks gather each thread's keys.
  thread_local PerThreadBuffers gather_tls;
  PerThreadBuffers& gather = gather_tls;  // the caller's, also inside the lambda
  if (!vector_ok && first_pos + n_q > block_size) {
    gather.reserve(pool.n_threads(), static_cast<size_t>(2 * (first_pos + n_q) * head_dim));
  }
  pool.parallel_for(n_q * n_heads, 1, [&](int64_t begin, int64_t end, int t) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / n_heads;
      const int64_t h = item % n_heads;
      const int64_t kv_off = (h / group) * head_dim;
      const float* qv = q + (i * n_heads + h) * head_dim;
      float* o = out + (i * n_heads + h) * head_dim;
      const int64_t n_keys = first_pos + i + 1;
      if (vector_ok) {
        paged(qv, k_pool + kv_off, v_pool + kv_off, block_table, block_size, kv_stride, n_keys,
              head_dim, scale, o);
      } else if (n_keys <= block_size) {  // one block holds every key: contiguous
        const int64_t base = static_cast<int64_t>(block_table[0]) * block_size * kv_stride;
        attend_row(qv, k_pool + base + kv_off, v_pool + base + kv_off, kv_stride, n_keys, head_dim,
                   scale, o);
      } else {
        float* const kg = gather.get(t);
        float* const vg = kg + n_keys * head_dim;
        for (int64_t j = 0; j < n_keys; ++j) {
          const int64_t row = static_cast<int64_t>(block_table[j / block_size]) * block_size + j % block_size;
          std::copy_n(k_pool + row * kv_stride + kv_off, head_dim, kg + j * head_dim);
          std::copy_n(v_pool + row * kv_stride + kv_off, head_dim, vg + j * head_dim);
        }
        attend_row(qv, kg, vg, head_dim, n_keys, head_dim, scale, o);
      }
    }
  });
}

void attention_full(const float* q, const float* k, const float* v, int64_t n, int64_t n_heads,
                    int64_t head_dim, float scale, float* out, ThreadPool& pool, Isa isa) {
  const int64_t stride = n_heads * head_dim;
  if (n < kBlockedMinTokens || head_dim % 8 != 0) {
    const AttendFn attend = vector_head_dim(head_dim) ? attention_kernels(isa).attend_row : &attend_row;
    pool.parallel_for(n * n_heads, 1, [&](int64_t begin, int64_t end, int) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / n_heads;
        const int64_t h = item % n_heads;
        attend(q + i * stride + h * head_dim, k + h * head_dim, v + h * head_dim, stride, n,
               head_dim, scale, out + i * stride + h * head_dim);
      }
    });
    return;
  }
  // Long segments (a whole image): the heads are split over the threads; per head, blocks of
  // kQueryBlock queries go through the matmul kernels on that thread — scores [block, n] = Q·Kᵀ,
  // a row softmax, then out = P·V — so the work runs at GEMM speed with one fork/join per call.
  // Memory is O(block · n) per thread: the n × n score matrix is never built.
  const auto softmax = attention_kernels(isa).softmax_row;
  // Per thread: q, k, vᵀ of one head, a block of scores, its output and the matmul scratch.
  const int64_t mm_scratch = std::max(matmul_scratch_floats(head_dim), matmul_scratch_floats(n));
  const int64_t per_thread = 3 * n * head_dim + kQueryBlock * n + kQueryBlock * head_dim + mm_scratch;
  thread_local PerThreadBuffers bufs_tls;
  PerThreadBuffers& bufs = bufs_tls;  // the caller's, also inside the lambda
  bufs.reserve(pool.n_threads(), static_cast<size_t>(per_thread));
  pool.parallel_for(n_heads, 1, [&](int64_t h0, int64_t h1, int t) {
    float* const qh = bufs.get(t);
    float* const kh = qh + n * head_dim;
    float* const vt = kh + n * head_dim;
    float* const scores = vt + n * head_dim;
    float* const oh = scores + kQueryBlock * n;
    float* const scratch = oh + kQueryBlock * head_dim;
    const TensorView k_view{DType::kF32, {n, head_dim}, kh};
    const TensorView vt_view{DType::kF32, {head_dim, n}, vt};
    for (int64_t h = h0; h < h1; ++h) {
      for (int64_t i = 0; i < n; ++i) {
        std::copy_n(q + i * stride + h * head_dim, head_dim, qh + i * head_dim);
        std::copy_n(k + i * stride + h * head_dim, head_dim, kh + i * head_dim);
        for (int64_t d = 0; d < head_dim; ++d) vt[d * n + i] = v[i * stride + h * head_dim + d];
      }
      for (int64_t q0 = 0; q0 < n; q0 += kQueryBlock) {
        const int64_t m = std::min(kQueryBlock, n - q0);
        matmul_on_this_thread(qh + q0 * head_dim, m, head_dim, k_view, scores, scratch, isa);
        for (int64_t r = 0; r < m; ++r) softmax(scores + r * n, n, scale);
        matmul_on_this_thread(scores, m, n, vt_view, oh, scratch, isa);
        for (int64_t r = 0; r < m; ++r) {
          std::copy_n(oh + r * head_dim, head_dim, out + (q0 + r) * stride + h * head_dim);
        }
      }
    }
  });
}

}  // namespace vlm::ops

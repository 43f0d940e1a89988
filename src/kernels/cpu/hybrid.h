// CPU kernels of Qwen3.5's hybrid decoder layers, one table per ISA level
// (kernels/cpu/hybrid_kernel.inc): the Gated DeltaNet's causal conv1d, its delta rule in
// recurrent and chunked form and its gated RMSNorm, and the gated attention's sigmoid gate and
// partial rotary. Only src/ops/ calls these; src/ops/ref/ holds the scalar versions they are
// tested against.
//
// All arrays are f32 and row-major; strides are in floats.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/matmul.h"

namespace vlm::kernels {

// The op's chunk: how many tokens gated_delta_net hands delta_rule_chunk at once. Chosen by
// measurement (`vlm bench --delta-rule 16,32,64,128` at Qwen3.5's dk = dv = 128): the n × n
// products (Q Kᵀ, K Kᵀ, T V, T K) grow with the chunk while the state's (W S, the output, Kᵀ v')
// do not, and below 32 the n × n products fill only part of the packed B's 32-wide panels: on
// Qwen3.5-2B's shape, 32 took 0.85× the time of 64 and 0.58× of 128, and 16 was no faster
// (docs/benchmarks.md).
inline constexpr int64_t kDeltaChunk = 32;

// Offsets, in floats, of delta_rule_chunk's scratch arrays for a chunk of n tokens, key dim dk
// and value dim dv, and the floats of the whole (`floats`, growing with n). The arrays from `kp`
// on are dead once the chunk's corrected values v' are packed, and the new state's product
// (`snew`) reuses their room.
struct DeltaChunkLayout {
  int64_t cum, row, beta, beta_exp, x, sv, kt, kp, kk, t2, vp, kc, u, w, snew, floats;
  DeltaChunkLayout(int64_t dk, int64_t dv, int64_t n) {
    int64_t o = 0;
    auto take = [&o](int64_t size) {
      const int64_t at = o;
      o += (size + 15) / 16 * 16;
      return at;
    };
    cum = take(n), row = take(n), beta = take(n), beta_exp = take(n);
    x = take(n * (dk + n)), sv = take(prepacked_floats(dv, dk + n)), kt = take(dk * n);
    snew = o;
    kp = take(prepacked_floats(n, dk)), kk = take(n * n), t2 = take(n * n);
    vp = take(prepacked_floats(dv, n)), kc = take(prepacked_floats(dk, n));
    u = take(n * dv), w = take(n * dk);
    floats = std::max(o, snew + dk * dv);
  }
};

// Floats of delta_rule_chunk's scratch for chunks of up to `chunk` tokens.
inline int64_t delta_chunk_scratch(int64_t dk, int64_t dv, int64_t chunk = kDeltaChunk) {
  return DeltaChunkLayout(dk, dv, chunk).floats;
}

// One value head's inputs to the delta rule over n tokens: token t's query and key (dk values,
// L2-normalised, the query scaled by 1/√dk) at q + t·qk_stride and k + t·qk_stride, its value
// (dv values) at v + t·v_stride, its log decay g[t·gb_stride] (≤ 0) and its β[t·gb_stride].
struct DeltaInputs {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* g = nullptr;
  const float* beta = nullptr;
  int64_t qk_stride = 0, v_stride = 0, gb_stride = 0;
};

struct HybridKernels {
  // Channels [c0, c1) of one sequence's causal depthwise conv1d and SiLU over n rows:
  // out[t, c] = silu(Σ_j w[j, c] · in(t − (K − 1) + j, c)), where in(i, ·) is row i of x (rows
  // x_stride apart) for i ≥ 0 and row K − 1 + i of `window` for i < 0; `window` [K − 1, C] holds
  // the inputs before the chunk, oldest first, and its channels [c0, c1) become the last K − 1
  // inputs. w: [K, C] (tap-major); out: n rows of C, out_stride apart.
  void (*conv1d_silu)(const float* x, int64_t x_stride, int64_t n, int64_t channels, int64_t c0,
                      int64_t c1, int64_t kernel, const float* w, float* window, float* out,
                      int64_t out_stride);
  // The gated delta rule of one value head, token by token (transformers'
  // torch_recurrent_gated_delta_rule): S ← S·e^g; δ = (v − Sᵀk)·β; S ← S + k δᵀ; out = Sᵀq.
  // S: [dk, dv] in place; per token one read-only pass gives Sᵀk and Sᵀq together and one more
  // pass decays and updates it. out: token t's dv values at out + t·out_stride; scratch: dv floats.
  void (*delta_rule_recurrent)(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* S,
                               float* out, int64_t out_stride, float* scratch);
  // The same over one chunk of n tokens at once, in the WY / UT form of transformers'
  // torch_chunk_gated_delta_rule, every product on the packed GEMM tiles (matmul_prepacked).
  // scratch: delta_chunk_scratch(dk, dv, c) floats for some c ≥ n.
  void (*delta_rule_chunk)(const DeltaInputs& in, int64_t n, int64_t dk, int64_t dv, float* S,
                           float* out, int64_t out_stride, float* scratch);
  // x[r, :] ← x[r, :] · rsqrt(Σ x² + 1e-6) · scale for r < rows (rows `stride` apart, n values):
  // the delta rule's q / k L2 norm (FLA's l2norm).
  void (*l2norm_rows)(float* x, int64_t rows, int64_t n, int64_t stride, float scale);
  // Qwen3.5's gated RMSNorm per head row of n values: y = x · rsqrt(mean(x²) + eps) · w ·
  // silu(z). Head row r of x and y is at r·n; of z at (r / heads)·z_stride + (r % heads)·n.
  void (*gated_rms_norm)(const float* x, const float* z, int64_t z_stride, int64_t heads,
                         int64_t head_rows, int64_t n, const float* w, float eps, float* y);
  // x[r, i] ← x[r, i] · sigmoid(g[r·g_stride + i]) for r < rows, i < n (the attention's output
  // gate).
  void (*sigmoid_mul)(float* x, const float* g, int64_t g_stride, int64_t rows, int64_t n);
  // Per head of x [n_heads, head_dim] (one token; heads head_stride apart): the q/k RMSNorm over
  // all head_dim values (weight w), then NeoX rotary of the first rotary_dim (pairs d and
  // d + rotary_dim / 2); cos, sin: [rotary_dim / 2].
  void (*qk_norm_rope_partial)(float* x, int64_t n_heads, int64_t head_stride, int64_t head_dim,
                               int64_t rotary_dim, const float* w, float eps, const float* cos,
                               const float* sin);
};

namespace generic {
const HybridKernels& hybrid_kernels();
}  // namespace generic
namespace avx2 {
const HybridKernels& hybrid_kernels();
}  // namespace avx2
namespace avx512 {
const HybridKernels& hybrid_kernels();
}  // namespace avx512

}  // namespace vlm::kernels

// Qwen3 text decoder of Qwen3-VL on the CPU: RMSNorm, per-head q/k RMSNorm, GQA attention with
// interleaved M-RoPE, SwiGLU MLP, a contiguous f32 KV cache.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "ops/ops.h"

namespace vlm {

// One sequence's KV cache: K and V per layer, [capacity, n_kv_heads * head_dim] f32 each.
struct KvCache {
  int64_t capacity = 0;  // positions
  int64_t row = 0;       // n_kv_heads * head_dim
  std::vector<float> k;  // [layers, capacity, row]
  std::vector<float> v;  // [layers, capacity, row]

  void allocate(const Qwen3VLTextConfig& c, int64_t capacity);
  float* k_layer(int64_t l) { return k.data() + l * capacity * row; }
  float* v_layer(int64_t l) { return v.data() + l * capacity * row; }
};

// 3-D M-RoPE position ids (T, H, W) of a run of tokens; text tokens carry the same value on all
// three axes.
struct Positions3 {
  const int64_t* t = nullptr;  // [n]
  const int64_t* h = nullptr;  // [n]
  const int64_t* w = nullptr;  // [n]
};

// Image features for the rows of one forward call. Rows that hold an image pad take the merger
// output instead of their token embedding, and after decoder layer l < deepstack.size() get
// deepstack[l] added (DeepStack injection, visual positions only).
struct VisionRows {
  const int32_t* feature_row = nullptr;  // [n]: row into the feature matrices, or -1 for text
  const float* embeds = nullptr;         // [features, hidden]
  std::vector<const float*> deepstack;   // each [features, hidden]
};

// Which rows get logits.
enum class LogitRows { kNone, kLast, kAll };

class TextDecoder {
 public:
  // Scratch is sized for `max_chunk` tokens per forward call, once: forward() allocates nothing.
  TextDecoder(const Qwen3VLConfig& cfg, const TextWeights& w, ThreadPool& pool, int64_t max_chunk);

  int64_t max_chunk() const { return max_chunk_; }
  int64_t vocab_size() const { return cfg_.vocab_size; }

  // Runs n ≤ max_chunk tokens occupying cache slots [first, first + n) at the given positions,
  // after which the cache holds slots [0, first + n). Writes logits to `logits`: [1, vocab] for
  // kLast, [n, vocab] for kAll.
  // `vision` may be null (text only).
  Status forward(const int32_t* ids, int64_t n, const Positions3& pos, int64_t first,
                 KvCache& cache, LogitRows rows, float* logits, const VisionRows* vision = nullptr);

  // ISA used for matmuls (defaults to the detected one; tests force lower levels).
  void set_isa(ops::Isa isa) { isa_ = isa; }

 private:
  void rope_tables(const Positions3& pos, int64_t n);

  const Qwen3VLTextConfig& cfg_;
  const TextWeights& w_;
  ThreadPool& pool_;
  int64_t max_chunk_;
  ops::Isa isa_ = ops::detected_isa();
  std::vector<float> inv_freq_;   // [head_dim / 2]
  std::vector<int> axis_of_;      // [head_dim / 2]: 0 = T, 1 = H, 2 = W (interleaved layout)
  // Scratch, [max_chunk, ...]:
  std::vector<float> x_;     // [chunk, hidden] residual stream
  std::vector<float> xn_;    // [chunk, hidden] normed
  std::vector<float> q_;     // [chunk, n_heads * head_dim]
  std::vector<float> k_;     // [chunk, n_kv * head_dim]
  std::vector<float> v_;     // [chunk, n_kv * head_dim]
  std::vector<float> attn_;  // [chunk, n_heads * head_dim]
  std::vector<float> tmp_;   // [chunk, hidden]
  std::vector<float> gate_;  // [chunk, intermediate]
  std::vector<float> up_;    // [chunk, intermediate]
  std::vector<float> cos_;   // [chunk, head_dim / 2]
  std::vector<float> sin_;   // [chunk, head_dim / 2]
};

}  // namespace vlm

// Qwen3 text decoder of Qwen3-VL on the CPU: RMSNorm, per-head q/k RMSNorm, GQA attention with
// interleaved M-RoPE, SwiGLU MLP, a paged f32 KV cache; several sequences share one pass.
#pragma once

#include <cstdint>
#include <vector>

#include "core/huge_page_buffer.h"
#include "core/thread_pool.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "ops/ops.h"

namespace vlm {

// The KV cache in blocks: K and V per layer, [num_blocks, block_size, n_kv_heads · head_dim] f32.
// A sequence owns blocks through its block table (src/kv decides which). One sequence in one
// block of `capacity` positions is the plain contiguous cache. The memory is reserved, not
// touched: anonymous mappings (on 2 MiB pages where the system allows) whose pages become
// resident, zeroed, when a block is first written, so a cache sized for many long sequences
// costs only the pages (per layer, for K and for V) that its written blocks fall in.
struct KvCache {
  int64_t num_blocks = 0;
  int64_t block_size = 0;  // positions per block
  int64_t row = 0;         // n_kv_heads · head_dim

  // kUnavailable when the memory cannot be mapped.
  Status allocate(const Qwen3VLTextConfig& c, int64_t num_blocks, int64_t block_size);
  int64_t capacity() const { return num_blocks * block_size; }
  float* k_layer(int64_t l) { return k_ + l * num_blocks * block_size * row; }
  float* v_layer(int64_t l) { return v_ + l * num_blocks * block_size * row; }

 private:
  HugePageBuffer k_buf_, v_buf_;  // [layers, num_blocks, block_size, row] f32 each
  float* k_ = nullptr;
  float* v_ = nullptr;
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

// A chunk's next token drawn on the device (SeqChunk::sample), as the engine's Sampler would:
// penalties, temperature, top-k, top-p, min-p, and the uniform draw u in [0, 1).
struct DevicePenalty {
  int32_t id;
  float repetition;  // logit < 0 ? logit · r : logit / r (1: none)
  float subtract;    // presence + frequency · count (0: none)
};
struct DeviceSample {
  int32_t top_k = 0;
  float inv_temperature = 1, top_p = 1, min_p = 0, u = 0;
  const DevicePenalty* penalties = nullptr;  // distinct ids
  int64_t n_penalties = 0;
};

// Which rows get logits.
enum class LogitRows { kNone, kLast, kAll };

// One sequence's share of a batched forward pass: n tokens at sequence positions
// [first, first + n), whose K/V go to the blocks of `block_table`.
struct SeqChunk {
  const int32_t* ids = nullptr;  // [n]
  int64_t n = 0;
  int64_t first = 0;             // tokens of this sequence already in the cache
  Positions3 pos;                // rotary positions of the n tokens
  const int32_t* block_table = nullptr;
  int64_t num_table_blocks = 0;  // must cover first + n positions
  const VisionRows* vision = nullptr;  // image rows of this chunk, or null
  LogitRows rows = LogitRows::kNone;
  // The caller needs only the argmax of this chunk's logit rows (greedy sampling, no penalty, no
  // logprobs). A device backend then leaves the rows on the device and returns their argmax;
  // the CPU decoder ignores it.
  bool argmax_only = false;
  // Or: the caller wants a token drawn with these settings from the (kLast) logit row; a device
  // backend draws it and leaves the row on the device. The CPU decoder ignores it.
  const DeviceSample* sample = nullptr;
};

// cos and sin of Qwen3-VL's interleaved M-RoPE angles for a run of positions, [n, head_dim / 2]
// each, in f32 as transformers computes them (the CPU and CUDA decoders both use these).
class MropeTables {
 public:
  explicit MropeTables(const Qwen3VLTextConfig& c);
  int64_t half() const { return static_cast<int64_t>(inv_freq_.size()); }
  void compute(const Positions3& pos, int64_t n, float* cos, float* sin) const;

 private:
  std::vector<float> inv_freq_;  // [head_dim / 2]
  std::vector<int> axis_of_;     // [head_dim / 2]: 0 = T, 1 = H, 2 = W (interleaved layout)
};

// Checks a batch of chunks before a forward pass (every backend): token ids in the vocabulary,
// block tables covering first + n positions with ids in [0, cache_blocks), Σ n ≤ max_chunk.
// Returns Σ n in *tokens.
Status check_chunks(const SeqChunk* chunks, int64_t n_chunks, const Qwen3VLTextConfig& c,
                    int64_t cache_blocks, int64_t block_size, int64_t max_chunk, int64_t* tokens);

class TextDecoder {
 public:
  // Scratch is sized for `max_chunk` tokens per forward call, once: forward() allocates nothing.
  TextDecoder(const Qwen3VLConfig& cfg, const TextWeights& w, ThreadPool& pool, int64_t max_chunk);

  int64_t max_chunk() const { return max_chunk_; }
  int64_t vocab_size() const { return cfg_.vocab_size; }

  // Runs every chunk in one pass (one matmul per weight for all their tokens; Σ n ≤ max_chunk).
  // Logits go to `logits` in chunk order: 1 row for kLast, n rows for kAll, none for kNone.
  Status forward_batch(const SeqChunk* chunks, int64_t n_chunks, KvCache& cache, float* logits);

  // One sequence in a single-block cache: n tokens at slots [first, first + n). `vision` may be
  // null (text only).
  Status forward(const int32_t* ids, int64_t n, const Positions3& pos, int64_t first,
                 KvCache& cache, LogitRows rows, float* logits, const VisionRows* vision = nullptr);

  // ISA used for matmuls (defaults to the detected one; tests force lower levels).
  void set_isa(ops::Isa isa) { isa_ = isa; }

 private:
  const Qwen3VLTextConfig& cfg_;
  const TextWeights& w_;
  ThreadPool& pool_;
  int64_t max_chunk_;
  ops::Isa isa_ = ops::detected_isa();
  MropeTables rope_;
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
  std::vector<int64_t> pos_t_, pos_h_, pos_w_;  // [chunk] positions of all chunks, concatenated
};

}  // namespace vlm

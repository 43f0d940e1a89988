// The text decoder of Qwen3-VL and Qwen3.5: RMSNorm, per-head q/k RMSNorm, GQA attention with
// interleaved M-RoPE, SwiGLU MLP (or a mixture of experts), a paged KV cache; several sequences
// share one pass. Qwen3.5's hybrid layers go through the same pass: its Gated DeltaNet layers
// (model/gated_delta_net.cc) keep a state slot per sequence in the cache, its attention layers
// gate their output and rotate part of each head. Written once, over the ops::Backend interface
// (the CPU or the GPU).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "ops/backend.h"

namespace vlm {

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

// One sequence's share of a batched forward pass: n tokens at sequence positions
// [first, first + n), whose K/V go to the blocks of `block_table`.
struct SeqChunk {
  const int32_t* ids = nullptr;  // [n]
  int64_t n = 0;
  int64_t first = 0;  // tokens of this sequence already in the cache
  Positions3 pos;     // rotary positions of the n tokens
  const int32_t* block_table = nullptr;
  int64_t num_table_blocks = 0;        // must cover first + n positions
  const VisionRows* vision = nullptr;  // image rows of this chunk, or null
  LogitRows rows = LogitRows::kNone;
  // A hybrid model's: the sequence's state slot in the cache (from zero when first == 0), and
  // for a verify chunk the first of the slots its per-token states go to (-1: none).
  int32_t state_slot = -1;
  int32_t token_state_slot = -1;
  // An MTP pass's (TextDecoder::run_mtp): each token's row of the hidden states it reads [n].
  const int32_t* hidden_rows = nullptr;
};

// Logit rows a chunk gets: 0, 1 or n.
inline int64_t logit_rows(const SeqChunk& c) {
  return c.rows == LogitRows::kNone ? 0 : (c.rows == LogitRows::kLast ? 1 : c.n);
}

// cos and sin of the interleaved M-RoPE angles for a run of positions, [n, rotary dims / 2] each
// (Qwen3-VL rotates whole heads, Qwen3.5 a part), in f32 as transformers computes them (the CPU
// and CUDA decoders both use these).
class MropeTables {
 public:
  explicit MropeTables(const Qwen3VLTextConfig& c);
  int64_t half() const { return static_cast<int64_t>(inv_freq_.size()); }
  void compute(const Positions3& pos, int64_t n, float* cos, float* sin) const;

 private:
  std::vector<float> inv_freq_;  // [rotary dims / 2]
  std::vector<int> axis_of_;     // [rotary dims / 2]: 0 = T, 1 = H, 2 = W (interleaved layout)
};

// Checks a batch of chunks before a forward pass: token ids in the vocabulary,
// block tables covering first + n positions with ids in [0, cache_blocks), Σ n ≤ max_chunk, and
// with state slots (state_slots > 0) each chunk's in [0, state_slots) and no two alike.
// Returns Σ n in *tokens.
Status check_chunks(const SeqChunk* chunks, int64_t n_chunks, const Qwen3VLTextConfig& c,
                    int64_t cache_blocks, int64_t block_size, int64_t max_chunk, int64_t* tokens,
                    int64_t state_slots = 0);

// A graph's shape (the ModelRunner's CUDA graphs): the batch padded to `rows` rows (each extra
// row a sequence of its own, one token at position 0 whose K/V go to the cache's scratch block)
// and every block table to `table_width` entries, so that a graph recorded for this shape
// replays any batch that fits it. rows 0: no padding (the batch as it is).
struct Padding {
  int64_t rows = 0;
  int64_t table_width = 0;
};

// One forward pass as prepare() laid it out for run(): its tables are in the decoder's buffers.
struct Pass {
  int64_t rows = 0;      // token rows (with padding)
  int64_t n_sel = 0;     // logit rows
  bool sel_all = false;  // the logit rows are rows 0 .. n_sel − 1 (then no gather)
  int64_t n_vis = 0;     // image rows
  size_t taps = 0;       // DeepStack features per image row
  ops::AttentionBatch attn;
  // The tables on the backend: int rows (TextDecoder's kIds ..), cos | sin, image features
  // [1 + taps, n_vis, hidden] f32.
  ops::Buf ints, rope, feats;
};

// The shape of Qwen3.5's Gated DeltaNet layers, from the text config's linear_* fields.
ops::DeltaNetShape delta_net_shape(const Qwen3VLTextConfig& c);

// The Qwen3 text decoder, written once over an ops::Backend: the CPU's kernels or the GPU's.
class TextDecoder {
 public:
  // Weights go to the backend (the CPU views them, a GPU uploads them), and the scratch and the
  // pass's tables are sized for `max_chunk` tokens, once: a forward pass allocates nothing.
  static Result<std::unique_ptr<TextDecoder>> create(const Qwen3VLConfig& cfg, const TextWeights& w,
                                                     ops::Backend& be, int64_t max_chunk);

  int64_t max_chunk() const { return max_chunk_; }
  int64_t vocab_size() const { return cfg_.vocab_size; }
  int64_t hidden_size() const { return cfg_.hidden_size; }
  ops::Backend& backend() const { return be_; }
  // Bytes of the linear weights a decode step reads (q/k/v/o, gate/up/down and the head), and
  // how many weights they hold (bytes · 8 / count: bits per weight, scales included).
  int64_t decode_weight_bytes() const;
  int64_t decode_weight_count() const;
  // Bytes of one sequence's linear-attention state (every linear layer's recurrent state and conv
  // window, f32) a decode step reads and rewrites; 0 without linear layers.
  int64_t decode_state_bytes() const;
  // The decoder's cache groups (kv/kv_cache_spec.h): its full-attention layers' K/V in `dtype`
  // (or else the activation type), in blocks of `block_size` tokens; a hybrid model's linear
  // layers' state slots.
  KvCacheSpec cache_spec(int64_t block_size, std::optional<DType> dtype = std::nullopt) const;
  bool hybrid() const { return cfg_.num_linear_layers() > 0; }
  // A KV cache for this decoder as `spec` describes it (its rows, in the backend's memory), room
  // in the pass's tables for block tables of up to max_blocks_per_seq entries, and for a hybrid
  // model `state_slots` state slots (at least one) and `state_snapshots` snapshots.
  Status allocate_cache(KvCache* cache, const KvCacheSpec& spec, int64_t num_blocks,
                        int64_t max_blocks_per_seq, int64_t state_slots = 0,
                        int64_t state_snapshots = 0);
  // The same with this decoder's own spec.
  Status allocate_cache(KvCache* cache, int64_t num_blocks, int64_t block_size,
                        int64_t max_blocks_per_seq, std::optional<DType> dtype = std::nullopt,
                        int64_t state_slots = 0) {
    return allocate_cache(cache, cache_spec(block_size, dtype), num_blocks, max_blocks_per_seq,
                          state_slots);
  }

  // Builds the pass's tables on the host from the chunks (slot mapping, per-token sequence and
  // position, block-table rows, logit rows, image rows and their features, the M-RoPE angles),
  // padded as `pad` says, and copies them to the backend. The chunks' arrays may go afterwards.
  Status prepare(const SeqChunk* chunks, int64_t n_chunks, const KvCache& cache, const Padding& pad,
                 Pass* pass);
  // The layers over a prepared pass: what a graph records. Logits (f32) of the pass's logit
  // rows go to `logits` [n_sel, vocab], in the backend's memory.
  Status run(const Pass& pass, const KvCache& cache, ops::Buf logits);

  // prepare + run + synchronize: 1 row for kLast, n rows for kAll, none for kNone, in chunk
  // order, into `logits` (the backend's memory).
  Status forward_batch(const SeqChunk* chunks, int64_t n_chunks, const KvCache& cache,
                       ops::Buf logits);
  // After run(): logit rows [first, first + n)'s hidden states after the final norm (what the
  // head multiplied), f32, to the host (`out` [n, hidden]). An f32 activation type only.
  Status normed_rows_to_host(int64_t first, int64_t n, float* out) const;

  // Qwen3.5's MTP head (speculative decoding's `--spec mtp`), when the weights have one (the CPU
  // only). run() then also keeps every row's last hidden state (after the final norm) until the
  // next run(). An MTP pass is prepared as any other, over the MTP's own cache (one attention
  // layer, addressed by the trunk's block ids), each chunk's token ids the *next* tokens of its
  // rows and `hidden_rows` where each row's hidden state is: in the last run()'s rows, or with
  // `chain` in the last MTP pass's logit rows (its output after the MTP's final norm). Logits of
  // the pass's logit rows to `logits` [n_sel, vocab].
  bool has_mtp() const { return mtp_ != nullptr; }
  KvCacheSpec mtp_cache_spec(int64_t block_size, std::optional<DType> dtype = std::nullopt) const;
  Status allocate_mtp_cache(KvCache* cache, const KvCacheSpec& spec, int64_t num_blocks,
                            int64_t max_blocks_per_seq);
  Status run_mtp(const Pass& pass, const KvCache& cache, bool chain, ops::Buf logits);

 private:
  // Σ of(w) over the linear weights a decode step reads (an MoE layer's experts: k of the average).
  int64_t decode_weights(int64_t (*of)(const ops::Linear&)) const;
  struct Layer {
    // Its cache: the KV cache's layer (full attention) or the state group's (linear).
    int64_t cache_index = 0;
    // A Gated DeltaNet layer's: q|k|v|z|b|a stacked, out_proj, and its small weights.
    std::unique_ptr<ops::Linear> in_proj, out_proj;
    ops::DeltaNetLayer delta;
    ops::Buf gated_norm;
    ops::Buf input_ln, q_norm, k_norm, post_ln;
    std::unique_ptr<ops::Linear> qkv, o, gate_up, down;  // gate_up, down: a dense layer's
    // A sparse layer's router and experts (gate|up and down of each, as the backend takes them).
    std::unique_ptr<ops::Linear> router;
    std::vector<std::unique_ptr<ops::Linear>> experts;  // gate|up of expert e at 2e, down at 2e + 1
    std::vector<const ops::Linear*> expert_gate_up, expert_down;
    // Qwen3.5 MoE's shared expert (gate|up, down) and its gate; null without one.
    std::unique_ptr<ops::Linear> shared_gate_up, shared_down, shared_gate;
  };
  // The MTP head: fc, its norms, its layer; scratch: every row's hidden state after the last
  // run(), the concatenated input [max_chunk, 2·hidden], the output rows after its norm
  // [max_chunk, hidden], and the concatenation's row indices (2i, then 2i + 1) [2·max_chunk].
  struct Mtp {
    std::unique_ptr<ops::Linear> fc;
    ops::Buf norm_embedding, norm_hidden, norm;
    Layer layer;
    ops::Buffer hidden, cat, out, even;
  };
  TextDecoder(const Qwen3VLConfig& cfg, ops::Backend& be, int64_t max_chunk);
  Status init(const TextWeights& w);
  Status init_layer(const TextLayerWeights& s, const std::string& where, Layer* out);
  Status init_mtp(const MtpWeights& w);
  Status run_layer(const Layer& L, const Pass& p, const KvCache& cache, bool pending) const;
  Status head(const Pass& p, ops::Buf norm, ops::Buf normed, ops::Buf logits) const;
  Status init_delta_net(const TextLayerWeights& s, Layer* d);
  Status alloc_scratch();
  // One layer's token mixer into tmp_: attention (gated or not) or a Gated DeltaNet.
  Status run_attention(const Layer& L, const Pass& p, const KvCache& cache) const;
  Status run_delta_net(const Layer& L, const Pass& p, const KvCache& cache) const;
  ops::DeltaNetShape delta_shape() const;

  const Qwen3VLTextConfig cfg_;
  ops::Backend& be_;
  int64_t max_chunk_;
  MropeTables rope_;
  std::unique_ptr<ops::Linear> embed_, lm_head_;  // lm_head_ null: tied to embed_
  ops::Buf norm_;
  std::vector<Layer> layers_;
  std::unique_ptr<Mtp> mtp_;
  // Activations, [max_chunk, ...] in the backend's type.
  ops::Buffer x_, xn_, qkv_, q_, attn_, tmp_, gate_up_, mlp_;
  // A hybrid model's: the attention's output gates [max_chunk, heads · head_dim]; a Gated
  // DeltaNet's input product, scratch and output (DeltaNetShape's proj_dim, mixed_dim, nv · dv).
  ops::Buffer gate_, proj_, mixed_, delta_out_;
  std::vector<std::vector<float>> conv_taps_;  // each linear layer's conv1d, tap-major
  // A sparse layer's: router logits f32 [max_chunk, E], the chosen experts int32 and their
  // weights f32 [max_chunk, k], and moe_experts' scratch; with a shared expert, its gate's
  // logits f32 [max_chunk] and its output [max_chunk, hidden].
  ops::Buffer router_logits_, route_ids_, route_weights_, moe_scratch_, shared_logit_, shared_;
  // The pass's tables: host staging, and the backend's copies (the same memory on the CPU).
  // ints: ids, slots, token sequence, token position, logit rows, image rows, an MTP pass's
  // hidden rows (max_chunk each).
  static constexpr int kIds = 0, kSlots = 1, kSeq = 2, kPos = 3, kSel = 4, kVis = 5, kHid = 6,
                       kIntRows = 7;
  ops::Buffer ints_host_, ints_, rope_host_, rope_dev_, tables_host_, tables_, feats_;
  int64_t table_cap_ = 0;  // block-table entries tables_ holds
  Status reserve_tables(int64_t entries);
  std::vector<int32_t> seq_row_, seq_len_, seq_pos_, seq_slot_, seq_token_slot_;  // [max_chunk]
  std::vector<int64_t> pos_t_, pos_h_, pos_w_;                                    // [max_chunk]
  std::vector<float> h_feats_;  // image rows' features (prefill only)
};

}  // namespace vlm

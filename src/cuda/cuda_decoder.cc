// The CUDA text decoder (src/cuda/cuda_decoder.h): TextDecoder::forward_batch step by step, on
// the device. Per call the host builds the small tables (token ids, M-RoPE cos/sin, KV slots,
// block tables, image rows) and uploads them; everything else stays on the device until the
// logits come back.
#include "cuda/cuda_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cuda/cuda_ops.h"
#include "cuda/flash_attention.h"
#include "cuda/fp8.h"
#include "cuda/gemm.h"
#include "cuda/int8_gemm.h"
#include "cuda/sampling.h"
#include "cuda/stream.h"
#include "cuda/weights.h"

namespace vlm::cuda {
namespace {

// A linear layer's weight [n, k] as the device holds it: in the activation type, INT8 with one
// f32 scale per output row (--quant int8), or E4M3 with one f32 scale (--quant fp8).
struct Linear {
  DeviceBuffer w, scale;
  bool int8 = false, fp8 = false;
  int64_t n = 0, k = 0;
};

// One decoder layer's weights; q|k|v and gate|up stacked so one product computes each group.
struct Layer {
  DeviceBuffer input_ln, q_norm, k_norm, post_ln;
  Linear qkv, o, gate_up, down;
};

// Chunks from this many tokens make a forward pass a prefill step (flash attention).
constexpr int64_t kFlashMinTokens = 16;

// Linear layers stacked by rows (q|k|v, gate|up): all stored as F32 / BF16 / F16 (kept in the
// activation type, or with fp8 quantized to E4M3 on the device, one scale for the stack), or all
// INT8 with per-row scales (kept so).
Status upload_linear(const std::vector<const TensorView*>& ts, DType act, bool fp8, Linear* out) {
  out->k = ts.front()->dim(1);
  out->n = 0;
  for (const TensorView* t : ts) out->n += t->dim(0);
  out->int8 = ts.front()->dtype == vlm::DType::kI8;
  if (!out->int8 && !fp8) return upload_stacked(ts, act, &out->w);
  if (!out->int8) {
    DeviceBuffer wide, amax;
    VLM_RETURN_IF_ERROR(upload_stacked(ts, act, &wide));
    VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(static_cast<size_t>(out->n * out->k), &out->w));
    VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(4, &out->scale));
    VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(4, &amax));
    VLM_RETURN_IF_ERROR(quantize_fp8(wide.data(), act, out->n * out->k,
                                     static_cast<float*>(amax.data()),
                                     static_cast<float*>(out->scale.data()), out->w.data()));
    out->fp8 = true;
    return synchronize();  // before `wide` and `amax` go
  }
  std::vector<int8_t> q;
  std::vector<float> scale;
  for (const TensorView* t : ts) {
    if (t->dtype != vlm::DType::kI8 || t->scale == nullptr || t->dim(1) != out->k) {
      return invalid_argument("stacked INT8 weights must all be INT8 [N, K] with scales");
    }
    const auto* d = static_cast<const int8_t*>(t->data);
    q.insert(q.end(), d, d + t->numel());
    scale.insert(scale.end(), t->scale, t->scale + t->dim(0));
  }
  VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(q.size(), &out->w));
  VLM_RETURN_IF_ERROR(out->w.upload(q.data(), q.size()));
  return DeviceBuffer::upload_f32(scale, &out->scale);
}

class CudaDecoder final : public DeviceDecoder {
 public:
  CudaDecoder(const Qwen3VLConfig& cfg, const CudaDecoderOptions& o)
      : c_(cfg.text_config), opts_(o), act_(o.f32 ? DType::kF32 : DType::kBF16), rope_(c_) {}

  Status init(const TextWeights& w) {
    if (device_count() == 0) return invalid_argument("no CUDA device is visible to this process");
    if (c_.head_dim % 2 != 0 || c_.head_dim > 256) {
      return invalid_argument("the CUDA backend needs an even head_dim up to 256, not " +
                              std::to_string(c_.head_dim));
    }
    VLM_RETURN_IF_ERROR(Gemm::create(&gemm_));
    // up(): linear weights onto the device, stacked by rows; decode reads each once per step.
    auto up = [&](const std::vector<const TensorView*>& ts, Linear* out, const char* name,
                  bool fp8 = false) -> Status {
      VLM_RETURN_IF_ERROR(upload_linear(ts, act_, fp8, out).with_context(name));
      decode_bytes_ += static_cast<int64_t>(out->w.bytes() + out->scale.bytes());
      any_int8_ = any_int8_ || out->int8;
      return ok_status();
    };
    VLM_RETURN_IF_ERROR(upload_tensor(w.embed_tokens, act_, &embed_).with_context("embed_tokens"));
    tied_ = w.lm_head.data == w.embed_tokens.data;
    if (tied_) {
      decode_bytes_ += static_cast<int64_t>(embed_.bytes());
    } else {
      VLM_RETURN_IF_ERROR(up({&w.lm_head}, &lm_head_, "lm_head"));
    }
    VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(w.norm, &norm_));
    layers_.resize(w.layers.size());
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const TextLayerWeights& s = w.layers[l];
      Layer& d = layers_[l];
      VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.input_layernorm, &d.input_ln));
      VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.post_attention_layernorm, &d.post_ln));
      VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.q_norm, &d.q_norm));
      VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.k_norm, &d.k_norm));
      const bool f8 = opts_.fp8;  // the layers' products; the head stays as stored
      VLM_RETURN_IF_ERROR(up({&s.q_proj, &s.k_proj, &s.v_proj}, &d.qkv, "q/k/v_proj", f8));
      VLM_RETURN_IF_ERROR(up({&s.o_proj}, &d.o, "o_proj", f8));
      VLM_RETURN_IF_ERROR(up({&s.gate_proj, &s.up_proj}, &d.gate_up, "gate/up_proj", f8));
      VLM_RETURN_IF_ERROR(up({&s.down_proj}, &d.down, "down_proj", f8));
    }
    if (any_int8_) {
      VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(
          static_cast<size_t>(kInt8ScratchElems) * (act_ == DType::kF32 ? 4 : 2), &int8_scratch_));
    }
    // Scratch for max_chunk tokens.
    const int64_t C = opts_.max_chunk, H = c_.hidden_size, I = c_.intermediate_size;
    const int64_t qd = c_.num_attention_heads * c_.head_dim;
    const int64_t kvd = c_.num_key_value_heads * c_.head_dim;
    const size_t a = act_ == DType::kF32 ? 4 : 2;
    for (auto [buf, n] : {std::pair{&x_, C * H},
                          {&xn_, C * H},
                          {&qkv_, C * (qd + 2 * kvd)},
                          {&q_, C * qd},
                          {&attn_, C * qd},
                          {&tmp_, C * H},
                          {&gate_up_, C * 2 * I},
                          {&mlp_, C * I}}) {
      VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(static_cast<size_t>(n) * a, buf));
    }
    VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(2 * C * rope_.half() * 4, &rope_dev_));
    VLM_RETURN_IF_ERROR(PinnedBuffer::allocate(2 * C * rope_.half() * 4, &rope_host_));
    VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(kIntRows * C * 4, &ints_));
    VLM_RETURN_IF_ERROR(PinnedBuffer::allocate(kIntRows * C * 4, &ints_host_));
    VLM_RETURN_IF_ERROR(PinnedBuffer::allocate(2 * C * 4, &argmax_host_));  // argmax | drawn
    VLM_RETURN_IF_ERROR(
        DeviceBuffer::allocate(paged_attention_scratch_floats(c_.head_dim) * 4, &partial_));
    VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(C * c_.vocab_size * 4, &logits_));
    if (opts_.fp8 && !layers_.empty()) {
      VLM_RETURN_IF_ERROR(
          DeviceBuffer::allocate(static_cast<size_t>(C * std::max({H, qd, I})), &fp8_x_));
      VLM_RETURN_IF_ERROR(DeviceBuffer::allocate(2 * 4, &fp8_scales_));
      // One product now, so that a GPU or cuBLASLt without FP8 fails at load, saying so.
      VLM_RETURN_IF_ERROR(linear(xn_.data(), layers_.front().o, 1, tmp_.data(), act_)
                              .with_context("--quant fp8 on this GPU"));
    }
    VLM_RETURN_IF_ERROR(Stream::create(&stream_));
    VLM_RETURN_IF_ERROR(synchronize());
    description_ = device_description(0) + (act_ == DType::kF32 ? ", f32" : ", bf16") +
                   (opts_.fp8 ? ", fp8 weights" : "") + (opts_.graphs ? ", CUDA graphs" : "");
    return ok_status();
  }

  int64_t max_chunk() const override { return opts_.max_chunk; }
  int64_t block_bytes(int64_t block_size) const override {
    return c_.num_hidden_layers * 2 * block_size * c_.num_key_value_heads * c_.head_dim *
           (act_ == DType::kF32 ? 4 : 2);
  }
  int64_t cache_budget_bytes(double utilization) const override {
    int64_t free_b = 0, total = 0;
    if (!memory_info(&free_b, &total).ok()) return 0;
    const int64_t cache_now = static_cast<int64_t>(k_cache_.bytes() + v_cache_.bytes());
    const int64_t used_other = total - free_b - cache_now;
    return std::max<int64_t>(
        0, static_cast<int64_t>(utilization * static_cast<double>(total)) - used_other);
  }
  Status allocate_cache(int64_t num_blocks, int64_t block_size,
                        int64_t max_blocks_per_seq) override;
  int64_t cache_blocks() const override { return blocks_; }
  int64_t cache_block_size() const override { return bs_; }
  std::string description() const override { return description_; }
  int64_t decode_weight_bytes() const override { return decode_bytes_; }
  int64_t graph_replays() const override { return replays_; }

  Status forward_batch(const SeqChunk* chunks, int64_t n_chunks, float* logits,
                       int32_t* argmax) override;

 private:
  // What one forward pass launches, once the tables are on the device.
  struct Pass {
    int64_t rows = 0;      // token rows (a graph's bucket: padded)
    int64_t n_sel = 0;     // rows that get logits
    bool sel_all = false;  // the logit rows are rows 0 .. n_sel − 1 (decode)
    int64_t stride = 0;    // block-table entries per sequence
    int64_t max_seen = 0;  // bound on the keys a query sees (sets the attention splits)
    int64_t n_tiles = 0;   // flash query tiles; 0: the warp kernel
    int64_t n_vis = 0;     // image rows
    size_t taps = 0;       // DeepStack features per image row
    bool argmax = false;
  };
  Status enqueue(const Pass& p);
  // Layer l's K (or V) cache: [blocks · block_size, n_kv_heads · head_dim].
  void* cache_layer(const DeviceBuffer& b, int64_t l) const {
    const size_t per = b.bytes() / static_cast<size_t>(c_.num_hidden_layers);
    return static_cast<char*>(b.data()) + per * static_cast<size_t>(l);
  }
  // y[M, L.n] = x[M, L.k] · Lᵀ, y in y_t (BF16 for FP8 weights).
  Status linear(const void* x, const Linear& L, int64_t M, void* y, DType y_t) {
    if (L.fp8) {
      float* amax = fp8_scales_.as<float>();
      VLM_RETURN_IF_ERROR(quantize_fp8(x, act_, M * L.k, amax, amax + 1, fp8_x_.data()));
      return gemm_->matmul_fp8(fp8_x_.data(), amax + 1, L.w.data(),
                               static_cast<const float*>(L.scale.data()), M, L.n, L.k, y);
    }
    if (L.int8) {
      return int8_matmul(*gemm_, x, act_, static_cast<const int8_t*>(L.w.data()),
                         static_cast<const float*>(L.scale.data()), M, L.n, L.k, y, y_t,
                         int8_scratch_.data());
    }
    return gemm_->matmul(x, L.w.data(), act_, M, L.n, L.k, y, y_t);
  }
  int32_t* host_ints(int row) const {
    return static_cast<int32_t*>(ints_host_.data()) + row * opts_.max_chunk;
  }
  const int32_t* dev_ints(int row) const {
    return ints_.as<const int32_t>() + row * opts_.max_chunk;
  }
  // The smallest graph bucket holding `rows` decode rows, or 0 when none does.
  int64_t bucket_for(int64_t rows) const {
    for (int64_t b : kBuckets) {
      if (b >= rows && b <= opts_.max_chunk) return b;
    }
    return 0;
  }

  // Rows of the int tables (each max_chunk long): ids, KV slots, sequence and position of each
  // token, the logit rows, then the flash query tiles (two rows: pairs).
  static constexpr int kIds = 0, kSlots = 1, kSeq = 2, kPos = 3, kSel = 4, kTiles = 5;
  static constexpr int kIntRows = 7;
  static constexpr int64_t kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256};

  const Qwen3VLTextConfig c_;
  CudaDecoderOptions opts_;
  DType act_;
  MropeTables rope_;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Stream> stream_;
  std::string description_;
  int64_t decode_bytes_ = 0;
  bool tied_ = false, any_int8_ = false;
  DeviceBuffer embed_, norm_, int8_scratch_;
  DeviceBuffer fp8_x_, fp8_scales_;  // --quant fp8: a product's E4M3 activations, amax | scale
  Linear lm_head_;                   // unless tied_ (then the embedding table, as stored)
  std::vector<Layer> layers_;
  DeviceBuffer x_, xn_, qkv_, q_, attn_, tmp_, gate_up_, mlp_, partial_, logits_;
  DeviceBuffer rope_dev_, ints_, tables_;  // uploaded per pass from the pinned copies below
  PinnedBuffer rope_host_, ints_host_, tables_host_, argmax_host_;
  DeviceBuffer vis_rows_, vis_feats_;           // image rows, [1 + taps, rows, hidden] f32 features
  DeviceBuffer samples_, penalties_, sampled_;  // the device draws: settings, penalties, ids
  DeviceBuffer k_cache_, v_cache_;              // [layers, (blocks + 1) · block_size, kvd] each
  int64_t blocks_ = 0, bs_ = 0, max_table_ = 0;  // block `blocks_` is the padding rows' scratch
  // Decode graphs by (rows bucket, table width); one is captured the second time its shape runs
  // every kernel and lets cuBLAS pick its algorithms eagerly).
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Graph>> graphs_;
  std::set<std::pair<int64_t, int64_t>> warmed_;
  bool graphs_broken_ = false;
  int64_t replays_ = 0;
  // Host staging, reused across calls.
  std::vector<int32_t> h_vis_rows_;
  std::vector<SampleParams> h_samples_;
  std::vector<PenaltyEntry> h_penalties_;
  std::vector<int64_t> h_chunk_off_, h_chunk_n_;
  std::vector<float> h_feats_;
  std::vector<int64_t> h_pos_t_, h_pos_h_, h_pos_w_;
};

Status CudaDecoder::allocate_cache(int64_t num_blocks, int64_t block_size,
                                   int64_t max_blocks_per_seq) {
  if (num_blocks <= 0 || block_size <= 0 || max_blocks_per_seq <= 0) {
    return invalid_argument("KV cache: no blocks");
  }
  graphs_.clear();  // they hold the old buffers' addresses
  warmed_.clear();
  k_cache_ = DeviceBuffer();
  v_cache_ = DeviceBuffer();
  blocks_ = bs_ = max_table_ = 0;
  // One block more than asked: the scratch slots of a decode graph's padding rows.
  const size_t half = static_cast<size_t>(block_bytes(block_size) / 2) * (num_blocks + 1);
  const size_t table_bytes = static_cast<size_t>(opts_.max_chunk * max_blocks_per_seq) * 4;
  Status s = DeviceBuffer::allocate(half, &k_cache_);
  if (s.ok()) s = DeviceBuffer::allocate(half, &v_cache_);
  if (s.ok()) s = DeviceBuffer::allocate(table_bytes, &tables_);
  if (s.ok()) s = PinnedBuffer::allocate(table_bytes, &tables_host_);
  if (!s.ok()) {
    k_cache_ = DeviceBuffer();
    v_cache_ = DeviceBuffer();
    return Status(StatusCode::kUnavailable, "KV cache of " + std::to_string(num_blocks) +
                                                      " blocks (" + std::to_string(2 * half >> 20) +
                                                      " MiB) does not fit the GPU: " + s.message());
  }
  blocks_ = num_blocks;
  bs_ = block_size;
  max_table_ = max_blocks_per_seq;
  return ok_status();
}

Status CudaDecoder::enqueue(const Pass& p) {
  const int64_t H = c_.hidden_size, nh = c_.num_attention_heads, nkv = c_.num_key_value_heads,
                hd = c_.head_dim, I = c_.intermediate_size, V = c_.vocab_size;
  const int64_t T = p.rows;
  const float eps = static_cast<float>(c_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* cos = rope_dev_.as<float>();
  const float* sin = cos + opts_.max_chunk * rope_.half();
  const int32_t* tables = tables_.as<const int32_t>();
  auto feats = [&](size_t k) { return vis_feats_.as<float>() + k * p.n_vis * H; };

  VLM_RETURN_IF_ERROR(embedding_gather(embed_.data(), act_, dev_ints(kIds), T, H, x_.data(), act_));
  if (p.n_vis > 0) {
    VLM_RETURN_IF_ERROR(set_rows_at(x_.data(), vis_rows_.as<const int32_t>(), feats(0), DType::kF32,
                                    p.n_vis, H, act_));
  }
  bool pending = false;  // tmp_ still has to be added to x_ (as in TextDecoder)
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    if (pending) {
      VLM_RETURN_IF_ERROR(add_rms_norm(x_.data(), tmp_.data(), L.input_ln.as<float>(), T, H, eps,
                                       xn_.data(), act_));
    } else {
      VLM_RETURN_IF_ERROR(rms_norm(x_.data(), L.input_ln.as<float>(), T, H, eps, xn_.data(), act_));
    }
    VLM_RETURN_IF_ERROR(linear(xn_.data(), L.qkv, T, qkv_.data(), act_));
    void* kc = cache_layer(k_cache_, static_cast<int64_t>(l));
    void* vc = cache_layer(v_cache_, static_cast<int64_t>(l));
    // q/k norms and rotary; q to q_, K and V straight into their cache slots.
    VLM_RETURN_IF_ERROR(qkv_rope_store(qkv_.data(), T, nh, nkv, hd, L.q_norm.as<float>(),
                                       L.k_norm.as<float>(), eps, cos, sin, dev_ints(kSlots),
                                       q_.data(), kc, vc, act_));
    if (p.n_tiles > 0) {
      VLM_RETURN_IF_ERROR(flash_attention_paged(q_.data(), dev_ints(kTiles), p.n_tiles,
                                                dev_ints(kSeq), dev_ints(kPos), tables, p.stride,
                                                bs_, kc, vc, nh, nkv, hd, scale, attn_.data()));
    } else {
      VLM_RETURN_IF_ERROR(paged_attention(q_.data(), T, dev_ints(kSeq), dev_ints(kPos), tables,
                                          p.stride, bs_, kc, vc, nh, nkv, hd, scale, p.max_seen,
                                          partial_.as<float>(), attn_.data(), act_));
    }
    VLM_RETURN_IF_ERROR(linear(attn_.data(), L.o, T, tmp_.data(), act_));
    VLM_RETURN_IF_ERROR(
        add_rms_norm(x_.data(), tmp_.data(), L.post_ln.as<float>(), T, H, eps, xn_.data(), act_));
    VLM_RETURN_IF_ERROR(linear(xn_.data(), L.gate_up, T, gate_up_.data(), act_));
    VLM_RETURN_IF_ERROR(silu_mul_rows(gate_up_.data(), T, I, mlp_.data(), act_));
    VLM_RETURN_IF_ERROR(linear(mlp_.data(), L.down, T, tmp_.data(), act_));
    pending = true;
    if (p.n_vis > 0 && l < p.taps) {  // DeepStack: after decoder layer l, the image rows get tap l
      VLM_RETURN_IF_ERROR(add_inplace(x_.data(), tmp_.data(), act_, T * H, act_));
      pending = false;
      VLM_RETURN_IF_ERROR(add_rows_at(x_.data(), vis_rows_.as<const int32_t>(), feats(1 + l),
                                      DType::kF32, p.n_vis, H, act_));
    }
  }
  if (p.n_sel == 0) return ok_status();
  // The rows that want logits, normed into xn_ (gathered there unless they are all rows), then
  // the head, in f32.
  if (pending) VLM_RETURN_IF_ERROR(add_inplace(x_.data(), tmp_.data(), act_, T * H, act_));
  if (p.sel_all) {
    VLM_RETURN_IF_ERROR(rms_norm(x_.data(), norm_.as<float>(), p.n_sel, H, eps, xn_.data(), act_));
  } else {
    VLM_RETURN_IF_ERROR(
        embedding_gather(x_.data(), act_, dev_ints(kSel), p.n_sel, H, xn_.data(), act_));
    VLM_RETURN_IF_ERROR(rms_norm(xn_.data(), norm_.as<float>(), p.n_sel, H, eps, xn_.data(), act_));
  }
  if (tied_) {
    VLM_RETURN_IF_ERROR(
        gemm_->matmul(xn_.data(), embed_.data(), act_, p.n_sel, V, H, logits_.data(), DType::kF32));
  } else {
    VLM_RETURN_IF_ERROR(linear(xn_.data(), lm_head_, p.n_sel, logits_.data(), DType::kF32));
  }
  if (p.argmax) {
    // The logit-row list is spent: its device row takes the argmax.
    VLM_RETURN_IF_ERROR(
        argmax_rows(logits_.as<float>(), p.n_sel, V, const_cast<int32_t*>(dev_ints(kSel))));
  }
  return ok_status();
}

Status CudaDecoder::forward_batch(const SeqChunk* chunks, int64_t n_chunks, float* logits,
                                  int32_t* argmax) {
  if (blocks_ == 0) return internal_error("forward: the KV cache is not allocated");
  const int64_t H = c_.hidden_size, V = c_.vocab_size, C = opts_.max_chunk;
  int64_t T = 0;
  VLM_RETURN_IF_ERROR(check_chunks(chunks, n_chunks, c_, blocks_, bs_, C, &T));
  StreamScope on_stream(stream_->get());

  // A decode step (one token per sequence, no image) within a bucket runs as a CUDA graph: the
  // rows padded to the bucket, the block tables to the next power of two (at least 16) of the
  // longest one, so a graph serves a range of context lengths without copying full-width tables.
  bool decode = opts_.graphs && !graphs_broken_;
  int64_t stride = 1, max_seen = 0, longest = 0;
  bool any_vision = false;
  size_t taps = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const SeqChunk& ch = chunks[c];
    if (ch.num_table_blocks > max_table_) {
      return internal_error("forward: a block table is longer than the cache was sized for");
    }
    stride = std::max(stride, ch.num_table_blocks);
    max_seen = std::max(max_seen, ch.first + ch.n);
    longest = std::max(longest, ch.n);
    decode = decode && ch.n == 1 && ch.vision == nullptr && ch.rows == LogitRows::kLast;
    if (ch.vision == nullptr) continue;
    if (any_vision && ch.vision->deepstack.size() != taps) {
      return internal_error("forward: image chunks with different DeepStack depths");
    }
    any_vision = true;
    taps = ch.vision->deepstack.size();
  }
  const int64_t bucket = decode ? bucket_for(T) : 0;
  const int64_t rows = bucket > 0 ? bucket : T;
  if (bucket > 0) {
    int64_t width = 16;
    while (width < stride) width *= 2;
    stride = std::min(width, max_table_);
  }
  const std::pair<int64_t, int64_t> shape{bucket, stride};

  // Host tables, in pinned memory.
  int32_t* ids = host_ints(kIds);
  int32_t* slots = host_ints(kSlots);
  int32_t* tok_seq = host_ints(kSeq);
  int32_t* tok_pos = host_ints(kPos);
  int32_t* sel = host_ints(kSel);
  int32_t* table = static_cast<int32_t*>(tables_host_.data());
  h_pos_t_.resize(rows);
  h_pos_h_.resize(rows);
  h_pos_w_.resize(rows);
  h_vis_rows_.clear();
  std::vector<std::pair<const VisionRows*, int32_t>> vis_src;
  int64_t n_sel = 0;
  for (int64_t c = 0, off = 0; c < n_chunks; off += chunks[c].n, ++c) {
    const SeqChunk& ch = chunks[c];
    std::copy_n(ch.block_table, ch.num_table_blocks, table + c * stride);
    std::copy_n(ch.ids, ch.n, ids + off);
    std::copy_n(ch.pos.t, ch.n, h_pos_t_.data() + off);
    std::copy_n(ch.pos.h, ch.n, h_pos_h_.data() + off);
    std::copy_n(ch.pos.w, ch.n, h_pos_w_.data() + off);
    for (int64_t i = 0; i < ch.n; ++i) {
      const int64_t p = ch.first + i;
      slots[off + i] = static_cast<int32_t>(ch.block_table[p / bs_] * bs_ + p % bs_);
      tok_seq[off + i] = static_cast<int32_t>(c);
      tok_pos[off + i] = static_cast<int32_t>(p);
      if (ch.vision != nullptr && ch.vision->feature_row[i] >= 0) {
        h_vis_rows_.push_back(static_cast<int32_t>(off + i));
        vis_src.emplace_back(ch.vision, ch.vision->feature_row[i]);
      }
    }
    if (ch.rows == LogitRows::kLast) sel[n_sel++] = static_cast<int32_t>(off + ch.n - 1);
    if (ch.rows == LogitRows::kAll) {
      for (int64_t i = 0; i < ch.n; ++i) sel[n_sel++] = static_cast<int32_t>(off + i);
    }
  }
  for (int64_t r = T; r < rows; ++r) {  // a graph's padding rows: token 0 at position 0, whose
    ids[r] = 0;                         // K/V go to the scratch block
    slots[r] = static_cast<int32_t>(blocks_ * bs_);
    tok_seq[r] = static_cast<int32_t>(r);
    tok_pos[r] = 0;
    table[r * stride] = static_cast<int32_t>(blocks_);
    h_pos_t_[r] = h_pos_h_[r] = h_pos_w_[r] = 0;
  }
  Pass pass;
  pass.rows = rows;
  pass.stride = stride;
  pass.argmax = argmax != nullptr || bucket > 0;
  if (bucket > 0) {
    pass.n_sel = rows;
    pass.sel_all = true;
    pass.max_seen = stride * bs_;  // fixed per graph; each query splits its own keys
  } else {
    pass.n_sel = n_sel;
    pass.max_seen = max_seen;
    // Prefill steps (a chunk of kFlashMinTokens or more) run attention on the tensor cores, in
    // BF16; decode steps keep the warp-per-row kernel, split along long contexts.
    if (act_ == DType::kBF16 && flash_attention_supports(c_.head_dim) &&
        longest >= kFlashMinTokens) {
      h_chunk_off_.clear();
      h_chunk_n_.clear();
      for (int64_t c = 0, off = 0; c < n_chunks; off += chunks[c].n, ++c) {
        h_chunk_off_.push_back(off);
        h_chunk_n_.push_back(chunks[c].n);
      }
      pass.n_tiles =
          flash_query_tiles(h_chunk_off_.data(), h_chunk_n_.data(), n_chunks, host_ints(kTiles));
    }
  }
  const int64_t half = rope_.half();
  float* cos = static_cast<float*>(rope_host_.data());
  rope_.compute(Positions3{h_pos_t_.data(), h_pos_h_.data(), h_pos_w_.data()}, rows, cos,
                cos + C * half);

  // Uploads on the stream; image features (rare, prefill only) by plain copies.
  pass.n_vis = static_cast<int64_t>(h_vis_rows_.size());
  pass.taps = taps;
  if (pass.n_vis > 0) {
    h_feats_.resize(static_cast<size_t>((1 + taps) * pass.n_vis * H));
    for (int64_t r = 0; r < pass.n_vis; ++r) {
      const VisionRows* vr = vis_src[r].first;
      const int64_t f = vis_src[r].second;
      std::copy_n(vr->embeds + f * H, H, h_feats_.data() + r * H);
      for (size_t t = 0; t < taps; ++t) {
        std::copy_n(vr->deepstack[t] + f * H, H, h_feats_.data() + ((1 + t) * pass.n_vis + r) * H);
      }
    }
    VLM_RETURN_IF_ERROR(vis_rows_.reserve(h_vis_rows_.size() * 4));
    VLM_RETURN_IF_ERROR(vis_rows_.upload(h_vis_rows_.data(), h_vis_rows_.size() * 4));
    VLM_RETURN_IF_ERROR(vis_feats_.reserve(h_feats_.size() * 4));
    VLM_RETURN_IF_ERROR(vis_feats_.upload(h_feats_.data(), h_feats_.size() * 4));
  }
  VLM_RETURN_IF_ERROR(copy_to_device_async(ints_.data(), ints_host_.data(), ints_host_.bytes()));
  VLM_RETURN_IF_ERROR(
      copy_to_device_async(tables_.data(), table, static_cast<size_t>(rows * stride) * 4));
  VLM_RETURN_IF_ERROR(
      copy_to_device_async(rope_dev_.data(), cos, static_cast<size_t>(rows * half) * 4));
  VLM_RETURN_IF_ERROR(copy_to_device_async(rope_dev_.as<float>() + C * half, cos + C * half,
                                           static_cast<size_t>(rows * half) * 4));

  // The pass: a graph replay, a capture, or plain launches.
  auto graph = graphs_.find(shape);
  if (bucket > 0 && graph == graphs_.end() && warmed_.count(shape) > 0) {
    VLM_RETURN_IF_ERROR(stream_synchronize());  // nothing of ours may be pending in the capture
    std::unique_ptr<Graph> captured;
    Status st = Graph::begin_capture();
    if (st.ok()) {
      const Status work = enqueue(pass);
      st = Graph::end_capture(&captured);
      if (st.ok()) st = work;
    }
    if (st.ok()) {
      graph = graphs_.emplace(shape, std::move(captured)).first;
    } else {  // keep serving without graphs
      std::fprintf(stderr, "vlm: CUDA graph capture failed, decoding without graphs: %s\n",
                   st.message().c_str());
      graphs_broken_ = true;
    }
  }
  if (bucket > 0 && graph != graphs_.end()) {
    VLM_RETURN_IF_ERROR(graph->second->launch());
    ++replays_;
  } else {
    VLM_RETURN_IF_ERROR(enqueue(pass));
    if (bucket > 0) warmed_.insert(shape);
  }

  // Draws on the device for the chunks that asked (their logit rows are penalised in place).
  h_samples_.clear();
  h_penalties_.clear();
  if (argmax != nullptr) {
    for (int64_t c = 0, row = 0; c < n_chunks; ++c) {
      const SeqChunk& ch = chunks[c];
      if (ch.sample != nullptr && ch.rows == LogitRows::kLast) {
        const DeviceSample& d = *ch.sample;
        SampleParams sp;
        sp.row = static_cast<int32_t>(row);
        sp.top_k = d.top_k;
        sp.inv_temperature = d.inv_temperature;
        sp.top_p = d.top_p;
        sp.min_p = d.min_p;
        sp.u = d.u;
        sp.penalty_begin = static_cast<int32_t>(h_penalties_.size());
        for (int64_t e = 0; e < d.n_penalties; ++e) {
          h_penalties_.push_back(
              {d.penalties[e].id, d.penalties[e].repetition, d.penalties[e].subtract});
        }
        sp.penalty_end = static_cast<int32_t>(h_penalties_.size());
        h_samples_.push_back(sp);
      }
      row += ch.rows == LogitRows::kNone ? 0 : (ch.rows == LogitRows::kLast ? 1 : ch.n);
    }
  }
  if (!h_samples_.empty()) {
    const size_t pbytes = std::max<size_t>(h_penalties_.size(), 1) * sizeof(PenaltyEntry);
    VLM_RETURN_IF_ERROR(samples_.reserve(h_samples_.size() * sizeof(SampleParams)));
    VLM_RETURN_IF_ERROR(penalties_.reserve(pbytes));
    VLM_RETURN_IF_ERROR(sampled_.reserve(h_samples_.size() * 4));
    VLM_RETURN_IF_ERROR(
        samples_.upload(h_samples_.data(), h_samples_.size() * sizeof(SampleParams)));
    if (!h_penalties_.empty()) {
      VLM_RETURN_IF_ERROR(
          penalties_.upload(h_penalties_.data(), h_penalties_.size() * sizeof(PenaltyEntry)));
    }
    VLM_RETURN_IF_ERROR(sample_rows(logits_.as<float>(), V,
                                    static_cast<const SampleParams*>(samples_.data()),
                                    static_cast<int64_t>(h_samples_.size()),
                                    static_cast<const PenaltyEntry*>(penalties_.data()),
                                    static_cast<int32_t*>(sampled_.data())));
  }

  // Results: the argmax of the real rows (the drawn ids of sampled ones), and the logit rows the
  // caller wants in full (one run per chunk; all of them without `argmax`).
  if (pass.argmax && argmax != nullptr) {
    VLM_RETURN_IF_ERROR(
        copy_to_host_async(argmax_host_.data(), dev_ints(kSel), static_cast<size_t>(n_sel) * 4));
  }
  if (!h_samples_.empty()) {
    VLM_RETURN_IF_ERROR(copy_to_host_async(static_cast<int32_t*>(argmax_host_.data()) + C,
                                           sampled_.data(), h_samples_.size() * 4));
  }
  for (int64_t c = 0, row = 0; c < n_chunks; ++c) {
    const SeqChunk& ch = chunks[c];
    const int64_t n_rows =
        ch.rows == LogitRows::kNone ? 0 : (ch.rows == LogitRows::kLast ? 1 : ch.n);
    if (n_rows > 0 && (argmax == nullptr || (!ch.argmax_only && ch.sample == nullptr))) {
      VLM_RETURN_IF_ERROR(copy_to_host_async(logits + row * V, logits_.as<float>() + row * V,
                                             static_cast<size_t>(n_rows * V) * 4));
    }
    row += n_rows;
  }
  VLM_RETURN_IF_ERROR(stream_synchronize());
  if (argmax != nullptr) {
    const auto* host = static_cast<const int32_t*>(argmax_host_.data());
    std::copy_n(host, n_sel, argmax);
    for (size_t j = 0; j < h_samples_.size(); ++j) argmax[h_samples_[j].row] = host[C + j];
  }
  return ok_status();
}

}  // namespace

Result<std::unique_ptr<DeviceDecoder>> make_cuda_decoder(const Qwen3VLConfig& cfg,
                                                         const TextWeights& w,
                                                         const CudaDecoderOptions& opts) {
  if (opts.max_chunk <= 0) return invalid_argument("max_chunk must be positive");
  auto d = std::make_unique<CudaDecoder>(cfg, opts);
  VLM_RETURN_IF_ERROR(d->init(w).with_context("loading the text decoder onto the GPU"));
  return std::unique_ptr<DeviceDecoder>(std::move(d));
}

}  // namespace vlm::cuda

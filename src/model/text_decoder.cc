#include "model/text_decoder.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <initializer_list>

namespace vlm {

MropeTables::MropeTables(const Qwen3VLTextConfig& c) {
  const int64_t dim = c.rotary_dims(), half = dim / 2;
  // inv_freq[j] = theta^(-2j / dim) over the rotary dims, as transformers computes it (float32
  // result).
  inv_freq_.resize(half);
  for (int64_t j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(dim);
    inv_freq_[j] = static_cast<float>(1.0 / std::pow(c.rope_theta, static_cast<double>(e)));
  }
  // Interleaved M-RoPE (apply_interleaved_mrope): frequency j takes the H position when
  // j % 3 == 1 and j < 3·sec_H, the W position when j % 3 == 2 and j < 3·sec_W, else T.
  axis_of_.assign(half, 0);
  const int64_t sec_h = c.mrope_section[1], sec_w = c.mrope_section[2];
  for (int64_t j = 0; j < half; ++j) {
    if (j % 3 == 1 && j < 3 * sec_h) axis_of_[j] = 1;
    if (j % 3 == 2 && j < 3 * sec_w) axis_of_[j] = 2;
  }
}

void MropeTables::compute(const Positions3& pos, int64_t n, float* cos, float* sin) const {
  const int64_t h = half();
  for (int64_t i = 0; i < n; ++i) {
    const float p[3] = {static_cast<float>(pos.t[i]), static_cast<float>(pos.h[i]),
                        static_cast<float>(pos.w[i])};
    for (int64_t j = 0; j < h; ++j) {
      const float a = p[axis_of_[j]] * inv_freq_[j];  // one f32 product, as torch's matmul
      cos[i * h + j] = std::cos(a);
      sin[i * h + j] = std::sin(a);
    }
  }
}

Status check_chunks(const SeqChunk* chunks, int64_t n_chunks, const Qwen3VLTextConfig& c,
                    int64_t cache_blocks, int64_t bs, int64_t max_chunk, int64_t* tokens,
                    int64_t state_slots) {
  int64_t T = 0;
  for (int64_t i = 0; i < n_chunks; ++i) {
    const SeqChunk& ch = chunks[i];
    if (ch.n <= 0) return invalid_argument("forward: a chunk has no tokens");
    if (state_slots > 0) {
      if (ch.state_slot < 0 || ch.state_slot >= state_slots) {
        return internal_error("forward: a chunk's state slot is outside the state cache");
      }
      for (int64_t j = 0; j < i; ++j) {
        if (chunks[j].state_slot == ch.state_slot) {
          return internal_error("forward: two chunks of one pass share a state slot");
        }
      }
    }
    if (ch.first + ch.n > ch.num_table_blocks * bs) {
      return out_of_range("sequence of " + std::to_string(ch.first + ch.n) +
                          " tokens exceeds its KV cache blocks (" +
                          std::to_string(ch.num_table_blocks * bs) + " positions)");
    }
    for (int64_t b = 0; b < ch.num_table_blocks; ++b) {
      if (ch.block_table[b] < 0 || ch.block_table[b] >= cache_blocks) {
        return internal_error("forward: block id outside the KV cache");
      }
    }
    for (int64_t k = 0; k < ch.n; ++k) {
      if (ch.ids[k] < 0 || ch.ids[k] >= c.vocab_size) {
        return invalid_argument("token id " + std::to_string(ch.ids[k]) +
                                " is outside the vocabulary [0, " + std::to_string(c.vocab_size) +
                                ")");
      }
    }
    T += ch.n;
  }
  if (T > max_chunk) return internal_error("forward: batch larger than the scratch buffers");
  *tokens = T;
  return ok_status();
}

TextDecoder::TextDecoder(const Qwen3VLConfig& cfg, ops::Backend& be, int64_t max_chunk)
    : cfg_(cfg.text_config), be_(be), max_chunk_(max_chunk), rope_(cfg.text_config) {}

Result<std::unique_ptr<TextDecoder>> TextDecoder::create(const Qwen3VLConfig& cfg,
                                                         const TextWeights& w, ops::Backend& be,
                                                         int64_t max_chunk) {
  if (max_chunk <= 0) return invalid_argument("max_chunk must be positive");
  if (cfg.text_config.head_dim % 2 != 0) return invalid_argument("head_dim must be even");
  if (!cfg.text_config.layer_types.empty() && !be.supports_hybrid()) {
    return unimplemented(std::string("the ") + ops::device_name(be.device()) +
                         " backend has no Qwen3.5 (Gated DeltaNet) kernels yet (the CPU runs "
                         "this model)");
  }
  if (cfg.text_config.num_experts > 0 && !be.supports_moe()) {
    return unimplemented(
        std::string("the ") + ops::device_name(be.device()) +
        " backend has no mixture-of-experts kernels yet (the CPU runs this model)");
  }
  if (has_fused_experts(w)) {
    return internal_error("the fused expert tensors were not split (quantize_text_weights)");
  }
  VLM_RETURN_IF_ERROR(be.reserve_attention(cfg.text_config.head_dim));
  std::unique_ptr<TextDecoder> d(new TextDecoder(cfg, be, max_chunk));
  VLM_RETURN_IF_ERROR(d->init(w));
  return d;
}

Status TextDecoder::init(const TextWeights& w) {
  auto linear = [&](std::initializer_list<const TensorView*> ws, bool layer, const char* name,
                    std::unique_ptr<ops::Linear>* out) -> Status {
    ops::LinearOptions o;
    o.decoder_layer = layer;
    VLM_ASSIGN_OR_RETURN(*out,
                         be_.linear(std::span<const TensorView* const>(ws.begin(), ws.size()), o)
                             .with_context(name));
    return ok_status();
  };
  VLM_RETURN_IF_ERROR(linear({&w.embed_tokens}, false, "embed_tokens", &embed_));
  if (w.lm_head.data != w.embed_tokens.data) {
    VLM_RETURN_IF_ERROR(linear({&w.lm_head}, false, "lm_head", &lm_head_));
  }
  VLM_ASSIGN_OR_RETURN(norm_, be_.vector(w.norm));
  layers_.resize(w.layers.size());
  conv_taps_.reserve(static_cast<size_t>(cfg_.num_linear_layers()));  // the backend views them
  int64_t linear_layers = 0, attention_layers = 0;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const TextLayerWeights& s = w.layers[l];
    layers_[l].cache_index = s.linear ? linear_layers++ : attention_layers++;
    VLM_RETURN_IF_ERROR(init_layer(s, "layer " + std::to_string(l), &layers_[l]));
  }
  if (!w.mtp.layers.empty()) VLM_RETURN_IF_ERROR(init_mtp(w.mtp));
  return alloc_scratch();
}

Status TextDecoder::init_layer(const TextLayerWeights& s, const std::string& where, Layer* out) {
  auto linear = [&](std::initializer_list<const TensorView*> ws, bool layer, const char* name,
                    std::unique_ptr<ops::Linear>* o) -> Status {
    ops::LinearOptions lo;
    lo.decoder_layer = layer;
    VLM_ASSIGN_OR_RETURN(*o,
                         be_.linear(std::span<const TensorView* const>(ws.begin(), ws.size()), lo)
                             .with_context(where + "'s " + name));
    return ok_status();
  };
  Layer& d = *out;
  VLM_ASSIGN_OR_RETURN(d.input_ln, be_.vector(s.input_layernorm));
  VLM_ASSIGN_OR_RETURN(d.post_ln, be_.vector(s.post_attention_layernorm));
  if (s.linear) {
    VLM_RETURN_IF_ERROR(init_delta_net(s, &d).with_context(where + "'s linear_attn"));
  } else {
    VLM_ASSIGN_OR_RETURN(d.q_norm, be_.vector(s.q_norm));
    VLM_ASSIGN_OR_RETURN(d.k_norm, be_.vector(s.k_norm));
    VLM_RETURN_IF_ERROR(linear({&s.q_proj, &s.k_proj, &s.v_proj}, true, "q/k/v_proj", &d.qkv));
    VLM_RETURN_IF_ERROR(linear({&s.o_proj}, true, "o_proj", &d.o));
  }
  if (!s.sparse) {
    VLM_RETURN_IF_ERROR(linear({&s.gate_proj, &s.up_proj}, true, "gate/up_proj", &d.gate_up));
    return linear({&s.down_proj}, true, "down_proj", &d.down);
  }
  const MoeWeights& m = s.moe;
  if (m.router.rank() != 2 || m.router.dim(0) != cfg_.num_experts ||
      m.gate.size() != static_cast<size_t>(cfg_.num_experts) || m.up.size() != m.gate.size() ||
      m.down.size() != m.gate.size()) {
    return internal_error(where + ": experts do not match the config");
  }
  VLM_RETURN_IF_ERROR(linear({&m.router}, false, "mlp.gate", &d.router));
  d.experts.resize(2 * m.gate.size());
  for (size_t e = 0; e < m.gate.size(); ++e) {
    VLM_RETURN_IF_ERROR(
        linear({&m.gate[e], &m.up[e]}, true, "expert gate/up_proj", &d.experts[2 * e]));
    VLM_RETURN_IF_ERROR(linear({&m.down[e]}, true, "expert down_proj", &d.experts[2 * e + 1]));
    d.expert_gate_up.push_back(d.experts[2 * e].get());
    d.expert_down.push_back(d.experts[2 * e + 1].get());
  }
  VLM_RETURN_IF_ERROR(
      be_.prepare_moe(d.expert_gate_up, d.expert_down).with_context(where + "'s experts"));
  if (m.shared != (cfg_.shared_expert_intermediate_size > 0)) {
    return internal_error(where + ": the shared expert does not match the config");
  }
  if (m.shared) {
    VLM_RETURN_IF_ERROR(linear({&m.shared_gate, &m.shared_up}, true, "shared_expert gate/up_proj",
                               &d.shared_gate_up));
    VLM_RETURN_IF_ERROR(linear({&m.shared_down}, true, "shared_expert down_proj", &d.shared_down));
    VLM_RETURN_IF_ERROR(
        linear({&m.shared_expert_gate}, false, "shared_expert_gate", &d.shared_gate));
  }
  return ok_status();
}

Status TextDecoder::init_mtp(const MtpWeights& w) {
  if (be_.device() != ops::Device::kCpu) {
    return unimplemented(std::string("the MTP head runs on the CPU only (the ") +
                         ops::device_name(be_.device()) + " backend is not yet proven with it)");
  }
  if (w.layers.size() != 1 || w.layers[0].linear) {
    return internal_error("the MTP head is one full-attention layer");
  }
  mtp_ = std::make_unique<Mtp>();
  ops::LinearOptions lo;
  lo.decoder_layer = true;
  const TensorView* fc = &w.fc;
  VLM_ASSIGN_OR_RETURN(
      mtp_->fc,
      be_.linear(std::span<const TensorView* const>(&fc, 1), lo).with_context("the MTP head's fc"));
  VLM_ASSIGN_OR_RETURN(mtp_->norm_embedding, be_.vector(w.norm_embedding));
  VLM_ASSIGN_OR_RETURN(mtp_->norm_hidden, be_.vector(w.norm_hidden));
  VLM_ASSIGN_OR_RETURN(mtp_->norm, be_.vector(w.norm));
  mtp_->layer.cache_index = 0;  // the MTP cache's one layer
  return init_layer(w.layers[0], "the MTP head's layer 0", &mtp_->layer);
}

Status TextDecoder::alloc_scratch() {
  // gate_up_ and mlp_ serve the dense MLP and the shared expert: the wider of the two.
  const int64_t C = max_chunk_, H = cfg_.hidden_size,
                I = std::max(cfg_.intermediate_size, cfg_.shared_expert_intermediate_size);
  const int64_t qd = cfg_.num_attention_heads * cfg_.head_dim;
  const int64_t kvd = cfg_.num_key_value_heads * cfg_.head_dim;
  const DType act = be_.act_dtype();
  for (auto [buf, n] : {std::pair{&x_, C * H},
                        {&xn_, C * H},
                        {&qkv_, C * (cfg_.q_proj_rows() + 2 * kvd)},
                        {&q_, C * qd},
                        {&attn_, C * qd},
                        {&tmp_, C * H},
                        {&gate_up_, C * 2 * I},
                        {&mlp_, C * I}}) {
    VLM_ASSIGN_OR_RETURN(*buf, be_.alloc(n, act));
  }
  if (cfg_.attn_output_gate) {
    VLM_ASSIGN_OR_RETURN(gate_, be_.alloc(C * qd, act));
  }
  if (hybrid()) {
    const ops::DeltaNetShape s = delta_shape();
    VLM_ASSIGN_OR_RETURN(proj_, be_.alloc(C * s.proj_dim(), act));
    VLM_ASSIGN_OR_RETURN(mixed_, be_.alloc(C * s.mixed_dim(), act));
    VLM_ASSIGN_OR_RETURN(delta_out_, be_.alloc(C * s.nv * s.dv, act));
  }
  if (cfg_.num_experts > 0) {
    const int64_t E = cfg_.num_experts, k = cfg_.num_experts_per_tok,
                  Ie = cfg_.moe_intermediate_size;
    VLM_ASSIGN_OR_RETURN(router_logits_, be_.alloc(C * E, DType::kF32));
    VLM_ASSIGN_OR_RETURN(route_ids_, be_.alloc(C * k, DType::kI32));
    VLM_ASSIGN_OR_RETURN(route_weights_, be_.alloc(C * k, DType::kF32));
    VLM_ASSIGN_OR_RETURN(moe_scratch_, be_.alloc(be_.moe_scratch_elems(C, E, k, H, Ie), act));
    if (cfg_.shared_expert_intermediate_size > 0) {
      VLM_ASSIGN_OR_RETURN(shared_logit_, be_.alloc(C, DType::kF32));
      VLM_ASSIGN_OR_RETURN(shared_, be_.alloc(C * H, act));
    }
  }
  if (mtp_ != nullptr) {
    VLM_ASSIGN_OR_RETURN(mtp_->hidden, be_.alloc(C * H, act));
    VLM_ASSIGN_OR_RETURN(mtp_->cat, be_.alloc(C * 2 * H, act));
    VLM_ASSIGN_OR_RETURN(mtp_->out, be_.alloc(C * H, act));
    VLM_ASSIGN_OR_RETURN(mtp_->even, be_.alloc(2 * C, DType::kI32));
    std::vector<int32_t> rows(static_cast<size_t>(2 * C));
    for (int64_t i = 0; i < C; ++i) {
      rows[static_cast<size_t>(i)] = static_cast<int32_t>(2 * i);
      rows[static_cast<size_t>(C + i)] = static_cast<int32_t>(2 * i + 1);
    }
    VLM_RETURN_IF_ERROR(be_.to_device(mtp_->even.buf(), rows.data(), rows.size() * 4));
    VLM_RETURN_IF_ERROR(be_.synchronize());
  }
  VLM_ASSIGN_OR_RETURN(ints_host_, be_.alloc_host(static_cast<size_t>(kIntRows * C) * 4));
  VLM_ASSIGN_OR_RETURN(ints_, be_.alloc(kIntRows * C, DType::kI32));
  VLM_ASSIGN_OR_RETURN(rope_host_, be_.alloc_host(static_cast<size_t>(2 * C * rope_.half()) * 4));
  VLM_ASSIGN_OR_RETURN(rope_dev_, be_.alloc(2 * C * rope_.half(), DType::kF32));
  for (auto* v : {&seq_row_, &seq_len_, &seq_pos_, &seq_slot_, &seq_token_slot_}) {
    v->resize(static_cast<size_t>(C));
  }
  for (auto* v : {&pos_t_, &pos_h_, &pos_w_}) v->resize(static_cast<size_t>(C));
  return reserve_tables(C);
}

Status TextDecoder::reserve_tables(int64_t entries) {
  if (entries <= table_cap_) return ok_status();
  VLM_ASSIGN_OR_RETURN(tables_host_, be_.alloc_host(static_cast<size_t>(entries) * 4));
  VLM_ASSIGN_OR_RETURN(tables_, be_.alloc(entries, DType::kI32));
  table_cap_ = entries;
  return ok_status();
}

int64_t TextDecoder::decode_weights(int64_t (*of)(const ops::Linear&)) const {
  int64_t total = of(lm_head_ ? *lm_head_ : *embed_);
  for (const Layer& l : layers_) {
    total += l.in_proj ? of(*l.in_proj) + of(*l.out_proj) : of(*l.qkv) + of(*l.o);
    if (l.router == nullptr) {
      total += of(*l.gate_up) + of(*l.down);
      continue;
    }
    // The router and k experts of the average size.
    int64_t experts = 0;
    for (const auto& e : l.experts) experts += of(*e);
    total += of(*l.router) +
             experts * cfg_.num_experts_per_tok / static_cast<int64_t>(l.expert_gate_up.size());
    if (l.shared_gate_up) {
      total += of(*l.shared_gate_up) + of(*l.shared_down) + of(*l.shared_gate);
    }
  }
  return total;
}

int64_t TextDecoder::decode_weight_bytes() const {
  return decode_weights([](const ops::Linear& w) { return w.bytes(); });
}

int64_t TextDecoder::decode_weight_count() const {
  return decode_weights([](const ops::Linear& w) { return w.rows() * w.cols(); });
}

int64_t TextDecoder::decode_state_bytes() const {
  if (!hybrid()) return 0;
  int64_t layers = 0;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) layers += cfg_.linear_layer(l) ? 1 : 0;
  return layers * delta_shape().state_floats() * static_cast<int64_t>(sizeof(float));
}

KvCacheSpec TextDecoder::cache_spec(int64_t block_size, std::optional<DType> dtype) const {
  KvCacheSpec spec;
  spec.block_size = block_size;
  KvCacheGroup& g = spec.groups.emplace_back();
  g.kind = CacheKind::kFullAttention;
  for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
    if (!cfg_.linear_layer(l)) g.layers.push_back(l);
  }
  g.attention.n_kv_heads = cfg_.num_key_value_heads;
  g.attention.head_dim = cfg_.head_dim;
  g.attention.dtype = dtype.value_or(be_.act_dtype());
  if (hybrid()) {
    KvCacheGroup& st = spec.groups.emplace_back();
    st.kind = CacheKind::kLinearState;
    for (int64_t l = 0; l < cfg_.num_hidden_layers; ++l) {
      if (cfg_.linear_layer(l)) st.layers.push_back(l);
    }
    st.state.floats = delta_shape().state_floats();
  }
  return spec;
}

KvCacheSpec TextDecoder::mtp_cache_spec(int64_t block_size, std::optional<DType> dtype) const {
  KvCacheSpec spec;
  spec.block_size = block_size;
  KvCacheGroup& g = spec.groups.emplace_back();
  g.kind = CacheKind::kFullAttention;
  g.layers.push_back(cfg_.num_hidden_layers);  // the layer after the trunk's
  g.attention.n_kv_heads = cfg_.num_key_value_heads;
  g.attention.head_dim = cfg_.head_dim;
  g.attention.dtype = dtype.value_or(be_.act_dtype());
  return spec;
}

Status TextDecoder::allocate_mtp_cache(KvCache* cache, const KvCacheSpec& spec, int64_t num_blocks,
                                       int64_t max_blocks_per_seq) {
  if (mtp_ == nullptr) return internal_error("allocate_mtp_cache: the decoder has no MTP head");
  if (spec.groups.size() != 1 || spec.attention_group().layers.size() != 1 ||
      spec.attention_group().attention.n_kv_heads != cfg_.num_key_value_heads ||
      spec.attention_group().attention.head_dim != cfg_.head_dim) {
    return invalid_argument("the KV cache spec does not describe the MTP head's layer");
  }
  VLM_RETURN_IF_ERROR(reserve_tables(max_chunk_ * std::max<int64_t>(max_blocks_per_seq, 1)));
  return cache->allocate(be_, spec.attention_group(), num_blocks, spec.block_size);
}

Status TextDecoder::allocate_cache(KvCache* cache, const KvCacheSpec& spec, int64_t num_blocks,
                                   int64_t max_blocks_per_seq, int64_t state_slots,
                                   int64_t state_snapshots) {
  VLM_RETURN_IF_ERROR(spec.validate());
  const KvCacheGroup& g = spec.attention_group();
  const KvCacheGroup* st = spec.state_group();
  const int64_t linear = hybrid() ? cfg_.num_linear_layers() : 0;
  if (static_cast<int64_t>(g.layers.size()) != cfg_.num_hidden_layers - linear ||
      g.attention.n_kv_heads != cfg_.num_key_value_heads || g.attention.head_dim != cfg_.head_dim ||
      (st == nullptr) != (linear == 0) ||
      (st != nullptr && (static_cast<int64_t>(st->layers.size()) != linear ||
                         st->state.floats != delta_shape().state_floats()))) {
    return invalid_argument("the KV cache spec does not describe this decoder's layers");
  }
  VLM_RETURN_IF_ERROR(reserve_tables(max_chunk_ * std::max<int64_t>(max_blocks_per_seq, 1)));
  VLM_RETURN_IF_ERROR(cache->allocate(be_, g, num_blocks, spec.block_size));
  if (st == nullptr) return ok_status();
  if (state_slots <= 0) return invalid_argument("a hybrid model's cache needs state slots");
  return cache->allocate_states(be_, *st, state_slots, state_snapshots)
      .with_context("the state slots");
}

Status TextDecoder::prepare(const SeqChunk* chunks, int64_t n_chunks, const KvCache& cache,
                            const Padding& pad, Pass* pass) {
  const int64_t H = cfg_.hidden_size, C = max_chunk_, bs = cache.block_size();
  int64_t T = 0;
  VLM_RETURN_IF_ERROR(check_chunks(chunks, n_chunks, cfg_, cache.num_blocks(), bs, C, &T,
                                   hybrid() ? cache.state_slots() : 0));
  const int64_t rows = pad.rows > 0 ? pad.rows : T;
  if (rows < T || rows > C) return internal_error("forward: padding outside [tokens, max_chunk]");
  int64_t stride = 1, max_seen = 0;
  size_t taps = 0;
  bool any_vision = false;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const SeqChunk& ch = chunks[c];
    stride = std::max(stride, ch.num_table_blocks);
    max_seen = std::max(max_seen, ch.first + ch.n);
    if (pad.rows > 0 && (ch.n != 1 || ch.vision != nullptr || ch.rows != LogitRows::kLast)) {
      return internal_error("forward: only decode rows (one token, no image, its logits) pad");
    }
    if (ch.vision == nullptr) continue;
    if (any_vision && ch.vision->deepstack.size() != taps) {
      return internal_error("forward: image chunks with different DeepStack depths");
    }
    any_vision = true;
    taps = ch.vision->deepstack.size();
  }
  if (pad.rows > 0) {
    if (pad.table_width < stride) return internal_error("forward: padding narrower than a table");
    stride = pad.table_width;
    max_seen = stride * bs;  // fixed per graph; each query splits its own keys
  }
  const int64_t seqs = n_chunks + (rows - T);
  // The tables' buffers keep their addresses (a recorded graph reads them): a pass wider than
  // allocate_cache() allowed for is refused, not grown into.
  if (seqs * stride > table_cap_) {
    return internal_error("forward: block tables wider than the cache was sized for (" +
                          std::to_string(stride) + " blocks)");
  }

  // The tables, row after row of the batch.
  int32_t* ints = ints_host_.as<int32_t>();
  int32_t* ids = ints + kIds * C;
  int32_t* slots = ints + kSlots * C;
  int32_t* tok_seq = ints + kSeq * C;
  int32_t* tok_pos = ints + kPos * C;
  int32_t* sel = ints + kSel * C;
  int32_t* vis = ints + kVis * C;
  int32_t* table = tables_host_.as<int32_t>();
  int64_t n_sel = 0, n_vis = 0;
  for (int64_t c = 0, off = 0; c < n_chunks; off += chunks[c].n, ++c) {
    const SeqChunk& ch = chunks[c];
    std::copy_n(ch.block_table, ch.num_table_blocks, table + c * stride);
    std::copy_n(ch.ids, ch.n, ids + off);
    std::copy_n(ch.pos.t, ch.n, pos_t_.data() + off);
    std::copy_n(ch.pos.h, ch.n, pos_h_.data() + off);
    std::copy_n(ch.pos.w, ch.n, pos_w_.data() + off);
    seq_row_[c] = static_cast<int32_t>(off);
    seq_len_[c] = static_cast<int32_t>(ch.n);
    seq_pos_[c] = static_cast<int32_t>(ch.first);
    seq_slot_[c] = ch.state_slot;
    seq_token_slot_[c] = ch.token_state_slot;
    if (ch.hidden_rows != nullptr) std::copy_n(ch.hidden_rows, ch.n, ints + kHid * C + off);
    for (int64_t i = 0; i < ch.n; ++i) {
      const int64_t p = ch.first + i;
      slots[off + i] = static_cast<int32_t>(ch.block_table[p / bs] * bs + p % bs);
      tok_seq[off + i] = static_cast<int32_t>(c);
      tok_pos[off + i] = static_cast<int32_t>(p);
      if (ch.vision != nullptr && ch.vision->feature_row[i] >= 0) {
        vis[n_vis++] = static_cast<int32_t>(off + i);
      }
    }
    if (ch.rows == LogitRows::kLast) sel[n_sel++] = static_cast<int32_t>(off + ch.n - 1);
    if (ch.rows == LogitRows::kAll) {
      for (int64_t i = 0; i < ch.n; ++i) sel[n_sel++] = static_cast<int32_t>(off + i);
    }
  }
  // A graph's padding rows: token 0 at position 0, whose K/V go to the scratch block.
  for (int64_t r = T, s = n_chunks; r < rows; ++r, ++s) {
    ids[r] = 0;
    slots[r] = static_cast<int32_t>(cache.scratch_block() * bs);
    tok_seq[r] = static_cast<int32_t>(s);
    tok_pos[r] = 0;
    table[s * stride] = static_cast<int32_t>(cache.scratch_block());
    seq_row_[s] = static_cast<int32_t>(r);
    seq_len_[s] = 1;
    seq_pos_[s] = 0;
    seq_slot_[s] = -1;
    seq_token_slot_[s] = -1;
    pos_t_[r] = pos_h_[r] = pos_w_[r] = 0;
    sel[n_sel++] = static_cast<int32_t>(r);
  }
  bool sel_all = true;
  for (int64_t i = 0; i < n_sel && sel_all; ++i) sel_all = sel[i] == i;

  // The image rows' features, [1 + taps, n_vis, H], in the order of their rows.
  h_feats_.resize(static_cast<size_t>((1 + taps) * n_vis * H));
  for (int64_t c = 0, off = 0, k = 0; c < n_chunks && n_vis > 0; off += chunks[c].n, ++c) {
    const VisionRows* vr = chunks[c].vision;
    if (vr == nullptr) continue;
    for (int64_t i = 0; i < chunks[c].n; ++i) {
      const int64_t f = vr->feature_row[i];
      if (f < 0) continue;
      std::copy_n(vr->embeds + f * H, H, h_feats_.data() + k * H);
      for (size_t t = 0; t < taps; ++t) {
        std::copy_n(vr->deepstack[t] + f * H, H, h_feats_.data() + ((1 + t) * n_vis + k) * H);
      }
      ++k;
    }
  }

  const int64_t half = rope_.half();
  float* cos = rope_host_.as<float>();
  // cos then sin, `rows` rows each (a graph's rows are fixed by its shape).
  rope_.compute(Positions3{pos_t_.data(), pos_h_.data(), pos_w_.data()}, rows, cos,
                cos + rows * half);

  // To the backend (on the CPU: the host tables themselves).
  VLM_ASSIGN_OR_RETURN(pass->ints,
                       be_.stage(ints, static_cast<size_t>(kIntRows * C) * 4, DType::kI32, &ints_));
  VLM_ASSIGN_OR_RETURN(pass->rope, be_.stage(cos, static_cast<size_t>(2 * rows * half) * 4,
                                             DType::kF32, &rope_dev_));
  VLM_ASSIGN_OR_RETURN(ops::Buf tables, be_.stage(table, static_cast<size_t>(seqs * stride) * 4,
                                                  DType::kI32, &tables_));
  pass->feats = {};
  if (n_vis > 0) {
    VLM_ASSIGN_OR_RETURN(pass->feats,
                         be_.stage(h_feats_.data(), h_feats_.size() * 4, DType::kF32, &feats_));
  }
  pass->rows = rows;
  pass->n_sel = n_sel;
  pass->sel_all = sel_all;
  pass->n_vis = n_vis;
  pass->taps = taps;
  ops::AttentionBatch& a = pass->attn;
  a.tokens = rows;
  a.seqs = seqs;
  a.seq_row = seq_row_.data();
  a.seq_len = seq_len_.data();
  a.seq_pos = seq_pos_.data();
  a.seq_slot = hybrid() ? seq_slot_.data() : nullptr;
  a.seq_token_slot = hybrid() ? seq_token_slot_.data() : nullptr;
  a.tables_host = table;
  a.tok_seq = pass->ints.at(kSeq * C);
  a.tok_pos = pass->ints.at(kPos * C);
  a.tables = tables;
  a.stride = stride;
  a.block_size = bs;
  a.max_seen = max_seen;
  // Unique across decoders that share a backend.
  static std::atomic<int64_t> next_serial{1};
  a.serial = next_serial.fetch_add(1, std::memory_order_relaxed);
  return ok_status();
}

// q|k|v, q/k norms and rotary (q to q_, K and V straight into their cache slots), attention,
// the output gate (Qwen3.5), o_proj into tmp_.
Status TextDecoder::run_attention(const Layer& L, const Pass& p, const KvCache& cache) const {
  const int64_t nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads, hd = cfg_.head_dim;
  const int64_t T = p.rows;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const ops::Buf cos = p.rope, sin = p.rope.at(T * rope_.half()),
                 slots = p.ints.at(kSlots * max_chunk_);
  const ops::KvLayer kv = cache.layer(L.cache_index);
  ops::Backend& be = be_;
  VLM_RETURN_IF_ERROR(be.linear(xn_.buf(), T, *L.qkv, qkv_.buf()));
  if (cfg_.attn_output_gate) {
    VLM_RETURN_IF_ERROR(be.qkv_gated_rope_store(qkv_.buf(), T, nh, nkv, hd, cfg_.rotary_dims(),
                                                L.q_norm, L.k_norm, eps, cos, sin, slots, q_.buf(),
                                                gate_.buf(), kv));
  } else {
    VLM_RETURN_IF_ERROR(be.qkv_rope_store(qkv_.buf(), T, nh, nkv, hd, L.q_norm, L.k_norm, eps, cos,
                                          sin, slots, q_.buf(), kv));
  }
  VLM_RETURN_IF_ERROR(be.paged_attention(q_.buf(), p.attn, kv, nh, nkv, hd, scale, attn_.buf()));
  if (cfg_.attn_output_gate) {
    VLM_RETURN_IF_ERROR(be.sigmoid_mul(attn_.buf(), gate_.buf(), T, nh * hd));
  }
  return be.linear(attn_.buf(), T, *L.o, tmp_.buf());
}

// Layer L over the pass's rows: its norm (adding the last layer's MLP output first when
// `pending`), token mixer and MLP, whose output is left in tmp_ (to be added to x_).
Status TextDecoder::run_layer(const Layer& L, const Pass& p, const KvCache& cache,
                              bool pending) const {
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t Is = cfg_.shared_expert_intermediate_size;
  const int64_t T = p.rows;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const ops::Buf x = x_.buf(), xn = xn_.buf(), tmp = tmp_.buf();
  ops::Backend& be = be_;
  if (pending) {
    VLM_RETURN_IF_ERROR(be.add_rms_norm(x, tmp, L.input_ln, T, H, eps, xn));
  } else {
    VLM_RETURN_IF_ERROR(be.rms_norm(x, L.input_ln, T, H, eps, xn));
  }
  VLM_RETURN_IF_ERROR(L.in_proj ? run_delta_net(L, p, cache) : run_attention(L, p, cache));
  VLM_RETURN_IF_ERROR(be.add_rms_norm(x, tmp, L.post_ln, T, H, eps, xn));
  if (L.router == nullptr) {
    VLM_RETURN_IF_ERROR(be.linear(xn, T, *L.gate_up, gate_up_.buf()));
    VLM_RETURN_IF_ERROR(be.silu_mul(gate_up_.buf(), T, I, mlp_.buf()));
    return be.linear(mlp_.buf(), T, *L.down, tmp);
  }
  const int64_t k = cfg_.num_experts_per_tok;
  VLM_RETURN_IF_ERROR(be.linear(xn, T, *L.router, router_logits_.buf()));
  VLM_RETURN_IF_ERROR(be.moe_route(router_logits_.buf(), T, cfg_.num_experts, k,
                                   cfg_.norm_topk_prob, route_ids_.buf(), route_weights_.buf()));
  VLM_RETURN_IF_ERROR(be.moe_experts(xn, T, route_ids_.buf(), route_weights_.buf(), k,
                                     L.expert_gate_up, L.expert_down, moe_scratch_.buf(), tmp));
  if (!L.shared_gate_up) return ok_status();
  // + sigmoid(shared_expert_gate · x) · shared_expert(x)
  VLM_RETURN_IF_ERROR(be.linear(xn, T, *L.shared_gate, shared_logit_.buf()));
  VLM_RETURN_IF_ERROR(be.linear(xn, T, *L.shared_gate_up, gate_up_.buf()));
  VLM_RETURN_IF_ERROR(be.silu_mul(gate_up_.buf(), T, Is, mlp_.buf()));
  VLM_RETURN_IF_ERROR(be.linear(mlp_.buf(), T, *L.shared_down, shared_.buf()));
  return be.add_sigmoid_scaled(tmp, shared_.buf(), shared_logit_.buf(), T, H);
}

// The logit rows of x_ (the pass's rows, its final layer's output added): normed by `norm`
// into `normed` (gathered first unless they are rows 0 .. n_sel − 1), then the head, in f32.
Status TextDecoder::head(const Pass& p, ops::Buf norm, ops::Buf normed, ops::Buf logits) const {
  const int64_t H = cfg_.hidden_size;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  ops::Backend& be = be_;
  if (p.sel_all) {
    VLM_RETURN_IF_ERROR(be.rms_norm(x_.buf(), norm, p.n_sel, H, eps, normed));
  } else {
    VLM_RETURN_IF_ERROR(be.gather_rows(x_.buf(), p.ints.at(kSel * max_chunk_), p.n_sel, H, normed));
    VLM_RETURN_IF_ERROR(be.rms_norm(normed, norm, p.n_sel, H, eps, normed));
  }
  return be.linear(normed, p.n_sel, lm_head_ ? *lm_head_ : *embed_, logits);
}

Status TextDecoder::normed_rows_to_host(int64_t first, int64_t n, float* out) const {
  const ops::Buf xn = xn_.buf();
  if (xn.dtype != DType::kF32) {
    return unimplemented(std::string("the final hidden states in ") + dtype_name(xn.dtype) +
                         " (pooling reads them in f32: the CPU)");
  }
  if (first < 0 || n < 0 || first + n > max_chunk_) {
    return invalid_argument("normed_rows_to_host: rows outside the pass");
  }
  const int64_t H = cfg_.hidden_size;
  return be_.to_host(out, xn.at(first * H), static_cast<size_t>(n * H) * sizeof(float));
}

Status TextDecoder::run(const Pass& p, const KvCache& cache, ops::Buf logits) {
  const int64_t H = cfg_.hidden_size;
  const int64_t C = max_chunk_, T = p.rows;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  auto ints = [&](int row) { return p.ints.at(row * C); };
  const ops::Buf x = x_.buf(), tmp = tmp_.buf();
  ops::Backend& be = be_;

  VLM_RETURN_IF_ERROR(be.embed(*embed_, ints(kIds), T, x));
  if (p.n_vis > 0) VLM_RETURN_IF_ERROR(be.set_rows(x, ints(kVis), p.feats, p.n_vis, H));
  // NOTE(vlm): each layer's MLP output (tmp) is added to the residual stream by the next norm
  // (add_rms_norm: one pass instead of two). Only DeepStack layers add it on their own, because
  // the image features go in after it.
  bool pending = false;  // tmp still has to be added to x
  for (size_t l = 0; l < layers_.size(); ++l) {
    const auto li = static_cast<int64_t>(l);
    VLM_RETURN_IF_ERROR(run_layer(layers_[l], p, cache, pending));
    pending = true;
    if (p.n_vis > 0 && l < p.taps) {  // DeepStack: after decoder layer l, the image rows get tap l
      VLM_RETURN_IF_ERROR(be.add(x, tmp, {}, T, H));
      pending = false;
      VLM_RETURN_IF_ERROR(
          be.add_rows(x, ints(kVis), p.feats.at((1 + li) * p.n_vis * H), p.n_vis, H));
    }
  }
  if (p.n_sel == 0 && mtp_ == nullptr) return ok_status();
  if (pending) VLM_RETURN_IF_ERROR(be.add(x, tmp, {}, T, H));
  if (mtp_ != nullptr) {  // every row's last hidden state, after the final norm: the MTP's input
    VLM_RETURN_IF_ERROR(be.rms_norm(x, norm_, T, H, eps, mtp_->hidden.buf()));
  }
  if (p.n_sel == 0) return ok_status();
  return head(p, norm_, xn_.buf(), logits);
}

Status TextDecoder::run_mtp(const Pass& p, const KvCache& cache, bool chain, ops::Buf logits) {
  if (mtp_ == nullptr) return internal_error("run_mtp: the decoder has no MTP head");
  const int64_t H = cfg_.hidden_size, C = max_chunk_, T = p.rows;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const ops::Buf x = x_.buf(), xn = xn_.buf(), tmp = tmp_.buf();
  const Mtp& m = *mtp_;
  ops::Backend& be = be_;
  // [norm_e(embed(id)) | norm_h(hidden)] as rows 2i and 2i + 1 of cat, one fc product to x.
  VLM_RETURN_IF_ERROR(be.embed(*embed_, p.ints.at(kIds * C), T, xn));
  if (p.n_vis > 0) {  // an image placeholder's "embedding" is its feature row, as in the trunk
    VLM_RETURN_IF_ERROR(be.set_rows(xn, p.ints.at(kVis * C), p.feats, p.n_vis, H));
  }
  VLM_RETURN_IF_ERROR(be.rms_norm(xn, m.norm_embedding, T, H, eps, xn));
  VLM_RETURN_IF_ERROR(
      be.gather_rows(chain ? m.out.buf() : m.hidden.buf(), p.ints.at(kHid * C), T, H, tmp));
  VLM_RETURN_IF_ERROR(be.rms_norm(tmp, m.norm_hidden, T, H, eps, tmp));
  VLM_RETURN_IF_ERROR(be.set_rows(m.cat.buf(), m.even.buf(), xn, T, H));
  VLM_RETURN_IF_ERROR(be.set_rows(m.cat.buf(), m.even.buf().at(C), tmp, T, H));
  VLM_RETURN_IF_ERROR(be.linear(m.cat.buf(), T, *m.fc, x));
  VLM_RETURN_IF_ERROR(run_layer(m.layer, p, cache, false));
  VLM_RETURN_IF_ERROR(be.add(x, tmp, {}, T, H));
  if (p.n_sel == 0) return ok_status();
  return head(p, m.norm, m.out.buf(), logits);
}

Status TextDecoder::forward_batch(const SeqChunk* chunks, int64_t n_chunks, const KvCache& cache,
                                  ops::Buf logits) {
  Pass pass;
  VLM_RETURN_IF_ERROR(prepare(chunks, n_chunks, cache, Padding{}, &pass));
  VLM_RETURN_IF_ERROR(run(pass, cache, logits));
  return be_.synchronize();
}

}  // namespace vlm

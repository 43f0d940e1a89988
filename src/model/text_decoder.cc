#include "model/text_decoder.h"

#include <algorithm>
#include <cmath>

namespace vlm {

Status KvCache::allocate(const Qwen3VLTextConfig& c, int64_t blocks, int64_t block) {
  const int64_t r = c.num_key_value_heads * c.head_dim;
  const size_t bytes = static_cast<size_t>(c.num_hidden_layers * blocks * block * r) * sizeof(float);
  VLM_ASSIGN_OR_RETURN(HugePageBuffer k, HugePageBuffer::allocate(bytes, /*noreserve=*/true));
  VLM_ASSIGN_OR_RETURN(HugePageBuffer v, HugePageBuffer::allocate(bytes, /*noreserve=*/true));
  k_buf_ = std::move(k);
  v_buf_ = std::move(v);
  k_ = reinterpret_cast<float*>(k_buf_.data());
  v_ = reinterpret_cast<float*>(v_buf_.data());
  num_blocks = blocks;
  block_size = block;
  row = r;
  return ok_status();
}

MropeTables::MropeTables(const Qwen3VLTextConfig& c) {
  const int64_t half = c.head_dim / 2;
  // inv_freq[j] = theta^(-2j / head_dim), as transformers computes it (float32 result).
  inv_freq_.resize(half);
  for (int64_t j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(c.head_dim);
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
                    int64_t cache_blocks, int64_t bs, int64_t max_chunk, int64_t* tokens) {
  int64_t T = 0;
  for (int64_t i = 0; i < n_chunks; ++i) {
    const SeqChunk& ch = chunks[i];
    if (ch.n <= 0) return invalid_argument("forward: a chunk has no tokens");
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
                                " is outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
      }
    }
    T += ch.n;
  }
  if (T > max_chunk) return internal_error("forward: batch larger than the scratch buffers");
  *tokens = T;
  return ok_status();
}

TextDecoder::TextDecoder(const Qwen3VLConfig& cfg, const TextWeights& w, ThreadPool& pool,
                         int64_t max_chunk)
    : cfg_(cfg.text_config), w_(w), pool_(pool), max_chunk_(max_chunk), rope_(cfg.text_config) {
  const int64_t half = cfg_.head_dim / 2;
  const int64_t H = cfg_.hidden_size, qd = cfg_.num_attention_heads * cfg_.head_dim,
                kvd = cfg_.num_key_value_heads * cfg_.head_dim, I = cfg_.intermediate_size;
  x_.resize(max_chunk * H);
  xn_.resize(max_chunk * H);
  q_.resize(max_chunk * qd);
  k_.resize(max_chunk * kvd);
  v_.resize(max_chunk * kvd);
  attn_.resize(max_chunk * qd);
  tmp_.resize(max_chunk * H);
  gate_.resize(max_chunk * I);
  up_.resize(max_chunk * I);
  cos_.resize(max_chunk * half);
  sin_.resize(max_chunk * half);
  pos_t_.resize(max_chunk);
  pos_h_.resize(max_chunk);
  pos_w_.resize(max_chunk);
}

Status TextDecoder::forward(const int32_t* ids, int64_t n, const Positions3& pos, int64_t first,
                            KvCache& cache, LogitRows rows, float* logits,
                            const VisionRows* vision) {
  if (cache.num_blocks != 1) return internal_error("forward: expects a single-block cache");
  static const int32_t kBlock0 = 0;
  SeqChunk c;
  c.ids = ids;
  c.n = n;
  c.first = first;
  c.pos = pos;
  c.block_table = &kBlock0;
  c.num_table_blocks = 1;
  c.vision = vision;
  c.rows = rows;
  return forward_batch(&c, 1, cache, logits);
}

Status TextDecoder::forward_batch(const SeqChunk* chunks, int64_t n_chunks, KvCache& cache,
                                  float* logits) {
  const int64_t H = cfg_.hidden_size, nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads,
                hd = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t qd = nh * hd, kvd = nkv * hd, bs = cache.block_size;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  // Validate, then lay the chunks' tokens out one after another: rows [off_c, off_c + n_c).
  int64_t T = 0;
  VLM_RETURN_IF_ERROR(check_chunks(chunks, n_chunks, cfg_, cache.num_blocks, bs, max_chunk_, &T));

  for (int64_t c = 0, off = 0; c < n_chunks; off += chunks[c].n, ++c) {
    const SeqChunk& ch = chunks[c];
    ops::embedding_lookup(w_.embed_tokens, ch.ids, ch.n, x_.data() + off * H);
    if (ch.vision != nullptr) {
      for (int64_t i = 0; i < ch.n; ++i) {
        const int32_t r = ch.vision->feature_row[i];
        if (r >= 0) std::copy_n(ch.vision->embeds + r * H, H, x_.data() + (off + i) * H);
      }
    }
    std::copy_n(ch.pos.t, ch.n, pos_t_.data() + off);
    std::copy_n(ch.pos.h, ch.n, pos_h_.data() + off);
    std::copy_n(ch.pos.w, ch.n, pos_w_.data() + off);
  }
  rope_.compute(Positions3{pos_t_.data(), pos_h_.data(), pos_w_.data()}, T, cos_.data(), sin_.data());

  // NOTE(vlm): each layer's MLP output (tmp_) is added to the residual stream by the next norm
  // (ops::add_rms_norm: one pass instead of two), the next layer's input norm or the final norm.
  // Only DeepStack layers add it on their own, because the image features go in after it.
  bool pending = false;  // tmp_ still has to be added to x_
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const TextLayerWeights& L = w_.layers[l];
    // Attention block: projections for all tokens of all chunks at once.
    if (pending) {
      ops::add_rms_norm(x_.data(), tmp_.data(), L.input_layernorm.data(), T, H, eps, xn_.data(),
                        pool_, isa_);
    } else {
      ops::rms_norm(x_.data(), L.input_layernorm.data(), T, H, eps, xn_.data(), pool_, isa_);
    }
    {
      const TensorView* ws[] = {&L.q_proj, &L.k_proj, &L.v_proj};
      float* ys[] = {q_.data(), k_.data(), v_.data()};
      ops::matmul_multi(xn_.data(), T, H, ws, ys, pool_, isa_);
    }
    // q/k RMSNorm over each head's head_dim values, then rotary: one pass over q and one over k.
    ops::qk_norm_rope(q_.data(), T, nh, hd, L.q_norm.data(), eps, cos_.data(), sin_.data(), pool_,
                      isa_);
    ops::qk_norm_rope(k_.data(), T, nkv, hd, L.k_norm.data(), eps, cos_.data(), sin_.data(),
                      pool_, isa_);
    float* kc = cache.k_layer(static_cast<int64_t>(l));
    float* vc = cache.v_layer(static_cast<int64_t>(l));
    for (int64_t c = 0, off = 0; c < n_chunks; off += chunks[c].n, ++c) {
      const SeqChunk& ch = chunks[c];
      for (int64_t i = 0; i < ch.n; ++i) {  // K/V rows into the sequence's blocks
        const int64_t p = ch.first + i;
        const int64_t slot = static_cast<int64_t>(ch.block_table[p / bs]) * bs + p % bs;
        std::copy_n(k_.data() + (off + i) * kvd, kvd, kc + slot * kvd);
        std::copy_n(v_.data() + (off + i) * kvd, kvd, vc + slot * kvd);
      }
      ops::attention_paged(q_.data() + off * qd, ch.n, ch.first, kc, vc, ch.block_table, bs, nh,
                           nkv, hd, scale, attn_.data() + off * qd, pool_, isa_);
    }
    ops::matmul(attn_.data(), T, qd, L.o_proj, tmp_.data(), pool_, isa_);
    // MLP block: residual add fused into its norm; SwiGLU in place in gate_.
    ops::add_rms_norm(x_.data(), tmp_.data(), L.post_attention_layernorm.data(), T, H, eps,
                      xn_.data(), pool_, isa_);
    {
      const TensorView* ws[] = {&L.gate_proj, &L.up_proj};
      float* ys[] = {gate_.data(), up_.data()};
      ops::matmul_multi(xn_.data(), T, H, ws, ys, pool_, isa_);
    }
    ops::silu_mul(gate_.data(), up_.data(), T * I, gate_.data(), pool_, isa_);
    ops::matmul(gate_.data(), T, I, L.down_proj, tmp_.data(), pool_, isa_);
    pending = true;
    // DeepStack: after decoder layer l, image rows get that tap's features.
    bool deepstack = false;
    for (int64_t c = 0; c < n_chunks; ++c) {
      const VisionRows* vis = chunks[c].vision;
      deepstack = deepstack || (vis != nullptr && l < vis->deepstack.size());
    }
    if (!deepstack) continue;
    ops::add_residual(x_.data(), tmp_.data(), nullptr, T, H, pool_, isa_);
    pending = false;
    for (int64_t c = 0, off = 0; c < n_chunks; off += chunks[c].n, ++c) {
      const VisionRows* vis = chunks[c].vision;
      if (vis == nullptr || l >= vis->deepstack.size()) continue;
      for (int64_t i = 0; i < chunks[c].n; ++i) {
        const int32_t r = vis->feature_row[i];
        if (r < 0) continue;
        const float* ds = vis->deepstack[l] + r * H;
        float* xr = x_.data() + (off + i) * H;
        for (int64_t d = 0; d < H; ++d) xr[d] += ds[d];
      }
    }
  }

  // Final norm and head only for the rows that want logits, gathered into xn_ (the last layer's
  // residual add, when pending, only for those rows too).
  int64_t n_rows = 0;
  for (int64_t c = 0, off = 0; c < n_chunks; off += chunks[c].n, ++c) {
    const SeqChunk& ch = chunks[c];
    const int64_t row0 = ch.rows == LogitRows::kLast ? off + ch.n - 1 : off;
    const int64_t rows = ch.rows == LogitRows::kNone ? 0 : (ch.rows == LogitRows::kLast ? 1 : ch.n);
    if (pending) {
      ops::add_rms_norm(x_.data() + row0 * H, tmp_.data() + row0 * H, w_.norm.data(), rows, H, eps,
                        xn_.data() + n_rows * H, pool_, isa_);
    } else {
      ops::rms_norm(x_.data() + row0 * H, w_.norm.data(), rows, H, eps, xn_.data() + n_rows * H,
                    pool_, isa_);
    }
    n_rows += rows;
  }
  if (n_rows > 0) ops::matmul(xn_.data(), n_rows, H, w_.lm_head, logits, pool_, isa_);
  return ok_status();
}

}  // namespace vlm

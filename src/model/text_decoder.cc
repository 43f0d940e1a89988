#include "model/text_decoder.h"

#include <algorithm>
#include <cmath>

namespace vlm {

void KvCache::allocate(const Qwen3VLTextConfig& c, int64_t cap) {
  capacity = cap;
  row = c.num_key_value_heads * c.head_dim;
  const size_t n = static_cast<size_t>(c.num_hidden_layers * cap * row);
  k.assign(n, 0.f);
  v.assign(n, 0.f);
}

TextDecoder::TextDecoder(const Qwen3VLConfig& cfg, const TextWeights& w, ThreadPool& pool,
                         int64_t max_chunk)
    : cfg_(cfg.text_config), w_(w), pool_(pool), max_chunk_(max_chunk) {
  const int64_t half = cfg_.head_dim / 2;
  // inv_freq[j] = theta^(-2j / head_dim), as transformers computes it (float32 result).
  inv_freq_.resize(half);
  for (int64_t j = 0; j < half; ++j) {
    const float e = static_cast<float>(2 * j) / static_cast<float>(cfg_.head_dim);
    inv_freq_[j] = static_cast<float>(1.0 / std::pow(cfg_.rope_theta, static_cast<double>(e)));
  }
  // Interleaved M-RoPE (apply_interleaved_mrope): frequency j takes the H position when
  // j % 3 == 1 and j < 3·sec_H, the W position when j % 3 == 2 and j < 3·sec_W, else T.
  axis_of_.assign(half, 0);
  const int64_t sec_h = cfg_.mrope_section[1], sec_w = cfg_.mrope_section[2];
  for (int64_t j = 0; j < half; ++j) {
    if (j % 3 == 1 && j < 3 * sec_h) axis_of_[j] = 1;
    if (j % 3 == 2 && j < 3 * sec_w) axis_of_[j] = 2;
  }
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
}

void TextDecoder::rope_tables(const Positions3& pos, int64_t n) {
  const int64_t half = cfg_.head_dim / 2;
  for (int64_t i = 0; i < n; ++i) {
    const float p[3] = {static_cast<float>(pos.t[i]), static_cast<float>(pos.h[i]),
                        static_cast<float>(pos.w[i])};
    for (int64_t j = 0; j < half; ++j) {
      const float a = p[axis_of_[j]] * inv_freq_[j];  // one f32 product, as torch's matmul
      cos_[i * half + j] = std::cos(a);
      sin_[i * half + j] = std::sin(a);
    }
  }
}

Status TextDecoder::forward(const int32_t* ids, int64_t n, const Positions3& pos, int64_t first,
                            KvCache& cache, LogitRows rows, float* logits,
                            const VisionRows* vision) {
  if (n <= 0) return invalid_argument("forward: no tokens");
  if (n > max_chunk_) return internal_error("forward: chunk larger than the scratch buffers");
  if (first + n > cache.capacity) {
    return out_of_range("sequence of " + std::to_string(first + n) +
                        " tokens exceeds the KV cache capacity " + std::to_string(cache.capacity));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= cfg_.vocab_size) {
      return invalid_argument("token id " + std::to_string(ids[i]) + " is outside the vocabulary [0, " +
                              std::to_string(cfg_.vocab_size) + ")");
    }
  }
  const int64_t H = cfg_.hidden_size, nh = cfg_.num_attention_heads, nkv = cfg_.num_key_value_heads,
                hd = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t qd = nh * hd, kvd = nkv * hd;
  const float eps = static_cast<float>(cfg_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  ops::embedding_lookup(w_.embed_tokens, ids, n, x_.data());
  if (vision != nullptr) {
    for (int64_t i = 0; i < n; ++i) {
      const int32_t r = vision->feature_row[i];
      if (r >= 0) std::copy_n(vision->embeds + r * H, H, x_.data() + i * H);
    }
  }
  rope_tables(pos, n);

  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const TextLayerWeights& L = w_.layers[l];
    // Attention block.
    ops::rms_norm(x_.data(), L.input_layernorm.data(), n, H, eps, xn_.data());
    ops::matmul(xn_.data(), n, H, L.q_proj, q_.data(), pool_, isa_);
    ops::matmul(xn_.data(), n, H, L.k_proj, k_.data(), pool_, isa_);
    ops::matmul(xn_.data(), n, H, L.v_proj, v_.data(), pool_, isa_);
    // q/k RMSNorm over each head's head_dim values, BEFORE rotary.
    ops::rms_norm(q_.data(), L.q_norm.data(), n * nh, hd, eps, q_.data());
    ops::rms_norm(k_.data(), L.k_norm.data(), n * nkv, hd, eps, k_.data());
    ops::rope_neox(q_.data(), n, nh, hd, cos_.data(), sin_.data());
    ops::rope_neox(k_.data(), n, nkv, hd, cos_.data(), sin_.data());
    float* kc = cache.k_layer(static_cast<int64_t>(l));
    float* vc = cache.v_layer(static_cast<int64_t>(l));
    std::copy(k_.begin(), k_.begin() + n * kvd, kc + first * kvd);
    std::copy(v_.begin(), v_.begin() + n * kvd, vc + first * kvd);
    ops::attention_causal(q_.data(), n, first, kc, vc, nh, nkv, hd, scale, attn_.data(), pool_, isa_);
    ops::matmul(attn_.data(), n, qd, L.o_proj, tmp_.data(), pool_, isa_);
    for (int64_t i = 0; i < n * H; ++i) x_[i] += tmp_[i];
    // MLP block.
    ops::rms_norm(x_.data(), L.post_attention_layernorm.data(), n, H, eps, xn_.data());
    ops::matmul(xn_.data(), n, H, L.gate_proj, gate_.data(), pool_, isa_);
    ops::matmul(xn_.data(), n, H, L.up_proj, up_.data(), pool_, isa_);
    ops::silu_mul(gate_.data(), up_.data(), n * I, gate_.data());
    ops::matmul(gate_.data(), n, I, L.down_proj, tmp_.data(), pool_, isa_);
    for (int64_t i = 0; i < n * H; ++i) x_[i] += tmp_[i];
    if (vision != nullptr && l < vision->deepstack.size()) {
      for (int64_t i = 0; i < n; ++i) {
        const int32_t r = vision->feature_row[i];
        if (r < 0) continue;
        const float* ds = vision->deepstack[l] + r * H;
        float* xr = x_.data() + i * H;
        for (int64_t d = 0; d < H; ++d) xr[d] += ds[d];
      }
    }
  }

  if (rows == LogitRows::kNone) return ok_status();
  const int64_t row0 = rows == LogitRows::kLast ? n - 1 : 0;
  const int64_t n_rows = rows == LogitRows::kLast ? 1 : n;
  ops::rms_norm(x_.data() + row0 * H, w_.norm.data(), n_rows, H, eps, xn_.data());
  ops::matmul(xn_.data(), n_rows, H, w_.lm_head, logits, pool_, isa_);
  return ok_status();
}

}  // namespace vlm

#include "model/vision_encoder.h"

#include <algorithm>
#include <cmath>

namespace vlm {

VisionEncoder::VisionEncoder(const Qwen3VLConfig& cfg, const VisionWeights& w, ThreadPool& pool)
    : cfg_(cfg.vision_config), w_(w), pool_(pool) {
  grid_side_ = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(cfg_.num_position_embeddings))));
  // Qwen3VLVisionRotaryEmbedding(dim = head_dim / 2): inv_freq = 10000^(-2i / dim), i < dim / 2,
  // computed in float32 as torch does.
  const int64_t head_dim = cfg_.hidden_size / cfg_.num_heads;
  const int64_t dim = head_dim / 2;
  inv_freq_.resize(dim / 2);
  for (int64_t i = 0; i < dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(dim);
    inv_freq_[i] = 1.0f / std::pow(10000.0f, e);
  }
}

// fast_pos_embed_interpolate: bilinear sampling of the learned grid_side × grid_side table with
// align_corners semantics (torch.linspace(0, side − 1, n)), then reordered to merge order and
// repeated for every temporal group.
void VisionEncoder::add_position_embedding(const GridThw& g, float* x) const {
  const int64_t D = cfg_.hidden_size, side = grid_side_, m = cfg_.spatial_merge_size;
  auto linspace = [&](int64_t n, int64_t i) -> float {
    if (n == 1) return 0.f;
    // torch.linspace in float32: start + i·step for the first half, end − (n−1−i)·step after.
    const float step = static_cast<float>(side - 1) / static_cast<float>(n - 1);
    return i < n / 2 ? static_cast<float>(i) * step
                     : static_cast<float>(side - 1) - static_cast<float>(n - 1 - i) * step;
  };
  const int64_t per_frame = g.h * g.w;
  for (int64_t i = 0; i < g.h; ++i) {
    const float yi = linspace(g.h, i);
    const int64_t y0 = static_cast<int64_t>(yi), y1 = std::min(y0 + 1, side - 1);
    const float dy = yi - static_cast<float>(y0);
    for (int64_t j = 0; j < g.w; ++j) {
      const float xj = linspace(g.w, j);
      const int64_t x0 = static_cast<int64_t>(xj), x1 = std::min(x0 + 1, side - 1);
      const float dx = xj - static_cast<float>(x0);
      const float w00 = (1 - dy) * (1 - dx), w01 = (1 - dy) * dx, w10 = dy * (1 - dx), w11 = dy * dx;
      const float* e00 = w_.pos_embed.data() + (y0 * side + x0) * D;
      const float* e01 = w_.pos_embed.data() + (y0 * side + x1) * D;
      const float* e10 = w_.pos_embed.data() + (y1 * side + x0) * D;
      const float* e11 = w_.pos_embed.data() + (y1 * side + x1) * D;
      // Raster patch (i, j) sits at this row in merge order.
      const int64_t row = ((i / m) * (g.w / m) + j / m) * m * m + (i % m) * m + (j % m);
      for (int64_t t = 0; t < g.t; ++t) {
        float* xr = x + (t * per_frame + row) * D;
        for (int64_t d = 0; d < D; ++d) {
          xr[d] += ((e00[d] * w00 + e01[d] * w01) + e10[d] * w10) + e11[d] * w11;
        }
      }
    }
  }
}

// rot_pos_emb: each patch row has (row, col) in unmerged patch units; the first half of the
// rotary angles uses row · inv_freq, the second col · inv_freq. Same for every temporal group.
void VisionEncoder::rotary_tables(const GridThw& g, std::vector<float>* cos,
                                  std::vector<float>* sin) const {
  const int64_t m = cfg_.spatial_merge_size, q = static_cast<int64_t>(inv_freq_.size());
  const int64_t half = 2 * q;  // head_dim / 2 angles per patch
  const int64_t per_frame = g.h * g.w;
  cos->resize(g.patches() * half);
  sin->resize(g.patches() * half);
  for (int64_t r = 0; r < per_frame; ++r) {
    const int64_t block = r / (m * m), intra = r % (m * m);
    const int64_t row = (block / (g.w / m)) * m + intra / m;
    const int64_t col = (block % (g.w / m)) * m + intra % m;
    for (int64_t t = 0; t < g.t; ++t) {
      float* c = cos->data() + (t * per_frame + r) * half;
      float* s = sin->data() + (t * per_frame + r) * half;
      for (int64_t i = 0; i < q; ++i) {
        const float a = static_cast<float>(row) * inv_freq_[i];
        const float b = static_cast<float>(col) * inv_freq_[i];
        c[i] = std::cos(a);
        s[i] = std::sin(a);
        c[q + i] = std::cos(b);
        s[q + i] = std::sin(b);
      }
    }
  }
}

void VisionEncoder::linear(const float* x, int64_t M, int64_t K, const TensorView& w, float* y) {
  if (fp16_) {
    ops::matmul_f16(x, M, K, w, y, pool_, isa_);
  } else {
    ops::matmul(x, M, K, w, y, pool_, isa_);
  }
}

void VisionEncoder::run_merger(const VisionMergerWeights& mw, bool postshuffle_norm, const float* x,
                               int64_t patches, float* out) {
  const int64_t D = cfg_.hidden_size, m2 = cfg_.spatial_merge_size * cfg_.spatial_merge_size;
  const int64_t tokens = patches / m2, wide = D * m2;
  // Each run of merge² consecutive rows (one 2×2 block) is one token of width merge²·D.
  std::vector<float> normed(static_cast<size_t>(patches * D));
  if (postshuffle_norm) {
    ops::layer_norm(x, mw.norm_w.data(), mw.norm_b.data(), tokens, wide, 1e-6f, normed.data(),
                    pool_, isa_);
  } else {
    ops::layer_norm(x, mw.norm_w.data(), mw.norm_b.data(), patches, D, 1e-6f, normed.data(),
                    pool_, isa_);
  }
  std::vector<float> hidden(static_cast<size_t>(tokens * wide));
  linear(normed.data(), tokens, wide, mw.fc1, hidden.data());
  // Both mergers use nn.GELU() (exact erf); fc1's bias add is fused into it.
  ops::gelu_erf(hidden.data(), mw.fc1_b.data(), tokens, wide, pool_, isa_);
  linear(hidden.data(), tokens, wide, mw.fc2, out);
  ops::add_bias(out, mw.fc2_b.data(), tokens, cfg_.out_hidden_size);
}

namespace {

Status check_grid(const GridThw& g, int64_t m) {
  if (g.t < 1 || g.h < m || g.w < m || g.h % m != 0 || g.w % m != 0) {
    return invalid_argument("image grid (" + std::to_string(g.t) + ", " + std::to_string(g.h) + ", " +
                            std::to_string(g.w) + ") is not a positive multiple of the merge size");
  }
  return ok_status();
}

}  // namespace

Status VisionEncoder::encode_rgb_batch(const RgbImage* images, int64_t n, VisionOutput* out) {
  for (int64_t i = 0; i < n; ++i) {
    VLM_RETURN_IF_ERROR(check_grid(images[i].grid, cfg_.spatial_merge_size));
    if (images[i].grid.t != 1) return invalid_argument("encode_rgb_batch: one frame per image");
  }
  if (device_ == nullptr) {
    return internal_error("an image without pixel values reached the CPU vision tower");
  }
  return device_->encode_rgb_batch(images, n, out);
}

void VisionEncoder::embed_patches(const float* pixel_values, const GridThw& g, float* x) {
  const int64_t S = g.patches(), D = cfg_.hidden_size;
  linear(pixel_values, S, w_.patch_embed.dim(1), w_.patch_embed, x);
  ops::add_bias(x, w_.patch_embed_b.data(), S, D);
  add_position_embedding(g, x);
}

Status VisionEncoder::encode(const float* pixel_values, const GridThw& g, VisionOutput* out) {
  const int64_t m = cfg_.spatial_merge_size;
  VLM_RETURN_IF_ERROR(check_grid(g, m));
  if (device_ != nullptr) return device_->encode(pixel_values, g, out);
  const int64_t S = g.patches(), D = cfg_.hidden_size, I = cfg_.intermediate_size;
  const int64_t nh = cfg_.num_heads, hd = D / nh, out_h = cfg_.out_hidden_size;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  std::vector<float> x(static_cast<size_t>(S * D)), xn(x.size()), tmp(x.size());
  std::vector<float> qkv(static_cast<size_t>(S * 3 * D)), q(x.size()), k(x.size()), v(x.size());
  std::vector<float> attn(x.size()), mlp(static_cast<size_t>(S * I));
  std::vector<float> cos, sin;

  embed_patches(pixel_values, g, x.data());
  rotary_tables(g, &cos, &sin);

  out->tokens = S / (m * m);
  out->embeds.assign(static_cast<size_t>(out->tokens * out_h), 0.f);
  out->deepstack.assign(w_.deepstack_mergers.size(), {});

  // NOTE(vlm): every residual add runs fused into the LayerNorm after it (ops::add_layer_norm:
  // x += delta + bias, xn = LN(x) in one pass over x): the attention's into norm2, the MLP's into
  // the next block's norm1. The bias adds of the linear layers ride along the same way.
  const int64_t per_frame = g.h * g.w;
  const size_t n_blocks = w_.blocks.size();
  if (n_blocks > 0) {
    const VisionBlockWeights& B0 = w_.blocks[0];
    ops::layer_norm(x.data(), B0.norm1_w.data(), B0.norm1_b.data(), S, D, 1e-6f, xn.data(), pool_,
                    isa_);
  }
  for (size_t b = 0; b < n_blocks; ++b) {
    const VisionBlockWeights& B = w_.blocks[b];
    linear(xn.data(), S, D, B.qkv, qkv.data());
    const float* qkv_b = B.qkv_b.data();
    for (int64_t i = 0; i < S; ++i) {  // [S, 3, heads, hd] + bias → three [S, heads, hd]
      const float* r = qkv.data() + i * 3 * D;
      float* dst[3] = {q.data() + i * D, k.data() + i * D, v.data() + i * D};
      for (int64_t part = 0; part < 3; ++part) {
        for (int64_t d = 0; d < D; ++d) dst[part][d] = r[part * D + d] + qkv_b[part * D + d];
      }
    }
    ops::rope_neox(q.data(), S, nh, hd, cos.data(), sin.data(), pool_, isa_);
    ops::rope_neox(k.data(), S, nh, hd, cos.data(), sin.data(), pool_, isa_);
    for (int64_t t = 0; t < g.t; ++t) {  // one attention segment per temporal group
      const int64_t off = t * per_frame * D;
      ops::attention_full(q.data() + off, k.data() + off, v.data() + off, per_frame, nh, hd, scale,
                          attn.data() + off, pool_, isa_);
    }
    linear(attn.data(), S, D, B.proj, tmp.data());
    ops::add_layer_norm(x.data(), tmp.data(), B.proj_b.data(), B.norm2_w.data(), B.norm2_b.data(),
                        S, D, 1e-6f, xn.data(), pool_, isa_);

    linear(xn.data(), S, D, B.fc1, mlp.data());
    ops::gelu_tanh(mlp.data(), B.fc1_b.data(), S, I, pool_, isa_);  // fc1's bias add fused
    linear(mlp.data(), S, I, B.fc2, tmp.data());
    if (b + 1 < n_blocks) {
      const VisionBlockWeights& N = w_.blocks[b + 1];
      ops::add_layer_norm(x.data(), tmp.data(), B.fc2_b.data(), N.norm1_w.data(),
                          N.norm1_b.data(), S, D, 1e-6f, xn.data(), pool_, isa_);
    } else {
      ops::add_residual(x.data(), tmp.data(), B.fc2_b.data(), S, D, pool_, isa_);
    }

    // DeepStack taps: the hidden state after block b, through that tap's own merger.
    for (size_t tap = 0; tap < cfg_.deepstack_visual_indexes.size(); ++tap) {
      if (cfg_.deepstack_visual_indexes[tap] == static_cast<int64_t>(b)) {
        out->deepstack[tap].assign(static_cast<size_t>(out->tokens * out_h), 0.f);
        run_merger(w_.deepstack_mergers[tap], /*postshuffle_norm=*/true, x.data(), S,
                   out->deepstack[tap].data());
      }
    }
  }
  run_merger(w_.merger, /*postshuffle_norm=*/false, x.data(), S, out->embeds.data());
  return ok_status();
}

}  // namespace vlm

// The CUDA vision tower (src/cuda/cuda_vision.h), step for step as VisionEncoder::encode.
#include "cuda/cuda_vision.h"

#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda_ops.h"
#include "cuda/flash_attention.h"
#include "cuda/gemm.h"
#include "cuda/weights.h"

namespace vlm::cuda {
namespace {

constexpr float kEps = 1e-6f;

struct Block {
  DeviceBuffer norm1_w, norm1_b, qkv, qkv_b, proj, proj_b, norm2_w, norm2_b, fc1, fc1_b, fc2, fc2_b;
};

struct Merger {
  DeviceBuffer norm_w, norm_b, fc1, fc1_b, fc2, fc2_b;
};

class CudaVisionEncoder final : public DeviceVisionEncoder {
 public:
  CudaVisionEncoder(const Qwen3VLConfig& cfg, const VisionEncoder& host, bool f32)
      : c_(cfg.vision_config), host_(host), act_(f32 ? DType::kF32 : DType::kBF16) {}

  Status init(const VisionWeights& w) {
    if (device_count() == 0) return invalid_argument("no CUDA device is visible to this process");
    const int64_t hd = c_.hidden_size / c_.num_heads;
    if (hd % 2 != 0 || hd > 256) {
      return invalid_argument("the CUDA vision tower needs an even head_dim up to 256");
    }
    VLM_RETURN_IF_ERROR(Gemm::create(&gemm_));
    VLM_RETURN_IF_ERROR(upload_tensor(w.patch_embed, act_, &patch_).with_context("patch_embed"));
    patch_in_ = w.patch_embed.dim(1);
    VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(w.patch_embed_b, &patch_b_));
    blocks_.resize(w.blocks.size());
    for (size_t i = 0; i < w.blocks.size(); ++i) {
      const VisionBlockWeights& s = w.blocks[i];
      Block& d = blocks_[i];
      const std::string at = "vision block " + std::to_string(i);
      for (auto [src, dst] : {std::pair{&s.norm1_w, &d.norm1_w},
                              {&s.norm1_b, &d.norm1_b},
                              {&s.qkv_b, &d.qkv_b},
                              {&s.proj_b, &d.proj_b},
                              {&s.norm2_w, &d.norm2_w},
                              {&s.norm2_b, &d.norm2_b},
                              {&s.fc1_b, &d.fc1_b},
                              {&s.fc2_b, &d.fc2_b}}) {
        VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(*src, dst));
      }
      for (auto [src, dst] :
           {std::pair{&s.qkv, &d.qkv}, {&s.proj, &d.proj}, {&s.fc1, &d.fc1}, {&s.fc2, &d.fc2}}) {
        VLM_RETURN_IF_ERROR(upload_tensor(*src, act_, dst).with_context(at));
      }
    }
    VLM_RETURN_IF_ERROR(upload_merger(w.merger, &merger_));
    deepstack_.resize(w.deepstack_mergers.size());
    for (size_t i = 0; i < w.deepstack_mergers.size(); ++i) {
      VLM_RETURN_IF_ERROR(upload_merger(w.deepstack_mergers[i], &deepstack_[i]));
    }
    return synchronize();
  }

  Status encode(const float* pixel_values, const GridThw& g, VisionOutput* out) override;
  Status encode_rgb_batch(const RgbImage* images, int64_t n, VisionOutput* out) override;

 private:
  Status upload_merger(const VisionMergerWeights& s, Merger* d) {
    VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.norm_w, &d->norm_w));
    VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.norm_b, &d->norm_b));
    VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.fc1_b, &d->fc1_b));
    VLM_RETURN_IF_ERROR(DeviceBuffer::upload_f32(s.fc2_b, &d->fc2_b));
    VLM_RETURN_IF_ERROR(upload_tensor(s.fc1, act_, &d->fc1).with_context("merger fc1"));
    return upload_tensor(s.fc2, act_, &d->fc2).with_context("merger fc2");
  }
  size_t act_bytes() const { return act_ == DType::kF32 ? 4 : 2; }
  // y = x · w[row0 : row0 + N]ᵀ: a slice of rows of a stored [*, K] weight.
  Status linear(const void* x, const DeviceBuffer& w, int64_t row0, int64_t M, int64_t N, int64_t K,
                void* y, DType y_t) {
    const char* wp =
        static_cast<const char*>(w.data()) + row0 * K * static_cast<int64_t>(act_bytes());
    return gemm_->matmul(x, wp, act_, M, N, K, y, y_t);
  }
  // A merger over all rows of x_; image i's tokens go to (out[i].*field).
  Status run_merger(const Merger& m, bool postshuffle, const std::vector<GridThw>& grids,
                    VisionOutput* out, int64_t tap);
  // Scratch for the images' patches side by side and the host tables (positions, rotary).
  Status prepare(const std::vector<GridThw>& grids);
  // The tower from the patches in pix_act_ on; out[i] for grids[i].
  Status run(const std::vector<GridThw>& grids, VisionOutput* out);

  const Qwen3VLVisionConfig& c_;
  const VisionEncoder& host_;
  DType act_;
  std::unique_ptr<Gemm> gemm_;
  DeviceBuffer patch_, patch_b_;
  int64_t patch_in_ = 0;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
  // Scratch, grown to the largest image so far.
  DeviceBuffer pix_, pix_act_, rgb_, lut_, pos_, cos_, sin_, x_, xn_, tmp_, q_, k_, v_, attn_, mlp_;
  DeviceBuffer m_norm_, m_hidden_, m_out_;
  std::vector<float> h_pos_, h_cos_, h_sin_, h_cos1_, h_sin1_, h_merged_;
};

Status CudaVisionEncoder::run_merger(const Merger& m, bool postshuffle,
                                     const std::vector<GridThw>& grids, VisionOutput* out,
                                     int64_t tap) {
  const int64_t D = c_.hidden_size, m2 = c_.spatial_merge_size * c_.spatial_merge_size;
  int64_t patches = 0;
  for (const GridThw& g : grids) patches += g.patches();
  const int64_t tokens = patches / m2, wide = D * m2, out_h = c_.out_hidden_size;
  // Each run of merge² consecutive rows (one 2×2 block) is one token of width merge²·D; no block
  // straddles two images (each image's patches are a multiple of merge²).
  if (postshuffle) {
    VLM_RETURN_IF_ERROR(layer_norm(x_.data(), m.norm_w.as<float>(), m.norm_b.as<float>(), tokens,
                                   wide, kEps, m_norm_.data(), act_));
  } else {
    VLM_RETURN_IF_ERROR(layer_norm(x_.data(), m.norm_w.as<float>(), m.norm_b.as<float>(), patches,
                                   D, kEps, m_norm_.data(), act_));
  }
  VLM_RETURN_IF_ERROR(linear(m_norm_.data(), m.fc1, 0, tokens, wide, wide, m_hidden_.data(), act_));
  VLM_RETURN_IF_ERROR(bias_gelu(m_hidden_.data(), m.fc1_b.as<float>(), tokens, wide, false, act_));
  VLM_RETURN_IF_ERROR(
      linear(m_hidden_.data(), m.fc2, 0, tokens, out_h, wide, m_out_.data(), DType::kF32));
  VLM_RETURN_IF_ERROR(add_bias(m_out_.data(), m.fc2_b.as<float>(), tokens, out_h, DType::kF32));
  h_merged_.resize(static_cast<size_t>(tokens * out_h));
  VLM_RETURN_IF_ERROR(m_out_.download(h_merged_.data(), h_merged_.size() * 4));
  int64_t first = 0;
  for (size_t i = 0; i < grids.size(); ++i) {
    const int64_t n = grids[i].patches() / m2;
    std::vector<float>& dst = tap < 0 ? out[i].embeds : out[i].deepstack[static_cast<size_t>(tap)];
    dst.assign(h_merged_.begin() + first * out_h, h_merged_.begin() + (first + n) * out_h);
    first += n;
  }
  return ok_status();
}

Status CudaVisionEncoder::encode(const float* pixel_values, const GridThw& g, VisionOutput* out) {
  VLM_RETURN_IF_ERROR(prepare({g}));
  const int64_t S = g.patches();
  VLM_RETURN_IF_ERROR(pix_.reserve(static_cast<size_t>(S * patch_in_) * 4));
  VLM_RETURN_IF_ERROR(pix_.upload(pixel_values, static_cast<size_t>(S * patch_in_) * 4));
  VLM_RETURN_IF_ERROR(convert(pix_.data(), DType::kF32, S * patch_in_, pix_act_.data(), act_));
  return run({g}, out);
}

Status CudaVisionEncoder::encode_rgb_batch(const RgbImage* images, int64_t n, VisionOutput* out) {
  if (n <= 0) return ok_status();
  const int64_t P = c_.patch_size, T = c_.temporal_patch_size;
  if (3 * T * P * P != patch_in_) return invalid_argument("encode_rgb_batch: patch size mismatch");
  std::vector<GridThw> grids;
  size_t bytes = 0;
  for (int64_t i = 0; i < n; ++i) {
    grids.push_back(images[i].grid);
    bytes += static_cast<size_t>(images[i].grid.h * P * images[i].grid.w * P * 3);
  }
  VLM_RETURN_IF_ERROR(prepare(grids));
  VLM_RETURN_IF_ERROR(rgb_.reserve(bytes));
  VLM_RETURN_IF_ERROR(lut_.reserve(static_cast<size_t>(n) * 3 * 256 * 4));
  size_t at = 0;
  int64_t row = 0;
  for (int64_t i = 0; i < n; ++i) {  // each image's bytes and table, then its patches in place
    const GridThw& g = images[i].grid;
    const size_t b = static_cast<size_t>(g.h * P * g.w * P * 3);
    auto* rgb = static_cast<uint8_t*>(rgb_.data()) + at;
    float* lut = lut_.as<float>() + i * 3 * 256;
    VLM_RETURN_IF_ERROR(copy_to_device(rgb, images[i].rgb, b));
    VLM_RETURN_IF_ERROR(copy_to_device(lut, images[i].lut, 3 * 256 * 4));
    char* pix = static_cast<char*>(pix_act_.data()) + row * patch_in_ * act_bytes();
    VLM_RETURN_IF_ERROR(patchify_rgb(rgb, lut, g.h, g.w, P, c_.spatial_merge_size, T, pix, act_));
    at += b;
    row += g.patches();
  }
  return run(grids, out);
}

Status CudaVisionEncoder::prepare(const std::vector<GridThw>& grids) {
  const int64_t m = c_.spatial_merge_size;
  const int64_t D = c_.hidden_size, I = c_.intermediate_size;
  const int64_t nh = c_.num_heads, hd = D / nh, out_h = c_.out_hidden_size;
  int64_t S = 0;
  for (const GridThw& g : grids) S += g.patches();
  const size_t a = act_bytes();
  for (auto [buf, bytes] : {std::pair{&pix_act_, S * patch_in_ * a},
                            {&pos_, S * D * 4},
                            {&cos_, S * (hd / 2) * 4},
                            {&sin_, S * (hd / 2) * 4},
                            {&x_, S * D * a},
                            {&xn_, S * D * a},
                            {&tmp_, S * D * a},
                            {&q_, S * D * a},
                            {&k_, S * D * a},
                            {&v_, S * D * a},
                            {&attn_, S * D * a},
                            {&mlp_, S * I * a},
                            {&m_norm_, S * D * a},
                            {&m_hidden_, S * D * a},
                            {&m_out_, (S / (m * m)) * out_h * 4}}) {
    VLM_RETURN_IF_ERROR(buf->reserve(static_cast<size_t>(bytes)));
  }
  // Host tables, image after image: the interpolated positions (added to zeros) and the rotary
  // angles.
  h_pos_.assign(static_cast<size_t>(S * D), 0.f);
  h_cos_.clear();
  h_sin_.clear();
  int64_t row = 0;
  for (const GridThw& g : grids) {
    host_.add_position_embedding(g, h_pos_.data() + row * D);
    host_.rotary_tables(g, &h_cos1_, &h_sin1_);
    h_cos_.insert(h_cos_.end(), h_cos1_.begin(), h_cos1_.end());
    h_sin_.insert(h_sin_.end(), h_sin1_.begin(), h_sin1_.end());
    row += g.patches();
  }
  VLM_RETURN_IF_ERROR(pos_.upload(h_pos_.data(), h_pos_.size() * 4));
  VLM_RETURN_IF_ERROR(cos_.upload(h_cos_.data(), h_cos_.size() * 4));
  return sin_.upload(h_sin_.data(), h_sin_.size() * 4);
}

Status CudaVisionEncoder::run(const std::vector<GridThw>& grids, VisionOutput* out) {
  const int64_t m = c_.spatial_merge_size;
  int64_t S = 0;
  for (const GridThw& g : grids) S += g.patches();
  const int64_t D = c_.hidden_size, I = c_.intermediate_size;
  const int64_t nh = c_.num_heads, hd = D / nh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const size_t a = act_bytes();
  VLM_RETURN_IF_ERROR(linear(pix_act_.data(), patch_, 0, S, D, patch_in_, x_.data(), act_));
  VLM_RETURN_IF_ERROR(add_bias(x_.data(), patch_b_.as<float>(), S, D, act_));
  VLM_RETURN_IF_ERROR(add_inplace(x_.data(), pos_.data(), DType::kF32, S * D, act_));

  for (size_t i = 0; i < grids.size(); ++i) {
    out[i].tokens = grids[i].patches() / (m * m);
    out[i].deepstack.assign(deepstack_.size(), {});
  }
  const size_t n_blocks = blocks_.size();
  if (n_blocks > 0) {
    VLM_RETURN_IF_ERROR(layer_norm(x_.data(), blocks_[0].norm1_w.as<float>(),
                                   blocks_[0].norm1_b.as<float>(), S, D, kEps, xn_.data(), act_));
  }
  for (size_t b = 0; b < n_blocks; ++b) {
    const Block& B = blocks_[b];
    // q, k, v: the three row slices of the fused qkv weight, each with its bias.
    void* parts[3] = {q_.data(), k_.data(), v_.data()};
    for (int64_t p = 0; p < 3; ++p) {
      VLM_RETURN_IF_ERROR(linear(xn_.data(), B.qkv, p * D, S, D, D, parts[p], act_));
      VLM_RETURN_IF_ERROR(add_bias(parts[p], B.qkv_b.as<float>() + p * D, S, D, act_));
    }
    for (const DeviceBuffer* x : {&q_, &k_}) {  // rotary only (no per-head norm in the tower)
      VLM_RETURN_IF_ERROR(qk_norm_rope(x->data(), S, nh, hd, nullptr, 0.f, cos_.as<float>(),
                                       sin_.as<float>(), act_));
    }
    // One attention segment per temporal group of each image.
    for (int64_t i = 0, first = 0; i < static_cast<int64_t>(grids.size());
         first += grids[i].patches(), ++i) {
      const int64_t per_frame = grids[i].h * grids[i].w;
      for (int64_t t = 0; t < grids[i].t; ++t) {
        const size_t off = static_cast<size_t>((first + t * per_frame) * D) * a;
        auto at = [&](const DeviceBuffer& buf) { return static_cast<char*>(buf.data()) + off; };
        if (act_ == DType::kBF16 && flash_attention_supports(hd)) {  // on the tensor cores
          VLM_RETURN_IF_ERROR(
              flash_attention_full(at(q_), at(k_), at(v_), per_frame, nh, hd, scale, at(attn_)));
        } else {
          VLM_RETURN_IF_ERROR(attention(at(q_), per_frame, at(k_), at(v_), per_frame, 0, false, nh,
                                        nh, hd, scale, at(attn_), act_));
        }
      }
    }
    VLM_RETURN_IF_ERROR(linear(attn_.data(), B.proj, 0, S, D, D, tmp_.data(), act_));
    VLM_RETURN_IF_ERROR(add_layer_norm(x_.data(), tmp_.data(), B.proj_b.as<float>(),
                                       B.norm2_w.as<float>(), B.norm2_b.as<float>(), S, D, kEps,
                                       xn_.data(), act_));
    VLM_RETURN_IF_ERROR(linear(xn_.data(), B.fc1, 0, S, I, D, mlp_.data(), act_));
    VLM_RETURN_IF_ERROR(bias_gelu(mlp_.data(), B.fc1_b.as<float>(), S, I, true, act_));
    VLM_RETURN_IF_ERROR(linear(mlp_.data(), B.fc2, 0, S, D, I, tmp_.data(), act_));
    if (b + 1 < n_blocks) {
      const Block& N = blocks_[b + 1];
      VLM_RETURN_IF_ERROR(add_layer_norm(x_.data(), tmp_.data(), B.fc2_b.as<float>(),
                                         N.norm1_w.as<float>(), N.norm1_b.as<float>(), S, D, kEps,
                                         xn_.data(), act_));
    } else {
      VLM_RETURN_IF_ERROR(add_layer_norm(x_.data(), tmp_.data(), B.fc2_b.as<float>(), nullptr,
                                         nullptr, S, D, kEps, nullptr, act_));
    }
    for (size_t tap = 0; tap < c_.deepstack_visual_indexes.size(); ++tap) {
      if (c_.deepstack_visual_indexes[tap] == static_cast<int64_t>(b)) {
        VLM_RETURN_IF_ERROR(run_merger(deepstack_[tap], /*postshuffle=*/true, grids, out,
                                       static_cast<int64_t>(tap)));
      }
    }
  }
  VLM_RETURN_IF_ERROR(run_merger(merger_, /*postshuffle=*/false, grids, out, -1));
  return synchronize();
}

}  // namespace

Result<std::unique_ptr<DeviceVisionEncoder>> make_cuda_vision_encoder(const Qwen3VLConfig& cfg,
                                                                      const VisionWeights& w,
                                                                      const VisionEncoder& host,
                                                                      bool f32) {
  auto e = std::make_unique<CudaVisionEncoder>(cfg, host, f32);
  VLM_RETURN_IF_ERROR(e->init(w).with_context("loading the vision tower onto the GPU"));
  return std::unique_ptr<DeviceVisionEncoder>(std::move(e));
}

}  // namespace vlm::cuda

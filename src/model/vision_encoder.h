// Qwen3-VL vision tower on the CPU: patch embedding, interpolated learned positions, 2-D rotary,
// pre-norm ViT blocks with attention kept inside each image, the patch merger and the DeepStack
// mergers.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "ops/ops.h"

namespace vlm {

// Grid of one image in patch units (image_grid_thw): t temporal groups of h × w patches.
struct GridThw {
  int64_t t = 1, h = 0, w = 0;
  int64_t patches() const { return t * h * w; }
};

struct VisionOutput {
  int64_t tokens = 0;                          // merged tokens = patches / merge²
  std::vector<float> embeds;                   // [tokens, out_hidden]: replaces the image pads
  std::vector<std::vector<float>> deepstack;   // per DeepStack tap: [tokens, out_hidden]
};

// A resized image for a device to normalise and patchify itself (PreprocessOptions::patchify
// false): its bytes, its normalisation table and its grid (one frame).
struct RgbImage {
  const uint8_t* rgb = nullptr;
  const float* lut = nullptr;
  GridThw grid;
};

// The vision tower on an accelerator (the CUDA backend): VisionEncoder::encode hands its work to
// one when set_device() gave it one.
class DeviceVisionEncoder {
 public:
  virtual ~DeviceVisionEncoder() = default;
  // As VisionEncoder::encode, on a grid VisionEncoder already checked.
  virtual Status encode(const float* pixel_values, const GridThw& grid, VisionOutput* out) = 0;
  // The same from resized images themselves, in one pass of the tower (their patches side by
  // side, attention within each image's frames): out[i] for images[i]. Each image's rgb is
  // [grid.h · P, grid.w · P, 3] bytes, normalised through its lut [3 · 256] (preprocess's
  // normalization_lut) and patchified on the device, each patch repeated over the
  // temporal_patch_size frames as the processor does.
  virtual Status encode_rgb_batch(const RgbImage* images, int64_t n, VisionOutput* out) = 0;
};

class VisionEncoder {
 public:
  VisionEncoder(const Qwen3VLConfig& cfg, const VisionWeights& w, ThreadPool& pool);

  void set_isa(ops::Isa isa) { isa_ = isa; }
  // FP16 arithmetic for the matmuls (ops::matmul_f16) where the CPU has it.
  void set_fp16(bool on) { fp16_ = on; }
  bool fp16() const { return fp16_ && ops::has_fp16_arithmetic(isa_); }

  // Encodes one image. pixel_values: [grid.patches(), 3·T·P·P] in merge order (the processor's
  // layout). Every temporal group attends only within itself, as transformers' cu_seqlens do.
  Status encode(const float* pixel_values, const GridThw& grid, VisionOutput* out);

  // Images preprocessed without patchify (PreprocessOptions::patchify false), in one pass: only
  // with a device encoder (DeviceVisionEncoder::encode_rgb_batch); an error on the CPU.
  Status encode_rgb_batch(const RgbImage* images, int64_t n, VisionOutput* out);

  // Runs encode() on `device` from now on (null: back on the CPU). Not owned.
  void set_device(DeviceVisionEncoder* device) { device_ = device; }
  bool on_device() const { return device_ != nullptr; }

  // The host-side tables a device encoder needs too: adds the interpolated learned position
  // embedding of `grid` to x [patches, D] (merge order); the 2-D rotary cos/sin [patches,
  // head_dim / 2].
  void add_position_embedding(const GridThw& grid, float* x) const;
  void rotary_tables(const GridThw& grid, std::vector<float>* cos, std::vector<float>* sin) const;

  // The input of block 0, as encode() computes it: x [grid.patches(), D] = the patch embedding of
  // pixel_values (with its bias) plus the position embedding (on the CPU).
  void embed_patches(const float* pixel_values, const GridThw& grid, float* x);

 private:
  // y = x · wᵀ through ops::matmul, or ops::matmul_f16 when fp16_.
  void linear(const float* x, int64_t M, int64_t K, const TensorView& w, float* y);
  void run_merger(const VisionMergerWeights& m, bool postshuffle_norm, const float* x,
                  int64_t patches, float* out);

  const Qwen3VLVisionConfig& cfg_;
  const VisionWeights& w_;
  ThreadPool& pool_;
  ops::Isa isa_ = ops::detected_isa();
  bool fp16_ = false;
  DeviceVisionEncoder* device_ = nullptr;
  int64_t grid_side_ = 0;        // sqrt(num_position_embeddings)
  std::vector<float> inv_freq_;  // [head_dim / 4] rotary frequencies per axis
};

}  // namespace vlm

// Qwen3-VL vision tower: patch embedding, interpolated learned positions, 2-D rotary, pre-norm ViT
// blocks with attention kept inside each image, the patch merger and the DeepStack mergers.
// Written once, over the ops::Backend interface (the CPU or the GPU).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "ops/backend.h"

namespace vlm {

// Grid of one image in patch units (image_grid_thw): t temporal groups of h × w patches.
struct GridThw {
  int64_t t = 1, h = 0, w = 0;
  int64_t patches() const { return t * h * w; }
};

struct VisionOutput {
  int64_t tokens = 0;                         // merged tokens = patches / merge²
  std::vector<float> embeds;                  // [tokens, out_hidden]: replaces the image pads
  std::vector<std::vector<float>> deepstack;  // per DeepStack tap: [tokens, out_hidden]
};

// A resized image for a backend to normalise and patchify itself (PreprocessOptions::patchify
// false): its bytes, its normalisation table and its grid (one frame).
struct RgbImage {
  const uint8_t* rgb = nullptr;
  const float* lut = nullptr;
  GridThw grid;
};

class VisionEncoder {
 public:
  // One encode in progress, run in units of work by advance(): the tower as a list of stages
  // (patch embedding, each block's q/k/v, attention, projection and MLP, each merger), each
  // stage over the rows of its batch (the attention's per frame), a unit being the next rows of
  // the current stage. The activations it carries between units are the encoder's scratch, so
  // one job at a time exists per encoder; destroying it, done or not, gives them back.
  class Job {
   public:
    ~Job();
    Job(const Job&) = delete;
    Job& operator=(const Job&) = delete;
    bool done() const { return stage_ >= plan_.size(); }
    // Per image of the job, in order; complete once done().
    std::vector<VisionOutput>& outputs() { return out_; }
    int64_t units_run() const { return units_; }
    // The kind of the next unit's stage, 0 .. kKinds - 1 (units of one kind run at one rate);
    // -1 once done.
    static constexpr int kKinds = 6;
    int stage_kind() const { return done() ? -1 : static_cast<int>(plan_[stage_].kind); }

   private:
    friend class VisionEncoder;
    enum class Kind { kEmbed, kQkv, kAttention, kProjection, kMlp, kMerger };
    struct Stage {
      Kind kind;
      int64_t block = 0;  // kQkv .. kMlp: the block; kMerger: the DeepStack tap, -1 the last
    };
    explicit Job(VisionEncoder* enc) : enc_(enc) {}
    VisionEncoder* enc_;
    std::vector<GridThw> grids_;
    std::vector<VisionOutput> out_;
    ops::Buf input_;  // [S, patch_in], the activation type
    int64_t S_ = 0;
    std::vector<Stage> plan_;
    size_t stage_ = 0;
    int64_t space_ = 0;  // the attention's frame (other stages: one space of all rows)
    int64_t row_ = 0;    // the next row in that space
    int64_t units_ = 0;
  };

  // The tower's weights go to the backend. fp16: the products in FP16 arithmetic where the
  // backend has it (the CPU's --vision-fp16, or its measured choice); bf16_gemm: the CPU's BF16
  // GEMM for the tower's products (unset: the backend's own).
  static Result<std::unique_ptr<VisionEncoder>> create(
      const Qwen3VLConfig& cfg, const VisionWeights& w, ops::Backend& be, bool fp16 = false,
      std::optional<ops::Bf16Gemm> bf16_gemm = std::nullopt);

  // Whether the products run FP16 arithmetic.
  bool fp16() const { return fp16_ && be_.has_fp16_arithmetic(); }
  // Whether the backend takes resized images as they are (encode_rgb_batch) and patchifies them
  // itself.
  bool takes_rgb() const { return be_.can_patchify(); }

  // Encodes one image. pixel_values: [grid.patches(), 3·T·P·P] in merge order (the processor's
  // layout). Every temporal group attends only within itself, as transformers' cu_seqlens do.
  Status encode(const float* pixel_values, const GridThw& grid, VisionOutput* out);

  // The same encode as a job, to run in units (encode() is begin + advance to the end).
  Result<std::unique_ptr<Job>> begin(const float* pixel_values, const GridThw& grid);
  // encode_rgb_batch as a job.
  Result<std::unique_ptr<Job>> begin_rgb(const RgbImage* images, int64_t n);
  // Runs the job's next unit: the current stage over its next `rows` rows (rounded up to the
  // backend's row grain, and to the stage's end when fewer than a grain would be left), or over
  // all of them with rows <= 0 or on a backend without a row grain. Every row's arithmetic is
  // the same whatever the units, so the outputs equal encode()'s bit for bit.
  Status advance(Job* job, int64_t rows);
  // What the job's next unit of `rows` rows (as advance() rounds them) costs, in FLOPs: the
  // runner's estimate of its time.
  double next_unit_flops(const Job& job, int64_t rows) const;
  // The rows advance() would run for `rows` (0: the rest of the current space).
  int64_t next_unit_rows(const Job& job, int64_t rows) const;

  // Resized images (PreprocessOptions::patchify false), in one pass of the tower: their patches
  // side by side, attention within each image's frames; out[i] for images[i]. Each image's rgb
  // is [grid.h · P, grid.w · P, 3] bytes, normalised through its lut [3 · 256] (preprocess's
  // normalization_lut) and patchified by the backend, each patch repeated over the
  // temporal_patch_size frames as the processor does. Only where takes_rgb().
  Status encode_rgb_batch(const RgbImage* images, int64_t n, VisionOutput* out);

  // The input of block 0, as encode() computes it: x [grid.patches(), D] (host, f32) = the patch
  // embedding of pixel_values (with its bias) plus the interpolated position embedding.
  Status embed_patches(const float* pixel_values, const GridThw& grid, float* x);

 private:
  struct Block {
    ops::Buf norm1_w, norm1_b, qkv_b, proj_b, norm2_w, norm2_b, fc1_b, fc2_b;
    std::unique_ptr<ops::Linear> qkv, proj, fc1, fc2;
  };
  struct Merger {
    ops::Buf norm_w, norm_b, fc1_b, fc2_b;
    std::unique_ptr<ops::Linear> fc1, fc2;
  };
  VisionEncoder(const Qwen3VLConfig& cfg, const VisionWeights& w, ops::Backend& be, bool fp16,
                std::optional<ops::Bf16Gemm> bf16_gemm);
  Status init();
  Status load_merger(const VisionMergerWeights& s, Merger* d);

  // Adds the interpolated learned position embedding of `grid` to x [patches, D] (merge order);
  // the 2-D rotary cos/sin [patches, head_dim / 2] (appended).
  void add_position_embedding(const GridThw& grid, float* x) const;
  void rotary_tables(const GridThw& grid, std::vector<float>* cos, std::vector<float>* sin) const;
  // Scratch for S patches; the host tables of the images' positions and rotary, staged.
  Status prepare(const std::vector<GridThw>& grids);
  // pixel_values [g.patches(), patch_in] f32 on the backend, in the activation type (prepare()
  // done: its scratch is sized).
  Result<ops::Buf> stage_pixels(const float* pixel_values, const GridThw& g);
  // A job over `grids` whose patches are in `input` (prepare() done): its plan and outputs.
  std::unique_ptr<Job> make_job(const std::vector<GridThw>& grids, ops::Buf input);
  // Runs a job to its end; moves its outputs to out[i] (one per image).
  Status finish(std::unique_ptr<Job> job, VisionOutput* out);
  // The patch embedding and position of input rows [r0, r1) into x_.
  Status embed(ops::Buf input, int64_t r0, int64_t r1);
  // The rows of the job's current space and where it starts among all rows.
  void space_of(const Job& job, int64_t* first, int64_t* rows) const;
  // Merger rows [t0, t1) (tokens); each image's part of them to its output.
  Status run_merger(Job* job, const Merger& m, bool postshuffle, int64_t tap, int64_t t0,
                    int64_t t1);
  // Grows a scratch buffer to `elems` of t.
  Status grow(ops::Buffer* b, int64_t elems, DType t);
  // Host memory goes back after each image (a big image's scratch is gigabytes); a device keeps
  // its grown buffers.
  void release_host_scratch();

  const Qwen3VLVisionConfig& cfg_;
  const VisionWeights& w_;
  ops::Backend& be_;
  bool fp16_ = false;
  std::optional<ops::Bf16Gemm> bf16_gemm_;
  int64_t grid_side_ = 0;        // sqrt(num_position_embeddings)
  std::vector<float> inv_freq_;  // [head_dim / 4] rotary frequencies per axis
  std::unique_ptr<ops::Linear> patch_;
  ops::Buf patch_b_;
  std::vector<Block> blocks_;
  Merger merger_;
  std::vector<Merger> deepstack_;
  // Scratch, grown to the largest batch of patches so far.
  ops::Buffer pix_, pix_act_, rgb_, lut_, pos_, cos_, sin_, x_, xn_, tmp_, qkv_, q_, k_, v_, attn_,
      mlp_, m_norm_, m_hidden_, m_out_;
  ops::Buf pos_dev_, cos_dev_, sin_dev_;  // the staged host tables
  std::vector<float> h_pos_, h_cos_, h_sin_;
  bool job_open_ = false;  // a Job holds the scratch
};

}  // namespace vlm

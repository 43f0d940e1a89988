// Turns a prompt with single image pads plus its images into what the decoder runs: the
// expanded ids, 3-D positions, and the vision features each image row takes.
//
// The work is split by where it runs (docs/architecture.md): stage_image (read, hash, decode,
// preprocess) runs on the thread that submits the request; encode_staged_image (the vision tower)
// and assemble_multimodal run on the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "engine/pixel_budget.h"
#include "engine/vision_cache.h"
#include "model/mrope_positions.h"
#include "model/qwen3vl_config.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
#include "vision/preprocess.h"
#include "vlm/request.h"

namespace vlm {

// Where one image's tokens are in an expanded prompt, and what identifies the image.
struct ImageSpan {
  int64_t begin = 0, end = 0;
  VisionCacheKey key;
};

struct PreparedPrompt {
  std::vector<int32_t> ids;            // expanded
  std::vector<ImageSpan> image_spans;  // in order
  std::vector<int32_t> feature_row;    // [ids.size()]: row in embeds / deepstack, -1 for text
  std::vector<float> embeds;           // [vision_tokens, hidden]
  std::vector<std::vector<float>> deepstack;  // per tap: [vision_tokens, hidden]
  RopeIndex rope;                             // 3-D positions and the decode delta
  int64_t vision_tokens = 0;
  double decode_ms = 0, preprocess_ms = 0, encode_ms = 0;

  // The VisionRows of the chunk starting at `first` (pointers into this struct).
  VisionRows rows_for_chunk(int64_t first) const;
};

// The [begin, end) runs of <|image_pad|> in a prompt, one per image. Errors: a pad that does not
// follow <|vision_start|>, or a run count that differs from `num_images`.
Result<std::vector<std::pair<size_t, size_t>>> find_image_runs(std::span<const int32_t> ids,
                                                               const Qwen3VLConfig& cfg,
                                                               size_t num_images);

// One image made ready before the engine thread sees it: the cached encoder output when the
// cache has it, else the preprocessed pixels.
struct StagedImage {
  VisionCacheKey key;
  std::shared_ptr<const EncodedImage> encoded;  // set: nothing left to compute
  PreprocessedImage pixels;                     // when encoded is null
  int64_t tokens = 0;                           // merged image tokens
  int64_t resized_h = 0, resized_w = 0;
  double decode_ms = 0, preprocess_ms = 0;  // 0 on a cache hit
  bool encoded_here = false;  // encoded for this request (not found in the vision cache)
};

// A vision-tower job (VisionEncoder::Job) for `images`, none encoded yet (several only as
// resized images for a device that patchifies, which go through the tower together). Run it
// with VisionEncoder::advance (or ModelRunner::encode), then take_encoded().
Result<std::unique_ptr<VisionEncoder::Job>> begin_encode(VisionEncoder& encoder,
                                                         std::span<StagedImage* const> images);
// A finished job's outputs into its images (encoded, encoded_here; their pixels released).
void take_encoded(VisionEncoder::Job& job, std::span<StagedImage* const> images);

// Reads (path) or takes (bytes) the image, and looks it up in `cache` (may be null); on a miss
// decodes and preprocesses it with `preprocess` overridden by the image's own pixel budget.
// `pool` may be null (single-threaded resize). With max_tokens >= 0, an image that would take
// more tokens is refused (kOutOfRange) from its header's size and the budget, before it is
// decoded or resized. Errors are not prefixed with which image it was.
// `budget` (may be null): the image holds its decoded pixels there from its header until it is
// preprocessed, waiting while they do not fit.
Status stage_image(const ImageInput& in, const PreprocessOptions& preprocess, VisionCache* cache,
                   ThreadPool* pool, StagedImage* out, int64_t max_tokens = -1,
                   PixelBudget* budget = nullptr);

// Runs the vision tower on a staged image that has no encoder output yet (a no-op otherwise), in
// one go.
Status encode_staged_image(VisionEncoder& encoder, StagedImage* img, double* encode_ms);

// Expands each run of `runs` to its image's token count, copies the features and computes the
// positions. Every image must be encoded.
Status assemble_multimodal(std::span<const int32_t> ids,
                           std::span<const std::pair<size_t, size_t>> runs,
                           std::span<const StagedImage> images, const Qwen3VLConfig& cfg,
                           PreparedPrompt* out);

// The length of the prompt once each run is expanded to `images[k].tokens`.
int64_t expanded_length(size_t num_ids, std::span<const std::pair<size_t, size_t>> runs,
                        std::span<const StagedImage> images);

}  // namespace vlm

// Turns a prompt with single image and video pads plus its images and videos into what the
// decoder runs: the expanded ids, 3-D positions, and the vision features each image row takes.
//
// The work is split by where it runs (docs/architecture.md): stage_image / stage_video (read,
// hash, decode, preprocess) and expand_video_runs (the timestamps) run on the thread that submits
// the request; encode_staged_image (the vision tower) and assemble_multimodal run on the engine
// thread. Images and videos are "items" in prompt order; an item with grid (t, h, w) owns t runs
// of pads (an image one, a video one per temporal group), each h·w/merge² tokens once expanded.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "engine/pixel_budget.h"
#include "engine/vision_cache.h"
#include "model/mrope_positions.h"
#include "model/qwen3vl_config.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
#include "vision/preprocess.h"
#include "vision/video_decode.h"
#include "vlm/request.h"
#include "vlm/tokenizer.h"

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

// A [begin, end) run of <|image_pad|> or <|video_pad|> in a prompt, and the item it belongs to.
struct PadRun {
  size_t begin = 0, end = 0;
  size_t item = 0;  // index among the prompt's images and videos, in prompt order
  bool video = false;
};

// The runs of image and video pads of a prompt, one per item, with their item numbers in order
// (a video pad that does not follow <|vision_start|> is text). Errors: an image pad that does not
// follow <|vision_start|>, or run counts that differ from `num_images` / `num_videos`.
Result<std::vector<PadRun>> find_pad_runs(std::span<const int32_t> ids, const Qwen3VLConfig& cfg,
                                          size_t num_images, size_t num_videos);

// One image made ready before the engine thread sees it: the cached encoder output when the
// cache has it, else the preprocessed pixels.
struct StagedImage {
  bool video = false;
  VisionCacheKey key;
  std::shared_ptr<const EncodedImage> encoded;  // set: nothing left to compute
  PreprocessedImage pixels;                     // when encoded is null
  int64_t tokens = 0;                           // merged image tokens (all groups of a video)
  int64_t groups = 1;                           // a video's temporal groups (runs in the prompt)
  std::vector<std::string> timestamps;          // a video's: each group's "<t.t seconds>"
  int64_t frames = 0;                           // a video's sampled frames
  int64_t decoded_frames = 0;                   // a video's frames decoded (sampled or not)
  int64_t resized_h = 0, resized_w = 0;
  double decode_ms = 0, preprocess_ms = 0;  // 0 on a cache hit
  bool encoded_here = false;  // encoded for this request (not found in the vision cache)
};

// A vision-tower job (VisionEncoder::Job) for `images`, none encoded yet (several only as
// resized images for a device that patchifies, which go through the tower together). Run it
// with VisionEncoder::advance (or ModelRunner::encode), then take_encoded().
Result<std::unique_ptr<VisionEncoder::Job>> begin_encode(VisionEncoder& encoder,
                                                         std::span<StagedImage* const> images);
// A finished job's outputs into its images (encoded, encoded_here; their pixels released), with
// a draft model's tower's outputs for the same images when given (EncodedImage::draft).
void take_encoded(VisionEncoder::Job& job, std::span<StagedImage* const> images,
                  VisionEncoder::Job* draft = nullptr);

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

// What stage_video needs besides the video: the checkpoint's video_preprocessor_config.json
// (overridden by the request's settings) and the decoder's limits.
struct VideoStaging {
  VideoPreprocessConfig config;
  VideoLimits limits;
  std::string unsupported;  // non-empty: why this model takes no video
};

// stage_image for a video: reads or takes the bytes, looks the video up in `cache` under its
// bytes, sampling and pixel budget; on a miss decodes the sampled frames and preprocesses them
// (grid_t = the temporal groups) and makes the groups' timestamps. With max_tokens >= 0, a video
// that would take more tokens is refused (kOutOfRange) once its frames are sampled (before they
// are resized). `budget` (may be null) holds the decoded frames' pixels until preprocessed.
Status stage_video(const VideoInput& in, const VideoStaging& staging, VisionCache* cache,
                   ThreadPool* pool, StagedImage* out, int64_t max_tokens = -1,
                   PixelBudget* budget = nullptr);

// Rewrites each video's <|vision_start|><|video_pad|><|vision_end|> (one pad) in `*ids` as
// Qwen3VLProcessor does: per temporal group, its timestamp text, then
// <|vision_start|><|video_pad|><|vision_end|>; `*runs` becomes one run per group. transformers
// writes the timestamps into the prompt's TEXT and tokenizes it whole, so the first timestamp is
// tokenized together with the text before it back to the previous special token (where that
// text's ids are what `tok` makes of it; the others follow special tokens). Errors: a video pad
// run longer than one, or not followed by <|vision_end|>.
Status expand_video_runs(const Tokenizer& tok, std::span<const StagedImage> items,
                         const Qwen3VLConfig& cfg, std::vector<int32_t>* ids,
                         std::vector<PadRun>* runs);

// Runs the vision tower on a staged image that has no encoder output yet (a no-op otherwise), in
// one go.
Status encode_staged_image(VisionEncoder& encoder, StagedImage* img, double* encode_ms);

// The items' features in order (the rows assemble_multimodal numbers): `which` of each item's
// encoder outputs (EncodedImage::out, or a draft model's EncodedImage::draft) into *embeds and
// each of `taps` DeepStack taps. Every item must be encoded.
void gather_features(std::span<const StagedImage> items, VisionOutput EncodedImage::*which,
                     size_t taps, std::vector<float>* embeds,
                     std::vector<std::vector<float>>* deepstack);

// Expands each run of `runs` to its share of its item's tokens, copies the features and computes
// the positions. Every item must be encoded.
Status assemble_multimodal(std::span<const int32_t> ids, std::span<const PadRun> runs,
                           std::span<const StagedImage> items, const Qwen3VLConfig& cfg,
                           PreparedPrompt* out);

// The prompt with each run expanded to its share of its item's tokens (the run's pad repeated), as
// assemble_multimodal expands it, with its check (a run is one pad or the whole share); needs
// only the items' token counts (no encoder output).
Result<std::vector<int32_t>> expand_pad_runs(std::span<const int32_t> ids,
                                             std::span<const PadRun> runs,
                                             std::span<const StagedImage> items,
                                             const Qwen3VLConfig& cfg);

// The length of the prompt once each run is expanded to its share of its item's tokens.
int64_t expanded_length(size_t num_ids, std::span<const PadRun> runs,
                        std::span<const StagedImage> items);

}  // namespace vlm

// Turns a prompt with single image pads plus its images into what the decoder runs: the
// expanded ids, 3-D positions, and the vision features each image row takes.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "model/mrope_positions.h"
#include "model/qwen3vl_config.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
#include "vision/preprocess.h"
#include "vlm/engine.h"
#include "vlm/request.h"

namespace vlm {

struct PreparedPrompt {
  std::vector<int32_t> ids;          // expanded
  std::vector<int32_t> feature_row;  // [ids.size()]: row in embeds / deepstack, -1 for text
  std::vector<float> embeds;         // [vision_tokens, hidden]
  std::vector<std::vector<float>> deepstack;  // per tap: [vision_tokens, hidden]
  RopeIndex rope;                    // 3-D positions and the decode delta
  int64_t vision_tokens = 0;
  double decode_ms = 0, preprocess_ms = 0, encode_ms = 0;

  // The VisionRows of the chunk starting at `first` (pointers into this struct).
  VisionRows rows_for_chunk(int64_t first) const;
};

// Decodes (bytes or path), preprocesses with `preprocess` overridden by the image's own pixel
// budget, and encodes one image; `cost` gets the times, resized size and token count. Errors are
// not yet prefixed with which image it was.
Status encode_image_input(const ImageInput& in, const PreprocessOptions& preprocess,
                          VisionEncoder& encoder, ThreadPool& pool, GridThw* grid,
                          VisionOutput* out, Engine::ImageTimings* cost);

// Decodes and preprocesses every image, runs the vision encoder, expands each single image pad
// (a run of one) to the image's token count, and computes positions. A prompt whose pad runs do
// not match the images is an error naming the mismatch.
Status prepare_multimodal(std::span<const int32_t> ids, const std::vector<ImageInput>& images,
                          const Qwen3VLConfig& cfg, const PreprocessOptions& preprocess,
                          VisionEncoder& encoder, ThreadPool& pool, PreparedPrompt* out);

}  // namespace vlm

// 3-D M-RoPE position ids of a prompt with images (transformers' get_rope_index).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/vision_encoder.h"
#include "vlm/status.h"

namespace vlm {

struct RopeIndex {
  std::vector<int64_t> t, h, w;  // [seq] each
  // Decode steps use position = cache_position + delta on all three axes.
  int64_t delta = 0;
};

// ids: the EXPANDED prompt (each image's pads already repeated grid.patches() / merge² times).
// Text runs advance all three axes together; an image's tokens get (s, s + row, s + col) over
// its merged grid, with s the next free position, and the text after it resumes at
// s + max(merged h, merged w). As in transformers, the visual items are the <|vision_start|>
// tokens directly followed by an image pad (or a video pad, with video_token_id >= 0); they take
// the grids in prompt order (pads with no vision start before them count as text, and grids
// beyond the counted items are ignored). A video's temporal group is an item of its own, with a
// grid of t = 1 (transformers splits video_grid_thw so): its t-index is 0.
Result<RopeIndex> compute_rope_index(std::span<const int32_t> ids, std::span<const GridThw> grids,
                                     int64_t image_token_id, int64_t vision_start_token_id,
                                     int64_t merge_size, int64_t video_token_id = -1);

}  // namespace vlm

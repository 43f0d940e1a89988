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
// s + max(merged h, merged w). Grids are matched to image-pad runs in order.
Result<RopeIndex> compute_rope_index(std::span<const int32_t> ids, std::span<const GridThw> grids,
                                     int64_t image_token_id, int64_t merge_size);

}  // namespace vlm

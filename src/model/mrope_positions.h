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
// s + max(merged h, merged w). As in transformers, the images are the <|vision_start|> tokens
// directly followed by an image pad; they take the grids in order (pads with no vision start
// before them count as text, and grids beyond the counted images are ignored).
Result<RopeIndex> compute_rope_index(std::span<const int32_t> ids, std::span<const GridThw> grids,
                                     int64_t image_token_id, int64_t vision_start_token_id,
                                     int64_t merge_size);

}  // namespace vlm

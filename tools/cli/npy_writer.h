// Writing float32 arrays as NumPy .npy files (`vlm logits --out`); the reader the tests use is in
// src/io/npy.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "vlm/status.h"

namespace vlm_cli {

// Writes `data` [prod(shape)] as a C-order '<f4' .npy (format version 1.0, header padded to 64
// bytes as numpy pads it). An empty shape writes a 0-d array holding data[0].
vlm::Status write_npy_f32(const std::string& path, const float* data,
                          const std::vector<int64_t>& shape);

}  // namespace vlm_cli

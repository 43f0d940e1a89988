// An 8-bit RGB image in memory.
#pragma once

#include <cstdint>
#include <vector>

namespace vlm {

struct Image {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;  // [height, width, 3], row-major, R G B

  uint8_t at(int64_t y, int64_t x, int c) const { return rgb[(y * width + x) * 3 + c]; }
};

}  // namespace vlm

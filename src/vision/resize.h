// Antialiased bicubic resampling of 8-bit RGB images, bit-exact with the resize the Qwen3-VL
// reference runs: torchvision F.resize(uint8 CHW, BICUBIC, antialias=True) on CPU, i.e. ATen's
// _upsample_bicubic2d_aa uint8 path (UpSampleKernel.cpp, torch 2.9), itself a port of Pillow's
// ImagingResample:
//
//   * Keys cubic kernel with a = -0.5; when shrinking by s = in/out > 1 the kernel is stretched by
//   s
//     (support 2s, taps ceil(2s)*2+1), which is the antialiasing; when enlarging, support is 2.
//   * Per output index i: center = s*(i+0.5), taps [xmin, xmin+xsize) clipped to the image, float64
//     weights normalised to sum 1 over the clipped taps.
//   * Weights are then quantised to int16 with one fixed-point precision per axis: the largest
//     p <= 22 for which round(max_weight * 2^(p+1)) < 2^15. Each output is
//     clamp((2^(p-1) + sum src*w_q) >> p, 0, 255).
//   * Separable: the horizontal pass first (into a uint8 intermediate, rounded and clamped as
//   above),
//     then the vertical pass; a pass whose size does not change is skipped, and equal sizes copy.
//
// Not Pillow's Image.resize: Pillow uses fixed 22-bit int32 weights, so it can differ by 1 LSB.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "vision/image.h"

namespace vlm {

// Fixed-point resampling weights for one axis (in_size -> out_size), as ATen computes them.
struct ResampleWeights {
  int64_t in_size = 0;
  int64_t out_size = 0;
  int64_t taps = 0;              // weights per output index (ceil(support) * 2 + 1)
  int precision = 0;             // fixed-point bits of `weights`
  std::vector<int64_t> first;    // [out_size] first input index read
  std::vector<int64_t> count;    // [out_size] input indices read, <= taps
  std::vector<int16_t> weights;  // [out_size, taps], entries past count[i] are 0
};

// Precondition: in_size > 0 and out_size > 0.
ResampleWeights compute_bicubic_aa_weights(int64_t in_size, int64_t out_size);

// Returns src resized to out_h x out_w. Rows are split across `pool` when given (nullptr: the
// calling thread does all the work); the result does not depend on the thread count. Preconditions
// (checked, abort on violation: callers validate user input first): src has width, height > 0 and
// rgb.size() == width * height * 3; out_h, out_w > 0.
Image resize_bicubic_antialias(const Image& src, int64_t out_h, int64_t out_w,
                               ThreadPool* pool = nullptr);

}  // namespace vlm

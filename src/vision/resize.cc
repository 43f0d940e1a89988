#include "vision/resize.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace vlm {
namespace {

constexpr int kChannels = 3;

// ATen's HelperInterpCubic::aa_filter with a = -0.5 (Keys; Pillow's value). Written exactly as
// ATen's cubic_convolution1/2 so the float64 weights round identically.
double cubic_aa_filter(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0.0;
}

int threads_of(const ThreadPool* pool) { return pool == nullptr ? 1 : pool->n_threads(); }

// Runs fn(begin, end, thread) over [0, n), split across the pool when there is one.
template <typename F>
void for_rows(ThreadPool* pool, int64_t n, int64_t grain, const F& fn) {
  if (threads_of(pool) <= 1) {
    fn(int64_t{0}, n, 0);
    return;
  }
  pool->parallel_for(n, grain, fn);
}

// Rows per parallel chunk: about 64k multiply-adds each, so small images stay on one thread.
int64_t row_grain(int64_t work_per_row) {
  return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, work_per_row));
}

uint8_t clamp_shift(int32_t acc, int precision) {
  // Arithmetic shift (floor for negatives, as ATen's >> and _mm_srai_epi32), then clamp.
  return static_cast<uint8_t>(std::clamp(acc >> precision, 0, 255));
}

// src [rows, in_w, 3] -> dst [rows, out_w, 3] along x.
void horizontal_pass(const uint8_t* src, int64_t rows, const ResampleWeights& rw, uint8_t* dst,
                     ThreadPool* pool) {
  const int64_t in_w = rw.in_size, out_w = rw.out_size;
  const int p = rw.precision;
  const int32_t half = p > 0 ? (int32_t{1} << (p - 1)) : 0;
  const int64_t grain = row_grain(out_w * rw.taps * kChannels);
  for_rows(pool, rows, grain, [&](int64_t y0, int64_t y1, int) {
    for (int64_t y = y0; y < y1; ++y) {
      const uint8_t* in = src + y * in_w * kChannels;
      uint8_t* out = dst + y * out_w * kChannels;
      for (int64_t x = 0; x < out_w; ++x) {
        const int16_t* k = rw.weights.data() + x * rw.taps;
        const uint8_t* s = in + rw.first[x] * kChannels;
        int32_t r = half, g = half, b = half;
        for (int64_t j = 0, n = rw.count[x]; j < n; ++j) {
          const int32_t w = k[j];
          r += s[j * 3 + 0] * w;
          g += s[j * 3 + 1] * w;
          b += s[j * 3 + 2] * w;
        }
        out[x * 3 + 0] = clamp_shift(r, p);
        out[x * 3 + 1] = clamp_shift(g, p);
        out[x * 3 + 2] = clamp_shift(b, p);
      }
    }
  });
}

// src [in_h, row_len] -> dst [out_h, row_len] along y (row_len = width * 3).
void vertical_pass(const uint8_t* src, int64_t row_len, const ResampleWeights& rw, uint8_t* dst,
                   ThreadPool* pool) {
  const int p = rw.precision;
  const int32_t half = p > 0 ? (int32_t{1} << (p - 1)) : 0;
  // Whole rows are accumulated so the inner loop is a contiguous multiply-add that vectorises.
  // One accumulator row per thread, allocated here so that workers never allocate (or throw).
  std::vector<int32_t> acc_rows(static_cast<size_t>(threads_of(pool) * row_len));
  for_rows(pool, rw.out_size, row_grain(row_len * rw.taps), [&](int64_t y0, int64_t y1, int t) {
    int32_t* acc = acc_rows.data() + t * row_len;
    for (int64_t y = y0; y < y1; ++y) {
      std::fill(acc, acc + row_len, half);
      const int16_t* k = rw.weights.data() + y * rw.taps;
      for (int64_t j = 0, n = rw.count[y]; j < n; ++j) {
        const int32_t w = k[j];
        const uint8_t* s = src + (rw.first[y] + j) * row_len;
        for (int64_t i = 0; i < row_len; ++i) acc[i] += s[i] * w;
      }
      uint8_t* out = dst + y * row_len;
      for (int64_t i = 0; i < row_len; ++i) out[i] = clamp_shift(acc[i], p);
    }
  });
}

}  // namespace

ResampleWeights compute_bicubic_aa_weights(int64_t in_size, int64_t out_size) {
  VLM_CHECK(in_size > 0 && out_size > 0, "resize sizes must be positive");
  ResampleWeights rw;
  rw.in_size = in_size;
  rw.out_size = out_size;
  // area_pixel_compute_scale(align_corners=false, no explicit scale): in / out in float64.
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  constexpr double kInterpSize = 4;  // bicubic
  const double support = scale >= 1.0 ? (kInterpSize * 0.5) * scale : kInterpSize * 0.5;
  rw.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;

  std::vector<double> wf(static_cast<size_t>(out_size * rw.taps), 0.0);
  rw.first.resize(static_cast<size_t>(out_size));
  rw.count.resize(static_cast<size_t>(out_size));
  double wt_max = 0.0;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    // Truncating casts as in ATen/Pillow ("round the value" by +0.5 then truncate toward 0).
    const int64_t xmin = std::max(static_cast<int64_t>(center - support + 0.5), int64_t{0});
    int64_t xsize = std::min(static_cast<int64_t>(center + support + 0.5), in_size) - xmin;
    xsize = std::clamp(xsize, int64_t{0}, rw.taps);
    double* w = wf.data() + i * rw.taps;
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      w[j] = cubic_aa_filter((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      total += w[j];
    }
    if (total != 0.0) {
      for (int64_t j = 0; j < xsize; ++j) {
        w[j] /= total;
        wt_max = std::max(wt_max, w[j]);
      }
    }
    rw.first[i] = xmin;
    rw.count[i] = xsize;
  }

  // The most fractional bits that keep the largest weight (times 2) inside int16.
  int precision = 0;
  for (; precision < 22; ++precision) {
    const int next = static_cast<int>(0.5 + wt_max * static_cast<double>(1 << (precision + 1)));
    if (next >= (1 << 15)) break;
  }
  rw.precision = precision;
  rw.weights.resize(wf.size());
  const double one = static_cast<double>(1 << precision);
  for (size_t k = 0; k < wf.size(); ++k) {
    const double v = wf[k] * one;
    rw.weights[k] =
        static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return rw;
}

Image resize_bicubic_antialias(const Image& src, int64_t out_h, int64_t out_w, ThreadPool* pool) {
  VLM_CHECK(src.width > 0 && src.height > 0, "resize of an empty image");
  VLM_CHECK(static_cast<int64_t>(src.rgb.size()) == src.width * src.height * kChannels,
            "image buffer does not match its size");
  VLM_CHECK(out_h > 0 && out_w > 0, "resize target must be positive");

  Image out;
  out.width = out_w;
  out.height = out_h;
  const bool need_h = out_w != src.width;
  const bool need_v = out_h != src.height;
  if (!need_h && !need_v) {
    // torchvision returns the input unchanged when the size already matches.
    out.rgb = src.rgb;
    return out;
  }
  out.rgb.resize(static_cast<size_t>(out_h * out_w * kChannels));

  std::vector<uint8_t> tmp;
  const uint8_t* vsrc = src.rgb.data();
  if (need_h) {
    const ResampleWeights wx = compute_bicubic_aa_weights(src.width, out_w);
    uint8_t* hdst = out.rgb.data();
    if (need_v) {
      tmp.resize(static_cast<size_t>(src.height * out_w * kChannels));
      hdst = tmp.data();
    }
    horizontal_pass(src.rgb.data(), src.height, wx, hdst, pool);
    vsrc = hdst;
  }
  if (need_v) {
    const ResampleWeights wy = compute_bicubic_aa_weights(src.height, out_h);
    vertical_pass(vsrc, out_w * kChannels, wy, out.rgb.data(), pool);
  }
  return out;
}

}  // namespace vlm

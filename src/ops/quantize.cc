// Weight-only INT8 (per output row) and INT4 (per group of 32, 64 or 128 along K, f16 scales)
// quantization, run once at load time.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/half.h"
#include "ops/ops.h"

namespace vlm::ops {
namespace {

// Round half to even for |v| < 2^22 in the default rounding mode: adding 1.5 · 2^23 pushes the
// fraction bits out of the mantissa, and the FPU rounds them to nearest even. Unlike
// std::nearbyint this needs no SSE4.1 (the baseline build has none) and vectorises; quantization of
// a 2B model touches 1.7e9 weights.
inline float round_half_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  return (v + kMagic) - kMagic;
}

// Row n of w widened to f32.
void widen_row(const TensorView& w, int64_t n, float* out) {
  const int64_t K = w.dim(1);
  switch (w.dtype) {
    case DType::kF32:
      std::memcpy(out, static_cast<const float*>(w.data) + n * K, K * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + n * K;
      for (int64_t k = 0; k < K; ++k) out[k] = bf16_to_f32(src[k]);
      return;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(w.data) + n * K;
      for (int64_t k = 0; k < K; ++k) out[k] = f16_to_f32(src[k]);
      return;
    }
    default:
      return;  // rejected by check_quantizable before any row is read
  }
}

// The sign-magnitude bits of f (sign cleared): integer order is float order, and inf / NaN are
// the patterns >= 0x7f800000. (A max over these vectorises; a float max or a std::isfinite test
// does not, and the quantizers see every weight of the model.)
inline uint32_t abs_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b & 0x7fffffffu;
}

// What both quantizers accept: a 2-D F32/BF16/F16 weight. what: "int8" / "int4".
Status check_quantizable(const TensorView& w, const char* what) {
  if (w.rank() != 2) {
    return invalid_argument(std::string(what) + " quantization needs a 2-D weight, got " +
                            shape_to_string(w.shape));
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kF16) {
    return invalid_argument(std::string(what) + " quantization takes F32/BF16/F16 weights, not " +
                            dtype_name(w.dtype));
  }
  return ok_status();
}

Status non_finite_row(const TensorView& w, const char* what, int64_t row) {
  return invalid_argument(std::string(what) + " quantization: row " + std::to_string(row) +
                          " of a " + shape_to_string(w.shape) + " weight has a non-finite value");
}

// NOTE(vlm): the INT4 scale of a group is the one among three candidates whose q gives the
// smallest squared error Σ (w - q·s)²:
//   max|w| / 7                the plain symmetric grid (−8 unused);
//   −w_max / 8, −w_max / 8.5  w_max = the group's largest-|w| weight with its sign, which lands
//                             on q = −8 so all 16 levels are used (ggml's Q4_0 takes −w_max / 8);
//                             8.5 shrinks the step further at the price of clipping the far end.
// rms error / rms weight, groups of 32 (scripts/int4_scale_candidates.py): N(0, 0.02²) rows as
// in the random 2B checkpoint: max|w|/7 9.70%, Q4_0 8.60%, these three 8.27% (−27% squared
// error); Laplace rows 12.1% / 10.7% / 10.3% (−27%); Student-t(3) rows 14.3% / 12.7% / 12.4%
// (−25%). 18 candidates (±7..9 by 0.25) gain only 1–3% more squared error, for 6× the work at
// load. (The script models f32 scales; with the scales rounded to f16, quant_test's logit errors
// moved by under 1%.) A negative scale is fine for the kernels (w = q·s either way).
// s = max|w| / d for d > 0, −w_max / |d| for d < 0; in this order (the first of equal errors wins).
// Each candidate is rounded to f16 (the stored scale) before q is chosen and its error measured:
// the weights are rounded once, to the grid of the scale the kernels will read.
constexpr float kInt4Divisors[] = {7.f, -8.f, -8.5f};
constexpr int kMaxGroup = 128;

// Quantizes one group of `n` (32, 64 or 128) finite values; returns its scale as f16 bits, writes
// q (−8..7). kOverflow when a candidate scale passes f16's range (|w| beyond ~4.6e5).
constexpr uint16_t kOverflow = 0x7c00;  // +inf
uint16_t quantize_group_int4(const float* v, int n, int32_t* q) {
  uint32_t amax_bits = 0, pos_bits = 0;  // max |v|; max over the positive v
  for (int k = 0; k < n; ++k) {
    uint32_t b;
    std::memcpy(&b, &v[k], sizeof(b));
    amax_bits = std::max(amax_bits, b & 0x7fffffffu);
    pos_bits = std::max(pos_bits, b < 0x80000000u ? b : 0u);
  }
  float amax;
  std::memcpy(&amax, &amax_bits, sizeof(amax));
  const float wmax = pos_bits == amax_bits ? amax : -amax;  // positive on a ±tie
  uint16_t best_scale = 0;
  float best_err = INFINITY;
  float best_r[kMaxGroup] = {};
  for (float d : kInt4Divisors) {
    const uint16_t h = f32_to_f16(d > 0 ? amax / d : -wmax / -d);
    if ((h & 0x7fffu) >= 0x7c00u) return kOverflow;
    const float s = f16_to_f32(h);
    // s == 0: a zero group (or dust that rounds to a zero f16 scale): q = 0 with scale 0, as
    // INT8 does.
    if (s == 0.f) continue;
    float r[kMaxGroup], e[kMaxGroup];
    for (int k = 0; k < n; ++k) {
      r[k] = std::clamp(round_half_even(v[k] / s), -8.f, 7.f);
      const float diff = v[k] - r[k] * s;
      e[k] = diff * diff;
    }
    for (int half = n / 2; half >= 1; half /= 2) {  // a fixed pairwise order, vectorisable
      for (int k = 0; k < half; ++k) e[k] += e[k + half];
    }
    if (e[0] < best_err) {  // strict: the first of equal candidates wins
      best_err = e[0];
      best_scale = h;
      std::memcpy(best_r, r, sizeof(float) * n);
    }
  }
  for (int k = 0; k < n; ++k) q[k] = static_cast<int32_t>(best_r[k]);
  return best_scale;
}

}  // namespace

Status quantize_int8(const TensorView& w, int8_t* q, float* scale, ThreadPool& pool) {
  VLM_RETURN_IF_ERROR(check_quantizable(w, "int8"));
  const int64_t N = w.dim(0), K = w.dim(1);
  std::atomic<int64_t> bad_row{-1};
  pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1, int) {
    std::vector<float> row(static_cast<size_t>(K));  // load time: one buffer per chunk is fine
    for (int64_t n = n0; n < n1; ++n) {
      widen_row(w, n, row.data());
      // max |w| on the bit patterns (abs_bits), which also finds inf / NaN.
      uint32_t amax_bits = 0;
      for (int64_t k = 0; k < K; ++k) amax_bits = std::max(amax_bits, abs_bits(row[k]));
      float amax;
      std::memcpy(&amax, &amax_bits, sizeof(amax));
      int8_t* qr = q + n * K;
      if (amax_bits >= 0x7f800000u) {
        bad_row.store(n);
        scale[n] = 0.f;
        std::memset(qr, 0, static_cast<size_t>(K));
        continue;
      }
      const float s = amax / 127.f;
      // amax ≤ 127 · 2^-149 gives s == 0 (a zero row, or subnormal dust): all q are 0.
      scale[n] = s;
      if (s == 0.f) {
        std::memset(qr, 0, static_cast<size_t>(K));
        continue;
      }
      // Locals, not captures or vector members: an int8 store may alias any memory, so the
      // compiler would otherwise reload them every iteration and not vectorise.
      const int64_t cols = K;
      const float* src = row.data();
      for (int64_t k = 0; k < cols; ++k) {
        // |src[k] / s| ≤ 127 up to rounding of s (more only when s is subnormal): the clamp keeps
        // it in [-127, 127], so -128 never appears and the grid is symmetric.
        const float r = std::clamp(round_half_even(src[k] / s), -127.f, 127.f);
        qr[k] = static_cast<int8_t>(static_cast<int32_t>(r));
      }
    }
  });
  if (bad_row.load() >= 0) return non_finite_row(w, "int8", bad_row.load());
  return ok_status();
}

Status quantize_int4(const TensorView& w, int64_t group, uint8_t* q, uint16_t* scale,
                     ThreadPool& pool) {
  VLM_RETURN_IF_ERROR(check_quantizable(w, "int4"));
  if (!int4_group_ok(group)) {
    return invalid_argument("int4 group size must be 32, 64 or 128, got " + std::to_string(group));
  }
  const int64_t N = w.dim(0), K = w.dim(1);
  if (K % group != 0) {
    return invalid_argument("int4 quantization needs the input dimension to be a multiple of " +
                            std::to_string(group) + " (the group size), got a " +
                            shape_to_string(w.shape) + " weight");
  }
  const int64_t groups = K / group;
  std::atomic<int64_t> bad_row{-1}, overflow_row{-1};
  pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1, int) {
    std::vector<float> row(static_cast<size_t>(K));  // load time: one buffer per chunk is fine
    for (int64_t n = n0; n < n1; ++n) {
      widen_row(w, n, row.data());
      uint8_t* qr = q + n * (K / 2);
      uint16_t* sr = scale + n * groups;
      // Non-finite check first on the bit patterns, as quantize_int8 does.
      uint32_t amax_bits = 0;
      for (int64_t k = 0; k < K; ++k) amax_bits = std::max(amax_bits, abs_bits(row[k]));
      if (amax_bits >= 0x7f800000u) bad_row.store(n);
      for (int64_t g = 0; g < groups && amax_bits < 0x7f800000u; ++g) {
        int32_t qg[kMaxGroup];
        sr[g] = quantize_group_int4(row.data() + g * group, static_cast<int>(group), qg);
        if (sr[g] == kOverflow) {
          overflow_row.store(n);
          break;
        }
        // Block b of the group (32 values, 16 bytes): byte j holds element j in the low nibble and
        // element j + 16 in the high one.
        for (int64_t b = 0; b < group / kInt4Block; ++b) {
          uint8_t* dst = qr + (g * group + b * kInt4Block) / 2;
          const int32_t* src = qg + b * kInt4Block;
          for (int64_t j = 0; j < kInt4Block / 2; ++j) {
            dst[j] = static_cast<uint8_t>((src[j] & 0xf) | ((src[j + kInt4Block / 2] & 0xf) << 4));
          }
        }
      }
    }
  });
  if (bad_row.load() >= 0) return non_finite_row(w, "int4", bad_row.load());
  if (overflow_row.load() >= 0) {
    return invalid_argument("int4 quantization: row " + std::to_string(overflow_row.load()) +
                            " of a " + shape_to_string(w.shape) +
                            " weight has a group whose scale is beyond f16's range (|w| > 4e5)");
  }
  return ok_status();
}

}  // namespace vlm::ops

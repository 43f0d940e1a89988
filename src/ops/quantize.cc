// Weight-only INT8 quantization (per output row), run once at load time.
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
      return;  // rejected by quantize_int8 before any row is read
  }
}

}  // namespace

Status quantize_int8(const TensorView& w, int8_t* q, float* scale, ThreadPool& pool) {
  if (w.rank() != 2) {
    return invalid_argument("int8 quantization needs a 2-D weight, got " +
                            shape_to_string(w.shape));
  }
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kF16) {
    return invalid_argument(std::string("int8 quantization takes F32/BF16/F16 weights, not ") +
                            dtype_name(w.dtype));
  }
  const int64_t N = w.dim(0), K = w.dim(1);
  std::atomic<int64_t> bad_row{-1};
  pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1, int) {
    std::vector<float> row(static_cast<size_t>(K));  // load time: one buffer per chunk is fine
    for (int64_t n = n0; n < n1; ++n) {
      widen_row(w, n, row.data());
      // max |w| on the bit patterns: with the sign cleared, integer order is float order, and
      // inf / NaN are the patterns >= 0x7f800000. (An integer max vectorises; a float max or a
      // std::isfinite test does not, and this loop sees every weight of the model.)
      uint32_t amax_bits = 0;
      for (int64_t k = 0; k < K; ++k) {
        uint32_t b;
        std::memcpy(&b, &row[k], sizeof(b));
        amax_bits = std::max(amax_bits, b & 0x7fffffffu);
      }
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
  if (bad_row.load() >= 0) {
    return invalid_argument("int8 quantization: row " + std::to_string(bad_row.load()) + " of a " +
                            shape_to_string(w.shape) + " weight has a non-finite value");
  }
  return ok_status();
}

}  // namespace vlm::ops

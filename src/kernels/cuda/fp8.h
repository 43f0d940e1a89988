#pragma once
// FP8 (E4M3) products on Hopper's tensor cores (--quant fp8): weights and activations
// in E4M3 with one f32 scale per tensor (value = e4m3 · scale, scale = max|x| / 448), f32
// accumulation, BF16 out, through cuBLASLt. The weights are quantized once at load, on the
// device; each product's activations are quantized on the fly (max, then convert; no host
// round trip, so it runs inside a CUDA graph).
#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "vlm/status.h"

namespace vlm::cuda {

// out[count] = e4m3(x / s) (round to nearest even, saturating), *scale = s = max|x| / 448 (1 when
// x is all zeros). x in x_t; scale a device float; amax a device float of scratch.
Status quantize_fp8(const void* x, DType x_t, int64_t count, float* amax, float* scale, void* out);

}  // namespace vlm::cuda

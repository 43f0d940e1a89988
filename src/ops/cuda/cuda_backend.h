// The CUDA backend: ops::Backend over the kernels of kernels/cuda and cuBLASLt, on the first
// NVIDIA GPU, on a stream of its own. Activations BF16 (or F32), every sum f32; weights uploaded
// once (q|k|v and gate|up as the model stacks them: one product each), INT8 with per-row scales
// as quantized on the host, or FP8 (E4M3, one scale per stack) for the decoder layers under
// --quant fp8. Built only where nvcc is.
#pragma once

#include <cstdint>
#include <memory>

#include "ops/backend.h"
#include "vlm/status.h"

namespace vlm::ops {

struct CudaBackendOptions {
  bool f32 = false;          // F32 activations and weights (to compare against float32 references)
  bool fp8 = false;          // the decoder layers' products in FP8 (BF16 activations only)
  int64_t max_tokens = 256;  // rows one product may have (sizes the FP8 activation scratch)
};

// No GPU: an error naming the cause.
Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& opts);

}  // namespace vlm::ops

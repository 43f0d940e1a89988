#pragma once
// Checkpoint tensors onto the device: the bytes as the CUDA backend keeps them, BF16 or
// F32, converted on the host from the stored F32, BF16 or F16 (BF16 rounding to nearest even, as
// torch casts). Uploaded once at load.
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/cuda/cuda_ops.h"
#include "vlm/status.h"

namespace vlm::cuda {

// w's values in `target` layout, row-major as stored. Other stored types (quantized, integer)
// are an error naming the type.
Status device_bytes(const TensorView& w, DType target, std::vector<uint8_t>* out);
// device_bytes, then one allocation and copy.
Status upload_tensor(const TensorView& w, DType target, DeviceBuffer* out);
// Several [N_i, K] weights stacked along their rows into one [Σ N_i, K] (one product computes all
// their outputs side by side: q|k|v, gate|up). They must share K.
Status upload_stacked(const std::vector<const TensorView*>& ws, DType target, DeviceBuffer* out);

}  // namespace vlm::cuda

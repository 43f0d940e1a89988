#pragma once
// The Qwen3-VL vision tower on an NVIDIA GPU: VisionEncoder::encode's steps with the
// weights uploaded once, activations in BF16 (or F32) with f32 sums, and the merger outputs
// returned in f32 for the decoder. The position-embedding interpolation and the rotary tables are
// built on the host by the CPU encoder and uploaded.
#include <memory>

#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "model/vision_encoder.h"
#include "vlm/status.h"

namespace vlm::cuda {

// host: the CPU encoder of the same weights (its host-side tables), which must outlive the result.
// f32: F32 weights and activations instead of BF16.
Result<std::unique_ptr<DeviceVisionEncoder>> make_cuda_vision_encoder(const Qwen3VLConfig& cfg,
                                                                      const VisionWeights& w,
                                                                      const VisionEncoder& host,
                                                                      bool f32);

}  // namespace vlm::cuda

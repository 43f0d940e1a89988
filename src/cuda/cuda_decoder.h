#pragma once
// The Qwen3-VL text decoder on an NVIDIA GPU: TextDecoder's forward pass with the
// weights uploaded once, activations in BF16 (or F32) with f32 sums, and a paged KV cache in
// device memory, behind the engine's DeviceDecoder interface.
#include <memory>

#include "model/device_decoder.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "vlm/status.h"

namespace vlm::cuda {

struct CudaDecoderOptions {
  int64_t max_chunk = 256;  // tokens per forward_batch call
  // false: weights and activations in BF16 (as transformers runs the model in bfloat16); true:
  // F32 throughout (to compare against transformers' float32 logits).
  bool f32 = false;
  // Decode steps (one token per sequence) run as CUDA graphs, one per batch-size bucket and
  // block-table width.
  bool graphs = true;
  // The layers' products in FP8 (E4M3, one scale per weight and per activation tensor); BF16
  // activations only.
  bool fp8 = false;
};

// Uploads `w` (F32, BF16 or F16 as stored; quantized weights are refused) onto the current
// device. No GPU: an error naming the cause. The KV cache is allocated by allocate_cache().
Result<std::unique_ptr<DeviceDecoder>> make_cuda_decoder(const Qwen3VLConfig& cfg,
                                                         const TextWeights& w,
                                                         const CudaDecoderOptions& opts);

}  // namespace vlm::cuda

// A text decoder on an accelerator (the CUDA backend, src/cuda): the forward pass of TextDecoder
// over a paged KV cache in the device's memory, which the decoder owns. The engine drives it
// through this interface, so the layers below the CUDA backend never need CUDA.
#pragma once

#include <cstdint>
#include <string>

#include "model/text_decoder.h"
#include "vlm/status.h"

namespace vlm {

class DeviceDecoder {
 public:
  virtual ~DeviceDecoder() = default;

  // Tokens one forward_batch call may carry (its scratch).
  virtual int64_t max_chunk() const = 0;
  // Bytes one KV block of block_size positions takes: every layer, K and V.
  virtual int64_t block_bytes(int64_t block_size) const = 0;
  // Bytes the KV cache may take so that the process uses at most `utilization` of the device's
  // memory, counting what is allocated now (weights, scratch, a previous cache being replaced).
  virtual int64_t cache_budget_bytes(double utilization) const = 0;
  // (Re)allocates the KV cache: num_blocks blocks of block_size positions, for block tables of
  // at most max_blocks_per_seq entries. The old one is freed first, so its contents are gone.
  virtual Status allocate_cache(int64_t num_blocks, int64_t block_size,
                                int64_t max_blocks_per_seq) = 0;
  virtual int64_t cache_blocks() const = 0;
  virtual int64_t cache_block_size() const = 0;

  // TextDecoder::forward_batch over this decoder's cache: logits (f32, host memory) in chunk
  // order, 1 row for kLast, n rows for kAll. With `argmax` (one id per logit row, the same order)
  // every logit row's argmax (the first largest) is returned too, or for chunks with `sample` the
  // token drawn; the rows of argmax_only and sample chunks are not copied into `logits` (their
  // place there is left as it was).
  virtual Status forward_batch(const SeqChunk* chunks, int64_t n_chunks, float* logits,
                               int32_t* argmax = nullptr) = 0;

  // "NVIDIA H200 (sm_90, 139.8 GiB), bf16"
  virtual std::string description() const = 0;
  // Bytes of the linear weights a decode step reads (q/k/v/o, gate/up/down, lm_head).
  virtual int64_t decode_weight_bytes() const = 0;
  // Forward passes replayed from captured CUDA graphs so far.
  virtual int64_t graph_replays() const = 0;
};

}  // namespace vlm

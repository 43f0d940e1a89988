#pragma once
// The CUDA backend's small ops (issue 7), first part: device memory, and the element-wise and
// per-row ops of the decoder (RMSNorm, residual add + RMSNorm, q/k norm + rotary, SwiGLU,
// DeepStack row adds, embedding gather).
// Pointers are device pointers; activations are F32 or BF16 (DType), every sum is f32, and the
// results are rounded once to the activation type. The CPU reference is src/ops/ref.
//
// Built only when CMake finds nvcc (VLM_HAVE_CUDA); nothing here needs a GPU to compile, and
// device_count() answers 0 where there is none (no driver, no device), so tests skip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "vlm/status.h"

namespace vlm::cuda {

// Devices the runtime sees; 0 where there is no driver or no device (never an error).
int device_count();
// "NVIDIA H200 (sm_90, 139.8 GiB)" for device `index`.
std::string device_description(int index);

// A device allocation, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Status allocate(size_t bytes, DeviceBuffer* out);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  Status upload(const void* host, size_t bytes);          // synchronous, from offset 0
  Status download(void* host, size_t bytes) const;        // synchronous, from offset 0

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

enum class DType { kF32, kBF16 };

// All ops run on the default stream and return the launch's error, if any; call synchronize()
// to see errors of the work itself.
Status synchronize();

// y[r] = x[r] * rsqrt(mean(x[r]²) + eps) * w, rows of n values; w is f32[n]. y may alias x.
Status rms_norm(const void* x, const float* w, int64_t rows, int64_t n, float eps, void* y, DType t);
// x[r] += delta[r] (rounded to the activation type, as the CPU path stores the residual), then
// y[r] = rms_norm(x[r]).
Status add_rms_norm(void* x, const void* delta, const float* w, int64_t rows, int64_t n, float eps,
                    void* y, DType t);
// out = silu(gate) * up, element-wise over count values.
Status silu_mul(const void* gate, const void* up, int64_t count, void* out, DType t);
// Qwen3's per-head q/k RMSNorm (weight w f32[head_dim]) then NeoX rotary, in place over x
// [tokens, n_heads, head_dim]; cos, sin f32 [tokens, head_dim / 2] (the M-RoPE angles, as the CPU
// path builds them). One warp per head; the normalised values stay f32 until the rotation.
Status qk_norm_rope(void* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                    float eps, const float* cos, const float* sin, DType t);
// x[rows[i]] += delta[i] for i < count (rows of n values): DeepStack's adds of the vision
// features at the image positions. The rows must be distinct and in range (checked on the host).
Status add_rows_at(void* x, const int32_t* rows, const void* delta, int64_t count, int64_t n,
                   DType t);
// Attention with an online softmax (f32 scores, sums and output accumulators), one warp per
// (query, head); GQA maps head h to KV head h / (n_heads / n_kv_heads). q, out [n_q, n_heads,
// head_dim]; k, v [n_kv, n_kv_heads, head_dim] (head_dim a multiple of 32, at most 256).
// causal: query i sees keys 0 .. first_pos + i (the KV cache of one sequence, contiguous);
// otherwise every query sees all n_kv keys (the vision encoder's bidirectional attention).
// The first, plain version: the flash-style tiled prefill and split-K paged decode come next.
Status attention(const void* q, int64_t n_q, const void* k, const void* v, int64_t n_kv,
                 int64_t first_pos, bool causal, int64_t n_heads, int64_t n_kv_heads,
                 int64_t head_dim, float scale, void* out, DType t);
// Greedy sampling on the device: ids[r] = the index of row r's largest logit (the lowest index
// among equal ones, as std::max_element; NaN never wins). logits f32 [rows, n].
Status argmax_rows(const float* logits, int64_t rows, int64_t n, int32_t* ids);
// out[i] = table[ids[i]] (rows of n values; the table in table_t, out in out_t). ids must be in
// range: the caller checks them on the host.
Status embedding_gather(const void* table, DType table_t, const int32_t* ids, int64_t count,
                        int64_t n, void* out, DType out_t);

}  // namespace vlm::cuda

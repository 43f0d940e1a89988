#pragma once
// The CUDA backend's ops other than the matrix products (gemm.h): device memory, the
// element-wise and per-row ops of the decoder and the vision tower, attention over contiguous or
// paged K/V, and greedy sampling.
// Pointers are device pointers; activations are F32 or BF16 (DType), every sum is f32, and the
// results are rounded once to the activation type. The CPU reference is src/ops/ref.
//
// Built only when CMake finds nvcc (VLM_HAVE_CUDA); nothing here needs a GPU to compile, and
// device_count() answers 0 where there is none (no driver, no device), so tests skip.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "vlm/status.h"

namespace vlm::cuda {

// Devices the runtime sees; 0 where there is no driver or no device (never an error).
int device_count();
// "NVIDIA <name> (sm_<cc>, <memory> GiB)" for device `index`.
std::string device_description(int index);

// Free and total bytes of the current device's memory.
Status memory_info(int64_t* free_bytes, int64_t* total_bytes);

// A device allocation, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Status allocate(size_t bytes, DeviceBuffer* out);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {  // the allocation as T*
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }
  // Grows the allocation (contents lost) when it is smaller than `bytes`; never shrinks it.
  Status reserve(size_t bytes);
  Status upload(const void* host, size_t bytes);    // synchronous, from offset 0
  Status download(void* host, size_t bytes) const;  // synchronous, from offset 0
  // Allocates v.size() floats and copies v there.
  static Status upload_f32(const std::vector<float>& v, DeviceBuffer* out);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Synchronous copy of `bytes` from device memory at `device` to host memory.
Status copy_to_host(void* host, const void* device, size_t bytes);
// Synchronous copy of `bytes` from host memory to device memory at `device`.
Status copy_to_device(void* device, const void* host, size_t bytes);

enum class DType { kF32, kBF16 };

// Every op launches on the calling thread's current stream (set_stream; null, the default: the
// legacy default stream) and returns the launch's error, if any; call synchronize() to see errors
// of the work itself. DeviceBuffer's copies are synchronous on the legacy stream, which waits for
// (and is waited for by) blocking streams.
void set_stream(void* stream);  // a cudaStream_t
void* current_stream();
Status synchronize();  // the whole device

// y[r] = x[r] * rsqrt(mean(x[r]²) + eps) * w, rows of n values; w is f32[n]. y may alias x.
Status rms_norm(const void* x, const float* w, int64_t rows, int64_t n, float eps, void* y,
                DType t);
// x[r] += delta[r] (rounded to the activation type, as the CPU path stores the residual), then
// y[r] = rms_norm(x[r]).
Status add_rms_norm(void* x, const void* delta, const float* w, int64_t rows, int64_t n, float eps,
                    void* y, DType t);
// Qwen3's per-head q/k RMSNorm (weight w f32[head_dim]; w null: no norm, only the rotary, as the
// vision tower's) then NeoX rotary, in place over x [tokens, n_heads, head_dim]; cos, sin f32
// [tokens, head_dim / 2] (the M-RoPE angles, as the CPU path builds them). One warp per head;
// the normalised values stay f32 until the rotation.
Status qk_norm_rope(void* x, int64_t tokens, int64_t n_heads, int64_t head_dim, const float* w,
                    float eps, const float* cos, const float* sin, DType t);
// The attention input of a decoder layer from one fused q|k|v product, in one pass: qkv [tokens,
// (n_heads + 2·n_kv_heads)·head_dim] row-major (q heads, then k heads, then v heads). q heads get
// q_norm + rotary into q [tokens, n_heads, head_dim]; k heads k_norm + rotary, and v heads as
// they are, into the paged caches at slots[i] (rows of n_kv_heads·head_dim). One warp per
// (token, head), as qk_norm_rope.
Status qkv_rope_store(const void* qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                      int64_t head_dim, const float* q_norm, const float* k_norm, float eps,
                      const float* cos, const float* sin, const int32_t* slots, void* q,
                      void* k_cache, void* v_cache, DType t);
// SwiGLU from one fused gate|up product: gu [rows, 2·n] (gate then up per row);
// out [rows, n] = silu(gate) · up.
Status silu_mul_rows(const void* gu, int64_t rows, int64_t n, void* out, DType t);
// x[rows[i]] += delta[i] for i < count (rows of n values; delta in delta_t): DeepStack's adds of
// the vision features at the image positions. The rows must be distinct and in range (checked on
// the host).
Status add_rows_at(void* x, const int32_t* rows, const void* delta, DType delta_t, int64_t count,
                   int64_t n, DType t);
// x[rows[i]] = src[i] (rows of n values; src in src_t): the merger's features replace the image
// pads' embeddings.
Status set_rows_at(void* x, const int32_t* rows, const void* src, DType src_t, int64_t count,
                   int64_t n, DType t);
// x += delta, element-wise over count values (delta in delta_t): a residual add no norm follows.
Status add_inplace(void* x, const void* delta, DType delta_t, int64_t count, DType t);
// The processor's normalise + patchify on the device: rgb [h, w, 3] bytes (h = grid_h·P,
// w = grid_w·P) into out [grid_h·grid_w, 3·T·P·P] rows in merge order (preprocess.h's layout),
// value lut[c·256 + byte], each patch repeated over the T temporal slots.
Status patchify_rgb(const uint8_t* rgb, const float* lut, int64_t grid_h, int64_t grid_w,
                    int64_t patch, int64_t merge, int64_t temporal, void* out, DType t);
// dst = src element-wise, from src_t to dst_t (rounded once).
Status convert(const void* src, DType src_t, int64_t count, void* dst, DType dst_t);
// x[r] += bias (f32 [n]) for every row r of `rows`.
Status add_bias(void* x, const float* bias, int64_t rows, int64_t n, DType t);
// LayerNorm per row of n values: y = (x − mean) · rsqrt(var + eps) · w + b (w, b f32 [n]; the
// biased variance, as torch). y may alias x.
Status layer_norm(const void* x, const float* w, const float* b, int64_t rows, int64_t n, float eps,
                  void* y, DType t);
// Per row: x += delta + bias (bias f32 [n], may be null; x stored rounded), then, when y is not
// null, y = layer_norm(x) with w, b (the vision blocks' residual add fused into the next norm).
Status add_layer_norm(void* x, const void* delta, const float* bias, const float* w, const float* b,
                      int64_t rows, int64_t n, float eps, void* y, DType t);
// In place: x = gelu(x + bias) per row (bias f32 [n], may be null); tanh: gelu_pytorch_tanh,
// else nn.GELU()'s exact erf form.
Status bias_gelu(void* x, const float* bias, int64_t rows, int64_t n, bool tanh, DType t);
// Bidirectional attention within n rows (one image frame: every query sees every key) with an
// online softmax (f32 scores, sums and output accumulators), one warp per (query, head); GQA maps
// head h to KV head h / (n_heads / n_kv_heads). q, out [n, n_heads, head_dim]; k, v [n,
// n_kv_heads, head_dim] (head_dim at most 256). The vision tower's attention where flash
// attention does not apply (F32).
Status attention_full(const void* q, const void* k, const void* v, int64_t n, int64_t n_heads,
                      int64_t n_kv_heads, int64_t head_dim, float scale, void* out, DType t);
// Causal GQA attention of a varlen batch against the paged KV cache (after qkv_rope_store put
// the batch's own K/V in their slots): query token i (of `tokens`, in sequence tok_seq[i], at
// position tok_pos[i]) sees that sequence's keys 0 .. tok_pos[i], found through its block
// table (row tok_seq[i] of block_tables, table_stride entries apart). q, out [tokens, n_heads,
// head_dim]; caches [blocks · block_size, n_kv_heads · head_dim]. Online softmax in f32, one warp
// per (query, GQA head group, split), each K/V row read once for the group: when few warps are
// there to fill the GPU (decode) and the context is long, the keys are split into
// attention_splits() parts whose partial results (m, l, acc) go to `partial` and are merged by a
// second kernel (flash-decoding). max_seen: the largest tok_pos + 1, or any bound on it (it sets
// the number of splits; each query splits its own keys). partial: f32, at least
// paged_attention_scratch_floats(head_dim) values.
Status paged_attention(const void* q, int64_t tokens, const int32_t* tok_seq,
                       const int32_t* tok_pos, const int32_t* block_tables, int64_t table_stride,
                       int64_t block_size, const void* k_cache, const void* v_cache,
                       int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                       int64_t max_seen, float* partial, void* out, DType t);
// How many parts paged_attention splits each query's keys into, for `units` warps before the
// split (queries × KV-head groups) and contexts up to max_seen: 1 when the warps already fill the
// GPU or the context is short (≤ 512), else enough parts of ≥ 256 keys to bring the warps to about
// 1024, at most 32.
int64_t attention_splits(int64_t units, int64_t max_seen);
// The f32 scratch paged_attention may use for head_dim, whatever the batch.
int64_t paged_attention_scratch_floats(int64_t head_dim);
// Greedy sampling on the device: ids[r] = the index of row r's largest logit (the lowest index
// among equal ones, as std::max_element; NaN never wins). logits f32 [rows, n].
Status argmax_rows(const float* logits, int64_t rows, int64_t n, int32_t* ids);
// out[i] = table[ids[i]] (rows of n values; the table in table_t, out in out_t). ids must be in
// range: the caller checks them on the host.
Status embedding_gather(const void* table, DType table_t, const int32_t* ids, int64_t count,
                        int64_t n, void* out, DType out_t);

}  // namespace vlm::cuda

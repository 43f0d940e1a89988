// The CPU backend: ops.h over the per-ISA kernels of kernels/cpu, f32 activations, the weights
// as the checkpoint (or the quantizer, or the huge-page copy) holds them — nothing is copied.
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "ops/backend.h"
#include "ops/ops.h"

namespace vlm::ops {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool& pool, Isa isa = detected_isa(),
                      Bf16Gemm bf16_gemm = Bf16Gemm::kWidenF32)
      : pool_(pool), isa_(isa), bf16_gemm_(bf16_gemm) {}

  // The ISA level of every op from now on (tests force lower levels).
  void set_isa(Isa isa) { isa_ = isa; }
  Isa isa() const { return isa_; }
  // How the GEMMs of BF16 weights multiply (prefill, the vision tower).
  Bf16Gemm bf16_gemm() const { return bf16_gemm_; }
  // The decode kernels of every linear layer from now on (ops.h: DecodeKernels).
  void set_decode_kernels(const DecodeKernels& k) { decode_ = k; }
  const DecodeKernels& decode_kernels() const { return decode_; }
  ThreadPool& pool() const { return pool_; }

  Device device() const override { return Device::kCpu; }
  DType act_dtype() const override { return DType::kF32; }
  std::string description() const override { return "cpu"; }

  Result<Buffer> alloc(int64_t elems, DType t, bool lazy) override;
  Result<Buffer> alloc_host(size_t bytes) override;
  Status to_device(Buf dst, const void* host, size_t bytes) override;
  Status to_host(void* host, Buf src, size_t bytes) override;
  Result<Buf> stage(const void* host, size_t bytes, DType t, Buffer* scratch) override;
  Status synchronize() override { return ok_status(); }

  Result<std::unique_ptr<Linear>> linear(std::span<const TensorView* const> stack,
                                         const LinearOptions& opts) override;
  Result<Buf> vector(const std::vector<float>& v) override;

  Status embed(const Linear& table, Buf ids, int64_t count, Buf out) override;
  Status rms_norm(Buf x, Buf w, int64_t rows, int64_t n, float eps, Buf y) override;
  Status add_rms_norm(Buf x, Buf delta, Buf w, int64_t rows, int64_t n, float eps, Buf y) override;
  Status add(Buf x, Buf delta, Buf bias, int64_t rows, int64_t n) override;
  Status linear(Buf x, int64_t M, const Linear& w, Buf y) override;
  Status qkv_rope_store(Buf qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                        int64_t head_dim, Buf q_norm, Buf k_norm, float eps, Buf cos, Buf sin,
                        Buf slots, Buf q, const KvLayer& cache) override;
  bool supports_kv_dtype(DType t) const override { return kv_type_supported(t); }
  Status paged_attention(Buf q, const AttentionBatch& b, const KvLayer& cache, int64_t n_heads,
                         int64_t n_kv_heads, int64_t head_dim, float scale, Buf out) override;
  Status silu_mul(Buf gu, int64_t rows, int64_t n, Buf out) override;
  bool supports_hybrid() const override { return true; }
  Status qkv_gated_rope_store(Buf qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                              int64_t head_dim, int64_t rotary_dim, Buf q_norm, Buf k_norm,
                              float eps, Buf cos, Buf sin, Buf slots, Buf q, Buf gate,
                              const KvLayer& cache) override;
  Status sigmoid_mul(Buf x, Buf g, int64_t rows, int64_t n) override;
  Status copy(Buf dst, Buf src, size_t bytes) override;
  Status gated_delta_net(Buf proj, const AttentionBatch& b, const DeltaNetLayer& layer, Buf states,
                         Buf mixed, Buf out) override;
  Status gated_rms_norm(Buf x, Buf z, int64_t z_stride, int64_t rows, int64_t heads, int64_t n,
                        Buf w, float eps, Buf y) override;
  Status set_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) override;
  Status add_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) override;
  Status gather_rows(Buf x, Buf rows, int64_t count, int64_t n, Buf out) override;

  bool supports_moe() const override { return true; }
  Status add_sigmoid_scaled(Buf x, Buf y, Buf g, int64_t rows, int64_t n) override;
  Status moe_route(Buf logits, int64_t rows, int64_t n_experts, int64_t top_k, bool renormalize,
                   Buf ids, Buf weights) override;
  Status moe_experts(Buf x, int64_t rows, Buf ids, Buf weights, int64_t top_k,
                     std::span<const Linear* const> gate_up, std::span<const Linear* const> down,
                     Buf scratch, Buf out) override;

  Status layer_norm(Buf x, Buf w, Buf b, int64_t rows, int64_t n, float eps, Buf y) override;
  Status add_layer_norm(Buf x, Buf delta, Buf bias, Buf w, Buf b, int64_t rows, int64_t n,
                        float eps, Buf y) override;
  Status bias_gelu(Buf x, Buf bias, int64_t rows, int64_t n, bool tanh) override;
  Status add_bias(Buf x, Buf bias, int64_t rows, int64_t n) override;
  Status split_qkv(Buf qkv, Buf bias, int64_t rows, int64_t n, Buf q, Buf k, Buf v) override;
  Status rope(Buf x, int64_t tokens, int64_t n_heads, int64_t head_dim, Buf cos, Buf sin) override;
  Status attention_full(Buf q, Buf k, Buf v, int64_t n, int64_t n_heads, int64_t head_dim,
                        float scale, Buf out) override;
  // 96 rows: a multiple of the attention's query block (48) and of the GEMM's row tiles, and at
  // least kPackedMinRows, so a part runs the same kernels on the same tiles as the whole.
  static constexpr int64_t kRowSliceGrain = 96;
  int64_t row_slice_grain() const override { return kRowSliceGrain; }
  Status attention_full_rows(Buf q, Buf k, Buf v, int64_t n, int64_t q0, int64_t q1,
                             int64_t n_heads, int64_t head_dim, float scale, Buf out) override;
  Status convert(Buf src, int64_t count, Buf dst) override;
  bool has_fp16_arithmetic() const override { return ops::has_fp16_arithmetic(isa_); }

 private:
  ThreadPool& pool_;
  Isa isa_;
  Bf16Gemm bf16_gemm_;
  DecodeKernels decode_;
  // moe_experts' grouping of the (row, weight) pairs by expert; grown, never shrunk.
  std::vector<int64_t> moe_start_;
  std::vector<int32_t> moe_rows_;
  std::vector<DeltaNetSeq> delta_seqs_;  // gated_delta_net's sequences
  std::vector<float> moe_weights_;
  // linear's x in an activation-ordered weight's column order (the backend is not re-entrant: the
  // engine core's thread runs every op, as moe_rows_ assumes too).
  std::vector<float> perm_x_;
};

}  // namespace vlm::ops

// The backend interface: the memory, the weights and exactly the operations the model (src/model)
// calls, so that the text decoder and the vision tower are written once. Two implementations:
// CpuBackend (cpu_backend.h: ops.h over kernels/cpu, the ISA picked at run time) and CudaBackend
// (cuda_backend.h: kernels/cuda, built where nvcc is).
//
// Every op runs in the order it was called (on CUDA: enqueued on the backend's stream; on the CPU:
// at once, on the calling thread and the pool). Activations are act_dtype() (f32 on the CPU, BF16
// or F32 on CUDA); weights of norms and biases, image features and logits are f32; sums are f32.
// The model hands a backend flat arrays only (token ids, KV slots, block-table rows, image rows):
// building them from requests and block tables is the model's and the engine's work, never a
// backend's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "vlm/status.h"

namespace vlm::ops {

enum class Device { kCpu, kCuda };
const char* device_name(Device d);  // "cpu", "cuda"

// A view of memory on one device: the pointer, the device it is on and the element type.
struct Buf {
  void* data = nullptr;
  Device device = Device::kCpu;
  DType dtype = DType::kF32;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // The view `elems` elements further on.
  Buf at(int64_t elems) const {
    Buf b = *this;
    b.data = static_cast<char*>(data) + static_cast<int64_t>(dtype_size(dtype)) * elems;
    return b;
  }
  explicit operator bool() const { return data != nullptr; }
};

// One decoder layer's K and V cache: [rows, n_kv_heads · head_dim] each in k.dtype (the KV cache
// type: the activation type, or on the CPU BF16 or INT8), and for INT8 one f32 scale per row and
// KV head in k_scale / v_scale ([rows, n_kv_heads]).
struct KvLayer {
  Buf k, v, k_scale, v_scale;
};

// Memory a backend allocated, freed when the last copy of this goes.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buf view, size_t bytes, std::shared_ptr<void> owner)
      : view_(view), bytes_(bytes), owner_(std::move(owner)) {}
  const Buf& buf() const { return view_; }
  Buf at(int64_t elems) const { return view_.at(elems); }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return view_.as<T>();
  }

 private:
  Buf view_;
  size_t bytes_ = 0;
  std::shared_ptr<void> owner_;
};

// A linear layer's weight [rows, cols] as a backend keeps it: one checkpoint weight, or several
// [N_i, cols] stacked by rows (q|k|v, gate|up) so that one product writes all their outputs side
// by side. Also the embedding table (whose rows embed() gathers, and which a tied head multiplies).
class Linear {
 public:
  virtual ~Linear() = default;
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Bytes one product reads: the weights and their scales.
  virtual int64_t bytes() const = 0;

 protected:
  int64_t rows_ = 0, cols_ = 0;
};

enum class Bf16Gemm;  // ops.h: how the CPU multiplies BF16 weights

struct LinearOptions {
  // The vision tower's products: FP16 arithmetic where the CPU has it (--vision-fp16, or the
  // measured choice).
  bool fp16_arithmetic = false;
  // The CPU's BF16 GEMM for this weight; unset: the backend's own choice.
  std::optional<Bf16Gemm> bf16_gemm;
  // A decoder layer's product (not the head or the embedding): FP8 on CUDA under --quant fp8.
  bool decoder_layer = false;
};

// A recorded sequence of ops (a CUDA graph) that replays them with the same arguments.
class Graph {
 public:
  virtual ~Graph() = default;
  virtual Status launch() = 0;
};

// One forward pass's sequences as paged attention reads them. Rows of the batch are grouped by
// sequence: sequence s has rows [seq_row[s], seq_row[s] + seq_len[s]) at positions seq_pos[s] ..,
// and its block table is row s of `tables` (stride entries). Padding rows of a graph's bucket are
// sequences of their own (one row at position 0 over the cache's scratch block).
struct AttentionBatch {
  int64_t tokens = 0, seqs = 0;
  const int32_t* seq_row = nullptr;      // host [seqs]
  const int32_t* seq_len = nullptr;      // host [seqs]
  const int32_t* seq_pos = nullptr;      // host [seqs]
  const int32_t* tables_host = nullptr;  // host [seqs, stride]
  Buf tok_seq, tok_pos, tables;          // backend: [tokens], [tokens], [seqs, stride] int32
  int64_t stride = 0, block_size = 0;
  int64_t max_seen = 0;  // a bound on any row's position + 1 (sets the decode splits on CUDA)
  // A hybrid model's: each sequence's state slot (host [seqs]); a sequence at position 0 starts
  // from zero state.
  const int32_t* seq_slot = nullptr;
  // With seq_slot: each sequence's first slot for its per-token states (host [seqs]; -1: none),
  // a verify chunk's (ops::DeltaNetSeq::token_states: token t's at that slot + t).
  const int32_t* seq_token_slot = nullptr;
  int64_t serial = 0;  // differs between passes: a backend may keep per-pass state
};

// The geometry of a Gated DeltaNet layer (Qwen3.5's linear attention): key heads, value heads (a
// multiple of them), their dims, and the conv1d's taps.
struct DeltaNetShape {
  int64_t nk = 0, nv = 0, dk = 0, dv = 0, kernel = 0;
  // The key head value head h reads: h / (nv / nk) in transformers' order, h % nk with the value
  // heads `tiled` over the key heads (llama.cpp's GGUF order: every tensor holding value heads
  // stores head g · r + j of transformers' as j · nk + g; a layer run in that order throughout
  // gives the same output, so a GGUF file's matrices stay as stored).
  bool tiled = false;
  int64_t key_head(int64_t h) const { return tiled ? h % nk : h / (nv / nk); }
  int64_t conv_dim() const { return 2 * nk * dk + nv * dv; }  // q | k | v channels
  // A row of the layer's stacked input product: q | k | v | z (nv·dv) | b (nv) | a (nv).
  int64_t proj_dim() const { return conv_dim() + nv * dv + 2 * nv; }
  // One sequence's state: the conv window [kernel − 1, conv_dim], then [nv, dk, dv].
  int64_t conv_state() const { return (kernel - 1) * conv_dim(); }
  int64_t recurrent_state() const { return nv * dk * dv; }
  int64_t state_floats() const { return conv_state() + recurrent_state(); }
  // A row of gated_delta_net's scratch: the conv output, then g and β of each value head.
  int64_t mixed_dim() const { return conv_dim() + 2 * nv; }
};

// A Gated DeltaNet layer as a backend runs it: its shape and its small weights (Backend::vector,
// f32): the conv taps [kernel, conv_dim] (tap-major), A_log and dt_bias [nv].
struct DeltaNetLayer {
  DeltaNetShape shape;
  Buf conv_w, a_log, dt_bias;
};

// A token drawn on the device from a logit row (sample_rows), as the engine's Sampler would:
// penalties, temperature, top-k, top-p, min-p, and the uniform draw u in [0, 1).
struct PenaltyEntry {
  int32_t id;
  float repetition;  // logit < 0 ? logit · r : logit / r (1: none)
  float subtract;    // presence + frequency · count (0: none)
};
struct SampleParams {
  int32_t row = 0;    // the logit row
  int32_t top_k = 0;  // 0: off
  float inv_temperature = 1;
  float top_p = 1;  // 1: off
  float min_p = 0;  // 0: off
  float u = 0;
  int32_t penalty_begin = 0, penalty_end = 0;  // this row's entries in the penalty array
};

struct DeviceStats {
  double utilization_percent = -1;  // -1: not reported
  int64_t memory_used = 0, memory_total = 0;
  double power_watts = -1;  // -1: not reported
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual DType act_dtype() const = 0;
  // "cpu" / "NVIDIA <name> (sm_<cc>, <memory> GiB), bf16".
  virtual std::string description() const = 0;

  // ---- Memory
  // `elems` zeroed elements of t on the device. lazy: reserved, resident as it is first written
  // (the KV cache).
  virtual Result<Buffer> alloc(int64_t elems, DType t, bool lazy = false) = 0;
  // Host memory the device copies from fast (pinned on CUDA).
  virtual Result<Buffer> alloc_host(size_t bytes) = 0;
  // Host → device, in op order: the host bytes must stay until synchronize().
  virtual Status to_device(Buf dst, const void* host, size_t bytes) = 0;
  // Device → host, in op order: done at synchronize().
  virtual Status to_host(void* host, Buf src, size_t bytes) = 0;
  // `bytes` of host memory (f32 or int32, type t) as the device sees them: on the CPU the host
  // memory itself; elsewhere copied (in op order) into *scratch, grown when too small.
  virtual Result<Buf> stage(const void* host, size_t bytes, DType t, Buffer* scratch) = 0;
  virtual Status synchronize() = 0;
  // Free and total bytes of the device's memory (an error on the CPU: sized otherwise).
  virtual Status memory_info(int64_t* free_bytes, int64_t* total_bytes) const;
  virtual bool device_stats(DeviceStats* out) const;

  // ---- Weights, kept for the backend's life
  virtual Result<std::unique_ptr<Linear>> linear(std::span<const TensorView* const> stack,
                                                 const LinearOptions& opts) = 0;
  // A norm's weight or a bias, f32 [v.size()] (v must outlive the backend).
  virtual Result<Buf> vector(const std::vector<float>& v) = 0;

  // ---- The text decoder's ops (x, y: [rows, n] activations unless said otherwise)
  // out[i] = table[ids[i]] for i < count (ids int32, in range).
  virtual Status embed(const Linear& table, Buf ids, int64_t count, Buf out) = 0;
  virtual Status rms_norm(Buf x, Buf w, int64_t rows, int64_t n, float eps, Buf y) = 0;
  // x += delta, then y = rms_norm(x).
  virtual Status add_rms_norm(Buf x, Buf delta, Buf w, int64_t rows, int64_t n, float eps,
                              Buf y) = 0;
  // x += delta (+ bias [n] f32, may be empty); delta in the activation type or f32.
  virtual Status add(Buf x, Buf delta, Buf bias, int64_t rows, int64_t n) = 0;
  // y [M, w.rows()] = x [M, w.cols()] · wᵀ, y in its own type (the activation type or f32).
  virtual Status linear(Buf x, int64_t M, const Linear& w, Buf y) = 0;
  // The attention input of a decoder layer from one q|k|v product qkv [tokens, (n_heads +
  // 2·n_kv_heads)·head_dim]: q heads get q_norm + rotary into q [tokens, n_heads, head_dim]; k
  // heads k_norm + rotary, and v heads as they are, into the caches' rows slots[i] (int32). cos,
  // sin: f32 [tokens, head_dim / 2]. qkv is scratch: a backend may rotate it in place.
  virtual Status qkv_rope_store(Buf qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                                int64_t head_dim, Buf q_norm, Buf k_norm, float eps, Buf cos,
                                Buf sin, Buf slots, Buf q, const KvLayer& cache) = 0;
  // Whether the KV cache may hold this type (the activation type always).
  virtual bool supports_kv_dtype(DType t) const { return t == act_dtype(); }
  // Checks at load that the attention ops take this head_dim, and sets aside what they need for
  // it (the decode splits' scratch on CUDA), so that no step allocates.
  virtual Status reserve_attention(int64_t head_dim) {
    (void)head_dim;
    return ok_status();
  }
  // Causal GQA attention of the batch's rows over the paged caches ([blocks · block_size,
  // n_kv_heads · head_dim] each), after qkv_rope_store put the batch's own K/V there.
  virtual Status paged_attention(Buf q, const AttentionBatch& b, const KvLayer& cache,
                                 int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale,
                                 Buf out) = 0;
  // out [rows, n] = silu(gate) · up from gu [rows, 2n] (gate then up in each row).
  virtual Status silu_mul(Buf gu, int64_t rows, int64_t n, Buf out) = 0;
  // x[rows[i]] = src[i] / += src[i] for i < count (rows int32, distinct; src f32 [count, n]):
  // image features into the image rows, DeepStack features added to them.
  virtual Status set_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) = 0;
  virtual Status add_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) = 0;
  // out[i] = x[rows[i]] for i < count.
  virtual Status gather_rows(Buf x, Buf rows, int64_t count, int64_t n, Buf out) = 0;

  // ---- A sparse layer's MLP, a mixture of experts (where supports_moe)
  virtual bool supports_moe() const { return false; }
  // The experts of each of `rows` rows from its router logits (f32 [rows, n_experts]): the top_k
  // largest logits, best first, a tie going to the lower expert index, into ids (int32 [rows,
  // top_k]); their softmax probabilities over all n_experts into weights (f32 [rows, top_k]),
  // renormalised to sum 1 when `renormalize`.
  virtual Status moe_route(Buf logits, int64_t rows, int64_t n_experts, int64_t top_k,
                           bool renormalize, Buf ids, Buf weights);
  // out [rows, n] = Σ_j weights[r, j] · down_e(silu(gate_e · x[r]) · up_e · x[r]) with e =
  // ids[r, j], added in increasing expert order; gate_up[e] [2·I, n] (gate rows, then up rows)
  // and down[e] [n, I] are expert e's products. scratch: moe_scratch_elems activations.
  virtual Status moe_experts(Buf x, int64_t rows, Buf ids, Buf weights, int64_t top_k,
                             std::span<const Linear* const> gate_up,
                             std::span<const Linear* const> down, Buf scratch, Buf out);
  // The activations of moe_experts' scratch for up to `rows` rows (here rows · (2·n + 3·I)).
  virtual int64_t moe_scratch_elems(int64_t rows, int64_t n_experts, int64_t top_k, int64_t n,
                                    int64_t I) const;
  // Once per sparse layer at load, before moe_experts runs over these experts.
  virtual Status prepare_moe(std::span<const Linear* const> gate_up,
                             std::span<const Linear* const> down) {
    (void)gate_up, (void)down;
    return ok_status();
  }

  // ---- Qwen3.5's hybrid layers (where supports_hybrid; elsewhere kUnimplemented)
  virtual bool supports_hybrid() const { return false; }
  // qkv_rope_store for the gated attention: q_proj's rows hold, per head, [q | gate] (qkv row:
  // n_heads · 2·head_dim, then the k and v heads); q heads go to q and gates to gate ([tokens,
  // n_heads, head_dim] each); q and k get their RMSNorm over all head_dim values and NeoX rotary
  // over the first rotary_dim (cos, sin: f32 [tokens, rotary_dim / 2]).
  virtual Status qkv_gated_rope_store(Buf qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                                      int64_t head_dim, int64_t rotary_dim, Buf q_norm, Buf k_norm,
                                      float eps, Buf cos, Buf sin, Buf slots, Buf q, Buf gate,
                                      const KvLayer& cache);
  // x [rows, n] ← x · sigmoid(g [rows, n]): the attention's output gate.
  virtual Status sigmoid_mul(Buf x, Buf g, int64_t rows, int64_t n);
  // x [rows, n] += sigmoid(g[r]) · y [rows, n], one gate logit per row (g f32 [rows]): Qwen3.5
  // MoE's shared expert added to the routed sum.
  virtual Status add_sigmoid_scaled(Buf x, Buf y, Buf g, int64_t rows, int64_t n);
  // A Gated DeltaNet layer's token mixing over the batch's sequences (ops::gated_delta_net):
  // proj [b.tokens, shape.proj_dim()], mixed: scratch [b.tokens, shape.mixed_dim()], out
  // [b.tokens, nv · dv]. `states` is the layer's slots [slots, shape.state_floats()] f32:
  // sequence s reads and updates slot b.seq_slot[s], from zero when b.seq_pos[s] is 0.
  virtual Status gated_delta_net(Buf proj, const AttentionBatch& b, const DeltaNetLayer& layer,
                                 Buf states, Buf mixed, Buf out);
  // Per value head: y = rms_norm(x) · w · silu(z). x, y [rows, heads, n] (may alias); z's rows
  // z_stride apart (heads · n values each).
  virtual Status gated_rms_norm(Buf x, Buf z, int64_t z_stride, int64_t rows, int64_t heads,
                                int64_t n, Buf w, float eps, Buf y);
  // dst = src, `bytes` of the device's memory (a state slot to or from its snapshot), in op
  // order.
  virtual Status copy(Buf dst, Buf src, size_t bytes);

  // ---- The vision tower's ops
  virtual Status layer_norm(Buf x, Buf w, Buf b, int64_t rows, int64_t n, float eps, Buf y) = 0;
  // x += delta + bias, then y = layer_norm(x).
  virtual Status add_layer_norm(Buf x, Buf delta, Buf bias, Buf w, Buf b, int64_t rows, int64_t n,
                                float eps, Buf y) = 0;
  // In place: x = gelu(x + bias); tanh: gelu_pytorch_tanh, else nn.GELU()'s erf form.
  virtual Status bias_gelu(Buf x, Buf bias, int64_t rows, int64_t n, bool tanh) = 0;
  // x += bias per row (x in its own type).
  virtual Status add_bias(Buf x, Buf bias, int64_t rows, int64_t n) = 0;
  // q, k, v [rows, n] = the three column blocks of qkv [rows, 3n] plus their bias (f32 [3n]).
  virtual Status split_qkv(Buf qkv, Buf bias, int64_t rows, int64_t n, Buf q, Buf k, Buf v) = 0;
  // NeoX rotary in place over x [tokens, n_heads, head_dim]; cos, sin f32 [tokens, head_dim / 2].
  virtual Status rope(Buf x, int64_t tokens, int64_t n_heads, int64_t head_dim, Buf cos,
                      Buf sin) = 0;
  // Bidirectional attention within n rows (one frame): q, k, v, out [n, n_heads, head_dim].
  virtual Status attention_full(Buf q, Buf k, Buf v, int64_t n, int64_t n_heads, int64_t head_dim,
                                float scale, Buf out) = 0;
  // Rows of a batch computed in parts: the row grain (0: not offered) such that linear(), the
  // row-wise ops and attention_full_rows() over rows split at its multiples give every row bit
  // for bit what one call over all of them gives (each part at least the grain, or the whole).
  // The vision tower then slices a long layer by rows; elsewhere it slices by whole ops only.
  virtual int64_t row_slice_grain() const { return 0; }
  // attention_full for query rows [q0, q1) only (every key seen; out's other rows untouched);
  // only where row_slice_grain() > 0.
  virtual Status attention_full_rows(Buf q, Buf k, Buf v, int64_t n, int64_t q0, int64_t q1,
                                     int64_t n_heads, int64_t head_dim, float scale, Buf out) {
    (void)q, (void)k, (void)v, (void)n, (void)q0, (void)q1, (void)n_heads, (void)head_dim,
        (void)scale, (void)out;
    return Status(StatusCode::kUnimplemented, "this backend computes attention by whole frames");
  }
  // Whether linear() runs FP16 arithmetic for weights made with LinearOptions::fp16_arithmetic.
  virtual bool has_fp16_arithmetic() const { return false; }
  // dst = src converted (f32 pixel values into the activation type).
  virtual Status convert(Buf src, int64_t count, Buf dst) = 0;
  // The processor's normalise + patchify from resized bytes (rgb [grid_h·P, grid_w·P, 3] u8,
  // lut f32 [3 · 256]) into out [grid_h·grid_w, 3·T·P·P] in merge order. Not on the CPU, whose
  // preprocessing patchifies (an error there).
  virtual bool can_patchify() const { return false; }
  virtual Status patchify(Buf rgb, Buf lut, int64_t grid_h, int64_t grid_w, int64_t patch,
                          int64_t merge, int64_t temporal, Buf out);

  // ---- Sampling on the device (where has_device_sampling)
  virtual bool has_device_sampling() const { return false; }
  // ids[r] = the first largest of logits row r (f32 [rows, n]).
  virtual Status argmax_rows(Buf logits, int64_t rows, int64_t n, Buf ids);
  // ids[i] = the token drawn for params[i]; the rows are penalised in place.
  virtual Status sample_rows(Buf logits, int64_t vocab, Buf params, int64_t count, Buf penalties,
                             Buf ids);

  // ---- Graphs (where supports_graphs): the ops between begin_capture and end_capture are
  // recorded, not run.
  virtual bool supports_graphs() const { return false; }
  virtual Status begin_capture();
  virtual Status end_capture(std::unique_ptr<Graph>* out);
};

}  // namespace vlm::ops

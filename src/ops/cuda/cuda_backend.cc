#include "ops/cuda/cuda_backend.h"

#include <algorithm>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/fp8.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/int8_gemm.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/nvml.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/stream.h"
#include "kernels/cuda/weights.h"

namespace vlm::ops {
namespace {

namespace cu = vlm::cuda;

// The device draws take the backend's structs as they are.
static_assert(sizeof(SampleParams) == sizeof(cu::SampleParams) &&
              offsetof(SampleParams, u) == offsetof(cu::SampleParams, u) &&
              offsetof(SampleParams, penalty_end) == offsetof(cu::SampleParams, penalty_end));
static_assert(sizeof(PenaltyEntry) == sizeof(cu::PenaltyEntry) &&
              offsetof(PenaltyEntry, subtract) == offsetof(cu::PenaltyEntry, subtract));

// Chunks from this many tokens make paged attention a prefill (flash attention, BF16).
constexpr int64_t kFlashMinTokens = 16;

cu::DType act_of(DType t) { return t == DType::kBF16 ? cu::DType::kBF16 : cu::DType::kF32; }

// A linear layer's weight [n, k] as the device holds it: in the activation type, INT8 with one
// f32 scale per output row (--quant int8), or E4M3 with one f32 scale (--quant fp8).
class CudaLinear final : public Linear {
 public:
  CudaLinear(int64_t n, int64_t k) {
    rows_ = n;
    cols_ = k;
  }
  int64_t bytes() const override { return static_cast<int64_t>(w.bytes() + scale.bytes()); }
  cu::DeviceBuffer w, scale;
  bool int8 = false, fp8 = false;
};

const CudaLinear& cuda(const Linear& l) { return static_cast<const CudaLinear&>(l); }

class CudaGraph final : public Graph {
 public:
  CudaGraph(std::unique_ptr<cu::Graph> g, void* stream) : g_(std::move(g)), stream_(stream) {}
  Status launch() override {
    cu::StreamScope on(stream_);
    return g_->launch();
  }

 private:
  std::unique_ptr<cu::Graph> g_;
  void* stream_;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& o)
      : opts_(o), act_(o.f32 ? DType::kF32 : DType::kBF16), cact_(act_of(act_)) {}

  Status init() {
    if (cu::device_count() == 0)
      return invalid_argument("no CUDA device is visible to this process");
    if (opts_.fp8 && opts_.f32) return invalid_argument("FP8 products need BF16 activations");
    VLM_RETURN_IF_ERROR(cu::Gemm::create(&gemm_));
    VLM_RETURN_IF_ERROR(cu::Stream::create(&stream_));
    description_ = cu::device_description(0) + (opts_.f32 ? ", f32" : ", bf16") +
                   (opts_.fp8 ? ", fp8 weights" : "");
    // Flash attention's query tiles: at most one per token and one partial tile per sequence.
    VLM_ASSIGN_OR_RETURN(tiles_, alloc(4 * opts_.max_tokens, DType::kI32, false));
    return cu::synchronize();
  }

  Device device() const override { return Device::kCuda; }
  DType act_dtype() const override { return act_; }
  std::string description() const override { return description_; }

  Result<Buffer> alloc(int64_t elems, DType t, bool lazy) override {
    const size_t bytes = dtype_nbytes(t, std::max<int64_t>(elems, 0));
    auto owner = std::make_shared<cu::DeviceBuffer>();
    const Status st = cu::DeviceBuffer::allocate(std::max<size_t>(bytes, 16), owner.get());
    if (!st.ok()) {
      return unavailable("out of GPU memory for " + std::to_string(bytes) + " bytes (" +
                         st.message() + ")");
    }
    // Zeroed, except what is written before it is read (the KV cache).
    if (!lazy) VLM_RETURN_IF_ERROR(cu::zero_device(owner->data(), owner->bytes()));
    return Buffer(Buf{owner->data(), Device::kCuda, t}, bytes, owner);
  }
  Result<Buffer> alloc_host(size_t bytes) override {
    auto owner = std::make_shared<cu::PinnedBuffer>();
    VLM_RETURN_IF_ERROR(cu::PinnedBuffer::allocate(std::max<size_t>(bytes, 16), owner.get()));
    return Buffer(Buf{owner->data(), Device::kCpu, DType::kU8}, bytes, owner);
  }
  Status to_device(Buf dst, const void* host, size_t bytes) override {
    cu::StreamScope on(stream_->get());
    return cu::copy_to_device_async(dst.data, host, bytes);
  }
  Status to_host(void* host, Buf src, size_t bytes) override {
    cu::StreamScope on(stream_->get());
    return cu::copy_to_host_async(host, src.data, bytes);
  }
  Result<Buf> stage(const void* host, size_t bytes, DType t, Buffer* scratch) override {
    if (scratch->bytes() < bytes || scratch->buf().device != Device::kCuda) {
      const auto elems = static_cast<int64_t>((bytes + dtype_size(t) - 1) / dtype_size(t));
      *scratch = {};
      VLM_ASSIGN_OR_RETURN(*scratch, alloc(elems, t, false));
    }
    VLM_RETURN_IF_ERROR(to_device(scratch->buf(), host, bytes));
    Buf b = scratch->buf();
    b.dtype = t;
    return b;
  }
  Status synchronize() override {
    cu::StreamScope on(stream_->get());
    return cu::stream_synchronize();
  }
  Status memory_info(int64_t* free_bytes, int64_t* total_bytes) const override {
    return cu::memory_info(free_bytes, total_bytes);
  }
  bool device_stats(DeviceStats* out) const override {
    auto s = cu::read_gpu_stats(0);
    if (!s.ok()) return false;
    out->utilization_percent = s->utilization_percent;
    out->memory_used = s->memory_used;
    out->memory_total = s->memory_total;
    out->power_watts = s->power_watts;
    return true;
  }

  Result<std::unique_ptr<Linear>> linear(std::span<const TensorView* const> stack,
                                         const LinearOptions& o) override;
  Result<Buf> vector(const std::vector<float>& v) override {
    cu::DeviceBuffer b;
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::upload_f32(v, &b));
    const Buf view{b.data(), Device::kCuda, DType::kF32};
    vectors_.push_back(std::move(b));
    return view;
  }

  Status embed(const Linear& table, Buf ids, int64_t count, Buf out) override {
    const CudaLinear& t = cuda(table);
    if (t.int8 || t.fp8) return internal_error("embed: a quantized table");
    cu::StreamScope on(stream_->get());
    return cu::embedding_gather(t.w.data(), cact_, ids.as<const int32_t>(), count, t.cols(),
                                out.data, cact_);
  }
  Status rms_norm(Buf x, Buf w, int64_t rows, int64_t n, float eps, Buf y) override {
    cu::StreamScope on(stream_->get());
    return cu::rms_norm(x.data, w.as<const float>(), rows, n, eps, y.data, cact_);
  }
  Status add_rms_norm(Buf x, Buf delta, Buf w, int64_t rows, int64_t n, float eps, Buf y) override {
    cu::StreamScope on(stream_->get());
    return cu::add_rms_norm(x.data, delta.data, w.as<const float>(), rows, n, eps, y.data, cact_);
  }
  Status add(Buf x, Buf delta, Buf bias, int64_t rows, int64_t n) override {
    cu::StreamScope on(stream_->get());
    if (bias) {
      if (delta.dtype != act_) return internal_error("add: a bias with an f32 delta");
      return cu::add_layer_norm(x.data, delta.data, bias.as<const float>(), nullptr, nullptr, rows,
                                n, 0.f, nullptr, cact_);
    }
    return cu::add_inplace(x.data, delta.data, act_of(delta.dtype), rows * n, cact_);
  }
  Status linear(Buf x, int64_t M, const Linear& w, Buf y) override {
    cu::StreamScope on(stream_->get());
    return product(x.data, cuda(w), M, y.data, act_of(y.dtype));
  }
  Status qkv_rope_store(Buf qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                        int64_t head_dim, Buf q_norm, Buf k_norm, float eps, Buf cos, Buf sin,
                        Buf slots, Buf q, const KvLayer& cache) override {
    if (cache.k.dtype != act_)
      return invalid_argument("cuda: the KV cache must be in the activation type");
    cu::StreamScope on(stream_->get());
    return cu::qkv_rope_store(qkv.data, tokens, n_heads, n_kv_heads, head_dim,
                              q_norm.as<const float>(), k_norm.as<const float>(), eps,
                              cos.as<const float>(), sin.as<const float>(),
                              slots.as<const int32_t>(), q.data, cache.k.data, cache.v.data, cact_);
  }
  Status paged_attention(Buf q, const AttentionBatch& b, const KvLayer& cache, int64_t n_heads,
                         int64_t n_kv_heads, int64_t head_dim, float scale, Buf out) override;
  Status silu_mul(Buf gu, int64_t rows, int64_t n, Buf out) override {
    cu::StreamScope on(stream_->get());
    return cu::silu_mul_rows(gu.data, rows, n, out.data, cact_);
  }
  Status set_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) override {
    cu::StreamScope on(stream_->get());
    return cu::set_rows_at(x.data, rows.as<const int32_t>(), src.data, act_of(src.dtype), count, n,
                           cact_);
  }
  Status add_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) override {
    cu::StreamScope on(stream_->get());
    return cu::add_rows_at(x.data, rows.as<const int32_t>(), src.data, act_of(src.dtype), count, n,
                           cact_);
  }
  Status gather_rows(Buf x, Buf rows, int64_t count, int64_t n, Buf out) override {
    cu::StreamScope on(stream_->get());
    return cu::embedding_gather(x.data, cact_, rows.as<const int32_t>(), count, n, out.data, cact_);
  }

  bool supports_moe() const override { return true; }
  Status moe_route(Buf logits, int64_t rows, int64_t n_experts, int64_t top_k, bool renormalize,
                   Buf ids, Buf weights) override {
    cu::StreamScope on(stream_->get());
    return cu::moe_route(logits.as<const float>(), rows, n_experts, top_k, renormalize,
                         ids.as<int32_t>(), weights.as<float>());
  }
  Status prepare_moe(std::span<const Linear* const> gate_up,
                     std::span<const Linear* const> down) override;
  Status moe_experts(Buf x, int64_t rows, Buf ids, Buf weights, int64_t top_k,
                     std::span<const Linear* const> gate_up, std::span<const Linear* const> down,
                     Buf scratch, Buf out) override;
  int64_t moe_scratch_elems(int64_t rows, int64_t n_experts, int64_t top_k, int64_t n,
                            int64_t I) const override {
    const auto a = static_cast<int64_t>(dtype_size(act_));
    return (moe_scratch(rows * top_k, n_experts, n, I).end + a - 1) / a;
  }

  Status layer_norm(Buf x, Buf w, Buf b, int64_t rows, int64_t n, float eps, Buf y) override {
    cu::StreamScope on(stream_->get());
    return cu::layer_norm(x.data, w.as<const float>(), b.as<const float>(), rows, n, eps, y.data,
                          cact_);
  }
  Status add_layer_norm(Buf x, Buf delta, Buf bias, Buf w, Buf b, int64_t rows, int64_t n,
                        float eps, Buf y) override {
    cu::StreamScope on(stream_->get());
    return cu::add_layer_norm(x.data, delta.data, bias.as<const float>(), w.as<const float>(),
                              b.as<const float>(), rows, n, eps, y.data, cact_);
  }
  Status bias_gelu(Buf x, Buf bias, int64_t rows, int64_t n, bool tanh) override {
    cu::StreamScope on(stream_->get());
    return cu::bias_gelu(x.data, bias.as<const float>(), rows, n, tanh, cact_);
  }
  Status add_bias(Buf x, Buf bias, int64_t rows, int64_t n) override {
    cu::StreamScope on(stream_->get());
    return cu::add_bias(x.data, bias.as<const float>(), rows, n, act_of(x.dtype));
  }
  Status split_qkv(Buf qkv, Buf bias, int64_t rows, int64_t n, Buf q, Buf k, Buf v) override {
    cu::StreamScope on(stream_->get());
    VLM_RETURN_IF_ERROR(cu::add_bias(qkv.data, bias.as<const float>(), rows, 3 * n, cact_));
    const size_t a = dtype_size(act_), row = static_cast<size_t>(n) * a;
    const Buf parts[3] = {q, k, v};
    for (int64_t p = 0; p < 3; ++p) {
      VLM_RETURN_IF_ERROR(cu::copy_2d_async(parts[p].data, row, qkv.at(p * n).data, 3 * row, row,
                                            static_cast<size_t>(rows)));
    }
    return ok_status();
  }
  Status rope(Buf x, int64_t tokens, int64_t n_heads, int64_t head_dim, Buf cos, Buf sin) override {
    cu::StreamScope on(stream_->get());
    return cu::qk_norm_rope(x.data, tokens, n_heads, head_dim, nullptr, 0.f, cos.as<const float>(),
                            sin.as<const float>(), cact_);
  }
  Status attention_full(Buf q, Buf k, Buf v, int64_t n, int64_t n_heads, int64_t head_dim,
                        float scale, Buf out) override {
    cu::StreamScope on(stream_->get());
    if (act_ == DType::kBF16 && cu::flash_attention_supports(head_dim)) {  // on the tensor cores
      return cu::flash_attention_full(q.data, k.data, v.data, n, n_heads, head_dim, scale,
                                      out.data);
    }
    return cu::attention_full(q.data, k.data, v.data, n, n_heads, n_heads, head_dim, scale,
                              out.data, cact_);
  }
  Status convert(Buf src, int64_t count, Buf dst) override {
    cu::StreamScope on(stream_->get());
    return cu::convert(src.data, act_of(src.dtype), count, dst.data, act_of(dst.dtype));
  }
  bool can_patchify() const override { return true; }
  Status patchify(Buf rgb, Buf lut, int64_t grid_h, int64_t grid_w, int64_t patch, int64_t merge,
                  int64_t temporal, Buf out) override {
    cu::StreamScope on(stream_->get());
    return cu::patchify_rgb(rgb.as<const uint8_t>(), lut.as<const float>(), grid_h, grid_w, patch,
                            merge, temporal, out.data, cact_);
  }

  bool has_device_sampling() const override { return true; }
  Status argmax_rows(Buf logits, int64_t rows, int64_t n, Buf ids) override {
    cu::StreamScope on(stream_->get());
    return cu::argmax_rows(logits.as<const float>(), rows, n, ids.as<int32_t>());
  }
  Status sample_rows(Buf logits, int64_t vocab, Buf params, int64_t count, Buf penalties,
                     Buf ids) override {
    cu::StreamScope on(stream_->get());
    return cu::sample_rows(logits.as<float>(), vocab, params.as<const cu::SampleParams>(), count,
                           penalties.as<const cu::PenaltyEntry>(), ids.as<int32_t>());
  }

  bool supports_graphs() const override { return true; }
  Status begin_capture() override {
    cu::StreamScope on(stream_->get());
    VLM_RETURN_IF_ERROR(cu::stream_synchronize());  // nothing of ours may be pending
    return cu::Graph::begin_capture();
  }
  Status end_capture(std::unique_ptr<Graph>* out) override {
    cu::StreamScope on(stream_->get());
    std::unique_ptr<cu::Graph> g;
    VLM_RETURN_IF_ERROR(cu::Graph::end_capture(&g));
    *out = std::make_unique<CudaGraph>(std::move(g), stream_->get());
    return ok_status();
  }

 private:
  // y[M, L.n] = x[M, L.k] · Lᵀ, y in y_t (BF16 for FP8 weights).
  Status product(const void* x, const CudaLinear& L, int64_t M, void* y, cu::DType y_t) {
    if (L.fp8) {
      if (M * L.cols() > fp8_x_elems_) return internal_error("FP8 product past its scratch");
      float* amax = fp8_scales_.as<float>();
      VLM_RETURN_IF_ERROR(cu::quantize_fp8(x, cact_, M * L.cols(), amax, amax + 1, fp8_x_.data()));
      return gemm_->matmul_fp8(fp8_x_.data(), amax + 1, L.w.data(),
                               static_cast<const float*>(L.scale.data()), M, L.rows(), L.cols(), y);
    }
    if (L.int8) {
      return cu::int8_matmul(*gemm_, x, cact_, static_cast<const int8_t*>(L.w.data()),
                             static_cast<const float*>(L.scale.data()), M, L.rows(), L.cols(), y,
                             y_t, int8_scratch_.data());
    }
    return gemm_->matmul(x, L.w.data(), cact_, M, L.rows(), L.cols(), y, y_t);
  }

  // moe_experts' scratch for `pairs` (row, expert) pairs, byte offsets from its start: gate|up
  // [pairs, 2·I] (at 0) and its SwiGLU [pairs, I] in the activation type, each pair's down
  // product [pairs, n] in f32, then the grouping, each 256-byte aligned; `end` is the size.
  struct MoeScratch {
    int64_t h, y, groups, end;
  };
  MoeScratch moe_scratch(int64_t pairs, int64_t E, int64_t n, int64_t I) const {
    const auto a = static_cast<int64_t>(dtype_size(act_));
    const auto up = [](int64_t b) { return (b + 255) / 256 * 256; };
    MoeScratch s{};
    s.h = up(pairs * 2 * I * a);
    s.y = s.h + up(pairs * I * a);
    s.groups = s.y + up(pairs * n * 4);
    s.end = s.groups + cu::moe_groups_bytes(E, pairs);
    return s;
  }
  // The device tables of one sparse layer's experts (prepare_moe), by its first gate|up Linear.
  struct MoeTables {
    cu::DeviceBuffer gate_up_w, gate_up_scale, down_w, down_scale;
    int64_t experts = 0, n = 0, I = 0;
    bool int8 = false;
  };

  CudaBackendOptions opts_;
  DType act_;
  cu::DType cact_;
  std::string description_;
  std::unique_ptr<cu::Gemm> gemm_;
  std::unique_ptr<cu::Stream> stream_;
  std::vector<cu::DeviceBuffer> vectors_;  // norms and biases
  cu::DeviceBuffer int8_scratch_, fp8_x_, fp8_scales_, partial_;
  int64_t fp8_x_elems_ = 0;
  bool fp8_checked_ = false;
  // Flash attention's query tiles of the current pass (AttentionBatch::serial).
  int64_t tiles_serial_ = -1, n_tiles_ = 0;
  std::vector<int64_t> chunk_off_, chunk_n_;
  std::vector<int32_t> h_tiles_;
  Buffer tiles_;
  std::map<const Linear*, MoeTables> moe_;
};

Status CudaBackend::prepare_moe(std::span<const Linear* const> gate_up,
                                std::span<const Linear* const> down) {
  if (gate_up.empty() || gate_up.size() != down.size()) {
    return internal_error("prepare_moe: gate|up and down experts differ in number");
  }
  if (static_cast<int64_t>(gate_up.size()) > cu::kMoeMaxExperts) {
    return unimplemented("more than " + std::to_string(cu::kMoeMaxExperts) + " experts on the GPU");
  }
  MoeTables t;
  t.int8 = cuda(*gate_up.front()).int8;
  t.experts = static_cast<int64_t>(gate_up.size());
  t.n = gate_up.front()->cols();
  t.I = down.front()->cols();
  if (gate_up.front()->rows() != 2 * t.I || down.front()->rows() != t.n) {
    return internal_error("prepare_moe: gate|up [2·I, n] and down [n, I] do not fit together");
  }
  const auto table = [&](std::span<const Linear* const> ls, cu::DeviceBuffer* w,
                         cu::DeviceBuffer* s) -> Status {
    std::vector<const void*> wp, sp;
    for (const Linear* l : ls) {
      const CudaLinear& c = cuda(*l);
      if (c.fp8) return unimplemented("FP8 experts (--quant fp8 with a mixture of experts)");
      if (c.int8 != t.int8) return internal_error("experts of mixed weight types");
      if (c.rows() != ls.front()->rows() || c.cols() != ls.front()->cols()) {
        return internal_error("experts of different shapes");
      }
      wp.push_back(c.w.data());
      sp.push_back(c.scale.data());
    }
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(wp.size() * sizeof(void*), w));
    VLM_RETURN_IF_ERROR(w->upload(wp.data(), wp.size() * sizeof(void*)));
    if (t.int8) {
      VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(sp.size() * sizeof(void*), s));
      VLM_RETURN_IF_ERROR(s->upload(sp.data(), sp.size() * sizeof(void*)));
    }
    return ok_status();
  };
  VLM_RETURN_IF_ERROR(table(gate_up, &t.gate_up_w, &t.gate_up_scale));
  VLM_RETURN_IF_ERROR(table(down, &t.down_w, &t.down_scale));
  moe_[gate_up.front()] = std::move(t);
  return ok_status();
}

Status CudaBackend::moe_experts(Buf x, int64_t rows, Buf ids, Buf weights, int64_t k,
                                std::span<const Linear* const> gate_up,
                                std::span<const Linear* const> down, Buf scratch, Buf out) {
  const auto it = gate_up.empty() ? moe_.end() : moe_.find(gate_up.front());
  if (it == moe_.end()) return internal_error("moe_experts: experts not prepared (prepare_moe)");
  const MoeTables& t = it->second;
  const auto E = static_cast<int64_t>(gate_up.size());
  const int64_t n = gate_up.front()->cols(), I = down.front()->cols(), pairs = rows * k;
  if (E != t.experts || down.size() != gate_up.size() || n != t.n || I != t.I) {
    return internal_error("moe_experts: not the experts prepare_moe saw");
  }
  if (k <= 0 || k > std::min<int64_t>(E, 32)) {
    return internal_error("moe_experts: top_k outside [1, min(experts, 32)]");
  }
  if (rows <= 0) return ok_status();
  const MoeScratch at = moe_scratch(pairs, E, n, I);
  auto* base = static_cast<char*>(scratch.data);
  void* gu = base;
  void* h = base + at.h;
  auto* y = reinterpret_cast<float*>(base + at.y);
  const cu::MoeGroups g = cu::moe_groups_at(base + at.groups, E, pairs);
  const auto ptrs = [](const cu::DeviceBuffer& b) {
    return static_cast<const void* const*>(b.data());
  };
  const auto scales = [&](const cu::DeviceBuffer& b) {
    return t.int8 ? static_cast<const float* const*>(b.data()) : nullptr;
  };
  cu::StreamScope on(stream_->get());
  VLM_RETURN_IF_ERROR(cu::moe_group(ids.as<const int32_t>(), pairs, E, g));
  VLM_RETURN_IF_ERROR(cu::moe_grouped_product(x.data, cact_, true, k, g, E, pairs,
                                              {ptrs(t.gate_up_w), scales(t.gate_up_scale), t.int8},
                                              2 * I, n, gu, cact_));
  VLM_RETURN_IF_ERROR(cu::silu_mul_rows(gu, pairs, I, h, cact_));
  VLM_RETURN_IF_ERROR(cu::moe_grouped_product(h, cact_, false, k, g, E, pairs,
                                              {ptrs(t.down_w), scales(t.down_scale), t.int8}, n, I,
                                              y, cu::DType::kF32));
  return cu::moe_combine(y, ids.as<const int32_t>(), weights.as<const float>(), rows, k, E, n,
                         out.data, act_of(out.dtype));
}

Result<std::unique_ptr<Linear>> CudaBackend::linear(std::span<const TensorView* const> ts,
                                                    const LinearOptions& o) {
  if (ts.empty()) return invalid_argument("a linear layer needs a weight");
  int64_t n = 0;
  const int64_t k = ts.front()->dim(1);
  for (const TensorView* t : ts) {
    if (t->rank() != 2 || t->dim(1) != k) {
      return invalid_argument("stacked weights must be 2-D with the same number of columns");
    }
    if (t->in_perm != nullptr) {
      return invalid_argument(
          "activation-ordered weights (TensorView::in_perm) run on the CPU only");
    }
    n += t->dim(0);
  }
  auto out = std::make_unique<CudaLinear>(n, k);
  out->int8 = ts.front()->dtype == vlm::DType::kI8;
  const bool fp8 = opts_.fp8 && o.decoder_layer && !out->int8;
  const std::vector<const TensorView*> stack(ts.begin(), ts.end());
  if (!out->int8 && !fp8) {
    VLM_RETURN_IF_ERROR(cu::upload_stacked(stack, cact_, &out->w));
    return std::unique_ptr<Linear>(std::move(out));
  }
  if (out->int8) {
    std::vector<int8_t> q;
    std::vector<float> scale;
    for (const TensorView* t : ts) {
      if (t->dtype != vlm::DType::kI8 || t->scale == nullptr) {
        return invalid_argument("stacked INT8 weights must all be INT8 [N, K] with scales");
      }
      const auto* d = static_cast<const int8_t*>(t->data);
      q.insert(q.end(), d, d + t->numel());
      scale.insert(scale.end(), t->scale, t->scale + t->dim(0));
    }
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(q.size(), &out->w));
    VLM_RETURN_IF_ERROR(out->w.upload(q.data(), q.size()));
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::upload_f32(scale, &out->scale));
    if (int8_scratch_.bytes() == 0) {
      VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(
          static_cast<size_t>(cu::kInt8ScratchElems) * dtype_size(act_), &int8_scratch_));
    }
    return std::unique_ptr<Linear>(std::move(out));
  }
  // FP8: quantized on the device, one scale for the stack.
  cu::DeviceBuffer wide, amax;
  VLM_RETURN_IF_ERROR(cu::upload_stacked(stack, cact_, &wide));
  VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(static_cast<size_t>(n * k), &out->w));
  VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(4, &out->scale));
  VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(4, &amax));
  VLM_RETURN_IF_ERROR(cu::quantize_fp8(wide.data(), cact_, n * k, static_cast<float*>(amax.data()),
                                       static_cast<float*>(out->scale.data()), out->w.data()));
  out->fp8 = true;
  VLM_RETURN_IF_ERROR(cu::synchronize());     // before `wide` and `amax` go
  if (opts_.max_tokens * k > fp8_x_elems_) {  // the activations' E4M3 copy, for the widest input
    fp8_x_elems_ = opts_.max_tokens * k;
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(static_cast<size_t>(fp8_x_elems_), &fp8_x_));
  }
  if (fp8_scales_.bytes() == 0)
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(2 * 4, &fp8_scales_));
  if (!fp8_checked_) {
    // One product now, so that a GPU or cuBLASLt without FP8 fails at load, saying so.
    cu::DeviceBuffer x, y;
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(static_cast<size_t>(k) * 2, &x));
    VLM_RETURN_IF_ERROR(cu::DeviceBuffer::allocate(static_cast<size_t>(n) * 2, &y));
    VLM_RETURN_IF_ERROR(cu::zero_device(x.data(), x.bytes()));
    cu::StreamScope on(stream_->get());
    VLM_RETURN_IF_ERROR(
        product(x.data(), *out, 1, y.data(), cact_).with_context("--quant fp8 on this GPU"));
    VLM_RETURN_IF_ERROR(cu::stream_synchronize());
    fp8_checked_ = true;
  }
  return std::unique_ptr<Linear>(std::move(out));
}

Status CudaBackend::paged_attention(Buf q, const AttentionBatch& b, const KvLayer& cache,
                                    int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                    float scale, Buf out) {
  cu::StreamScope on(stream_->get());
  int64_t longest = 0;
  for (int64_t s = 0; s < b.seqs; ++s) longest = std::max<int64_t>(longest, b.seq_len[s]);
  // Prefill steps (a chunk of kFlashMinTokens or more) run attention on the tensor cores, in
  // BF16; decode steps keep the warp-per-row kernel, split along long contexts.
  if (act_ == DType::kBF16 && cu::flash_attention_supports(head_dim) &&
      longest >= kFlashMinTokens) {
    if (tiles_serial_ != b.serial) {  // this pass's query tiles, once for all its layers
      chunk_off_.assign(b.seq_row, b.seq_row + b.seqs);
      chunk_n_.assign(b.seq_len, b.seq_len + b.seqs);
      h_tiles_.resize(static_cast<size_t>(2 * (b.tokens + b.seqs)));
      n_tiles_ = cu::flash_query_tiles(chunk_off_.data(), chunk_n_.data(), b.seqs, h_tiles_.data());
      VLM_ASSIGN_OR_RETURN(Buf t, stage(h_tiles_.data(), static_cast<size_t>(2 * n_tiles_) * 4,
                                        DType::kI32, &tiles_));
      (void)t;
      tiles_serial_ = b.serial;
    }
    return cu::flash_attention_paged(
        q.data, tiles_.as<const int32_t>(), n_tiles_, b.tok_seq.as<const int32_t>(),
        b.tok_pos.as<const int32_t>(), b.tables.as<const int32_t>(), b.stride, b.block_size,
        cache.k.data, cache.v.data, n_heads, n_kv_heads, head_dim, scale, out.data);
  }
  if (partial_.bytes() < static_cast<size_t>(cu::paged_attention_scratch_floats(head_dim)) * 4) {
    return internal_error("paged attention: head_dim " + std::to_string(head_dim) +
                          " was not reserved at load");
  }
  return cu::paged_attention(q.data, b.tokens, b.tok_seq.as<const int32_t>(),
                             b.tok_pos.as<const int32_t>(), b.tables.as<const int32_t>(), b.stride,
                             b.block_size, cache.k.data, cache.v.data, n_heads, n_kv_heads,
                             head_dim, scale, b.max_seen, partial_.as<float>(), out.data, cact_);
}

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(const CudaBackendOptions& opts) {
  if (opts.max_tokens <= 0) return invalid_argument("max_tokens must be positive");
  auto b = std::make_unique<CudaBackend>(opts);
  VLM_RETURN_IF_ERROR(b->init().with_context("starting the CUDA backend"));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace vlm::ops

#include "ops/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/huge_page_buffer.h"
#include "kernels/cpu/matmul.h"

namespace vlm::ops {
namespace {

// The checkpoint's views themselves (one, or several stacked by rows).
class CpuLinear final : public Linear {
 public:
  CpuLinear(std::vector<TensorView> parts, bool fp16, Bf16Gemm gemm)
      : parts_(std::move(parts)), fp16_(fp16), gemm_(gemm) {
    cols_ = parts_.front().dim(1);
    for (const TensorView& p : parts_) rows_ += p.dim(0);
    for (const TensorView& p : parts_) ptrs_.push_back(&p);
    for (size_t i = 0; i < parts_.size(); ++i) {  // the parts grouped by their column order
      const int32_t* perm = parts_[i].in_perm;
      auto same = [&](const Order& o) {
        return o.perm == perm || (o.perm != nullptr && perm != nullptr &&
                                  std::memcmp(o.perm, perm, static_cast<size_t>(cols_) * 4) == 0);
      };
      auto it = std::find_if(orders_.begin(), orders_.end(), same);
      if (it == orders_.end()) it = orders_.insert(orders_.end(), Order{perm, {}});
      it->parts.push_back(i);
    }
  }
  // The parts whose columns multiply x in one order (TensorView::in_perm; null: x's own).
  struct Order {
    const int32_t* perm;
    std::vector<size_t> parts;
  };
  int64_t bytes() const override {
    int64_t total = 0;
    for (const TensorView& v : parts_) {
      total += static_cast<int64_t>(v.nbytes() + v.quant_nbytes());
    }
    return total;
  }
  const std::vector<TensorView>& parts() const { return parts_; }
  std::span<const TensorView* const> ptrs() const { return ptrs_; }
  bool fp16() const { return fp16_; }
  Bf16Gemm gemm() const { return gemm_; }
  const std::vector<Order>& orders() const { return orders_; }
  bool permuted() const { return orders_.size() != 1 || orders_.front().perm != nullptr; }

 private:
  std::vector<TensorView> parts_;
  std::vector<Order> orders_;
  std::vector<const TensorView*> ptrs_;
  bool fp16_;
  Bf16Gemm gemm_;
};

const CpuLinear& cpu(const Linear& l) { return static_cast<const CpuLinear&>(l); }
float* f(Buf b) { return b.as<float>(); }
const int32_t* i32(Buf b) { return b.as<const int32_t>(); }

}  // namespace

Result<Buffer> CpuBackend::alloc(int64_t elems, DType t, bool lazy) {
  const size_t bytes = dtype_nbytes(t, std::max<int64_t>(elems, 0));
  // From 1 MiB a mapping of its own, as the lazy reservation: zero pages from the kernel, resident
  // only where written. calloc serves blocks up to glibc's mmap threshold (4 MiB, Engine::load)
  // from the heap, where reused memory is cleared and so resident whole: the decoder's scratch,
  // sized for the longest prefill chunk, cost its full size whatever rows the steps reached.
  constexpr size_t kMappedBytes = size_t{1} << 20;
  if (lazy || bytes >= kMappedBytes) {
    VLM_ASSIGN_OR_RETURN(HugePageBuffer mem, HugePageBuffer::allocate(bytes, /*noreserve=*/true));
    auto owner = std::make_shared<HugePageBuffer>(std::move(mem));
    return Buffer(Buf{owner->data(), Device::kCpu, t}, bytes, owner);
  }
  void* p = std::calloc(std::max<size_t>(bytes, 1), 1);
  if (p == nullptr)
    return unavailable("out of memory allocating " + std::to_string(bytes) + " bytes");
  return Buffer(Buf{p, Device::kCpu, t}, bytes, std::shared_ptr<void>(p, std::free));
}

Result<Buffer> CpuBackend::alloc_host(size_t bytes) {
  return alloc(static_cast<int64_t>(bytes), DType::kU8, false);
}

Status CpuBackend::to_device(Buf dst, const void* host, size_t bytes) {
  if (dst.data != host) std::memcpy(dst.data, host, bytes);
  return ok_status();
}

Status CpuBackend::to_host(void* host, Buf src, size_t bytes) {
  if (src.data != host) std::memcpy(host, src.data, bytes);
  return ok_status();
}

Result<Buf> CpuBackend::stage(const void* host, size_t, DType t, Buffer*) {
  return Buf{const_cast<void*>(host), Device::kCpu, t};
}

Result<std::unique_ptr<Linear>> CpuBackend::linear(std::span<const TensorView* const> stack,
                                                   const LinearOptions& opts) {
  if (stack.empty()) return invalid_argument("a linear layer needs a weight");
  std::vector<TensorView> parts;
  for (const TensorView* t : stack) {
    VLM_RETURN_IF_ERROR(check_linear_weight(*t, stack.front()->dim(1)));
    parts.push_back(*t);
  }
  if (opts.fp16_arithmetic && parts.size() != 1) {
    return invalid_argument("FP16 arithmetic takes one weight, not a stack");
  }
  if (opts.fp16_arithmetic && parts.front().in_perm != nullptr) {
    return invalid_argument("FP16 arithmetic takes weights in x's column order (no in_perm)");
  }
  return std::unique_ptr<Linear>(
      new CpuLinear(std::move(parts), opts.fp16_arithmetic, opts.bf16_gemm.value_or(bf16_gemm_)));
}

Result<Buf> CpuBackend::vector(const std::vector<float>& v) {
  return Buf{const_cast<float*>(v.data()), Device::kCpu, DType::kF32};
}

Status CpuBackend::embed(const Linear& table, Buf ids, int64_t count, Buf out) {
  if (cpu(table).parts().front().in_perm != nullptr) {
    return invalid_argument("an embedding table with reordered columns (in_perm)");
  }
  embedding_lookup(cpu(table).parts().front(), i32(ids), count, f(out));
  return ok_status();
}

Status CpuBackend::rms_norm(Buf x, Buf w, int64_t rows, int64_t n, float eps, Buf y) {
  ops::rms_norm(f(x), f(w), rows, n, eps, f(y), pool_, isa_);
  return ok_status();
}

Status CpuBackend::add_rms_norm(Buf x, Buf delta, Buf w, int64_t rows, int64_t n, float eps,
                                Buf y) {
  ops::add_rms_norm(f(x), f(delta), f(w), rows, n, eps, f(y), pool_, isa_);
  return ok_status();
}

Status CpuBackend::add(Buf x, Buf delta, Buf bias, int64_t rows, int64_t n) {
  add_residual(f(x), f(delta), f(bias), rows, n, pool_, isa_);
  return ok_status();
}

Status CpuBackend::linear(Buf x, int64_t M, const Linear& w, Buf y) {
  const CpuLinear& l = cpu(w);
  if (l.fp16()) {
    matmul_f16(f(x), M, l.cols(), l.parts().front(), f(y), pool_, isa_);
    return ok_status();
  }
  // The outputs side by side in y's rows, one pass of the threads over the stacked weights.
  float* ys[8];
  const size_t n = l.parts().size();
  if (n > 8) return internal_error("a linear stack of more than 8 weights");
  int64_t col = 0;
  for (size_t i = 0; i < n; ++i) {
    ys[i] = f(y) + col;
    col += l.parts()[i].dim(0);
  }
  if (!l.permuted()) {
    matmul_multi(f(x), M, l.cols(), l.ptrs(), std::span<float* const>(ys, n), pool_, isa_, l.rows(),
                 l.gemm(), decode_);
    return ok_status();
  }
  // Activation-ordered weights: x's columns gathered into each part's order, then its product.
  const int64_t K = l.cols();
  for (const CpuLinear::Order& o : l.orders()) {
    const float* xo = f(x);
    if (o.perm != nullptr) {
      perm_x_.resize(static_cast<size_t>(M * K));
      float* xp = perm_x_.data();
      const float* x0 = f(x);
      pool_.parallel_for(M, 1, [&](int64_t m0, int64_t m1, int) {
        for (int64_t m = m0; m < m1; ++m) {
          for (int64_t k = 0; k < K; ++k) xp[m * K + k] = x0[m * K + o.perm[k]];
        }
      });
      xo = xp;
    }
    const TensorView* ws[8];
    float* yo[8];
    for (size_t i = 0; i < o.parts.size(); ++i) {
      ws[i] = l.ptrs()[o.parts[i]];
      yo[i] = ys[o.parts[i]];
    }
    matmul_multi(xo, M, K, std::span<const TensorView* const>(ws, o.parts.size()),
                 std::span<float* const>(yo, o.parts.size()), pool_, isa_, l.rows(), l.gemm(),
                 decode_);
  }
  return ok_status();
}

namespace {

KvPool pool_of(const KvLayer& c) {
  KvPool p;
  p.k = c.k.data;
  p.v = c.v.data;
  p.k_scale = c.k_scale.as<float>();
  p.v_scale = c.v_scale.as<float>();
  p.type = c.k.dtype;
  return p;
}

}  // namespace

Status CpuBackend::qkv_rope_store(Buf qkv, int64_t tokens, int64_t n_heads, int64_t n_kv_heads,
                                  int64_t head_dim, Buf q_norm, Buf k_norm, float eps, Buf cos,
                                  Buf sin, Buf slots, Buf q, const KvLayer& cache) {
  ops::qkv_rope_store(f(qkv), tokens, n_heads, n_kv_heads, head_dim, f(q_norm), f(k_norm), eps,
                      f(cos), f(sin), i32(slots), f(q), pool_of(cache), pool_, isa_);
  return ok_status();
}

Status CpuBackend::paged_attention(Buf q, const AttentionBatch& b, const KvLayer& cache,
                                   int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                   float scale, Buf out) {
  const int64_t qd = n_heads * head_dim;
  const KvPool kv = pool_of(cache);
  for (int64_t s = 0; s < b.seqs; ++s) {
    const int64_t row = b.seq_row[s];
    attention_paged(f(q) + row * qd, b.seq_len[s], b.seq_pos[s], kv, b.tables_host + s * b.stride,
                    b.block_size, n_heads, n_kv_heads, head_dim, scale, f(out) + row * qd, pool_,
                    isa_);
  }
  return ok_status();
}

Status CpuBackend::silu_mul(Buf gu, int64_t rows, int64_t n, Buf out) {
  silu_mul_rows(f(gu), rows, n, f(out), pool_, isa_);
  return ok_status();
}

Status CpuBackend::qkv_gated_rope_store(Buf qkv, int64_t tokens, int64_t n_heads,
                                        int64_t n_kv_heads, int64_t head_dim, int64_t rotary_dim,
                                        Buf q_norm, Buf k_norm, float eps, Buf cos, Buf sin,
                                        Buf slots, Buf q, Buf gate, const KvLayer& cache) {
  ops::qkv_gated_rope_store(f(qkv), tokens, n_heads, n_kv_heads, head_dim, rotary_dim, f(q_norm),
                            f(k_norm), eps, f(cos), f(sin), i32(slots), f(q), f(gate),
                            pool_of(cache), pool_, isa_);
  return ok_status();
}

Status CpuBackend::copy(Buf dst, Buf src, size_t bytes) {
  std::memcpy(dst.data, src.data, bytes);
  return ok_status();
}

Status CpuBackend::sigmoid_mul(Buf x, Buf g, int64_t rows, int64_t n) {
  ops::sigmoid_mul(f(x), f(g), n, rows, n, pool_, isa_);
  return ok_status();
}

Status CpuBackend::gated_delta_net(Buf proj, const AttentionBatch& b, const DeltaNetLayer& layer,
                                   Buf states, Buf mixed, Buf out) {
  const DeltaNetShape& s = layer.shape;
  if (b.seq_slot == nullptr) return internal_error("gated_delta_net: the batch has no state slots");
  if (delta_seqs_.size() < static_cast<size_t>(b.seqs)) {  // grows rarely: to 64 sequences at once
    delta_seqs_.resize(static_cast<size_t>(std::max<int64_t>(b.seqs, 64)));
  }
  for (int64_t i = 0; i < b.seqs; ++i) {
    DeltaNetSeq& q = delta_seqs_[static_cast<size_t>(i)];
    q.row = b.seq_row[i];
    q.len = b.seq_len[i];
    q.fresh = b.seq_pos[i] == 0;
    q.conv = f(states) + b.seq_slot[i] * s.state_floats();
    q.state = q.conv + s.conv_state();
    const int32_t ts = b.seq_token_slot != nullptr ? b.seq_token_slot[i] : -1;
    q.token_states = ts >= 0 ? f(states) + ts * s.state_floats() : nullptr;
  }
  ops::gated_delta_net(f(proj), s.proj_dim(), delta_seqs_.data(), b.seqs, s, f(layer.conv_w),
                       f(layer.a_log), f(layer.dt_bias), f(mixed), f(out), pool_, isa_);
  return ok_status();
}

Status CpuBackend::gated_rms_norm(Buf x, Buf z, int64_t z_stride, int64_t rows, int64_t heads,
                                  int64_t n, Buf w, float eps, Buf y) {
  ops::gated_rms_norm(f(x), f(z), z_stride, rows, heads, n, f(w), eps, f(y), pool_, isa_);
  return ok_status();
}

Status CpuBackend::set_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) {
  for (int64_t i = 0; i < count; ++i) std::copy_n(f(src) + i * n, n, f(x) + i32(rows)[i] * n);
  return ok_status();
}

Status CpuBackend::add_rows(Buf x, Buf rows, Buf src, int64_t count, int64_t n) {
  for (int64_t i = 0; i < count; ++i) {
    const float* s = f(src) + i * n;
    float* xr = f(x) + i32(rows)[i] * n;
    for (int64_t d = 0; d < n; ++d) xr[d] += s[d];
  }
  return ok_status();
}

Status CpuBackend::gather_rows(Buf x, Buf rows, int64_t count, int64_t n, Buf out) {
  for (int64_t i = 0; i < count; ++i) std::copy_n(f(x) + i32(rows)[i] * n, n, f(out) + i * n);
  return ok_status();
}

Status CpuBackend::add_sigmoid_scaled(Buf x, Buf y, Buf g, int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-f(g)[r]));
    float* o = f(x) + r * n;
    const float* v = f(y) + r * n;
    for (int64_t d = 0; d < n; ++d) o[d] += s * v[d];
  }
  return ok_status();
}

Status CpuBackend::moe_route(Buf logits, int64_t rows, int64_t E, int64_t k, bool renormalize,
                             Buf ids, Buf weights) {
  if (k <= 0 || k > E) return internal_error("moe_route: top_k outside [1, n_experts]");
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = f(logits) + r * E;
    int32_t* id = ids.as<int32_t>() + r * k;
    float* w = f(weights) + r * k;
    // The k largest, best first: an expert moves ahead only of strictly smaller logits, so of
    // equal ones the lower index (seen first) stays in front.
    int64_t n = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (n == k && !(l[e] > l[id[k - 1]])) continue;
      int64_t at = n < k ? n++ : k - 1;
      for (; at > 0 && l[e] > l[id[at - 1]]; --at) id[at] = id[at - 1];
      id[at] = static_cast<int32_t>(e);
    }
    // softmax over all E (f32, the max subtracted), then the chosen ones renormalised.
    const float m = l[id[0]];
    float sum = 0;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(l[e] - m);
    float chosen = 0;
    for (int64_t j = 0; j < k; ++j) {
      w[j] = std::exp(l[id[j]] - m) / sum;
      chosen += w[j];
    }
    if (renormalize) {
      for (int64_t j = 0; j < k; ++j) w[j] /= chosen;
    }
  }
  return ok_status();
}

Status CpuBackend::moe_experts(Buf x, int64_t rows, Buf ids, Buf weights, int64_t k,
                               std::span<const Linear* const> gate_up,
                               std::span<const Linear* const> down, Buf scratch, Buf out) {
  const auto E = static_cast<int64_t>(gate_up.size());
  if (E == 0 || down.size() != gate_up.size()) return internal_error("moe_experts: no experts");
  const int64_t n = gate_up.front()->cols(), I = down.front()->cols();
  // The (row, weight) pairs grouped by expert, rows in order inside a group (a counting sort).
  moe_start_.assign(static_cast<size_t>(E + 1), 0);
  const int32_t* id = i32(ids);
  for (int64_t i = 0; i < rows * k; ++i) {
    if (id[i] < 0 || id[i] >= E) return internal_error("moe_experts: expert id out of range");
    ++moe_start_[static_cast<size_t>(id[i]) + 1];
  }
  for (int64_t e = 0; e < E; ++e) moe_start_[e + 1] += moe_start_[e];
  if (moe_rows_.size() < static_cast<size_t>(rows * k)) {
    moe_rows_.resize(static_cast<size_t>(rows * k));
    moe_weights_.resize(static_cast<size_t>(rows * k));
  }
  {
    std::vector<int64_t>& next = moe_start_;  // advanced while filling, restored after
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t j = 0; j < k; ++j) {
        const int64_t at = next[static_cast<size_t>(id[r * k + j])]++;
        moe_rows_[at] = static_cast<int32_t>(r);
        moe_weights_[at] = f(weights)[r * k + j];
      }
    }
    for (int64_t e = E; e > 0; --e) next[e] = next[e - 1];
    next[0] = 0;
  }
  float* xs = f(scratch);        // [rows, n]: the expert's rows of x
  float* gu = xs + rows * n;     // [rows, 2·I]
  float* h = gu + rows * 2 * I;  // [rows, I]
  float* ys = h + rows * I;      // [rows, n]
  auto at = [](float* p) { return Buf{p, Device::kCpu, DType::kF32}; };
  std::fill_n(f(out), rows * n, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t b = moe_start_[e], cnt = moe_start_[e + 1] - b;
    if (cnt == 0) continue;
    for (int64_t i = 0; i < cnt; ++i) std::copy_n(f(x) + moe_rows_[b + i] * n, n, xs + i * n);
    VLM_RETURN_IF_ERROR(linear(at(xs), cnt, *gate_up[e], at(gu)));
    silu_mul_rows(gu, cnt, I, h, pool_, isa_);
    VLM_RETURN_IF_ERROR(linear(at(h), cnt, *down[e], at(ys)));
    for (int64_t i = 0; i < cnt; ++i) {
      const float w = moe_weights_[b + i];
      float* o = f(out) + moe_rows_[b + i] * n;
      const float* y = ys + i * n;
      for (int64_t d = 0; d < n; ++d) o[d] += w * y[d];
    }
  }
  return ok_status();
}

Status CpuBackend::layer_norm(Buf x, Buf w, Buf b, int64_t rows, int64_t n, float eps, Buf y) {
  ops::layer_norm(f(x), f(w), f(b), rows, n, eps, f(y), pool_, isa_);
  return ok_status();
}

Status CpuBackend::add_layer_norm(Buf x, Buf delta, Buf bias, Buf w, Buf b, int64_t rows, int64_t n,
                                  float eps, Buf y) {
  ops::add_layer_norm(f(x), f(delta), f(bias), f(w), f(b), rows, n, eps, f(y), pool_, isa_);
  return ok_status();
}

Status CpuBackend::bias_gelu(Buf x, Buf bias, int64_t rows, int64_t n, bool tanh) {
  if (tanh) {
    gelu_tanh(f(x), f(bias), rows, n, pool_, isa_);
  } else {
    gelu_erf(f(x), f(bias), rows, n, pool_, isa_);
  }
  return ok_status();
}

Status CpuBackend::add_bias(Buf x, Buf bias, int64_t rows, int64_t n) {
  ops::add_bias(f(x), f(bias), rows, n);
  return ok_status();
}

Status CpuBackend::split_qkv(Buf qkv, Buf bias, int64_t rows, int64_t n, Buf q, Buf k, Buf v) {
  const float* b = f(bias);
  for (int64_t i = 0; i < rows; ++i) {  // [rows, 3, n] + bias → three [rows, n]
    const float* r = f(qkv) + i * 3 * n;
    float* dst[3] = {f(q) + i * n, f(k) + i * n, f(v) + i * n};
    for (int64_t part = 0; part < 3; ++part) {
      for (int64_t d = 0; d < n; ++d) dst[part][d] = r[part * n + d] + b[part * n + d];
    }
  }
  return ok_status();
}

Status CpuBackend::rope(Buf x, int64_t tokens, int64_t n_heads, int64_t head_dim, Buf cos,
                        Buf sin) {
  rope_neox(f(x), tokens, n_heads, head_dim, f(cos), f(sin), pool_, isa_);
  return ok_status();
}

Status CpuBackend::attention_full(Buf q, Buf k, Buf v, int64_t n, int64_t n_heads, int64_t head_dim,
                                  float scale, Buf out) {
  ops::attention_full(f(q), f(k), f(v), n, n_heads, head_dim, scale, f(out), pool_, isa_);
  return ok_status();
}

static_assert(CpuBackend::kRowSliceGrain % ops::kAttentionRowGrain == 0 &&
                  CpuBackend::kRowSliceGrain % 16 == 0 &&
                  CpuBackend::kRowSliceGrain >= kernels::kPackedMinRows,
              "row parts run the whole call's attention blocks, GEMM tiles and kernels");

Status CpuBackend::attention_full_rows(Buf q, Buf k, Buf v, int64_t n, int64_t q0, int64_t q1,
                                       int64_t n_heads, int64_t head_dim, float scale, Buf out) {
  if (q0 < 0 || q1 > n || q0 > q1 || (q0 % ops::kAttentionRowGrain != 0)) {
    return invalid_argument("attention_full_rows: rows [" + std::to_string(q0) + ", " +
                            std::to_string(q1) + ") of " + std::to_string(n));
  }
  ops::attention_full_rows(f(q), f(k), f(v), n, q0, q1, n_heads, head_dim, scale, f(out), pool_,
                           isa_);
  return ok_status();
}

Status CpuBackend::convert(Buf src, int64_t count, Buf dst) {
  if (src.data != dst.data) std::copy_n(f(src), count, f(dst));
  return ok_status();
}

}  // namespace vlm::ops

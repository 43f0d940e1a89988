// The one place that picks a kernel for an op: by weight dtype and CPU ISA level.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "ops/ops.h"

namespace vlm::ops {
namespace {

Isa detect_hardware() {
#if defined(VLM_HAVE_X86_DISPATCH)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("fma")) {
    return Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return Isa::kAvx2;
  }
#endif
  return Isa::kGeneric;
}

Isa detect_capped() {
  Isa hw = detect_hardware();
  const char* env = std::getenv("VLM_CPU_ISA");
  if (env == nullptr || *env == '\0') return hw;
  Isa want = hw;
  if (std::strcmp(env, "generic") == 0) want = Isa::kGeneric;
  if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
  if (std::strcmp(env, "avx512") == 0) want = Isa::kAvx512;
  // The variable only lowers the level: asking for more than the CPU has keeps the hardware level.
  return static_cast<int>(want) < static_cast<int>(hw) ? want : hw;
}

// Weight rows converted per block when many x rows share them (see matmul_kernel.inc).
// 32 = the packed kernel's panel width (kernels/cpu/matmul.h).
constexpr int64_t kScratchRows = 32;

using MatmulRowsFn = decltype(&kernels::generic::matmul_rows);

// From this many x rows on, I4 weights are widened to BF16 for the BF16 kernel (below).
constexpr int64_t kInt4WidenMinRows = 8;

// y = x · w^T for I4 weights. Few x rows (decode): the INT4 kernel streams the packed rows.
// Many: each thread widens blocks of kScratchRows rows to BF16 in a thread_local [32, K] buffer
// and runs `bf16_kernel` on them, so INT4 prefill costs the BF16 GEMM plus one widening of the
// weights (N · K, against its M · N · K).
// NOTE(vlm): BF16, not f32: rounding q · scale to BF16 moves a weight by at most 2^-9 of itself,
// far below the INT4 step (the ops tests bound it), and it lets the BF16 GEMM serve INT4 too.
void matmul_int4(const float* x, int64_t M, int64_t K, const TensorView& w, float* y,
                 ThreadPool& pool, Isa isa, MatmulRowsFn bf16_kernel) {
  const int64_t N = w.dim(0);
  const auto* q = static_cast<const uint8_t*>(w.data);
  auto* q4_kernel = &kernels::generic::matmul_rows_q4;
  auto* widen = &kernels::generic::dequantize_rows_q4_bf16;
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == Isa::kAvx512) {
    q4_kernel = &kernels::avx512::matmul_rows_q4;
    widen = &kernels::avx512::dequantize_rows_q4_bf16;
  }
  if (isa == Isa::kAvx2) {
    q4_kernel = &kernels::avx2::matmul_rows_q4;
    widen = &kernels::avx2::dequantize_rows_q4_bf16;
  }
#endif
  if (M < kInt4WidenMinRows) {
    pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1, int) {
      q4_kernel(x, M, K, q, w.scale, n0, n1, y, N);
    });
    return;
  }
  pool.parallel_for(N, kScratchRows, [&](int64_t n0, int64_t n1, int) {
    // Grow once to the largest K seen, then reused (no allocation in steady state).
    thread_local std::vector<uint16_t> rows;  // [kScratchRows, K] BF16 bits
    thread_local std::vector<float> scratch;  // the BF16 kernel's [kScratchRows, K]
    const size_t need = static_cast<size_t>(kScratchRows * K);
    if (rows.size() < need) rows.resize(need);
    if (scratch.size() < need) scratch.resize(need);
    for (int64_t nb = n0; nb < n1; nb += kScratchRows) {
      const int64_t ne = std::min(n1, nb + kScratchRows);
      widen(q, w.scale, K, nb, ne, rows.data());
      bf16_kernel(x, M, K, DType::kBF16, rows.data(), nullptr, 0, ne - nb, y + nb, N,
                  scratch.data(), kScratchRows);
    }
  });
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric: return "generic";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "?";
}

Isa detected_isa() {
  static const Isa isa = detect_capped();
  return isa;
}

std::vector<Isa> runnable_isas() {
  std::vector<Isa> out;
  Isa hw = detect_hardware();
  for (Isa i : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (static_cast<int>(i) <= static_cast<int>(hw)) out.push_back(i);
  }
  return out;
}

Status check_linear_weight(const TensorView& w, int64_t in_features) {
  if (w.rank() != 2) return invalid_argument("linear weight must be 2-D, got " + shape_to_string(w.shape));
  if (w.dtype != DType::kF32 && w.dtype != DType::kBF16 && w.dtype != DType::kF16 &&
      w.dtype != DType::kI8 && w.dtype != DType::kI4) {
    return invalid_argument(std::string("unsupported weight dtype ") + dtype_name(w.dtype));
  }
  if (w.dtype == DType::kI8 && w.scale == nullptr) {
    return invalid_argument("I8 linear weight " + shape_to_string(w.shape) +
                            " has no per-row scales");
  }
  if (w.dtype == DType::kI4 && w.scale == nullptr) {
    return invalid_argument("I4 linear weight " + shape_to_string(w.shape) +
                            " has no group scales");
  }
  if (w.dtype == DType::kI4 && w.dim(1) % kInt4Group != 0) {
    return invalid_argument("I4 linear weight " + shape_to_string(w.shape) +
                            " has a row length that is not a multiple of " +
                            std::to_string(kInt4Group));
  }
  if (w.dim(1) != in_features) {
    return invalid_argument("linear weight " + shape_to_string(w.shape) + " does not take " +
                            std::to_string(in_features) + " inputs");
  }
  return ok_status();
}

void matmul(const float* x, int64_t M, int64_t K, const TensorView& w, float* y, ThreadPool& pool,
            Isa isa) {
  const int64_t N = w.dim(0);
  auto* kernel = &kernels::generic::matmul_rows;
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == Isa::kAvx512) kernel = &kernels::avx512::matmul_rows;
  if (isa == Isa::kAvx2) kernel = &kernels::avx2::matmul_rows;
#endif
  if (w.dtype == DType::kI4) {
    matmul_int4(x, M, K, w, y, pool, isa, kernel);
    return;
  }
  const bool want_scratch = (M >= 8 && w.dtype != DType::kF32) || M >= kernels::kPackedMinRows;
  // Grain: 16 rows of w keeps the 4-row micro-kernel busy and spreads N over the threads.
  pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1, int) {
    // NOTE: thread_local scratch grows once to the largest K seen, then is reused: steady-state
    // decoding allocates nothing (M == 1 never asks for scratch at all).
    thread_local std::vector<float> scratch;
    float* s = nullptr;
    if (want_scratch) {
      if (scratch.size() < static_cast<size_t>(kScratchRows * K)) scratch.resize(kScratchRows * K);
      s = scratch.data();
    }
    kernel(x, M, K, w.dtype, w.data, w.scale, n0, n1, y, N, s, kScratchRows);
  });
}

}  // namespace vlm::ops

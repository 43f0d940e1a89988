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
      w.dtype != DType::kI8) {
    return invalid_argument(std::string("unsupported weight dtype ") + dtype_name(w.dtype));
  }
  if (w.dtype == DType::kI8 && w.scale == nullptr) {
    return invalid_argument("I8 linear weight " + shape_to_string(w.shape) +
                            " has no per-row scales");
  }
  if (w.dim(1) != in_features) {
    return invalid_argument("linear weight " + shape_to_string(w.shape) + " does not take " +
                            std::to_string(in_features) + " inputs");
  }
  return ok_status();
}

void matmul(const float* x, int64_t M, int64_t K, const TensorView& w, float* y, ThreadPool& pool,
            Isa isa) {
  const TensorView* ws[] = {&w};
  float* ys[] = {y};
  matmul_multi(x, M, K, ws, ys, pool, isa);
}

namespace {

using MatmulRowsFn = decltype(&kernels::generic::matmul_rows);

MatmulRowsFn matmul_kernel(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  if (isa == Isa::kAvx512) return &kernels::avx512::matmul_rows;
  if (isa == Isa::kAvx2) return &kernels::avx2::matmul_rows;
#endif
  return &kernels::generic::matmul_rows;
}

bool wants_scratch(int64_t M, DType wtype) {
  return M >= kernels::kPackedMinRows || (M >= 8 && wtype != DType::kF32);
}

}  // namespace

void matmul_multi(const float* x, int64_t M, int64_t K, std::span<const TensorView* const> ws,
                  std::span<float* const> ys, ThreadPool& pool, Isa isa) {
  const MatmulRowsFn kernel = matmul_kernel(isa);
  int64_t total = 0;
  bool want_scratch = false;
  for (const TensorView* w : ws) {
    total += w->dim(0);
    want_scratch = want_scratch || wants_scratch(M, w->dtype);
  }
  // (A named reference: inside the lambda, the thread_local itself would name each worker's own.)
  thread_local PerThreadBuffers scratch_tls;
  PerThreadBuffers& scratch = scratch_tls;
  if (want_scratch) scratch.reserve(pool.n_threads(), matmul_scratch_floats(K));
  // Grain: 16 rows of w keeps the 4-row micro-kernel busy and spreads N over the threads. A
  // thread's range of the stacked rows may span several weights: each part runs on its own.
  pool.parallel_for(total, 16, [&](int64_t n0, int64_t n1, int t) {
    float* s = want_scratch ? scratch.get(t) : nullptr;
    int64_t off = 0;
    for (size_t i = 0; i < ws.size() && off < n1; ++i) {
      const TensorView& w = *ws[i];
      const int64_t N = w.dim(0);
      const int64_t b = std::max(n0, off), e = std::min(n1, off + N);
      if (b < e) {
        kernel(x, M, K, w.dtype, w.data, w.scale, b - off, e - off, ys[i], N, s, kScratchRows);
      }
      off += N;
    }
  });
}

int64_t matmul_scratch_floats(int64_t K) { return kScratchRows * K; }

void matmul_on_this_thread(const float* x, int64_t M, int64_t K, const TensorView& w, float* y,
                           float* scratch, Isa isa) {
  const int64_t N = w.dim(0);
  matmul_kernel(isa)(x, M, K, w.dtype, w.data, w.scale, 0, N, y, N, scratch, kScratchRows);
}

}  // namespace vlm::ops

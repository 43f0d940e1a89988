// cuBLAS behind src/kernels/cuda/gemm.h. Row-major y = x·Wᵀ is column-major yᵀ = W·xᵀ, where W's
// row-major [N, K] storage is a column-major [K, N] matrix used transposed.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <limits>
#include <string>

namespace vlm::cuda {
namespace {

Status from(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string("cuBLAS ") + what + ": " + cublasGetStatusString(s));
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // false: cuBLASLt had no algorithm (or failed): cublasGemmEx instead
  ~Plan() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

// yᵀ [N, M] (column-major, ld ldy) = op(A) · B with A = W as a column-major [K, N] (ld K) used
// transposed and B = xᵀ as a column-major [K, M] (ld K); f32 compute and scale.
Gemm::Plan* Gemm::plan_for(const Shape& shape) {
  auto it = plans_.find(shape);
  if (it != plans_.end()) return it->second.get();
  const auto [M, N, K, ldy, in_i, out_i] = shape;
  const auto in = static_cast<cudaDataType_t>(in_i), out = static_cast<cudaDataType_t>(out_i);
  auto p = std::make_unique<Plan>();
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  size_t ws = workspace_.bytes();
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const bool ok =
      cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
          CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->a, in, K, N, K) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->b, in, K, M, K) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatrixLayoutCreate(&p->c, out, N, M, ldy) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof ws) == CUBLAS_STATUS_SUCCESS &&
      cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), p->op, p->a, p->b, p->c,
                                     p->c, pref, 1, &result, &found) == CUBLAS_STATUS_SUCCESS;
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  p->usable = ok && found > 0;
  if (p->usable) p->algo = result.algo;
  return (plans_[shape] = std::move(p)).get();
}

Status Gemm::create(std::unique_ptr<Gemm>* out) {
  std::unique_ptr<Gemm> g(new Gemm());
  cublasHandle_t h = nullptr;
  if (Status s = from(cublasCreate(&h), "create"); !s.ok()) return s;
  g->handle_ = h;
  cublasLtHandle_t lt = nullptr;
  if (Status s = from(cublasLtCreate(&lt), "Lt create"); !s.ok()) return s;
  g->lt_ = lt;
  constexpr size_t kWorkspace = size_t{32} << 20;  // what cuBLAS asks for on Hopper, with room
  if (Status s = DeviceBuffer::allocate(kWorkspace, &g->workspace_); !s.ok()) return s;
  if (Status s = from(cublasSetWorkspace(h, g->workspace_.data(), kWorkspace), "workspace");
      !s.ok()) {
    return s;
  }
  *out = std::move(g);
  return ok_status();
}

Gemm::~Gemm() {
  plans_.clear();
  if (lt_ != nullptr) cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

Status Gemm::matmul(const void* x, const void* w, DType in_t, int64_t M, int64_t N, int64_t K,
                    void* y, DType y_t, int64_t ldy) {
  if (in_t == DType::kF32 && y_t != DType::kF32)
    return invalid_argument("gemm: F32 inputs give F32");
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (ldy == 0) ldy = N;
  if (M < 0 || N < 0 || K < 0 || M > kMax || N > kMax || K > kMax || ldy < N || ldy > kMax) {
    return invalid_argument("gemm: shape out of range");
  }
  if (M == 0 || N == 0) return ok_status();
  const float alpha = 1.f, beta = 0.f;
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  const cudaDataType_t in = in_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  auto* h = static_cast<cublasHandle_t>(handle_);
  if (void* st = current_stream(); st != stream_ || !stream_set_) {
    // cublasSetStream resets the workspace to cuBLAS's own pool: ours goes back at once.
    VLM_RETURN_IF_ERROR(from(cublasSetStream(h, static_cast<cudaStream_t>(st)), "stream"));
    VLM_RETURN_IF_ERROR(
        from(cublasSetWorkspace(h, workspace_.data(), workspace_.bytes()), "workspace"));
    stream_ = st;
    stream_set_ = true;
  }
  const cudaDataType_t out = y_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  Plan* p = plan_for(Shape{M, N, K, ldy, static_cast<int>(in), static_cast<int>(out)});
  if (p->usable) {
    const cublasStatus_t st = cublasLtMatmul(
        static_cast<cublasLtHandle_t>(lt_), p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y,
        p->c, &p->algo, workspace_.data(), workspace_.bytes(), static_cast<cudaStream_t>(stream_));
    if (st == CUBLAS_STATUS_SUCCESS) return ok_status();
    p->usable = false;  // this shape goes the cublasGemmEx way from now on
  }
  return from(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, in, k, x, in, k, &beta,
                           y, y_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(ldy),
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "GemmEx");
}

Status Gemm::matmul_fp8(const void* x, const float* x_scale, const void* w, const float* w_scale,
                        int64_t M, int64_t N, int64_t K, void* y) {
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (M < 0 || N < 0 || K < 0 || M > kMax || N > kMax || K > kMax || K % 16 != 0) {
    return invalid_argument("fp8 gemm: shape out of range (K must be a multiple of 16)");
  }
  if (M == 0 || N == 0) return ok_status();
  Plan* p =
      plan_for(Shape{M, N, K, N, static_cast<int>(CUDA_R_8F_E4M3), static_cast<int>(CUDA_R_16BF)});
  if (!p->usable) return unimplemented("cuBLASLt has no FP8 (E4M3) algorithm for this shape");
  // The scales are read on the device when the product runs (a graph replays the same buffers).
  const auto a_scale = CUBLASLT_MATMUL_DESC_A_SCALE_POINTER;
  const auto b_scale = CUBLASLT_MATMUL_DESC_B_SCALE_POINTER;
  VLM_RETURN_IF_ERROR(from(cublasLtMatmulDescSetAttribute(p->op, a_scale, &w_scale, sizeof w_scale),
                           "fp8 A scale"));
  VLM_RETURN_IF_ERROR(from(cublasLtMatmulDescSetAttribute(p->op, b_scale, &x_scale, sizeof x_scale),
                           "fp8 B scale"));
  const float alpha = 1.f, beta = 0.f;
  return from(cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_), p->op, &alpha, w, p->a, x, p->b,
                             &beta, y, p->c, y, p->c, &p->algo, workspace_.data(),
                             workspace_.bytes(), static_cast<cudaStream_t>(current_stream())),
              "fp8 matmul");
}

}  // namespace vlm::cuda

// cuBLAS behind src/cuda/gemm.h. Row-major y = x·Wᵀ is column-major yᵀ = W·xᵀ, where W's
// row-major [N, K] storage is a column-major [K, N] matrix used transposed.
#include "cuda/gemm.h"

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

Status Gemm::create(std::unique_ptr<Gemm>* out) {
  std::unique_ptr<Gemm> g(new Gemm());
  cublasHandle_t h = nullptr;
  if (Status s = from(cublasCreate(&h), "create"); !s.ok()) return s;
  g->handle_ = h;
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
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

Status Gemm::matmul(const void* x, const void* w, DType in_t, int64_t M, int64_t N, int64_t K,
                    void* y, DType y_t, int64_t ldy) {
  if (in_t == DType::kF32 && y_t != DType::kF32) return invalid_argument("gemm: F32 inputs give F32");
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
  return from(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k,
                           &alpha, w, in, k, x, in, k, &beta, y,
                           y_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF, static_cast<int>(ldy),
                           CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT),
              "GemmEx");
}

}  // namespace vlm::cuda

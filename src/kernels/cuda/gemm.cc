// cuBLAS behind src/kernels/cuda/gemm.h. Row-major y = x·Wᵀ is column-major yᵀ = W·xᵀ, where W's
// row-major [N, K] storage is a column-major [K, N] matrix used transposed.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <limits>
#include <string>
#include <type_traits>

namespace vlm::cuda {
namespace {

// cuBLAS is opened when the first Gemm is made, not linked: linked, its libraries load (and
// cuBLASLt's initializers run) in every process, ~136 MiB resident on a CPU-only run. The
// functions used, by their exported names (cublas_v2.h maps cublasCreate to cublasCreate_v2, ...).
// clang-format off
#define VLM_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2) X(cublasSetWorkspace_v2) \
  X(cublasGetStatusString)
#define VLM_CUBLASLT_FUNCTIONS(X) \
  X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtMatmul) \
  X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute) \
  X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) \
  X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy) \
  X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)
// clang-format on

// The exported cublasGemmEx (cublas_api.h adds an inline C++ overload beside it).
using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);

struct Cublas {
#define VLM_CUBLAS_MEMBER(f) decltype(&::f) f = nullptr;
  VLM_CUBLAS_FUNCTIONS(VLM_CUBLAS_MEMBER)
  VLM_CUBLASLT_FUNCTIONS(VLM_CUBLAS_MEMBER)
#undef VLM_CUBLAS_MEMBER
  GemmExFn cublasGemmEx = nullptr;
  std::string error;  // why it could not be opened (empty: every function was found)
};

// The library by its soname (the loader's search: LD_LIBRARY_PATH, ld.so.cache), else at the
// toolkit's library directory found at configure time.
void* open_library(const char* soname, const char* toolkit_dir, std::string* error) {
  if (void* h = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  const char* why = ::dlerror();
  const std::string first = why != nullptr ? why : soname;
  const std::string path = std::string(toolkit_dir) + "/" + soname;
  if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  why = ::dlerror();
  *error = "cannot open cuBLAS (" + first + "; " + (why != nullptr ? why : path) +
           "): the CUDA backend needs the CUDA toolkit's cuBLAS libraries on the library path";
  return nullptr;
}

const Cublas& cublas() {
  static const Cublas api = [] {
    Cublas a;
    // cuBLASLt first: libcublas needs it, and finds it already loaded.
    void* lt = open_library(VLM_CUBLASLT_SONAME, VLM_CUDA_LIBRARY_DIR, &a.error);
    void* blas =
        lt == nullptr ? nullptr : open_library(VLM_CUBLAS_SONAME, VLM_CUDA_LIBRARY_DIR, &a.error);
    if (blas == nullptr) return a;
    const auto find = [&](void* lib, const char* name, auto* fn) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(::dlsym(lib, name));
      if (*fn == nullptr && a.error.empty()) a.error = std::string("cuBLAS lacks ") + name;
    };
#define VLM_CUBLAS_FIND(f) find(blas, #f, &a.f);
#define VLM_CUBLASLT_FIND(f) find(lt, #f, &a.f);
    VLM_CUBLAS_FUNCTIONS(VLM_CUBLAS_FIND)
    find(blas, "cublasGemmEx", &a.cublasGemmEx);
    VLM_CUBLASLT_FUNCTIONS(VLM_CUBLASLT_FIND)
#undef VLM_CUBLAS_FIND
#undef VLM_CUBLASLT_FIND
    return a;
  }();
  return api;
}

Status from(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return ok_status();
  return internal_error(std::string("cuBLAS ") + what + ": " + cublas().cublasGetStatusString(s));
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // false: cuBLASLt had no algorithm (or failed): cublasGemmEx instead
  ~Plan() {
    if (c != nullptr) cublas().cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublas().cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublas().cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublas().cublasLtMatmulDescDestroy(op);
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
      cublas().cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F) ==
          CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ==
          CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ==
          CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatrixLayoutCreate(&p->a, in, K, N, K) == CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatrixLayoutCreate(&p->b, in, K, M, K) == CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatrixLayoutCreate(&p->c, out, N, M, ldy) == CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof ws) == CUBLAS_STATUS_SUCCESS &&
      cublas().cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(lt_), p->op, p->a, p->b,
                                              p->c, p->c, pref, 1, &result,
                                              &found) == CUBLAS_STATUS_SUCCESS;
  if (pref != nullptr) cublas().cublasLtMatmulPreferenceDestroy(pref);
  p->usable = ok && found > 0;
  if (p->usable) p->algo = result.algo;
  return (plans_[shape] = std::move(p)).get();
}

Status Gemm::open_cublas() {
  const std::string& e = cublas().error;
  return e.empty() ? ok_status() : unavailable(e);
}

Status Gemm::create(std::unique_ptr<Gemm>* out) {
  VLM_RETURN_IF_ERROR(open_cublas());
  std::unique_ptr<Gemm> g(new Gemm());
  cublasHandle_t h = nullptr;
  if (Status s = from(cublas().cublasCreate_v2(&h), "create"); !s.ok()) return s;
  g->handle_ = h;
  cublasLtHandle_t lt = nullptr;
  if (Status s = from(cublas().cublasLtCreate(&lt), "Lt create"); !s.ok()) return s;
  g->lt_ = lt;
  constexpr size_t kWorkspace = size_t{32} << 20;  // what cuBLAS asks for on Hopper, with room
  if (Status s = DeviceBuffer::allocate(kWorkspace, &g->workspace_); !s.ok()) return s;
  if (Status s =
          from(cublas().cublasSetWorkspace_v2(h, g->workspace_.data(), kWorkspace), "workspace");
      !s.ok()) {
    return s;
  }
  *out = std::move(g);
  return ok_status();
}

Gemm::~Gemm() {
  plans_.clear();
  if (lt_ != nullptr) cublas().cublasLtDestroy(static_cast<cublasLtHandle_t>(lt_));
  if (handle_ != nullptr) cublas().cublasDestroy_v2(static_cast<cublasHandle_t>(handle_));
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
    VLM_RETURN_IF_ERROR(
        from(cublas().cublasSetStream_v2(h, static_cast<cudaStream_t>(st)), "stream"));
    VLM_RETURN_IF_ERROR(from(
        cublas().cublasSetWorkspace_v2(h, workspace_.data(), workspace_.bytes()), "workspace"));
    stream_ = st;
    stream_set_ = true;
  }
  const cudaDataType_t out = y_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  Plan* p = plan_for(Shape{M, N, K, ldy, static_cast<int>(in), static_cast<int>(out)});
  if (p->usable) {
    const cublasStatus_t st = cublas().cublasLtMatmul(
        static_cast<cublasLtHandle_t>(lt_), p->op, &alpha, w, p->a, x, p->b, &beta, y, p->c, y,
        p->c, &p->algo, workspace_.data(), workspace_.bytes(), static_cast<cudaStream_t>(stream_));
    if (st == CUBLAS_STATUS_SUCCESS) return ok_status();
    p->usable = false;  // this shape goes the cublasGemmEx way from now on
  }
  return from(cublas().cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, in, k, x, in,
                                    k, &beta, y, y_t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF,
                                    static_cast<int>(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
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
  VLM_RETURN_IF_ERROR(
      from(cublas().cublasLtMatmulDescSetAttribute(p->op, a_scale, &w_scale, sizeof w_scale),
           "fp8 A scale"));
  VLM_RETURN_IF_ERROR(
      from(cublas().cublasLtMatmulDescSetAttribute(p->op, b_scale, &x_scale, sizeof x_scale),
           "fp8 B scale"));
  const float alpha = 1.f, beta = 0.f;
  return from(
      cublas().cublasLtMatmul(static_cast<cublasLtHandle_t>(lt_), p->op, &alpha, w, p->a, x, p->b,
                              &beta, y, p->c, y, p->c, &p->algo, workspace_.data(),
                              workspace_.bytes(), static_cast<cudaStream_t>(current_stream())),
      "fp8 matmul");
}

}  // namespace vlm::cuda

#pragma once
// The CUDA backend's matrix products: y[M, N] = x[M, K] · W[N, K]ᵀ, with W as the
// checkpoint stores a linear layer (row-major [out, in]), BF16 or F32 inputs and f32
// accumulation (never TF32), through cuBLASLt with the algorithm its heuristic picks for each
// shape (asked once per shape and kept); cublasGemmEx where cuBLASLt offers none. Device
// pointers; the calling thread's current stream (cuda_ops.h).
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernels/cuda/cuda_ops.h"
#include "vlm/status.h"

namespace vlm::cuda {

class Gemm {
 public:
  static Status create(std::unique_ptr<Gemm>* out);
  // Opens cuBLAS (once per process: create does it first) and finds every function used; no GPU
  // needed. kUnavailable naming the libraries' error when it cannot.
  static Status open_cublas();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x [M, K] and w [N, K] row-major, both in in_t; y [M, N] row-major in y_t, rounded once from
  // the f32 sums. BF16 inputs give F32 or BF16 y; F32 inputs give F32 y.
  // ldy: elements between rows of y (0: N), so that y may be a column block of a wider matrix.
  Status matmul(const void* x, const void* w, DType in_t, int64_t M, int64_t N, int64_t K, void* y,
                DType y_t, int64_t ldy = 0);
  // The FP8 product (fp8.h): x [M, K] and w [N, K] in E4M3 with device scales (value = e4m3 ·
  // scale), y [M, N] BF16. An error where cuBLASLt has no FP8 algorithm for the shape.
  Status matmul_fp8(const void* x, const float* x_scale, const void* w, const float* w_scale,
                    int64_t M, int64_t N, int64_t K, void* y);

 private:
  // One shape's cuBLASLt descriptors and chosen algorithm (opaque here: cublasLt types).
  struct Plan;
  using Shape = std::tuple<int64_t, int64_t, int64_t, int64_t, int, int>;  // M, N, K, ldy, in, out
  Plan* plan_for(const Shape& shape);

  Gemm() = default;
  void* handle_ = nullptr;  // cublasHandle_t
  void* lt_ = nullptr;      // cublasLtHandle_t
  std::map<Shape, std::unique_ptr<Plan>> plans_;
  // cuBLAS's workspace, set once so that no product allocates (a CUDA graph capture may hold it).
  DeviceBuffer workspace_;
  void* stream_ = nullptr;  // the stream the handle is on (cudaStream_t)
  bool stream_set_ = false;
};

}  // namespace vlm::cuda

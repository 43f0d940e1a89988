#pragma once
// Helpers shared by the translation units of src/kernels/cuda and src/ops/cuda (not used above the
// CUDA backend): CUDA runtime errors as Status, and the stream every launch goes to (cuda_ops.h:
// set_stream).
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "vlm/status.h"

namespace vlm::cuda {

inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return ok_status();
  return internal_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

inline cudaStream_t launch_stream() { return static_cast<cudaStream_t>(current_stream()); }

}  // namespace vlm::cuda

// Tensor views: typed, shaped pointers into memory owned elsewhere (an mmap'd file, an arena).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vlm {

enum class DType { kF32, kBF16, kF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Size of one element in bytes.
size_t dtype_size(DType t);
// "F32", "BF16", ... (the safetensors spelling).
const char* dtype_name(DType t);
// Parses the safetensors spelling; returns false when unknown.
bool dtype_from_name(std::string_view name, DType* out);

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first, row-major contiguous
  const void* data = nullptr;  // not owned
  // kI8 linear weights only: [shape[0]] f32 scales, one per output row, so that row n is
  // data[n, :] · scale[n] (weight-only INT8, see ops::quantize_int8). Not owned; null otherwise.
  const float* scale = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  int64_t dim(size_t i) const { return shape[i]; }
  size_t rank() const { return shape.size(); }
};

// "[2048, 128]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace vlm

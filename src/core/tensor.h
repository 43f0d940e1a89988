// Tensor views: typed, shaped pointers into memory owned elsewhere (an mmap'd file, an arena).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vlm {

enum class DType { kF32, kBF16, kF16, kF64, kI64, kI32, kI16, kI8, kI4, kU8, kBool };

// Elements per group of kI4 weights that share one scale (see TensorView::scale).
constexpr int64_t kInt4Group = 32;

// Size in bytes of one element, or for kI4 (two elements per byte) of the byte that holds two:
// ggml's type_size / blck_size pair, with dtype_block below. Use dtype_nbytes for byte counts.
size_t dtype_size(DType t);
// Elements per dtype_size bytes: 2 for kI4, 1 otherwise.
int64_t dtype_block(DType t);
// Bytes of `numel` contiguous elements (kI4: numel / 2, rounded up).
size_t dtype_nbytes(DType t, int64_t numel);
// "F32", "BF16", ... (the safetensors spelling; "I4" has none and is for messages only).
const char* dtype_name(DType t);
// Parses the safetensors spelling; returns false when unknown.
bool dtype_from_name(std::string_view name, DType* out);

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first, row-major contiguous
  const void* data = nullptr;  // not owned
  // kI8 linear weights only: [shape[0]] f32 scales, one per output row, so that row n is
  // data[n, :] · scale[n] (weight-only INT8, see ops::quantize_int8). Not owned; null otherwise.
  //
  // kI4 linear weights [N, K] (K a multiple of kInt4Group): data holds N rows of K / 2 bytes, and
  // scale [N, K / 32] f32 row-major, one per group of 32 consecutive k, so that
  //   w[n, k] = q[n, k] · scale[n, k / 32]   (q in −8..7; see ops::quantize_int4).
  // Inside a row, group g's 16 bytes hold q[n, 32g + j] in the low nibble and q[n, 32g + 16 + j]
  // in the high nibble of byte 16g + j (j < 16), each a two's-complement 4-bit value.
  const float* scale = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return dtype_nbytes(dtype, numel()); }
  int64_t dim(size_t i) const { return shape[i]; }
  size_t rank() const { return shape.size(); }
};

// "[2048, 128]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace vlm

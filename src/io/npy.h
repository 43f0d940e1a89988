// NumPy .npy files: the exchange format for reference logits and activations dumped by the
// Python scripts (np.save) and compared against by the model tests. Only what those need: read
// float32 / int32 / int64 / uint8, C order, little-endian (`vlm logits` writes them with
// tools/cli/npy_writer.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "vlm/status.h"

namespace vlm {

// A whole array read from a .npy file, converted to one of three host types.
struct NpyArray {
  DType dtype = DType::kF32;   // kF32 for '<f4'; kI64 for '<i4' (widened) and '<i8'; kU8 for '|u1'
  std::vector<int64_t> shape;  // outermost first; empty for a 0-d array
  std::vector<float> f32;      // [numel] when dtype == kF32, else empty
  std::vector<int64_t> i64;    // [numel] when dtype == kI64, else empty
  std::vector<uint8_t> u8;     // [numel] when dtype == kU8, else empty (images: [h, w, 3])

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Reads a .npy file of format version 1.0, 2.0 or 3.0 with descr '<f4', '<i4', '<i8' or '|u1'
// ('<u1' is accepted too: numpy writes '|u1', byte order being moot for one byte) and
// fortran_order False. Anything else (other dtypes, Fortran order, pickled objects, a header that
// is not the dict numpy writes, data shorter or longer than the shape needs) is an error naming
// the file. Never reads outside the file.
Result<NpyArray> read_npy(const std::string& path);

}  // namespace vlm

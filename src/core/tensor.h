// Tensor views: typed, shaped pointers into memory owned elsewhere (an mmap'd file, an arena).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace vlm {

enum class DType {
  kF32,
  kBF16,
  kF16,
  kF64,
  kI64,
  kI32,
  kI16,
  kI8,
  kI4,
  kU8,
  kBool,
  // FP8 E4M3 (safetensors' F8_E4M3, torch.float8_e4m3fn): 1 sign, 4 exponent bits (bias 7), 3
  // mantissa bits, no infinities, 0x7F / 0xFF NaN, largest 448. Read by the loaders of
  // pre-quantized checkpoints only (model/prequant.h), never multiplied as stored.
  kF8E4M3,
  // GGUF's block types, linear weights [N, K] held as the file stores them (ggml's blocks, K a
  // multiple of the block; layouts in kernels/cpu/ggml_blocks.h): Q8_0 (34 bytes per 32 values),
  // Q4_K (144 per 256), Q5_K (176 per 256), Q6_K (210 per 256).
  kQ8_0,
  kQ4K,
  kQ5K,
  kQ6K,
};

// Whether t is one of GGUF's block types above.
constexpr bool is_ggml_block(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4K || t == DType::kQ5K || t == DType::kQ6K;
}

// kI4 rows are packed in blocks of this many values (16 bytes; layout below), and a group of
// values sharing one scale is 1, 2 or 4 blocks: kInt4Block, 64 or 128 values.
constexpr int64_t kInt4Block = 32;
// The group size --quant int4 gives (4.5 bits per weight with its f16 scale).
constexpr int64_t kInt4DefaultGroup = 32;
// Whether g is a group size kI4 weights may have: 32, 64 or 128.
constexpr bool int4_group_ok(int64_t g) { return g == 32 || g == 64 || g == 128; }

// How a kI4 weight's 4-bit integers become values. Weight [N, K], group size G = `group`:
//   w[n, k] = (q[n, k] − zero[n, k / G]) · scale[n, k / G]
// q in −8..7 (data, layout in TensorView); scale [N, K / G] IEEE half bits; zero [N, K / G]
// int8 or null (symmetric: zero 0). A format with unsigned q' = q + 8 in 0..15 and zero point z'
// maps onto this as q = q' − 8 and zero = z' − 8 (−8..7). Not owned.
struct Int4Params {
  const uint16_t* scale = nullptr;
  const int8_t* zero = nullptr;
  int64_t group = kInt4DefaultGroup;
};

// Size in bytes of one element, or for kI4 (two elements per byte) of the byte that holds two,
// or for a GGUF block type of one block: ggml's type_size / blck_size pair, with dtype_block
// below. Use dtype_nbytes for byte counts.
size_t dtype_size(DType t);
// Elements per dtype_size bytes: 2 for kI4, 32 or 256 for the GGUF block types, 1 otherwise.
int64_t dtype_block(DType t);
// Bytes of `numel` contiguous elements (kI4: numel / 2, rounded up; block types: whole blocks).
size_t dtype_nbytes(DType t, int64_t numel);
// "F32", "BF16", ... (the safetensors spelling; "I4" and the GGUF types' "Q8_0", "Q4_K", ...
// have none and are for messages only).
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
  // kI4 linear weights [N, K] only (K a multiple of int4.group): data holds N rows of K / 2
  // bytes; block b of a row (values 32b .. 32b + 32) is its 16 bytes 16b .. 16b + 16, byte j
  // holding q[n, 32b + j] in the low nibble and q[n, 32b + 16 + j] in the high one, each a
  // two's-complement 4-bit value. Scales and zero points: Int4Params (ops::quantize_int4 makes
  // them).
  Int4Params int4;
  // Linear weights of a checkpoint with activation-ordered groups (GPTQ's desc_act), stored with
  // their groups contiguous: column k multiplies x[:, in_perm[k]] ([shape[1]] int32, a
  // permutation). Not owned; null: column k multiplies x[:, k]. CpuBackend::linear reads it; every
  // other consumer of a weight refuses it (CUDA, FP16 arithmetic, embeddings).
  const int32_t* in_perm = nullptr;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return dtype_nbytes(dtype, numel()); }
  // Bytes of a quantized weight's scales and zero points (kI8: 4 per row; kI4: 2 per group, 3
  // with zero points); 0 for other dtypes.
  size_t quant_nbytes() const;
  int64_t dim(size_t i) const { return shape[i]; }
  size_t rank() const { return shape.size(); }
};

// "[2048, 128]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace vlm

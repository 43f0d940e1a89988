// GGUF tensor types decoded to f32 block by block, exactly as the format defines them: the same
// f32 arithmetic in the same order as ggml's reference dequantizers and the `gguf` package's
// (llama.cpp's gguf-py), so the results are bit-identical to theirs (tests/unit/gguf_quants_test
// checks every type on random blocks). This is the exact path every other use of a GGUF weight
// starts from.
#pragma once

#include <cstdint>
#include <span>

#include "io/gguf.h"
#include "vlm/status.h"

namespace vlm {

// Whether dequantize() decodes type t: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K,
// Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS.
bool ggml_can_dequantize(GgmlType t);

// Decodes `out.size()` elements of type t from `src` (whole blocks: out.size() a multiple of the
// type's block, src.size() the blocks' bytes) into `out`. InvalidArgument naming the type when it
// is not one of the above or the sizes do not match.
Status dequantize(GgmlType t, std::span<const uint8_t> src, std::span<float> out);

// The whole tensor (t.numel() floats). Errors name the tensor.
Status dequantize(const GgufTensor& t, std::span<float> out);

}  // namespace vlm

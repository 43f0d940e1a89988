// An INT4 weight's f16 scale as f32 inside a kernel body: F16C's conversion where the ISA level
// compiling the kernel has it, else core/half.h's branch-free decode (scales are finite). In an
// unnamed namespace on purpose: every ISA level's translation unit compiles its own copy (one
// inline function with external linkage would be a single definition for all levels, and the
// linker could hand the baseline build the F16C one).
#pragma once

#include <cstdint>

#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/half.h"

namespace vlm::kernels {
namespace {

inline float f16_scale(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32_finite(h);
#endif
}

}  // namespace
}  // namespace vlm::kernels

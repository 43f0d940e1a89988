// The BF16 decode candidates built for the avx512 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx512
#include "kernels/cpu/decode_kernel.inc"

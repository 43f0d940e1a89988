// The BF16 decode candidates built for the avx2 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx2
#include "kernels/cpu/decode_kernel.inc"

// The INT4 matmul kernel built for the avx2 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx2
#include "kernels/cpu/matmul_q4_kernel.inc"

// The INT4 matmul kernel built for the generic ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS generic
#include "kernels/cpu/matmul_q4_kernel.inc"

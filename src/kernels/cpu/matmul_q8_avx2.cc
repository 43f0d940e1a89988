// INT8-activation kernels built for the avx2 ISA level (vpmaddubsw + vpmaddwd; flags set in
// src/CMakeLists.txt).
#define VLM_KERNEL_NS avx2
#include "kernels/cpu/matmul_q8_avx2_kernel.inc"

// GGUF block-weight kernels built for the avx2vnni ISA level (AVX2 + AVX-VNNI; flags set in
// src/CMakeLists.txt).
#define VLM_KERNEL_NS avxvnni
#include "kernels/cpu/matmul_ggml_avx2_kernel.inc"

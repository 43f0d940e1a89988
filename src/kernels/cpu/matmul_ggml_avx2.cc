// GGUF block-weight kernels built for the avx2 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx2
#include "kernels/cpu/matmul_ggml_avx2_kernel.inc"

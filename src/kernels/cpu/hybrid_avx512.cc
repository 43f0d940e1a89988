// The hybrid-layer kernels built for the avx512 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx512
#include "kernels/cpu/hybrid_kernel.inc"

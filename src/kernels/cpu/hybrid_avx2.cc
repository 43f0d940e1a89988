// The hybrid-layer kernels built for the avx2 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx2
#include "kernels/cpu/hybrid_kernel.inc"

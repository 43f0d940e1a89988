// The hybrid-layer kernels built for the generic ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS generic
#include "kernels/cpu/hybrid_kernel.inc"

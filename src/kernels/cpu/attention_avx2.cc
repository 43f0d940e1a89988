// The attention kernel built for the avx2 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx2
#include "kernels/cpu/attention_kernel.inc"

// The attention kernel built for the avx512 ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS avx512
#include "kernels/cpu/attention_kernel.inc"

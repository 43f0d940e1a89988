// The INT4 matmul kernel built for the generic ISA level (flags set in src/CMakeLists.txt).
#define VLM_KERNEL_NS generic
#include "core/half.h"
#include "kernels/cpu/matmul_q4_kernel.inc"

namespace vlm::kernels {

void int4_panel_scales(const Int4Params& p, int64_t K, int64_t nb, int64_t cols, int64_t k0,
                       int64_t kc, int64_t panel, float* scales) {
  const int shift = int4_group_shift(p.group);
  const int64_t groups = K / p.group;
  for (int64_t b = 0; b < kc / kInt4Block; ++b) {
    const int64_t g = (k0 / kInt4Block + b) >> shift;
    for (int64_t j = 0; j < panel; ++j) {
      scales[b * panel + j] = j < cols ? f16_to_f32_finite(p.scale[(nb + j) * groups + g]) : 0.f;
    }
  }
}

}  // namespace vlm::kernels

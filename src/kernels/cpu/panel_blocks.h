// The order in which the packed GEMMs (matmul_kernel.inc, matmul_q8_avx512vnni.cc,
// matmul_f16_avx512fp16.cc) visit their (weight panel, K block) pairs, and the weight lines a
// block reads (for prefetching the next block while the current one runs).
#pragma once

#include <algorithm>
#include <cstdint>

namespace vlm::kernels {

// Output columns [nb, nb + cols) of one panel, over K values [k0, k0 + block_k).
struct PanelBlock {
  int64_t nb, cols, k0;
};

// NOTE(vlm): loop order. Panel-major (all K blocks of a panel, then the next panel) keeps the
// panel's y columns in L1/L2 but streams all of x once per panel; K-block-major keeps x's K block
// in L2 but reads and writes the thread's whole y slice once per K block. On the 2-core VM
// panel-major was 25-40% faster at M = 128 and K-block-major 4-10% faster from M = 512 on
// ([512 | 784] × [1024 .. 6144] shapes, f32 panels).
class PanelBlocks {
 public:
  static constexpr int64_t kKBlockMajorMinRows = 256;

  // Columns [n0, n1) in panels of `panel`, K in blocks of `block_k`, for M rows of x.
  PanelBlocks(int64_t M, int64_t n0, int64_t n1, int64_t K, int64_t panel, int64_t block_k)
      : n0_(n0),
        n1_(n1),
        panel_(panel),
        block_k_(block_k),
        k_major_(M >= kKBlockMajorMinRows),
        n_panels_((n1 - n0 + panel - 1) / panel),
        n_kblocks_((K + block_k - 1) / block_k) {}

  int64_t count() const { return n_panels_ * n_kblocks_; }

  // The i-th block in visiting order.
  PanelBlock operator[](int64_t i) const {
    const int64_t p = k_major_ ? i % n_panels_ : i / n_kblocks_;
    const int64_t kb = k_major_ ? i / n_panels_ : i % n_kblocks_;
    const int64_t nb = n0_ + p * panel_;
    return {nb, std::min(panel_, n1_ - nb), kb * block_k_};
  }

 private:
  int64_t n0_, n1_, panel_, block_k_;
  bool k_major_;
  int64_t n_panels_, n_kblocks_;
};

// Prefetches (into L2) part `part` of `parts` of the 64-byte lines block b reads from a weight
// whose row n starts at w + n · row_bytes: bytes [first, first + bytes) of rows b.nb .. b.nb +
// b.cols (first, bytes: the block's K values [b.k0, b.k0 + its K block) in that weight's bytes).
inline void prefetch_panel_block(const char* w, int64_t row_bytes, const PanelBlock& b,
                                 int64_t first, int64_t bytes, int64_t part, int64_t parts) {
  const int64_t lines_per_row = (bytes + 63) / 64, total = b.cols * lines_per_row;
  for (int64_t i = total * part / parts; i < total * (part + 1) / parts; ++i) {
    __builtin_prefetch(
        w + (b.nb + i / lines_per_row) * row_bytes + first + (i % lines_per_row) * 64, 0, 2);
  }
}

}  // namespace vlm::kernels

// AMX BF16 tiles for the prefill GEMM (kernels/cpu/matmul.h, namespace amx). Compiled with
// -mamx-tile -mamx-bf16 -mavx512bf16; run only where amx::available() says so.
//
// Tiles: C 0..3 (2 × 2 blocks of 16 rows × 16 f32 columns), A 4..5 (16 x rows × 32 BF16 of K),
// B 6..7 (16 pairs of K × 16 weight rows, pairs interleaved as TDPBF16PS reads them: the layout of
// avx512bf16::pack_pairs). A block of 32 weight rows is packed once for the whole K (K · 64 bytes,
// L2), then every 32 x rows run over it. x's BF16 rows come from avx512bf16::convert_rows_bf16.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/matmul.h"

namespace vlm::kernels::amx {
namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an XSAVE feature's state
constexpr int kXfeatureXtiledata = 18;

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

bool detect() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(0), "c"(0));
  if (eax < 7) return false;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(0));
  const bool amx_bf16 = (edx >> 22) & 1, amx_tile = (edx >> 24) & 1;
  const bool avx512 = ((ebx >> 16) & 1) && ((ebx >> 30) & 1) && ((ebx >> 31) & 1);  // F, BW, VL
  // AVX512_BF16 too: x's conversion and the panel's packing are avx512bf16's.
  if (!amx_bf16 || !amx_tile || !avx512 || !avx512bf16::available()) return false;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  if (!((ecx >> 27) & 1)) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  (void)hi;
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG and XTILEDATA enabled by the OS
  if ((lo & 0xE6u) != 0xE6u) return false;            // and the AVX-512 state
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

void load_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  _tile_loadconfig(&cfg);
}

// Rows of a C tile not backed by x rows (the padding to 16) are dropped.
void copy_rows(const float* buf, int64_t rows, float* y, int64_t ldy) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * ldy, buf + r * 16, 64);
}

}  // namespace

bool available() {
  static const bool ok = detect();
  return ok;
}

void matmul_rows_bf16(const uint16_t* xb, int64_t M, int64_t K, const uint16_t* w, int64_t n0,
                      int64_t n1, float* y, int64_t ldy, void* scratch) {
  auto* panel = static_cast<uint16_t*>(scratch);  // the pairs avx512bf16::pack_pairs lays out
  load_config();
  const int64_t lda = K * 2;  // bytes between x rows
  for (int64_t n = n0; n < n1; n += 32) {
    const int blocks = n + 32 <= n1 ? 2 : 1;
    avx512bf16::pack_pairs(w, K, n, blocks, static_cast<uint32_t*>(scratch));
    const int64_t ldb = 64 * blocks;  // bytes between k-pair rows of the panel
    for (int64_t m = 0; m < M; m += 32) {
      const bool two = m + 16 < M;  // a second block of 16 x rows
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < K; k += 32) {
        const uint16_t* b = panel + (k / 2) * 32 * blocks;
        _tile_loadd(4, xb + m * K + k, lda);
        _tile_loadd(6, b, ldb);
        _tile_dpbf16ps(0, 4, 6);
        if (blocks == 2) {
          _tile_loadd(7, b + 32, ldb);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two) {
          _tile_loadd(5, xb + (m + 16) * K + k, lda);
          _tile_dpbf16ps(2, 5, 6);
          if (blocks == 2) _tile_dpbf16ps(3, 5, 7);
        }
      }
      // C tile T (16 × 16 f32) to y at (row, col): straight when its 16 rows are all x rows,
      // else through a buffer (the tile register is named in the instruction: a macro).
#define VLM_AMX_STORE(T, row, col)                           \
  do {                                                       \
    if ((row) + 16 <= M) {                                   \
      _tile_stored(T, y + (row)*ldy + (col), ldy * 4);       \
    } else {                                                 \
      alignas(64) float buf[16 * 16];                        \
      _tile_stored(T, buf, 64);                              \
      copy_rows(buf, M - (row), y + (row)*ldy + (col), ldy); \
    }                                                        \
  } while (0)
      VLM_AMX_STORE(0, m, n);
      if (blocks == 2) VLM_AMX_STORE(1, m, n + 16);
      if (two) {
        VLM_AMX_STORE(2, m + 16, n);
        if (blocks == 2) VLM_AMX_STORE(3, m + 16, n + 16);
      }
#undef VLM_AMX_STORE
    }
  }
  _tile_release();
}

}  // namespace vlm::kernels::amx

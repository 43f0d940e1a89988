// Flash attention with WMMA (src/kernels/cuda/flash_attention.h). One CTA of 4 warps takes 64
// queries of one head; warp w owns query rows 16w .. 16w + 15. Per key tile of 64: the CTA loads K
// and V into shared memory (zeros past the last key), each warp computes its S = Q·Kᵀ rows on the
// tensor cores, updates its rows' running max and sum, writes P in BF16, rescales its O rows and
// adds P·V. O lives in shared memory in f32 between tiles.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/flash_attention.h"
#include "kernels/cuda/runtime.h"

namespace vlm::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64;  // queries per CTA and keys per step
constexpr int kWarps = 4;  // 16 query rows each
constexpr int kThreads = 32 * kWarps;

// Where the keys come from: the paged cache through a block table, or contiguous rows.
struct KeySource {
  const bf16* k;
  const bf16* v;
  int64_t row;           // elements between consecutive slots / tokens
  const int32_t* table;  // paged: this sequence's block table; null: contiguous
  int64_t block_size;
  __device__ int64_t offset(int64_t p) const {
    const int64_t slot =
        table != nullptr ? static_cast<int64_t>(table[p / block_size]) * block_size + p % block_size
                         : p;
    return slot * row;
  }
};

template <int HD>
struct Smem {
  bf16 q[kTile][HD];
  bf16 k[kTile][HD];
  bf16 v[kTile][HD];
  float s[kTile][kTile];
  bf16 p[kTile][kTile];
  float o[kTile][HD];
  float m[kTile], l[kTile], corr[kTile];
  int32_t pos[kTile];  // each query row's position (causal), -1 for padding rows
};

// Copies `rows` rows of `hd` BF16 values (the rest of HD and of kTile zero) into dst[kTile][HD];
// row r comes from src + offset(r). With hd a multiple of 8 (every Qwen3-VL head: 128, 72, 64)
// in 16-byte pieces (rows then start 16-byte aligned: offsets are multiples of hd), else value by
// value.
template <int HD, typename Offset>
__device__ void load_tile(bf16 (*dst)[HD], const bf16* src, int64_t rows, int64_t hd,
                          Offset offset) {
  if (hd % 8 == 0) {
    constexpr int kPieces = HD / 8;  // HD is a multiple of 16
    for (int e = threadIdx.x; e < kTile * kPieces; e += kThreads) {
      const int r = e / kPieces, d = (e % kPieces) * 8;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (r < rows && d < hd) v = *reinterpret_cast<const uint4*>(src + offset(r) + d);
      *reinterpret_cast<uint4*>(&dst[r][d]) = v;
    }
    return;
  }
  for (int e = threadIdx.x; e < kTile * HD; e += kThreads) {
    const int r = e / HD, d = e % HD;
    dst[r][d] = (r < rows && d < hd) ? src[offset(r) + d] : __float2bfloat16_rn(0.f);
  }
}

// q rows [q0, q0 + nq) of head h attend to keys [0, kend) from `keys` (causal: key p only where
// p <= the row's position). q, out: [tokens, n_heads, hd].
template <int HD>
__device__ void flash_tile(Smem<HD>& sm, const bf16* q, int64_t q0, int64_t nq, int64_t h,
                           int64_t n_heads, int64_t hd, const int32_t* tok_pos, bool causal,
                           const KeySource& keys, int64_t kv_head, int64_t kend, float scale,
                           bf16* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  load_tile<HD>(sm.q, q, nq, hd, [&](int64_t r) { return ((q0 + r) * n_heads + h) * hd; });
  for (int r = threadIdx.x; r < kTile; r += kThreads) {
    sm.pos[r] = r < nq ? (causal ? tok_pos[q0 + r] : 0x7fffffff) : -1;
    sm.m[r] = -INFINITY;
    sm.l[r] = 0.f;
  }
  for (int e = threadIdx.x; e < kTile * HD; e += kThreads) sm.o[e / HD][e % HD] = 0.f;
  __syncthreads();

  const int row0 = warp * 16;
  for (int64_t k0 = 0; k0 < kend; k0 += kTile) {
    const int64_t nk = kend - k0 < kTile ? kend - k0 : kTile;
    auto at = [&](int64_t r) { return keys.offset(k0 + r) + kv_head * hd; };
    load_tile<HD>(sm.k, keys.k, nk, hd, at);
    load_tile<HD>(sm.v, keys.v, nk, hd, at);
    __syncthreads();

    // S = Q·Kᵀ for this warp's 16 rows: K [keys][HD] row-major is Kᵀ column-major.
    for (int n = 0; n < kTile / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < HD / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::load_matrix_sync(a, &sm.q[row0][kk * 16], HD);
        wmma::load_matrix_sync(b, &sm.k[n * 16][kk * 16], HD);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&sm.s[row0][n * 16], acc, kTile, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this tile, row by row; each lane takes columns lane and lane + 32.
    for (int rr = 0; rr < 16; ++rr) {
      const int r = row0 + rr;
      const int32_t pos = sm.pos[r];
      float s2[2];
      for (int j = 0; j < 2; ++j) {
        const int c = lane + 32 * j;
        const int64_t p = k0 + c;
        s2[j] = (c < nk && p <= pos) ? sm.s[r][c] * scale : -INFINITY;
      }
      float mx = fmaxf(s2[0], s2[1]);
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = sm.m[r];
      const float m_new = fmaxf(m_old, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing seen yet
      const float p0 = expf(s2[0] - m_use), p1 = expf(s2[1] - m_use);
      float sum = p0 + p1;
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      sm.p[r][lane] = __float2bfloat16_rn(p0);
      sm.p[r][lane + 32] = __float2bfloat16_rn(p1);
      __syncwarp();
      if (lane == 0) {
        const float corr = expf(m_old - m_use);  // 0 while m_old is -inf
        sm.corr[r] = corr;
        sm.l[r] = sm.l[r] * corr + sum;
        sm.m[r] = m_new;
      }
      __syncwarp();
    }
    // O rows ·= corr, then O += P·V on the tensor cores.
    for (int rr = 0; rr < 16; ++rr) {
      const float corr = sm.corr[row0 + rr];
      for (int d = lane; d < HD; d += 32) sm.o[row0 + rr][d] *= corr;
    }
    __syncwarp();
    for (int n = 0; n < HD / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, &sm.o[row0][n * 16], HD, wmma::mem_row_major);
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(a, &sm.p[row0][kk * 16], kTile);
        wmma::load_matrix_sync(b, &sm.v[kk * 16][n * 16], HD);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(&sm.o[row0][n * 16], acc, HD, wmma::mem_row_major);
    }
    __syncthreads();  // before the next tile overwrites K and V
  }
  for (int rr = 0; rr < 16; ++rr) {
    const int r = row0 + rr;
    if (r >= nq) break;
    const float inv = sm.l[r] > 0.f ? 1.f / sm.l[r] : 0.f;
    bf16* dst = out + ((q0 + r) * n_heads + h) * hd;
    for (int d = lane; d < hd; d += 32) dst[d] = __float2bfloat16_rn(sm.o[r][d] * inv);
  }
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    flash_paged_kernel(const bf16* q, const int32_t* tiles, const int32_t* tok_seq,
                       const int32_t* tok_pos, const int32_t* tables, int64_t table_stride,
                       int64_t bs, const bf16* kc, const bf16* vc, int64_t n_heads, int64_t group,
                       int64_t hd, float scale, bf16* out) {
  extern __shared__ __align__(128) unsigned char raw[];
  Smem<HD>& sm = *reinterpret_cast<Smem<HD>*>(raw);
  const int64_t q0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
  const int64_t h = blockIdx.y;
  const int64_t n_kv = n_heads / group;
  KeySource keys{kc, vc, n_kv * hd, tables + static_cast<int64_t>(tok_seq[q0]) * table_stride, bs};
  const int64_t kend = static_cast<int64_t>(tok_pos[q0 + nq - 1]) + 1;  // positions increase
  flash_tile<HD>(sm, q, q0, nq, h, n_heads, hd, tok_pos, true, keys, h / group, kend, scale, out);
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    flash_full_kernel(const bf16* q, const bf16* k, const bf16* v, int64_t n, int64_t n_heads,
                      int64_t hd, float scale, bf16* out) {
  extern __shared__ __align__(128) unsigned char raw[];
  Smem<HD>& sm = *reinterpret_cast<Smem<HD>*>(raw);
  const int64_t q0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t nq = n - q0 < kTile ? n - q0 : kTile;
  KeySource keys{k, v, n_heads * hd, nullptr, 1};
  flash_tile<HD>(sm, q, q0, nq, blockIdx.y, n_heads, hd, nullptr, false, keys, blockIdx.y, n, scale,
                 out);
}

// Launches with HD the head_dim rounded up to 16 (64, 80, 96, 112 or 128).
template <typename F>
Status with_hd(int64_t head_dim, F&& f) {
  if (head_dim <= 64) return f(std::integral_constant<int, 64>{});
  if (head_dim <= 80) return f(std::integral_constant<int, 80>{});
  if (head_dim <= 96) return f(std::integral_constant<int, 96>{});
  if (head_dim <= 112) return f(std::integral_constant<int, 112>{});
  return f(std::integral_constant<int, 128>{});
}

// Lets `kernel` take `smem` bytes of dynamic shared memory (over the 48 KiB default); once per
// kernel instantiation.
template <auto Kernel>
Status prepare(size_t smem) {
  static const cudaError_t e = cudaFuncSetAttribute(
      Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  return cuda_status(e, "flash attention shared memory");
}

}  // namespace

bool flash_attention_supports(int64_t head_dim) { return head_dim >= 16 && head_dim <= 128; }

int64_t flash_query_tiles(const int64_t* chunk_off, const int64_t* chunk_n, int64_t n_chunks,
                          int32_t* tiles) {
  int64_t n = 0;
  for (int64_t c = 0; c < n_chunks; ++c) {
    for (int64_t t = 0; t < chunk_n[c]; t += kTile) {
      tiles[2 * n] = static_cast<int32_t>(chunk_off[c] + t);
      tiles[2 * n + 1] = static_cast<int32_t>(chunk_n[c] - t < kTile ? chunk_n[c] - t : kTile);
      ++n;
    }
  }
  return n;
}

Status flash_attention_paged(const void* q, const int32_t* tiles, int64_t n_tiles,
                             const int32_t* tok_seq, const int32_t* tok_pos,
                             const int32_t* block_tables, int64_t table_stride, int64_t block_size,
                             const void* k_cache, const void* v_cache, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim, float scale, void* out) {
  if (!flash_attention_supports(head_dim)) return invalid_argument("flash attention: head_dim");
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || block_size <= 0) {
    return invalid_argument("flash attention: bad heads or block size");
  }
  if (n_tiles <= 0) return ok_status();
  if (n_tiles > 0x7fffffff || n_heads > 65535) return invalid_argument("flash attention: grid");
  return with_hd(head_dim, [&](auto hd_c) -> Status {
    constexpr int HD = decltype(hd_c)::value;
    const size_t smem = sizeof(Smem<HD>);
    VLM_RETURN_IF_ERROR(prepare<flash_paged_kernel<HD>>(smem));
    flash_paged_kernel<HD><<<dim3(static_cast<unsigned>(n_tiles), static_cast<unsigned>(n_heads)),
                             kThreads, smem, launch_stream()>>>(
        static_cast<const bf16*>(q), tiles, tok_seq, tok_pos, block_tables, table_stride,
        block_size, static_cast<const bf16*>(k_cache), static_cast<const bf16*>(v_cache), n_heads,
        n_heads / n_kv_heads, head_dim, scale, static_cast<bf16*>(out));
    return cuda_status(cudaGetLastError(), "flash_attention_paged launch");
  });
}

Status flash_attention_full(const void* q, const void* k, const void* v, int64_t n, int64_t n_heads,
                            int64_t head_dim, float scale, void* out) {
  if (!flash_attention_supports(head_dim)) return invalid_argument("flash attention: head_dim");
  if (n <= 0) return ok_status();
  if (n_heads > 65535) return invalid_argument("flash attention: grid");
  return with_hd(head_dim, [&](auto hd_c) -> Status {
    constexpr int HD = decltype(hd_c)::value;
    const size_t smem = sizeof(Smem<HD>);
    VLM_RETURN_IF_ERROR(prepare<flash_full_kernel<HD>>(smem));
    const unsigned tiles = static_cast<unsigned>((n + kTile - 1) / kTile);
    flash_full_kernel<HD>
        <<<dim3(tiles, static_cast<unsigned>(n_heads)), kThreads, smem, launch_stream()>>>(
            static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
            n, n_heads, head_dim, scale, static_cast<bf16*>(out));
    return cuda_status(cudaGetLastError(), "flash_attention_full launch");
  });
}

}  // namespace vlm::cuda

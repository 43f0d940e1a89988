#pragma once
// Flash-style attention on the tensor cores: BF16 q, K, V, f32 scores and output sums,
// online softmax, tiles of 64 queries × 64 keys per step, one CTA of 4 warps per (query tile,
// head). P is rounded to BF16 for the P·V product, as FlashAttention does. Two uses:
//   - the decoder's prefill over the paged KV cache (causal, GQA, varlen batch);
//   - the vision tower's bidirectional attention inside one frame (contiguous K/V).
// head_dim up to 128 (padded to a multiple of 16 inside the kernel). Device pointers, the current
// stream (cuda_ops.h).
#include <cstdint>

#include "vlm/status.h"

namespace vlm::cuda {

// Whether flash attention takes this head_dim (BF16 only).
bool flash_attention_supports(int64_t head_dim);

// Query tiles of a varlen batch for flash_attention_paged: every run of up to 64 consecutive
// tokens of one chunk, as (first token in the batch, tokens) pairs. chunk_off/chunk_n: each
// chunk's first token in the batch and its count. Returns the tiles appended to `tiles`.
int64_t flash_query_tiles(const int64_t* chunk_off, const int64_t* chunk_n, int64_t n_chunks,
                          int32_t* tiles);

// Causal attention of the batch's tokens over the paged cache, as paged_attention (same q, out,
// tok_seq, tok_pos, block tables and cache layout), BF16 only. tiles: n_tiles (first, count)
// pairs from flash_query_tiles, on the device.
Status flash_attention_paged(const void* q, const int32_t* tiles, int64_t n_tiles,
                             const int32_t* tok_seq, const int32_t* tok_pos,
                             const int32_t* block_tables, int64_t table_stride, int64_t block_size,
                             const void* k_cache, const void* v_cache, int64_t n_heads,
                             int64_t n_kv_heads, int64_t head_dim, float scale, void* out);

// Bidirectional attention of n tokens over the same n (one image frame): q, k, v, out
// [n, n_heads, head_dim] BF16.
Status flash_attention_full(const void* q, const void* k, const void* v, int64_t n, int64_t n_heads,
                            int64_t head_dim, float scale, void* out);

}  // namespace vlm::cuda

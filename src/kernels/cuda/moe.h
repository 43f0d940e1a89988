#pragma once
// A mixture-of-experts MLP on the GPU, without a host round trip (so a decode step stays one
// graph): the router's top-k, the (row, expert) pairs grouped by expert on the device, one grouped
// product over every active expert's rows for gate|up and one for down, and the weighted sum.
//
// Each pair's product is computed on its own (a fixed order of its K products, whatever rows share
// its expert or its tile), and the sum over a row's k experts runs in increasing expert order, as
// on the CPU: the result does not depend on the batch or on the order the grouping leaves.
#include <cstdint>

#include "kernels/cuda/cuda_ops.h"
#include "vlm/status.h"

namespace vlm::cuda {

// Pair rows per tile of the grouped product (one warp per output column runs over all of them).
inline constexpr int64_t kMoeTileRows = 8;

// ids [rows, k] (int32) = the k largest of each row of logits (f32 [rows, E]), best first, a tie
// going to the lower index; weights [rows, k] (f32) their softmax probabilities over all E,
// renormalised to sum 1 when `renormalize`. k ≤ 32.
Status moe_route(const float* logits, int64_t rows, int64_t E, int64_t k, bool renormalize,
                 int32_t* ids, float* weights);

// The bookkeeping of one grouping, in device memory: `pairs` = rows · k.
struct MoeGroups {
  int32_t* offsets;     // [E + 1]: expert e's pairs are order[offsets[e] .. offsets[e + 1])
  int32_t* tile_start;  // [E + 1]: expert e's first tile of kMoeTileRows pairs
  int32_t* order;       // [pairs]: pair indices r · k + j, grouped by expert
};
// The most experts the grouping and the router take (their per-expert state is in shared memory).
inline constexpr int64_t kMoeMaxExperts = 1024;
// Device bytes of a MoeGroups for E experts and `pairs` pairs (each array 256-byte aligned).
int64_t moe_groups_bytes(int64_t E, int64_t pairs);
// Lays the arrays out in `mem` (moe_groups_bytes(E, pairs) bytes).
MoeGroups moe_groups_at(void* mem, int64_t E, int64_t pairs);
// Groups the pairs of ids [pairs] by expert (an id outside [0, E) is left out); within an expert
// the order is whatever the device's atomics leave (no result depends on it).
Status moe_group(const int32_t* ids, int64_t pairs, int64_t E, const MoeGroups& g);

// The weights of one stack of experts: expert e's [N, K] rows at w[e] (activation type, or INT8
// with one f32 scale per row at scale[e] when int8), as device arrays of E pointers.
struct MoeWeights {
  const void* const* w;
  const float* const* scale;  // INT8 only
  bool int8;
};

// For every pair p = order[i] of expert e: y[p] [N] = x[in_row(p)] [K] · W_eᵀ, in y_t (F32 or the
// activation type x_t); in_row(p) = p / k when `gather` (x holds the layer's rows), else p (x
// holds one row per pair). f32 sums, rounded once.
Status moe_grouped_product(const void* x, DType x_t, bool gather, int64_t k, const MoeGroups& g,
                           int64_t E, int64_t pairs, const MoeWeights& w, int64_t N, int64_t K,
                           void* y, DType y_t);

// out[r] [n] (activation type t) = Σ_j weights[r, j] · y[r · k + j] (y f32 [rows · k, n]), the
// j in increasing order of ids[r, j]; f32 sums, rounded once. An id outside [0, E) adds nothing
// (moe_group left its pair out).
Status moe_combine(const float* y, const int32_t* ids, const float* weights, int64_t rows,
                   int64_t k, int64_t E, int64_t n, void* out, DType t);

}  // namespace vlm::cuda

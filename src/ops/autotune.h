// Kernel choice by measurement: where a kernel family has more than one way to compute the same
// thing on this CPU, a short micro-benchmark at the model's own shapes picks the fastest, once per
// CPU model, ISA set and build — the result is cached in a file, so only the first start pays.
// Today's family: the GEMM of BF16 weights (f32 after widening the weights, AVX512_BF16 dot
// products, or AMX BF16 tiles).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "ops/ops.h"
#include "vlm/status.h"

namespace vlm::ops {

struct KernelCandidate {
  std::string name;   // "f32", "dpbf16", "amx"; a decode family's candidate names (ops.h)
  double gflops = 0;  // GFLOP/s; for a decode family GB/s of weights streamed
};

struct KernelChoice {
  std::string family;                       // "bf16_gemm"
  std::vector<KernelCandidate> candidates;  // as measured (or as cached)
  std::string chosen;
  bool cached = false;  // read from the cache file, not measured now
  std::string shape;    // "M=128 K=2048 N=4096"
};

// The cache's folder: $VLM_CACHE_DIR, else $XDG_CACHE_HOME/vlm, else $HOME/.cache/vlm ("" when
// none of them is set).
std::string kernel_cache_dir();

// The BF16 GEMM for products of M x rows, K inputs and N weight rows on this CPU: every candidate
// this CPU runs (f32; dpbf16 and amx where bf16_gemm_available()) timed on random data for about
// 0.1 s each after a warm-up run, in three rounds that take the candidates in turn, each
// candidate's best round kept, the fastest chosen. With a cache folder, a result for the same CPU
// model, ISA set, build and shape is read from `<dir>/cpu-kernels.txt` instead, and a new one added
// to it (written to a temporary file and renamed over it). Errors only for an unusable shape; a
// cache that cannot be read or written is measured around, not an error.
// `family` names the product in the report and the cache ("bf16_gemm": the text decoder's,
// "vision_gemm": the vision tower's). A BF16 candidate must beat f32 by 5% to be chosen: exact
// arithmetic is not given up for noise. The cache key holds the thread count and ISA level too.
Result<KernelChoice> choose_bf16_gemm(ThreadPool& pool, Isa isa, int64_t M, int64_t K, int64_t N,
                                      const std::string& cache_dir,
                                      const std::string& family = "bf16_gemm");

// The decode kernel of family f (ops.h: DecodeKernels) for these weights, the model's own linear
// weights the family takes (decode_family_takes) in the order a decode step reads them: each
// candidate this level runs streams them one x row at a time (a prefix of at least 512 MiB where
// they hold that much, so the sweep comes from memory as a decode step's does) for about 0.1 s
// after a warm-up run, in three rounds as choose_bf16_gemm's; its best rate is GB/s of weight bytes
// (with their scales). The fastest exact candidate is chosen; an inexact one
// (DecodeCandidate::exact false) only when `exact_only` is false and it beats that by 5%. Cached as
// choose_bf16_gemm's choices are (keyed by the family, the weights' count, shapes and bytes, the
// threads and the level). Errors for no weights or a weight the family does not take.
Result<KernelChoice> choose_decode_kernel(ThreadPool& pool, Isa isa, DecodeFamily f,
                                          std::span<const TensorView* const> weights,
                                          bool exact_only, const std::string& cache_dir);

// "bf16_gemm: f32 412.3 GFLOP/s, amx 1650.8 GFLOP/s -> amx (cached; M=128 K=2048 N=4096)"; decode
// families in GB/s.
std::string describe(const KernelChoice& c);

}  // namespace vlm::ops

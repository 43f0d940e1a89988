// The measurements behind `vlm bench` that need more than Engine::generate — the machine's memory
// bandwidth, and decode through the engine core with many requests at once — and the process
// figures the CLI reports. Built on the public API only. Methodology: docs/benchmarks.md.
#pragma once

#include <cstdint>
#include <vector>

#include "vlm/engine.h"
#include "vlm/status.h"

namespace vlm_cli {

// Peak resident set size of this process in bytes.
int64_t peak_rss_bytes();

// `n` prompt ids spread over the vocabulary (a different sequence for each `salt`), all in
// [3, min(vocab, 150000) - 32): clear of bos/eos at the bottom and of the special tokens (image
// pads, vision start/end) that Qwen vocabularies keep at the top.
std::vector<int32_t> synthetic_prompt_ids(int64_t n, int64_t vocab, int64_t salt = 0);

// ---- Memory bandwidth: the roof of a memory-bound decode step.

struct MemoryBandwidthOptions {
  int64_t bytes =
      0;  // per buffer (two are allocated), rounded up to 4 KiB; 0: default_membw_bytes()
  int n_threads = 0;  // 0: all hardware threads
  int reps = 5;       // timed passes of each kernel, after one untimed pass of each
};

struct MemoryBandwidth {
  int64_t bytes = 0;  // per buffer, as allocated (whole pages)
  int n_threads = 0;
  std::vector<double> read_gb_s;  // per pass: a vectorised sum over the buffer, bytes / s
  std::vector<double> copy_gb_s;  // per pass: memcpy, (read + written bytes) / s = 2 · bytes / s
  uint64_t checksum = 0;          // what the read passes summed, plus a copied byte
};

// cpu0's level-3 cache in bytes, from sysfs; 0 when unknown.
int64_t last_level_cache_bytes();
// 4 × the L3 (at least 256 MiB), or 2 GiB when the L3 size is unknown.
int64_t default_membw_bytes();

// Two buffers written once (first touch) on the threads that read them later; one untimed pass
// of each kernel, then `reps` timed ones. Each thread takes one page-aligned slice. The read
// kernel sums 64-byte lines with 16-byte vector adds (the baseline ISA reaches the memory roof).
// GB = 1e9 bytes. kUnavailable if the buffers cannot be allocated.
vlm::Result<MemoryBandwidth> measure_memory_bandwidth(const MemoryBandwidthOptions& options);

// ---- Batched decode through the engine core.

struct BatchedDecodeOptions {
  int batch = 8;                    // concurrent requests (at most the engine's max_num_seqs)
  int64_t prompt_tokens = 128;      // per request (synthetic_prompt_ids, salt = request index)
  std::vector<int32_t> prompt_ids;  // instead: this prompt for every request
  int64_t gen_tokens = 128;         // tokens per request after its first (a step each, but --spec)
  int reps = 3;                     // timed rounds
  bool warmup = true;               // first an untimed round of one decode step per request
};

// One round: `batch` greedy ignore_eos requests submitted together, each producing
// gen_tokens + 1 tokens. The decode window opens with the last token sampled in the engine step
// that gave the last request its first token and closes with the round's last token; tokens
// sampled in the steps in between count (at batch 1: the gen_tokens decode steps, as
// Engine::generate's decode_ms; with speculative decoding a step may give a request several).
struct BatchedDecodeRound {
  int64_t tokens = 0;           // of all requests, inside the window
  int64_t steps = 0;            // engine steps inside the window
  int64_t request_steps = 0;    // of those, summed over the requests: the steps each had tokens in
  std::vector<double> step_ms;  // each of them, in order: from the step before's last token
  double decode_ms = 0;         // the window
  double first_tokens_ms = 0;   // first submission → the window opens (every request prefilled)
  double tok_s() const {
    return decode_ms > 0 ? static_cast<double>(tokens) / (decode_ms / 1000) : 0;
  }
};

vlm::Result<std::vector<BatchedDecodeRound>> bench_batched_decode(
    vlm::Engine& engine, const BatchedDecodeOptions& options);

}  // namespace vlm_cli

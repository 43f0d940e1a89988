// The time a step may spend beside its running decodes: "side work", the slices of an image
// encode and the chunks of prompts not yet computed. Every step carries the running requests'
// decodes; side work rides along within a budget, so that inter-token latency stays even while
// new requests are encoded and prefilled (Sarathi-Serve's stall-free batching, with the encoder
// inside the same budget). Plain data: the engine reports what its forward passes and encode
// slices took, and this decides the next step's shares. The Scheduler owns one (scheduler.h).
//
// The cost model: moving averages (weight 0.2 on the newest pass) of a decode-only pass and of
// a prompt token's time beyond it. The budget: a fixed one (--max-encoder-ms), or
// auto_side_budget_ms() over the decode-only pass and the requests waiting for side work.
#pragma once

#include <cstdint>
#include <span>

namespace vlm {

struct SchedulerOutput;  // sched/scheduler.h

class StepBudget {
 public:
  // `max_side_ms`: > 0 a fixed side budget per step; 0 the automatic one; < 0 none (encodes run
  // whole and prompt chunks take the whole token budget).
  explicit StepBudget(double max_side_ms = -1) : max_side_ms_(max_side_ms) {}

  // The automatic budget: `pass_ms` (a decode-only forward pass) times kSidePassesPerWaiting per
  // waiting request, between 1 and kMaxSidePasses passes (and at least 1 ms). One waiting request
  // gets one pass, so a step with side work costs about twice a decode step; a queue gets more,
  // so that new requests join the decode batch sooner (a memory-bound decode pass costs about the
  // same for more streams) while steps stay within a few passes of each other. The constants were
  // measured (docs/benchmarks.md).
  static constexpr double kSidePassesPerWaiting = 0.75;
  static constexpr double kMaxSidePasses = 3;
  static double auto_side_budget_ms(double pass_ms, int64_t waiting);
  // NOTE(vlm): beside decodes a limited prefill chunk has at least this many tokens (or the rest
  // of the prompt). Below 32 rows the CPU's INT8 GEMMs once multiplied in f32 at 3-5x the cost
  // per token; their byte GEMM now runs from 2 rows (8 on AVX2), and at 16 rows costs about
  // 1.25x (VNNI) to 1.5x (AVX2) per token what it does at 32 (ops::int8_activation_min_rows).
  static constexpr int64_t kMinSideChunk = 16;

  bool enabled() const { return max_side_ms_ >= 0; }
  // At a step's start, with `waiting` requests waiting for side work (an encode, or a prompt not
  // yet computed): fixes the step's side budget and forgets the last step's encode time.
  void begin_step(int64_t waiting);
  double side_ms() const { return side_ms_; }

  // The image encode's share of this step. With no request running (nothing waits for the
  // encode), or no budget, it runs to its end (`budget_ms` 0). Else it gets what the pending
  // prompt tokens (older requests: they go first) are not expected to take of the side budget,
  // and waits for the next step (`run` false) when that is under a quarter of it.
  struct EncodeShare {
    bool run = true;
    double budget_ms = 0;  // <= 0: to the end, each stage whole
  };
  EncodeShare encode_share(int64_t num_running, int64_t pending_prefill_tokens) const;
  // What this step's encode slices took.
  void add_encode_ms(double ms) { encode_ms_ += ms; }

  // The prompt tokens this step's prefill chunks may take together beside running decodes: what
  // the side budget has left after the encode, at the measured cost of a prompt token, but at
  // least kMinSideChunk. `none` when there is no budget or no measurement yet.
  int64_t prefill_limit(int64_t none) const;

  // A forward pass over `items` (their token counts) took `ms`.
  void observe_forward(const SchedulerOutput& out, double ms);
  // A prompt token's time beyond a decode pass (0 until measured), and a decode-only pass's.
  double prefill_token_ms() const { return extra_tokens_ > 0 ? extra_ms_ / extra_tokens_ : 0; }
  double decode_pass_ms() const { return decode_ms_; }

  // Which images go into one encode: given the images not yet encoded in admission order (each
  // with its patches, and whether it can join a batch: a resized image for a tower that
  // patchifies), how many of the first go together. The first always goes; more only when the
  // tower batches and the first is batchable, while they are batchable and fit `max_patches`
  // together.
  struct EncodeCandidate {
    int64_t patches = 0;
    bool batchable = false;
  };
  static constexpr int64_t kBatchPatches = 32768;
  static size_t encode_batch_size(std::span<const EncodeCandidate> candidates, bool tower_batches,
                                  int64_t max_patches = kBatchPatches);

 private:
  double max_side_ms_;
  double forward_ms_ = 0;    // every forward pass
  double decode_ms_ = 0;     // passes with decodes only: what the streams' pace costs
  double extra_ms_ = 0;      // passes with prefill chunks: their time beyond decode_ms_ ...
  double extra_tokens_ = 0;  // ... and their prompt tokens, so a token costs the ratio
  double side_ms_ = 0;       // this step's side budget
  double encode_ms_ = 0;     // this step's encode slices
};

}  // namespace vlm

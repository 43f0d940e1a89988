// Continuous batching: many requests share every forward pass; they join and leave the running
// batch at each step (vLLM v1's EngineCore, as a thread in this process). One engine thread owns
// the scheduler, the paged KV cache and the model runner; other threads submit requests and
// cancel them. What a request produces goes to its stream as raw tokens: turning them into text
// is the work of the thread that consumes the stream (OutputProcessor), never of this one.
// Engine::load makes the one EngineCore of an Engine; Engine::submit / generate / logits use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "vlm/engine.h"

namespace vlm {

struct SampledToken;     // engine/model_runner.h
class PixelBudget;       // engine/pixel_budget.h
struct SchedulerOutput;  // sched/scheduler.h

// What Engine::logits asks of a request besides its stream: every prompt position's logits
// ([expanded prompt tokens, vocab], sized by submit) and the prompt with its image pads expanded
// (written by the engine thread before the request's first token).
struct PromptOutputs {
  std::vector<float>* logits = nullptr;
  std::vector<int32_t>* expanded_ids = nullptr;
  bool read_prefix_cache = false;  // with logits: leading cached positions are not computed
};

class EngineCore {
 public:
  // Over the model `engine` has loaded; starts the engine thread. `on_step` (may be empty) gets
  // each step's wall time, `on_encode` (may be empty) each step's encoder slices and their time.
  static Result<std::unique_ptr<EngineCore>> create(
      Engine::Impl& engine, const BatchingOptions& opts, std::function<void(double)> on_step,
      std::function<void(int64_t, double)> on_encode = nullptr);
  ~EngineCore();  // stops the engine thread; requests not yet finished get no further output

  // Engine::submit (see there).
  Result<std::unique_ptr<RequestStream>> submit(GenerateRequest request,
                                                std::function<void()> notify,
                                                PromptOutputs prompt = {});

  Engine::CoreStats stats() const;
  std::chrono::steady_clock::time_point last_heartbeat() const;
  void wait_idle();
  // Runs `fn` on the engine thread between two steps (it may use the model and the thread pool)
  // and returns when it has run.
  void run_on_engine_thread(const std::function<void()>& fn);

  // The side budget beside running requests when --max-encoder-ms is not given: `pass_ms` (a
  // decode-only forward pass) times kSidePassesPerWaiting per waiting request, between 1 and
  // kMaxSidePasses passes. One waiting request gets one pass, so a step with side work costs about
  // twice a decode step; a queue gets more, so that new requests join the decode batch sooner (a
  // memory-bound decode pass costs about the same for more streams) while steps stay within a few
  // passes of each other. The constants were measured (docs/benchmarks.md).
  static constexpr double kSidePassesPerWaiting = 0.75;
  static constexpr double kMaxSidePasses = 3;
  static double auto_side_budget_ms(double pass_ms, int64_t waiting);

  struct Shared;  // the part streams reach too (aborts); they hold it weakly
  struct State;

 private:
  EngineCore(Engine::Impl& engine, const BatchingOptions& opts);
  void loop();
  void step();
  void admit();
  // admit()'s part: runs the image encode in progress (or starts one for the first request, in
  // order, that needs one) for this step's share; a finished encode goes into its images and
  // the vision cache.
  void encode_images(const std::vector<int64_t>& to_admit);
  // Drops the encode in progress if it serves request `id` (cancelled, ended).
  void drop_encode_of(int64_t id);
  // The step's side budget beside running requests, for encode slices and prefill chunks
  // together: --max-encoder-ms when given, else auto_side_budget_ms() over the recent decode-only
  // passes and the requests waiting for side work (an encode or a prompt not yet computed). The
  // cost model behind it: moving averages of a decode-only pass and of a prompt token's time
  // beyond it.
  double side_budget_ms() const;
  // NOTE(vlm): beside decodes a limited prefill chunk has at least this many tokens (or the rest
  // of the prompt). Below 32 rows the CPU's INT8 GEMMs once multiplied in f32 at 3-5x the cost
  // per token; their byte GEMM now runs from 2 rows (8 on AVX2), and at 16 rows costs about
  // 1.25x (VNNI) to 1.5x (AVX2) per token what it does at 32 (ops::int8_activation_min_rows).
  static constexpr int64_t kMinSideChunk = 16;
  void observe_forward(const SchedulerOutput& out, double ms);
  double prefill_token_ms() const;  // 0 until measured
  void update(int64_t step_index);
  void publish_kv_events();
  // req: engine_core.cc's Req; `last`: its final token, sampled by step `step` at `sampled_ns`.
  void end(void* req, FinishReason reason, const Status& error, const SampledToken* last = nullptr,
           int64_t step = 0, int64_t sampled_ns = 0);
  void publish_stats_locked();

  Engine::Impl& m_;
  BatchingOptions opts_;
  std::unique_ptr<PixelBudget> pixel_budget_;  // decoded image pixels in flight (submit threads)
  std::function<void(double)> on_step_;
  std::function<void(int64_t, double)> on_encode_;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<State> st_;
  std::thread thread_;
};

}  // namespace vlm

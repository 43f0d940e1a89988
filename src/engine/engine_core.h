// Continuous batching: many requests share every forward pass; they join and leave the running
// batch at each step (vLLM v1's EngineCore, as a thread in this process). One engine thread owns
// the scheduler, the paged KV cache and the model runner; other threads submit requests (through
// the InputProcessor, on their own thread) and cancel them. What a request produces goes to its
// stream as raw tokens: turning them into text is the work of the thread that consumes the stream
// (OutputProcessor), never of this one. Each step: schedule → execute → update.
// Engine::load makes the one EngineCore of an Engine; Engine::submit / generate / logits use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "engine/input_processor.h"
#include "engine/model_runner.h"
#include "vlm/engine.h"

namespace vlm {

class PixelBudget;       // engine/pixel_budget.h
class VisionCache;       // engine/vision_cache.h
struct SchedulerOutput;  // sched/scheduler.h

// Speculative decoding's draft model (SpecMethod::kDraft), when there is one.
struct DraftModel {
  TextDecoder* decoder = nullptr;   // null: no draft model
  VisionEncoder* vision = nullptr;  // null: the draft sees images as their pad tokens
  int64_t vocab_size = 0;
  int64_t deepstack_taps = 0;
  int64_t hidden = 0;  // its text hidden size (an image feature row's length)
  DType kv_dtype = DType::kF32;
};

// What the engine core runs over: the model as the runner and the input processor see it, and
// the KV cache's element type (resolved by Engine::load). The Engine owns what they point to and
// outlives its core.
struct CoreModel {
  RunnerModel runner;
  InputModel input;
  DType kv_dtype = DType::kF32;
  double gpu_memory_utilization = 0.9;  // the device's share the KV cache may fill up to
  DraftModel draft;
};

class EngineCore {
 public:
  // Starts the engine thread. `on_step` (may be empty) gets each step's wall time, `on_encode`
  // (may be empty) each step's encoder slices and their time.
  static Result<std::unique_ptr<EngineCore>> create(
      CoreModel model, const BatchingOptions& opts, std::function<void(double)> on_step,
      std::function<void(int64_t, double)> on_encode = nullptr);
  ~EngineCore();  // stops the engine thread; requests not yet finished get no further output

  // Engine::submit (see there).
  Result<std::unique_ptr<RequestStream>> submit(GenerateRequest request,
                                                std::function<void()> notify,
                                                PromptOutputs prompt = {});

  // Engine::prompt_tokens (see there).
  Result<std::vector<int32_t>> prompt_tokens(GenerateRequest request) const {
    return input_->expanded_prompt(std::move(request));
  }

  Engine::CoreStats stats() const;
  std::chrono::steady_clock::time_point last_heartbeat() const;
  void wait_idle();
  // Runs `fn` on the engine thread between two steps (it may use the model and the thread pool)
  // and returns when it has run.
  void run_on_engine_thread(const std::function<void()>& fn);

  struct Shared;  // the part streams reach too (aborts); they hold it weakly
  struct State;

 private:
  EngineCore(CoreModel model, const BatchingOptions& opts);
  void loop();
  void step();
  // 1. New requests and aborts from the inbox.
  void take_requests();
  // 2. The step's side budget, the image encodes, admission and the schedule
  // (State::sched_out).
  void schedule();
  // Hands the requests not yet admitted (`waiting`, in order) to the scheduler once their images
  // are encoded: a request whose images are not all encoded yet waits, and the ones after it.
  void admit(std::span<EngineRequest* const> waiting);
  // 3. One forward pass over the schedule; each sampled token goes to its stream at once (but a
  // request's last, which comes with its end once the scheduler has freed its blocks).
  Status execute(const SchedulerOutput& out);
  // 4. The scheduler learns what was computed and sampled; requests that hit a stop token or
  // their budget end, and so do prefill-only ones whose prompt is done.
  void update();
  // Speculative decoding: the step's verify counters and the requests' caps; the next step's
  // proposals.
  static constexpr int32_t kSpecRetrySteps = 8;
  void record_spec(const SchedulerOutput& out);
  void propose();
  Status save_verify_snapshot(const StepRow& row);
  // A hybrid model's verify row in state slot `slot`: the first of its per-token state slots.
  int32_t token_slot(int32_t slot) const;
  void fail_step(const Status& st);  // an engine fault: the step's requests fail
  void publish_kv_events();
  // Ends `r`: the stream learns why (a finish reason, or an error), with `last` (its final token,
  // sampled by step `step_index`) when set, and the engine forgets it (its blocks go back).
  void end(EngineRequest& r, FinishReason reason, const Status& error,
           const SampledToken* last = nullptr, int64_t step_index = 0);
  void publish_stats_locked();

  CoreModel model_;
  BatchingOptions opts_;
  std::unique_ptr<PixelBudget> pixel_budget_;  // decoded image pixels in flight (submit threads)
  std::unique_ptr<VisionCache> vision_cache_;  // submit threads look up, the engine thread puts
  std::unique_ptr<InputProcessor> input_;
  std::function<void(double)> on_step_;
  std::function<void(int64_t, double)> on_encode_;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<State> st_;
  std::thread thread_;
};

}  // namespace vlm

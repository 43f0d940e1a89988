// Continuous batching: many requests share every forward pass; they join and leave the running
// batch at each step (vLLM v1's EngineCore, as a thread in this process). One engine thread owns
// the scheduler, the paged KV cache and the model; other threads only submit and abort.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>
#include <thread>
#include <unordered_map>

#include "sched/scheduler.h"
#include "vlm/engine.h"

namespace vlm {

// One event of one request, delivered on the engine thread.
struct CoreEvent {
  int64_t request_id = 0;
  int32_t token_id = -1;   // -1: no new token (final flush or error)
  bool stop_token = false;  // the token is an eos or stop id: it ends the reply, not part of it
  int64_t step = 0;        // with a token: the engine step (Stats::steps) that sampled it
  std::string text;        // newly complete text
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  Status error;            // non-ok: the request failed (finished is true)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  // With request.logprobs >= 0, on token events: the token's log-probability and the most likely
  // alternatives (id, log-probability), best first.
  bool has_logprobs = false;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top_logprobs;
  // On the final event: where the request's time went.
  double queue_ms = 0;       // submit → first forward pass, image encoding excluded
  double preprocess_ms = 0;  // image decode + preprocess (on the submitting thread)
  double encode_ms = 0;      // vision tower (images not found in the cache)
  int64_t images = 0, images_cached = 0, image_tokens = 0;
};


class EngineCore {
 public:
  // Takes over `engine` (do not call its generate/logits while the core runs).
  // `on_step`, when set, is called on the engine thread after every step that ran the model,
  // with the step's wall time in seconds (the server's step-time histogram).
  static Result<std::unique_ptr<EngineCore>> create(Engine& engine, const BatchingOptions& opts,
                                                    std::function<void(double)> on_step = nullptr);
  ~EngineCore();  // stops the engine thread; unfinished requests get no further events

  // Queues a request; `on_event` is called on the engine thread for every token and once with
  // finished = true. Runs on the caller's thread: validation, and reading, decoding and
  // preprocessing the images (or finding them in the vision cache), so a bad image, a prompt
  // over the context or a full queue (ResourceExhausted) is an error here. Later failures (engine
  // faults) arrive as an error event.
  Result<int64_t> submit(GenerateRequest request, std::function<void(const CoreEvent&)> on_event);
  // Cancels a request (e.g. the client went away): its KV blocks are freed at the next step and
  // it gets no more events. Unknown or finished ids are ignored.
  void abort(int64_t id);

  // Snapshot for metrics and tests (engine-thread values, read under the lock).
  struct Stats {
    int64_t running = 0, waiting = 0, kv_blocks_used = 0, kv_blocks_total = 0, steps = 0,
            preemptions = 0;
    int64_t vision_cache_hits = 0, vision_cache_misses = 0, vision_cache_entries = 0;
    int64_t vision_cache_bytes = 0;
  };
  Stats stats() const;
  // When the engine loop last finished a step or an idle wait (it wakes at least every second):
  // a loop that stops beating is stuck.
  std::chrono::steady_clock::time_point last_heartbeat() const;
  // Blocks until no request is queued or running (tests).
  void wait_idle();

  struct State;

 private:
  EngineCore(Engine& engine, const BatchingOptions& opts, Scheduler sched);
  std::function<void(double)> on_step_;
  void loop();
  void step();
  void run_batch(const SchedulerOutput& out);
  void admit();
  void finish(void* req, CoreEvent ev);  // req: the engine thread's record (engine_core.cc)
  void publish_stats_locked();           // stats ← scheduler, with the state lock held

  Engine& engine_;
  BatchingOptions opts_;
  std::unique_ptr<State> st_;
  std::thread thread_;
};

}  // namespace vlm

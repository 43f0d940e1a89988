// Continuous batching: many requests share every forward pass; they join and leave the running
// batch at each step (vLLM v1's EngineCore, as a thread in this process). One engine thread owns
// the scheduler, the paged KV cache and the model; other threads only submit and abort.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "sched/scheduler.h"
#include "vlm/engine.h"

namespace vlm {

// One event of one request, delivered on the engine thread.
struct CoreEvent {
  int64_t request_id = 0;
  int32_t token_id = -1;   // -1: no new token (final flush or error)
  std::string text;        // newly complete text
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  Status error;            // non-ok: the request failed (finished is true)
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
};


class EngineCore {
 public:
  // Takes over `engine` (do not call its generate/logits while the core runs).
  static Result<std::unique_ptr<EngineCore>> create(Engine& engine, const BatchingOptions& opts);
  ~EngineCore();  // stops the engine thread; unfinished requests get no further events

  // Queues a request; `on_event` is called on the engine thread for every token and once with
  // finished = true. Validation errors return here; later failures arrive as an error event.
  Result<int64_t> submit(GenerateRequest request, std::function<void(const CoreEvent&)> on_event);
  // Cancels a request (e.g. the client went away): its KV blocks are freed at the next step and
  // it gets no more events. Unknown or finished ids are ignored.
  void abort(int64_t id);

  // Snapshot for metrics and tests (engine-thread values, read under the lock).
  struct Stats {
    int64_t running = 0, waiting = 0, kv_blocks_used = 0, kv_blocks_total = 0, steps = 0,
            preemptions = 0;
  };
  Stats stats() const;
  // Blocks until no request is queued or running (tests).
  void wait_idle();

  struct State;

 private:
  EngineCore(Engine& engine, const BatchingOptions& opts, Scheduler sched);
  void loop();
  void step();
  void run_batch(const SchedulerOutput& out);
  void finish(void* req, CoreEvent ev);
  void publish_stats_locked();  // stats ← scheduler, with the state lock held  // req: the engine thread's record (engine_core.cc)

  Engine& engine_;
  BatchingOptions opts_;
  std::unique_ptr<State> st_;
  std::thread thread_;
};

}  // namespace vlm

// The engine core's thread boundary: submission (the InputProcessor on the caller's thread, then
// the inbox), the engine thread's loop and its stop, and what other threads may ask of it.
#include <chrono>
#include <string>

#include "core/clock.h"
#include "engine/engine_core.h"
#include "engine/engine_core_state.h"
#include "engine/output_processor.h"
#include "engine/pixel_budget.h"
#include "engine/vision_cache.h"

namespace vlm {

EngineCore::~EngineCore() {
  Shared& sh = *shared_;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.stop = true;
  }
  sh.cv.notify_all();
  if (thread_.joinable()) thread_.join();
  // The engine thread is gone; what it left is settled here. Tasks still queued run on this
  // thread (the pool is free now); every request not yet ended ends with an error, so that a
  // reader blocked in next() and wait_idle() return.
  std::vector<std::function<void()>> tasks;
  std::deque<std::unique_ptr<EngineRequest>> inbox;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    tasks.swap(sh.tasks);
    inbox.swap(sh.inbox);
  }
  for (auto& task : tasks) task();
  st_->encodes.reset();  // it points into the requests
  for (auto& r : inbox) st_->reqs[r->id] = std::move(r);
  const Status stopped = unavailable("the engine stopped before the request finished");
  for (auto& [id, r] : st_->reqs) r->stream->close(FinishReason::kNone, stopped);
  st_->reqs.clear();
  std::lock_guard<std::mutex> lock(sh.mu);
  sh.in_flight = 0;
  sh.cv_idle.notify_all();
}

Result<std::unique_ptr<RequestStream>> EngineCore::submit(GenerateRequest request,
                                                          std::function<void()> notify,
                                                          PromptOutputs prompt) {
  std::vector<std::string> stop = request.stop;
  const int32_t logprobs = request.logprobs;
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<EngineRequest> r,
                       input_->process(std::move(request), prompt));
  auto processor =
      std::make_unique<OutputProcessor>(model_.input.tokenizer, std::move(stop), logprobs);
  const std::shared_ptr<RequestStreamState> stream = r->stream;
  stream->notify = std::move(notify);
  stream->abort = [w = std::weak_ptr<Shared>(shared_)](int64_t id) {
    if (auto s = w.lock()) s->abort(id);
  };
  Shared& sh = *shared_;
  std::lock_guard<std::mutex> lock(sh.mu);
  // Queued = submitted and not running: the inbox, plus what the engine thread holds but has
  // not scheduled yet.
  if (sh.in_flight - sh.stats.running >= opts_.max_waiting) {
    return Status(StatusCode::kResourceExhausted,
                  "the request queue is full (" + std::to_string(opts_.max_waiting) + " waiting)");
  }
  r->id = stream->id = sh.next_id++;
  r->submitted = Clock::now();  // queued from here: the image work above is not queueing
  sh.inbox.push_back(std::move(r));
  ++sh.in_flight;
  sh.cv.notify_all();
  return EngineAccess::make_stream(stream, std::move(processor));
}

Engine::CoreStats EngineCore::stats() const {
  Engine::CoreStats out;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    out = shared_->stats;
  }
  const VisionCache::Stats vc = vision_cache_->stats();
  out.vision_cache_hits = vc.hits;
  out.vision_cache_misses = vc.misses;
  out.vision_cache_entries = vc.entries;
  out.vision_cache_bytes = static_cast<int64_t>(vc.bytes);
  out.image_pixels_peak = pixel_budget_->peak();
  out.image_pixel_waits = pixel_budget_->waits();
  return out;
}

std::chrono::steady_clock::time_point EngineCore::last_heartbeat() const {
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(shared_->heartbeat_ns.load()));
}

void EngineCore::run_on_engine_thread(const std::function<void()>& fn) {
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->tasks.push_back([&] {
      fn();
      std::lock_guard<std::mutex> done_lock(done_mu);
      done = true;
      done_cv.notify_all();
    });
  }
  shared_->cv.notify_all();
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return done; });
}

void EngineCore::wait_idle() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv_idle.wait(lock, [&] { return shared_->in_flight == 0; });
}

void EngineCore::loop() {
  Shared& sh = *shared_;
  std::vector<std::function<void()>> tasks;
  for (;;) {
    sh.heartbeat_ns = steady_now_ns();
    {
      std::unique_lock<std::mutex> lock(sh.mu);
      auto has_work = [&] {
        return sh.stop || !sh.inbox.empty() || !sh.aborts.empty() || !sh.tasks.empty() ||
               !st_->reqs.empty();
      };
      // An idle engine still wakes every second, so that its heartbeat shows it is alive.
      if (!sh.cv.wait_for(lock, std::chrono::seconds(1), has_work)) continue;
      if (sh.stop) return;
      tasks.swap(sh.tasks);
    }
    for (auto& task : tasks) task();
    tasks.clear();
    {
      std::unique_lock<std::mutex> lock(sh.mu);
      // The batching window: an idle engine gives a first arrival's companions a moment.
      if (opts_.batch_wait_ms > 0 && st_->reqs.empty() && !sh.inbox.empty()) {
        sh.cv.wait_for(lock, std::chrono::milliseconds(opts_.batch_wait_ms), [&] {
          return sh.stop || static_cast<int64_t>(sh.inbox.size()) >= opts_.max_num_seqs;
        });
        if (sh.stop) return;
      }
    }
    step();
  }
}

}  // namespace vlm

// EngineCore's two halves of state: what the submitting threads and the streams share with the
// engine thread (Shared, under its lock), and what only the engine thread touches (State).
// Private to engine_core.cc (the step) and engine_core_thread.cc (the thread boundary).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/engine_core.h"
#include "engine/image_encodes.h"
#include "engine/kv_events.h"
#include "engine/mtp_proposer.h"
#include "engine/proposer.h"
#include "engine/request.h"
#include "kv/block_hash.h"
#include "kv/kv_cache.h"
#include "sched/scheduler.h"

namespace vlm {

// What submitting threads and streams share with the engine thread: the inbox, the aborts, the
// counters. Streams hold it weakly (a cancel after the core is gone does nothing).
struct EngineCore::Shared {
  mutable std::mutex mu;
  std::condition_variable cv;       // wakes the engine thread
  std::condition_variable cv_idle;  // wakes wait_idle()
  std::deque<std::unique_ptr<EngineRequest>> inbox;
  std::vector<int64_t> aborts;
  std::vector<std::function<void()>> tasks;  // run_on_engine_thread()
  bool stop = false;
  int64_t next_id = 1;
  int64_t in_flight = 0;  // submitted and not yet finished / aborted
  Engine::CoreStats stats;
  std::atomic<int64_t> heartbeat_ns{0};  // steady_clock, set by the engine thread

  void abort(int64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    aborts.push_back(id);
    cv.notify_all();
  }
};

// The engine thread's own.
struct EngineCore::State {
  std::unique_ptr<Scheduler> sched;
  KvCache cache;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<ImageEncodes> encodes;  // null without a vision tower
  std::unique_ptr<Proposer> proposer;     // speculative decoding's (null: off)
  MtpProposer* mtp = nullptr;             // the proposer, when it is the MTP head's
  std::unordered_map<int64_t, std::unique_ptr<EngineRequest>> reqs;
  // Per-step scratch, kept so that its memory is reused: steady-state decode steps allocate
  // nothing (tests/model/alloc_test.cc).
  SchedulerOutput sched_out;
  std::vector<StepRow> rows;
  std::vector<SampledToken> sampled;
  std::vector<std::pair<int64_t, int64_t>> computed;
  std::vector<ProposeJob> propose_jobs;
  std::vector<int64_t> aborts;
  std::vector<EngineRequest*> waiting;  // not yet admitted, in order
  BlockHasher hasher;                   // prefix-cache keys, seeded at random per engine
  std::vector<KvCacheEvent> kv_log;     // publish_kv_events()' scratch
  std::vector<BlockExtraKey> extras;    // block keys' scratch
  int64_t steps = 0;
  // A hybrid model with proposals: slot s's per-token states are slots token_slot_base + s·K
  // onward (-1: none).
  int32_t token_slot_base = -1;
};

}  // namespace vlm

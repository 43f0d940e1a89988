// A persistent pool of worker threads for data-parallel loops.
// One caller at a time: parallel_for is not re-entrant (the engine thread is the only caller).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace vlm {

// A non-owning reference to a callable with signature void(int64_t begin, int64_t end, int thread).
// Unlike std::function it never allocates, whatever the lambda captures: parallel_for runs on every
// matmul of every decode step, which must not touch the heap.
class RangeFn {
 public:
  template <typename F>
  RangeFn(const F& f)  // NOLINT: implicit, so call sites pass lambdas directly
      : obj_(&f), call_([](const void* o, int64_t b, int64_t e, int t) {
          (*static_cast<const F*>(o))(b, e, t);
        }) {}
  void operator()(int64_t b, int64_t e, int t) const { call_(obj_, b, e, t); }

 private:
  const void* obj_;
  void (*call_)(const void*, int64_t, int64_t, int);
};

class ThreadPool {
 public:
  // n_threads counts the calling thread: n_threads - 1 workers are started. 0 = hardware threads.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int n_threads() const { return n_threads_; }

  // Calls fn(begin, end, thread_index) over [0, n) split into contiguous chunks of whole grains
  // (the last may be short), a few per thread, which the threads claim as they go: a thread may
  // run several chunks, and a slow or descheduled one leaves its share to the others. Blocks
  // until all chunks are done. fn must not throw. Allocates nothing.
  void parallel_for(int64_t n, int64_t grain, RangeFn fn);

 private:
  void worker_loop(int index);
  void run_chunks(int index);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  std::atomic<uint64_t> generation_{0};  // bumped per parallel_for; workers wake on change
  std::atomic<int> pending_{0};          // workers still running the current job
  std::atomic<bool> stop_{false};
  // The current job (written before generation_ is bumped; valid while pending_ > 0).
  const RangeFn* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t chunk_ = 0;
  std::atomic<int64_t> next_chunk_{0};
};

// Float buffers for each of a pool's threads, owned by the thread that calls parallel_for and
// grown there before the fork — so which thread runs which chunk never decides when memory is
// allocated (steady-state decoding allocates nothing, whatever the scheduling).
class PerThreadBuffers {
 public:
  // Makes n_threads buffers of at least `floats` floats each (allocates only to grow).
  void reserve(int n_threads, size_t floats) {
    if (bufs_.size() < static_cast<size_t>(n_threads)) bufs_.resize(n_threads);
    for (auto& b : bufs_) {
      if (b.size() < floats) b.resize(floats);
    }
  }
  float* get(int thread) { return bufs_[thread].data(); }

 private:
  std::vector<std::vector<float>> bufs_;
};

}  // namespace vlm

#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace vlm {
namespace {

// NOTE(vlm): a decode step is ~150 fork/joins (5 per layer); waking a worker through the
// condition variable costs tens of microseconds on a VM. Workers and the caller first spin this
// many pause iterations (~50-100 us) on the atomics, then sleep: a busy engine hands work over
// without a syscall, an idle one sleeps.
constexpr int kSpinIters = 4000;
// Chunks per thread: enough that a thread that lags (descheduled, or slower at its share of
// DRAM) is made up for by the others, few enough that per-chunk overhead stays negligible.
constexpr int64_t kChunksPerThread = 4;

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0)
    n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks(int index) {
  for (;;) {
    const int64_t begin = next_chunk_.fetch_add(1, std::memory_order_relaxed) * chunk_;
    if (begin >= n_) return;
    (*fn_)(begin, std::min(n_, begin + chunk_), index);
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinIters && generation_.load(std::memory_order_acquire) == seen &&
                    !stop_.load(std::memory_order_relaxed);
         ++i) {
      cpu_relax();
    }
    if (generation_.load(std::memory_order_acquire) == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
    }
    if (stop_.load()) return;
    seen = generation_.load(std::memory_order_acquire);
    run_chunks(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mu_);
      cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t n_grains = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<int64_t>(n_threads_, n_grains));
  if (threads <= 1) {
    fn(0, n, 0);
    return;
  }
  const int64_t chunks = std::min<int64_t>(n_grains, threads * kChunksPerThread);
  fn_ = &fn;
  n_ = n;
  chunk_ = (n_grains + chunks - 1) / chunks * grain;
  next_chunk_.store(0, std::memory_order_relaxed);
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);  // every worker takes part
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_start_.notify_all();
  run_chunks(0);
  for (int i = 0; i < kSpinIters && pending_.load(std::memory_order_acquire) != 0; ++i) {
    cpu_relax();
  }
  if (pending_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return pending_.load() == 0; });
  }
}

}  // namespace vlm

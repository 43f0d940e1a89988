#include "core/thread_pool.h"

#include <algorithm>

namespace vlm {

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunk(int index) {
  int64_t begin = static_cast<int64_t>(index) * chunk_;
  int64_t end = std::min(n_, begin + chunk_);
  if (begin < end) (*fn_)(begin, end, index);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_chunk(index);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  int64_t n_grains = (n + grain - 1) / grain;
  int threads = static_cast<int>(std::min<int64_t>(n_threads_, n_grains));
  if (threads <= 1) {
    fn(0, n, 0);
    return;
  }
  int64_t grains_per_thread = (n_grains + threads - 1) / threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    n_ = n;
    chunk_ = grains_per_thread * grain;
    pending_ = n_threads_ - 1;  // every worker wakes; those past the end do nothing
    ++generation_;
  }
  cv_start_.notify_all();
  run_chunk(0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace vlm

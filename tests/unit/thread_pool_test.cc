// ThreadPool: chunks claimed dynamically cover [0, n) exactly once, in whole grains; the caller's
// per-thread buffers (PerThreadBuffers) grow only when asked for more.
#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <vector>

namespace vlm {
namespace {

TEST(ThreadPool, ChunksCoverTheRangeOnceInWholeGrains) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 16, 100, 1000}) {
      for (int64_t grain : {1, 4, 16, 64}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::mutex mu;
        std::set<int> seen_threads;
        bool bad_chunk = false;
        for (int round = 0; round < 3; ++round) {  // the pool is reused between jobs
          pool.parallel_for(n, grain, [&](int64_t b, int64_t e, int t) {
            std::lock_guard<std::mutex> lock(mu);
            seen_threads.insert(t);
            // Every chunk starts on a grain boundary; all but the last end on one.
            if (b % grain != 0 || (e != n && e % grain != 0) || b >= e) bad_chunk = true;
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
          });
        }
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 3)
              << "threads " << threads << " n " << n << " grain " << grain << " i " << i;
        }
        EXPECT_FALSE(bad_chunk) << threads << " " << n << " " << grain;
        for (int t : seen_threads) EXPECT_TRUE(t >= 0 && t < threads) << t;
      }
    }
  }
}

TEST(ThreadPool, PerThreadBuffersGrowOnlyWhenAskedForMore) {
  PerThreadBuffers bufs;
  bufs.reserve(3, 100);
  float* const first[3] = {bufs.get(0), bufs.get(1), bufs.get(2)};
  bufs.reserve(2, 50);  // smaller: nothing moves
  for (int t = 0; t < 3; ++t) EXPECT_EQ(bufs.get(t), first[t]) << t;
  bufs.get(2)[99] = 1.f;  // the whole size is usable
  bufs.reserve(4, 100);   // one more thread: the others keep their memory
  for (int t = 0; t < 3; ++t) EXPECT_EQ(bufs.get(t), first[t]) << t;
  bufs.get(3)[99] = 1.f;
}

}  // namespace
}  // namespace vlm

// Memory-bandwidth probe (`vlm bench --membw`): how fast this machine streams buffers far larger
// than its last-level cache. A decode step reads every weight once, so this is its roof.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "vlm/status.h"

namespace vlm {

// Size of cpu0's level-3 cache from sysfs (/sys/devices/system/cpu/cpu0/cache/index3/size, e.g.
// "266240K"); 0 when it is not there or not readable.
int64_t l3_cache_bytes();

struct MembwSamples {
  int64_t bytes = 0;              // size of each of the two buffers
  std::vector<double> read_gb_s;  // per pass: bytes / s of a sum over the buffer (1 GB = 1e9 B)
  std::vector<double> copy_gb_s;  // per pass: 2 · bytes / s of memcpy (read + write, as STREAM)
  uint64_t checksum = 0;          // what the read passes summed (keeps the reads from vanishing)
};

// Allocates two buffers of `bytes` (rounded up to 4 KiB), writes them once (first touch), runs
// one untimed pass of each kernel and then `reps` timed passes of each. In every pass the threads
// of `pool` claim page-aligned slices (parallel_for's chunks). The read kernel sums
// 64-byte lines with 16-byte vector adds (SSE2 / NEON at the baseline ISA: no per-ISA build
// needed to reach the memory roof). kUnavailable when the buffers cannot be allocated.
Result<MembwSamples> measure_membw(int64_t bytes, int reps, ThreadPool& pool);

}  // namespace vlm

#pragma once
// GPU utilisation and memory from NVML (the driver's libnvidia-ml.so.1, loaded at run time, so
// that nothing needs the driver to start), for /metrics.
#include <cstdint>

#include "vlm/status.h"

namespace vlm::cuda {

struct GpuStats {
  double utilization_percent = -1;  // busy share of the last sample period; -1: not reported
  int64_t memory_used = 0, memory_total = 0;  // bytes, the whole device (every process)
  double power_watts = -1;                    // board power draw; -1: not reported
};

// NVML's readings for device `index`; an error where NVML or the device is not there.
Result<GpuStats> read_gpu_stats(int index);

}  // namespace vlm::cuda

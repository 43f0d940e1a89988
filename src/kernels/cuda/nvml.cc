// NVML through dlopen (src/kernels/cuda/nvml.h). The few entry points and structs below are NVML's
// stable C ABI (nvml.h is not part of the toolkit here).
#include "kernels/cuda/nvml.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace vlm::cuda {
namespace {

using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {
  unsigned int gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};

struct Nvml {
  int (*init)() = nullptr;
  int (*handle_by_index)(unsigned int, NvmlDevice*) = nullptr;
  int (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  int (*memory)(NvmlDevice, NvmlMemory*) = nullptr;
  int (*power)(NvmlDevice, unsigned int*) = nullptr;  // milliwatts
  std::string error;
};

const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      n.error = "NVML is not available (libnvidia-ml.so.1 not found)";
      return;
    }
    n.init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    n.handle_by_index = reinterpret_cast<int (*)(unsigned int, NvmlDevice*)>(
        dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    n.utilization = reinterpret_cast<int (*)(NvmlDevice, NvmlUtilization*)>(
        dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    n.memory =
        reinterpret_cast<int (*)(NvmlDevice, NvmlMemory*)>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    n.power =
        reinterpret_cast<int (*)(NvmlDevice, unsigned int*)>(dlsym(lib, "nvmlDeviceGetPowerUsage"));
    if (n.init == nullptr || n.handle_by_index == nullptr || n.memory == nullptr) {
      n.error = "NVML lacks the entry points vlm reads";
    } else if (int rc = n.init(); rc != 0) {
      n.error = "nvmlInit failed (" + std::to_string(rc) + ")";
    }
  });
  return n;
}

}  // namespace

Result<GpuStats> read_gpu_stats(int index) {
  const Nvml& n = nvml();
  if (!n.error.empty()) return Status(StatusCode::kUnimplemented, n.error);
  NvmlDevice dev = nullptr;
  if (int rc = n.handle_by_index(static_cast<unsigned int>(index), &dev); rc != 0) {
    return internal_error("NVML: no device " + std::to_string(index) + " (" + std::to_string(rc) +
                          ")");
  }
  GpuStats s;
  NvmlMemory mem{};
  if (int rc = n.memory(dev, &mem); rc != 0) {
    return internal_error("NVML: memory info failed (" + std::to_string(rc) + ")");
  }
  s.memory_used = static_cast<int64_t>(mem.used);
  s.memory_total = static_cast<int64_t>(mem.total);
  NvmlUtilization u{};
  if (n.utilization != nullptr && n.utilization(dev, &u) == 0) s.utilization_percent = u.gpu;
  unsigned int milliwatts = 0;
  if (n.power != nullptr && n.power(dev, &milliwatts) == 0) s.power_watts = milliwatts / 1000.0;
  return s;
}

}  // namespace vlm::cuda

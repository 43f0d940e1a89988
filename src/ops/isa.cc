// The CPU's ISA level: detected once (capped by VLM_CPU_ISA), and what each level can run.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ops/ops.h"

namespace vlm::ops {
namespace {

// Whether this CPU runs the kernels of level `isa`.
bool cpu_runs(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  switch (isa) {
    case Isa::kGeneric:
      return true;
    case Isa::kAvx2:
      return avx2;
    case Isa::kAvx2Vnni:
      return avx2 && __builtin_cpu_supports("avxvnni");
    case Isa::kAvx512:
      return avx512;
    case Isa::kAvx512Vnni:
      return avx512 && __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Isa::kGeneric;
#endif
}

constexpr Isa kLevels[] = {Isa::kGeneric, Isa::kAvx2, Isa::kAvx2Vnni, Isa::kAvx512,
                           Isa::kAvx512Vnni};

Isa detect_capped() {
  Isa want = Isa::kAvx512Vnni;
  const char* env = std::getenv("VLM_CPU_ISA");
  if (env != nullptr) {
    for (Isa l : kLevels) {
      if (std::strcmp(env, isa_name(l)) == 0) want = l;
    }
  }
  // The variable only lowers the level: the best level at or below it that the CPU runs.
  Isa best = Isa::kGeneric;
  for (Isa l : kLevels) {
    if (static_cast<int>(l) <= static_cast<int>(want) && cpu_runs(l)) best = l;
  }
  return best;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return "generic";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx2Vnni:
      return "avx2vnni";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Vnni:
      return "avx512vnni";
  }
  return "?";
}

Isa detected_isa() {
  static const Isa isa = detect_capped();
  return isa;
}

std::vector<Isa> runnable_isas() {
  std::vector<Isa> out;
  for (Isa l : kLevels) {
    if (cpu_runs(l)) out.push_back(l);
  }
  return out;
}

bool has_fp16_arithmetic(Isa isa) {
#if defined(VLM_HAVE_X86_DISPATCH)
  static const bool cpu = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512fp16") != 0;
  }();
  return cpu && (isa == Isa::kAvx512 || isa == Isa::kAvx512Vnni);
#else
  (void)isa;
  return false;
#endif
}

}  // namespace vlm::ops

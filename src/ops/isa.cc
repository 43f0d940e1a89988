// The CPU's ISA level: detected once (capped by VLM_CPU_ISA), and what each level can run.
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ops/ops.h"

namespace vlm::ops {
namespace {

Isa detect_hardware() {
#if defined(VLM_HAVE_X86_DISPATCH)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
    return __builtin_cpu_supports("avx512vnni") ? Isa::kAvx512Vnni : Isa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    return Isa::kAvx2;
  }
#endif
  return Isa::kGeneric;
}

Isa detect_capped() {
  Isa hw = detect_hardware();
  const char* env = std::getenv("VLM_CPU_ISA");
  if (env == nullptr || *env == '\0') return hw;
  Isa want = hw;
  if (std::strcmp(env, "generic") == 0) want = Isa::kGeneric;
  if (std::strcmp(env, "avx2") == 0) want = Isa::kAvx2;
  if (std::strcmp(env, "avx512") == 0) want = Isa::kAvx512;
  if (std::strcmp(env, "avx512vnni") == 0) want = Isa::kAvx512Vnni;
  // The variable only lowers the level: asking for more than the CPU has keeps the hardware level.
  return static_cast<int>(want) < static_cast<int>(hw) ? want : hw;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return "generic";
    case Isa::kAvx2:
      return "avx2";
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
  Isa hw = detect_hardware();
  for (Isa i : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (static_cast<int>(i) <= static_cast<int>(hw)) out.push_back(i);
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

// vlm::system_info: what this build holds (kernel levels, CUDA) and what this CPU runs of it.
#include "ops/ops.h"
#include "vlm/engine.h"

#ifndef VLM_VERSION
#define VLM_VERSION "dev"
#endif

namespace vlm {

SystemInfo system_info() {
  SystemInfo s;
  s.version = VLM_VERSION;
  s.isas_built.push_back(ops::isa_name(ops::Isa::kGeneric));
#ifdef VLM_HAVE_X86_DISPATCH
  for (ops::Isa isa :
       {ops::Isa::kAvx2, ops::Isa::kAvx2Vnni, ops::Isa::kAvx512, ops::Isa::kAvx512Vnni}) {
    s.isas_built.push_back(ops::isa_name(isa));
  }
#endif
  for (ops::Isa isa : ops::runnable_isas()) s.isas_runnable.push_back(ops::isa_name(isa));
  s.isa_auto = ops::isa_name(ops::detected_isa());
#ifdef VLM_HAVE_AVX512BF16
  s.extras_built.push_back("avx512bf16");
  if (ops::bf16_gemm_available(ops::Bf16Gemm::kDotBf16)) s.extras_runnable.push_back("avx512bf16");
#endif
#ifdef VLM_HAVE_AMX
  s.extras_built.push_back("amx");
  if (ops::amx_available()) s.extras_runnable.push_back("amx");
#endif
#ifdef VLM_HAVE_X86_DISPATCH
  s.extras_built.push_back("avx512fp16");  // --vision-fp16
  if (ops::has_fp16_arithmetic(ops::Isa::kAvx512)) s.extras_runnable.push_back("avx512fp16");
#endif
#ifdef VLM_HAVE_CUDA
  s.cuda_built = true;
#endif
  return s;
}

}  // namespace vlm

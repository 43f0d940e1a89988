// Option help shared by the CLI's subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include "vlm/engine.h"

namespace vlm::cli {

inline constexpr const char* kQuantHelp =
    "Quantize the text decoder's linear weights at load: int8 (one scale per output row), int4 "
    "(one scale per 32 inputs) on the CPU only, or fp8 (E4M3 weights and activations, one scale "
    "per tensor) with --device cuda only";

inline constexpr const char* kMmapHelp =
    "Serve the weights straight from the checkpoint's file mapping (faster start-up, page cache "
    "shared between processes) instead of copying them onto 2 MiB pages (~10% faster prefill "
    "and decode)";

inline constexpr const char* kVisionFp16Help =
    "Run the vision encoder's matmuls in FP16 arithmetic on CPUs with AVX-512 FP16 (twice the "
    "multiply rate; activations and runs of 32 products rounded to FP16); ignored elsewhere";

// --device, --gpu-dtype and --gpu-memory-utilization, bound to the engine options' fields.
inline void add_device_options(CLI::App* app, EngineOptions* o) {
  app->add_option("--device", o->device,
                  "Where the text decoder runs: cpu (default) or cuda (the first NVIDIA GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app->add_option("--gpu-dtype", o->gpu_dtype,
                  "cuda: weights and activations in bf16 (default) or f32")
      ->check(CLI::IsMember({"bf16", "f32"}));
  app->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "cuda: share of the GPU's memory for weights, scratch and the KV cache "
                  "(default 0.9)");
  app->add_flag("!--no-cuda-graphs", o->cuda_graphs,
                "cuda: launch every kernel of each decode step instead of replaying CUDA graphs");
}

}  // namespace vlm::cli

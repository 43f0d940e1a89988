// Option help shared by the CLI's subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>

#include "vlm/engine.h"

namespace vlm::cli {

inline constexpr const char* kQuantHelp =
    "Quantize the text decoder's linear weights at load: none (default), int8 (one scale per "
    "output row), int4 "
    "(one f16 scale per group of inputs, see --int4-group: 4.5 bits per weight) on the CPU only, "
    "or fp8 (E4M3 weights and activations, one scale "
    "per tensor) with --device cuda only";

inline constexpr const char* kMmapHelp =
    "Serve the weights straight from the checkpoint's file mapping (faster start-up, page cache "
    "shared between processes) instead of copying them onto 2 MiB pages (~10% faster prefill "
    "and decode)";

inline constexpr const char* kVisionFp16Help =
    "Run the vision encoder's matmuls in FP16 arithmetic on CPUs with AVX-512 FP16 (twice the "
    "multiply rate; activations and runs of 32 products rounded to FP16); ignored elsewhere";

// An option whose text is parsed into an enum once, here, by vlm's own parser (parse_quant,
// parse_device, ...): a bad value is refused with that parser's message.
template <typename E>
void add_enum_option(CLI::App* app, const std::string& name, E* out,
                     Result<E> (*parse)(std::string_view), const std::string& help) {
  app->add_option_function<std::string>(
         name, [out, parse](const std::string& s) { *out = *parse(s); }, help)
      ->check(CLI::Validator(
          [parse](std::string& s) {
            auto r = parse(s);
            return r.ok() ? std::string() : r.status().message();
          },
          "", ""));
}

// --quant and --int4-group, bound to an engine option's fields.
inline void add_quant_option(CLI::App* app, Quant* q, int64_t* int4_group) {
  add_enum_option(app, "--quant", q, parse_quant, kQuantHelp);
  app->add_option("--int4-group", *int4_group,
                  "--quant int4: inputs per scale, 32 (default: 4.5 bits per weight), 64 (4.25) "
                  "or 128 (4.125; coarser)")
      ->check(CLI::IsMember({32, 64, 128}));
}

// --mmproj: a GGUF model's vision file.
inline void add_mmproj_option(CLI::App* app, EngineOptions* o) {
  app->add_option(
      "--mmproj", o->mmproj,
      "With a GGUF model file (-m FILE.gguf): its vision tower's GGUF file (llama.cpp's "
      "mmproj); without it the model is text only");
}

// --device, --gpu-dtype, --gpu-memory-utilization, --precision and --no-autotune, bound to the
// engine options' fields.
inline void add_device_options(CLI::App* app, EngineOptions* o) {
  add_enum_option(app, "--device", &o->device, parse_device,
                  "Where the model runs: cpu (default) or cuda (the first NVIDIA GPU)");
  add_enum_option(app, "--gpu-dtype", &o->gpu_dtype, parse_gpu_dtype,
                  "cuda: weights and activations in bf16 (default) or f32");
  add_enum_option(app, "--precision", &o->precision, parse_precision,
                  "cpu: auto (default: a BF16 checkpoint's prefill and vision products may run in "
                  "BF16 arithmetic where that measures faster, e.g. on AMX tiles) or f32 (every "
                  "product exact in f32)");
  app->add_flag("!--no-autotune", o->autotune,
                "cpu: no kernel measurement at load (the f32 kernels, unless VLM_CPU_KERNELS "
                "forces others)");
  app->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                  "cuda: share of the GPU's memory for weights, scratch and the KV cache "
                  "(default 0.9)");
  add_enum_option(app, "--kv-cache-dtype", &o->kv_cache_dtype, parse_kv_cache_dtype,
                  "What the KV cache stores: auto (default: bf16 on the CPU for a BF16 "
                  "checkpoint, else f32; the activation type on cuda), f32, bf16, or int8 (one "
                  "scale per token and KV head; cpu)");
  app->add_flag("!--no-cuda-graphs", o->cuda_graphs,
                "cuda: launch every kernel of each decode step instead of replaying CUDA graphs");
}

// --spec, --spec-tokens, --spec-draft-model, --ngram-min and --ngram-max, bound to the engine's
// speculative decoding.
inline void add_spec_options(CLI::App* app, SpecOptions* s) {
  add_enum_option(
      app, "--spec", &s->method, parse_spec_method,
      "Speculative decoding: none (default), ngram (prompt lookup: the tokens that "
      "followed the sequence's last n-gram earlier in the prompt or reply are proposed) "
      "draft (a smaller model with the same tokenizer, --spec-draft-model, "
      "proposes) or mtp (a Qwen3.5 checkpoint's own MTP head proposes); the proposals "
      "are checked in one pass and the output is the same, "
      "under the conditions docs/architecture.md gives; CPU only");
  app->add_option("--spec-draft-model", s->draft_model,
                  "--spec draft: the draft model's checkpoint directory (loaded with this "
                  "model's options; its KV cache comes out of the same budget)");
  app->add_option("--spec-tokens", s->num_tokens,
                  "--spec: tokens proposed per step at most (default 4, up to 16)");
  app->add_option("--ngram-min", s->ngram_min,
                  "--spec ngram: the shortest n-gram looked up (default 2)");
  app->add_option("--ngram-max", s->ngram_max,
                  "--spec ngram: the longest n-gram looked up, tried first (default 4)");
}

}  // namespace vlm::cli

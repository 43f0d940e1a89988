// Engine internals: the loaded model, which engine.cc loads and serves the public API from. The
// engine core sees it only through the narrow CoreModel (engine_core.h). Not part of the public
// API.
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "core/thread_pool.h"
#include "engine/engine_access.h"
#include "engine/engine_core.h"
#include "engine/multimodal.h"
#include "engine/structured_output.h"
#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
#include "ops/backend.h"
#include "vision/preprocess.h"
#include "vlm/chat.h"
#include "vlm/engine.h"

namespace vlm {

struct Engine::Impl {
  EngineOptions opts;
  Qwen3VLConfig cfg;
  GenerationConfig gen;
  std::unique_ptr<WeightStore> store;
  HugePageBuffer weight_pages;  // the weights' bytes unless EngineOptions::mmap_weights
  TextWeights weights;
  VisionWeights vision_weights;
  bool has_vision = false;
  PreprocessOptions preprocess;
  VideoStaging video;                     // video_preprocessor_config.json and the decoder's limits
  std::shared_ptr<ThreadPool> pool;       // a draft model shares its target's
  std::unique_ptr<ops::Backend> backend;  // where the model runs: the CPU, or "cuda"
  std::unique_ptr<TextDecoder> decoder;
  std::unique_ptr<VisionEncoder> vision;       // null without a vision tower
  std::atomic<int64_t> graph_replays{0};       // decode steps replayed from recorded graphs
  std::string cpu_kernels;                     // Engine::cpu_kernels(): the CPU kernel choices
  std::string cpu_kernel_choice;               // Engine::cpu_kernel_choice(): the names alone
  std::shared_ptr<const Tokenizer> tokenizer;  // shared with the request streams' processors
  std::optional<ChatTemplate> chat_template;   // Engine::chat's; set with the tokenizer
  Status chat_template_error;                  // why there is none (a template that failed)
  std::vector<int32_t> eos_ids;
  std::vector<std::string> load_notes;  // Engine::load_notes()
  // Grammars compiled against the vocabulary (structured output); null without a tokenizer.
  std::unique_ptr<StructuredOutputs> structured;
  int64_t max_context = 0;
  ops::Isa isa = ops::Isa::kGeneric;
  // Speculative decoding's draft model (SpecMethod::kDraft): loaded as this one, without a core.
  std::unique_ptr<Impl> draft;
  // Last: made over everything above and stopped (its thread joined) before any of it goes.
  std::unique_ptr<EngineCore> core;

  // What the engine core runs over (pointers into this struct, which outlives the core).
  CoreModel core_model() {
    CoreModel m;
    m.runner.decoder = decoder.get();
    m.runner.vision = vision.get();
    m.runner.vocab_size = cfg.text_config.vocab_size;
    m.runner.isa = isa;
    m.runner.cuda_graphs = opts.cuda_graphs;
    m.runner.graph_replays = &graph_replays;
    m.input.cfg = &cfg;
    m.input.gen = &gen;
    m.input.tokenizer = tokenizer;
    m.input.eos_ids = eos_ids;
    m.input.structured = structured.get();
    m.input.preprocess = &preprocess;
    m.input.video = &video;
    m.input.has_vision = has_vision;
    m.input.max_context = max_context;
    m.input.on_cpu = opts.device == Device::kCpu;
    m.input.pooling_only = opts.pooling_only;
    m.input.head_missing = weights.head_missing;
    m.gpu_memory_utilization = opts.gpu_memory_utilization;
    if (draft) {
      m.draft.decoder = draft->decoder.get();
      m.draft.vision = draft->vision.get();
      m.draft.vocab_size = draft->cfg.text_config.vocab_size;
      m.draft.hidden = draft->cfg.text_config.hidden_size;
      m.draft.deepstack_taps =
          static_cast<int64_t>(draft->cfg.vision_config.deepstack_visual_indexes.size());
    }
    return m;
  }
};

}  // namespace vlm

// Engine internals: the loaded model, shared by engine.cc (loading, the public API) and the engine
// core (engine_core.cc, model_runner.cc). Not part of the public API.
#pragma once

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "engine/engine_core.h"
#include "engine/multimodal.h"
#include "engine/sampler.h"
#include "engine/structured_output.h"
#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "model/qwen3vl_weights.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
#include "ops/backend.h"
#include "vision/preprocess.h"
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
  VideoStaging video;  // video_preprocessor_config.json and the decoder's limits
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ops::Backend> backend;  // where the model runs: the CPU, or "cuda"
  std::unique_ptr<TextDecoder> decoder;
  std::unique_ptr<VisionEncoder> vision;       // null without a vision tower
  std::atomic<int64_t> graph_replays{0};       // decode steps replayed from recorded graphs
  std::string cpu_kernels;                     // Engine::cpu_kernels(): the CPU kernel choices
  std::shared_ptr<const Tokenizer> tokenizer;  // shared with the request streams' processors
  std::vector<int32_t> eos_ids;
  // Grammars compiled against the vocabulary (structured output); null without a tokenizer.
  std::unique_ptr<StructuredOutputs> structured;
  int64_t max_context = 0;
  ops::Isa isa = ops::Isa::kGeneric;
  // Last: made over everything above and stopped (its thread joined) before any of it goes.
  std::unique_ptr<EngineCore> core;

  int64_t max_chunk() const { return decoder->max_chunk(); }

  // Request → generation_config.json → transformers defaults; checks ranges.
  Result<ResolvedSampling> resolve_sampling(const SamplingParams& sp) const {
    ResolvedSampling rs;
    rs.temperature = sp.temperature.value_or(gen.temperature);
    rs.top_k = sp.top_k.value_or(gen.top_k);
    rs.top_p = sp.top_p.value_or(gen.top_p);
    rs.min_p = sp.min_p.value_or(gen.min_p);
    rs.repetition_penalty = sp.repetition_penalty.value_or(gen.repetition_penalty);
    rs.presence_penalty = sp.presence_penalty;
    rs.frequency_penalty = sp.frequency_penalty;
    rs.greedy =
        !sp.do_sample.value_or(gen.do_sample || sp.temperature.has_value()) || rs.temperature <= 0;
    rs.seed = sp.seed.has_value() ? *sp.seed : std::random_device{}();
    const int64_t V = cfg.text_config.vocab_size;
    for (const auto& [id, bias] : sp.logit_bias) {
      if (id < 0 || id >= V) {
        return invalid_argument("logit_bias: token id " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(V) + ")");
      }
      if (!(bias >= -100 && bias <= 100))
        return invalid_argument("logit_bias values must be in [-100, 100]");
    }
    rs.logit_bias = sp.logit_bias;
    if (rs.temperature < 0) return invalid_argument("temperature must be >= 0");
    if (rs.top_k < 0) return invalid_argument("top_k must be >= 0");
    if (!(rs.top_p > 0 && rs.top_p <= 1)) return invalid_argument("top_p must be in (0, 1]");
    if (!(rs.min_p >= 0 && rs.min_p <= 1)) return invalid_argument("min_p must be in [0, 1]");
    if (!(rs.repetition_penalty > 0)) return invalid_argument("repetition_penalty must be > 0");
    return rs;
  }

  Status check_prompt_ids(std::span<const int32_t> ids) const {
    const int64_t V = cfg.text_config.vocab_size;
    for (int32_t id : ids) {
      if (id < 0 || id >= V) {
        return invalid_argument("token id " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(V) + ")");
      }
    }
    return ok_status();
  }

  // Whether the prompt goes the multimodal way: it has images or videos, or on a checkpoint with
  // a vision tower image pads or a video placeholder (<|vision_start|><|video_pad|>; a video pad
  // elsewhere is text, as in transformers). On a text-only checkpoint pads are ordinary tokens.
  // Images or videos without a vision tower are an error.
  Result<bool> is_multimodal(std::span<const int32_t> ids, const std::vector<ImageInput>& images,
                             const std::vector<VideoInput>& videos) const {
    bool has_pads = false;
    for (size_t i = 0; i < ids.size() && !has_pads; ++i) {
      has_pads = ids[i] == cfg.image_token_id ||
                 (ids[i] == cfg.video_token_id && i > 0 && ids[i - 1] == cfg.vision_start_token_id);
    }
    if ((!images.empty() || !videos.empty()) && !has_vision) {
      return invalid_argument(
          "this checkpoint has no vision tower: images and videos are not supported");
    }
    return !images.empty() || !videos.empty() || (has_pads && has_vision);
  }

  // max_new_tokens for a prompt of n tokens: the request's, else generation_config's shrunk to
  // the room left in the context; both must fit the context with the prompt.
  Result<int64_t> generation_budget(int64_t n, std::optional<int64_t> requested) const {
    if (n >= max_context) {
      return out_of_range("the prompt (" + std::to_string(n) +
                          " tokens) does not fit the context of " + std::to_string(max_context) +
                          " tokens");
    }
    const int64_t max_new = requested.has_value()
                                ? *requested
                                : std::min(gen.max_new_tokens.value_or(256), max_context - n);
    if (max_new < 0) return invalid_argument("max_tokens must be >= 0");
    if (max_new > max_context - n) {  // n < max_context here: no overflow whatever max_new is
      return out_of_range("the prompt (" + std::to_string(n) + " tokens) and max_tokens (" +
                          std::to_string(max_new) + ") exceed the context of " +
                          std::to_string(max_context) + " tokens (at most " +
                          std::to_string(max_context - n) + " tokens can be generated)");
    }
    return max_new;
  }

  // A text-only prompt as the decoder runs it: the ids, no image rows, 1-D positions.
  static void prepare_text(std::span<const int32_t> ids, PreparedPrompt* p) {
    p->ids.assign(ids.begin(), ids.end());
    p->feature_row.assign(ids.size(), -1);
    const int64_t n = static_cast<int64_t>(ids.size());
    p->rope.t.resize(n);
    for (int64_t i = 0; i < n; ++i) p->rope.t[i] = i;
    p->rope.h = p->rope.t;
    p->rope.w = p->rope.t;
    p->rope.delta = 0;
  }
};

}  // namespace vlm

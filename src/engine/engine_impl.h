// Engine internals shared by engine.cc (one request at a time) and engine_core.cc (continuous
// batching). Not part of the public API.
#pragma once

#include <algorithm>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "engine/multimodal.h"
#include "engine/sampler.h"
#include "io/safetensors.h"
#include "model/qwen3vl_config.h"
#include "model/device_decoder.h"
#include "model/qwen3vl_weights.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
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
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<TextDecoder> decoder;   // on the CPU; null when the GPU runs the decoder
  std::unique_ptr<DeviceDecoder> gpu;     // EngineOptions::device == "cuda"
  std::vector<int32_t> gpu_table;         // 0, 1, 2, …: a single sequence over the GPU's blocks
  std::unique_ptr<VisionEncoder> vision;
  std::unique_ptr<DeviceVisionEncoder> gpu_vision;  // "cuda": runs `vision`'s encode (uses it)
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> eos_ids;
  int64_t max_context = 0;
  ops::Isa isa = ops::Isa::kGeneric;
  KvCache cache;
  std::vector<float> logits;      // [vocab]: the last position of generate()'s steps
  int64_t step_pos = 0;           // the rotary position of a decode step (T = H = W)

  int64_t max_chunk() const { return gpu ? gpu->max_chunk() : decoder->max_chunk(); }

  // Makes sure the cache holds `n` positions; grows (never shrinks) between requests.
  Status reserve_cache(int64_t n) {
    if (gpu == nullptr) {
      if (cache.capacity() < n) cache.allocate(cfg.text_config, 1, n);
      return ok_status();
    }
    if (gpu->cache_blocks() * gpu->cache_block_size() < n) {
      constexpr int64_t kBlock = 16;
      const int64_t blocks = (n + kBlock - 1) / kBlock;
      VLM_RETURN_IF_ERROR(gpu->allocate_cache(blocks, kBlock, blocks));
    }
    gpu_table.resize(static_cast<size_t>(gpu->cache_blocks()));
    for (size_t b = 0; b < gpu_table.size(); ++b) gpu_table[b] = static_cast<int32_t>(b);
    return ok_status();
  }

  // One sequence's n tokens at cache slots [first, first + n): TextDecoder::forward on the CPU,
  // or a one-chunk batch over the GPU's blocks in order.
  Status forward(const int32_t* ids, int64_t n, const Positions3& pos, int64_t first, LogitRows rows,
                 float* out, const VisionRows* vision) {
    if (gpu == nullptr) return decoder->forward(ids, n, pos, first, cache, rows, out, vision);
    SeqChunk c;
    c.ids = ids;
    c.n = n;
    c.first = first;
    c.pos = pos;
    c.block_table = gpu_table.data();
    c.num_table_blocks = std::min<int64_t>(static_cast<int64_t>(gpu_table.size()),
                                           (first + n + gpu->cache_block_size() - 1) / gpu->cache_block_size());
    c.vision = vision;
    c.rows = rows;
    return gpu->forward_batch(&c, 1, out);
  }

  // Runs the whole prompt from cache slot 0 in chunks. rows: kLast → logits of the last position
  // into `out` [vocab]; kAll → every position into `out` [n, vocab].
  Status prefill(const PreparedPrompt& p, LogitRows rows, float* out) {
    const int64_t n = static_cast<int64_t>(p.ids.size());
    const int64_t chunk = max_chunk();
    const int64_t V = cfg.text_config.vocab_size;
    for (int64_t first = 0; first < n; first += chunk) {
      const int64_t len = std::min(chunk, n - first);
      const bool last = first + len == n;
      Positions3 pos{p.rope.t.data() + first, p.rope.h.data() + first, p.rope.w.data() + first};
      VisionRows vr;
      if (p.vision_tokens > 0) vr = p.rows_for_chunk(first);
      LogitRows want = rows == LogitRows::kAll ? LogitRows::kAll : (last ? rows : LogitRows::kNone);
      float* dst = rows == LogitRows::kAll ? out + first * V : out;
      VLM_RETURN_IF_ERROR(forward(p.ids.data() + first, len, pos, first, want, dst,
                                  p.vision_tokens > 0 ? &vr : nullptr));
    }
    return ok_status();
  }

  // One decode step: token `id` at cache slot `slot`, rotary position slot + delta on all axes.
  Status step(int32_t id, int64_t slot, int64_t delta, float* out) {
    step_pos = slot + delta;
    Positions3 p{&step_pos, &step_pos, &step_pos};
    return forward(&id, 1, p, slot, LogitRows::kLast, out, nullptr);
  }

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
    rs.greedy = !sp.do_sample.value_or(gen.do_sample || sp.temperature.has_value()) || rs.temperature <= 0;
    rs.seed = sp.seed.has_value() ? *sp.seed : std::random_device{}();
    const int64_t V = cfg.text_config.vocab_size;
    for (const auto& [id, bias] : sp.logit_bias) {
      if (id < 0 || id >= V) {
        return invalid_argument("logit_bias: token id " + std::to_string(id) +
                                " is outside the vocabulary [0, " + std::to_string(V) + ")");
      }
      if (!(bias >= -100 && bias <= 100)) return invalid_argument("logit_bias values must be in [-100, 100]");
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
        return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                std::to_string(V) + ")");
      }
    }
    return ok_status();
  }

  // Whether the prompt goes the multimodal way: it has images, or image pads on a checkpoint
  // with a vision tower (on a text-only one, pads are ordinary tokens). Images without a vision
  // tower are an error.
  Result<bool> is_multimodal(std::span<const int32_t> ids, const std::vector<ImageInput>& images) const {
    const bool has_pads = std::find(ids.begin(), ids.end(), static_cast<int32_t>(cfg.image_token_id)) != ids.end();
    if (!images.empty() && !has_vision) {
      return invalid_argument("this checkpoint has no vision tower: images are not supported");
    }
    return !images.empty() || (has_pads && has_vision);
  }

  // max_new_tokens for a prompt of n tokens: the request's, else generation_config's shrunk to
  // the room left in the context; both must fit the context with the prompt.
  Result<int64_t> generation_budget(int64_t n, std::optional<int64_t> requested) const {
    if (n >= max_context) {
      return out_of_range("the prompt (" + std::to_string(n) + " tokens) does not fit the context of " +
                          std::to_string(max_context) + " tokens");
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

  // Expands images, encodes them, computes positions; text-only prompts get 1-D positions.
  Status prepare(std::span<const int32_t> ids, const std::vector<ImageInput>& images,
                 PreparedPrompt* p) {
    VLM_RETURN_IF_ERROR(check_prompt_ids(ids));
    VLM_ASSIGN_OR_RETURN(const bool multimodal, is_multimodal(ids, images));
    if (multimodal) return prepare_multimodal(ids, images, cfg, preprocess, *vision, *pool, p);
    p->ids.assign(ids.begin(), ids.end());
    p->feature_row.assign(ids.size(), -1);
    const int64_t n = static_cast<int64_t>(ids.size());
    p->rope.t.resize(n);
    for (int64_t i = 0; i < n; ++i) p->rope.t[i] = i;
    p->rope.h = p->rope.t;
    p->rope.w = p->rope.t;
    p->rope.delta = 0;
    return ok_status();
  }
};

}  // namespace vlm

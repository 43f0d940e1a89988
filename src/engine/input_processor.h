// The InputProcessor (vLLM v1's): everything between a GenerateRequest and a request the
// scheduler may run. On the submitting thread (process): the request's checks, its sampling
// resolved (request → generation_config.json → transformers' defaults), its images and videos
// read, decoded, preprocessed and priced against the context (or found in the vision cache), its
// videos' timestamps written into the prompt, its budget fitted to the context and the KV cache.
// On the engine thread, once its images are encoded (assemble): the prompt expanded with their
// tokens, features and 3-D positions.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/multimodal.h"
#include "engine/pixel_budget.h"
#include "engine/request.h"
#include "engine/structured_output.h"
#include "engine/vision_cache.h"
#include "kv/block_hash.h"
#include "model/qwen3vl_config.h"
#include "vlm/engine.h"
#include "vlm/tokenizer.h"

namespace vlm {

// What Engine::logits asks of a request besides its stream: every prompt position's logits
// ([expanded prompt tokens, vocab], sized at submit; the request is then prefill-only) and the
// prompt with its image pads expanded (written by the engine thread at admission).
struct PromptOutputs {
  std::vector<float>* logits = nullptr;
  std::vector<int32_t>* expanded_ids = nullptr;
  bool read_prefix_cache = false;  // with logits: leading cached positions are not computed
};

// The model as the InputProcessor sees it (owned by the Engine, which outlives it).
struct InputModel {
  const Qwen3VLConfig* cfg = nullptr;
  const GenerationConfig* gen = nullptr;
  std::shared_ptr<const Tokenizer> tokenizer;  // may be null (token-id input only)
  std::vector<int32_t> eos_ids;
  StructuredOutputs* structured = nullptr;  // null without a tokenizer (thread-safe)
  const PreprocessOptions* preprocess = nullptr;
  const VideoStaging* video = nullptr;
  bool has_vision = false;
  int64_t max_context = 0;
  bool on_cpu = true;         // pooling runs on the CPU only (so far)
  bool pooling_only = false;  // EngineOptions::pooling_only: requests that generate are refused
  bool head_missing = false;  // no lm_head.weight: no logits either
};

class InputProcessor {
 public:
  // `cache` and `pixels` are shared with the engine thread (both are thread-safe); requests must
  // fit a KV cache of `num_blocks` blocks of `block_size` tokens.
  InputProcessor(InputModel model, VisionCache* cache, PixelBudget* pixels, int32_t num_blocks,
                 int32_t block_size);

  // The caller's thread: `request` checked, resolved and staged into an EngineRequest with its
  // stream's state (not yet numbered or queued). Bad input is an error here; nothing is queued.
  Result<std::unique_ptr<EngineRequest>> process(GenerateRequest request,
                                                 const PromptOutputs& prompt) const;
  // A pooling request's own checks (the CPU, its logit ids), and its generation settings
  // cleared (they are not used).
  Status check_pooling(GenerateRequest& request, const PromptOutputs& prompt) const;

  // The engine thread, at admission: whether every image of `r` is encoded now (found in the
  // vision cache meanwhile, or encoded for it). Once they are, assemble() expands the prompt
  // into *out (its images' counts to `r`'s stats; its staged images released).
  bool ready(EngineRequest& r) const;
  // The caller's thread: the ids `request` would prefill (Engine::prompt_tokens), its media
  // staged and expanded; nothing queued.
  Result<std::vector<int32_t>> expanded_prompt(GenerateRequest request) const;
  Status assemble(EngineRequest& r, PreparedPrompt* out) const;

 private:
  // Request → generation_config.json → transformers defaults; checks ranges.
  Result<ResolvedSampling> resolve_sampling(const SamplingParams& sp) const;
  Status check_prompt_ids(std::span<const int32_t> ids) const;
  // Whether the prompt goes the multimodal way: it has images or videos, or on a checkpoint with
  // a vision tower image pads or a video placeholder (<|vision_start|><|video_pad|>; a video pad
  // elsewhere is text, as in transformers). On a text-only checkpoint pads are ordinary tokens.
  // Images or videos without a vision tower are an error.
  Result<bool> is_multimodal(std::span<const int32_t> ids, const std::vector<ImageInput>& images,
                             const std::vector<VideoInput>& videos) const;
  // max_new_tokens for a prompt of n tokens: the request's, else generation_config's shrunk to
  // the room left in the context; both must fit the context with the prompt.
  Result<int64_t> generation_budget(int64_t n, std::optional<int64_t> requested) const;
  // Reads, decodes and preprocesses the images and videos of `request` into `r` (or finds them
  // cached), pricing each against the context; expands the videos' placeholders.
  Status stage_media(GenerateRequest& request, EngineRequest& r) const;
  // The sampler of `request`: its settings, thinking budget and grammar.
  Result<std::unique_ptr<Sampler>> make_sampler(const GenerateRequest& request,
                                                const ResolvedSampling& rs) const;

  InputModel m_;
  VisionCache* cache_;
  PixelBudget* pixels_;
  int32_t num_blocks_, block_size_;
};

// The prefix-cache key of block k of `ids` (block size bs) after `parent` (null: the first): its
// token ids, and every image whose tokens it covers (`extras`: scratch).
BlockHash prefix_block_hash(const BlockHasher& hasher, std::span<const int32_t> ids,
                            std::span<const ImageSpan> spans, int64_t k, int64_t bs,
                            const BlockHash* parent, std::vector<BlockExtraKey>* extras);

}  // namespace vlm

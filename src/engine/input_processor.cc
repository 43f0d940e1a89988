#include "engine/input_processor.h"

#include <algorithm>
#include <random>
#include <string>

#include "sched/scheduler.h"

namespace vlm {

namespace {

// A text-only prompt as the decoder runs it: the ids, no image rows, 1-D positions.
void prepare_text_prompt(std::span<const int32_t> ids, PreparedPrompt* p) {
  p->ids.assign(ids.begin(), ids.end());
  p->feature_row.assign(ids.size(), -1);
  const int64_t n = static_cast<int64_t>(ids.size());
  p->rope.t.resize(n);
  for (int64_t i = 0; i < n; ++i) p->rope.t[i] = i;
  p->rope.h = p->rope.t;
  p->rope.w = p->rope.t;
  p->rope.delta = 0;
}

}  // namespace

BlockHash prefix_block_hash(const BlockHasher& hasher, std::span<const int32_t> ids,
                            std::span<const ImageSpan> spans, int64_t k, int64_t bs,
                            const BlockHash* parent, std::vector<BlockExtraKey>* extras) {
  const int64_t begin = k * bs, end = begin + bs;
  extras->clear();
  for (const ImageSpan& s : spans) {
    if (s.begin < end && s.end > begin) {
      BlockExtraKey& x = extras->emplace_back();
      x.kind = BlockExtraKey::Kind::kImage;
      x.content = s.key.content;
      x.params = {s.key.min_pixels, s.key.max_pixels};
    }
  }
  return hasher.hash(parent, ids.subspan(static_cast<size_t>(begin), static_cast<size_t>(bs)),
                     *extras);
}

InputProcessor::InputProcessor(InputModel model, VisionCache* cache, PixelBudget* pixels,
                               int32_t num_blocks, int32_t block_size)
    : m_(std::move(model)),
      cache_(cache),
      pixels_(pixels),
      num_blocks_(num_blocks),
      block_size_(block_size) {}

Result<ResolvedSampling> InputProcessor::resolve_sampling(const SamplingParams& sp) const {
  const GenerationConfig& gen = *m_.gen;
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
  const int64_t V = m_.cfg->text_config.vocab_size;
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

Status InputProcessor::check_prompt_ids(std::span<const int32_t> ids) const {
  const int64_t V = m_.cfg->text_config.vocab_size;
  for (int32_t id : ids) {
    if (id < 0 || id >= V) {
      return invalid_argument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    }
  }
  return ok_status();
}

Result<bool> InputProcessor::is_multimodal(std::span<const int32_t> ids,
                                           const std::vector<ImageInput>& images,
                                           const std::vector<VideoInput>& videos) const {
  const Qwen3VLConfig& cfg = *m_.cfg;
  bool has_pads = false;
  for (size_t i = 0; i < ids.size() && !has_pads; ++i) {
    has_pads = ids[i] == cfg.image_token_id ||
               (ids[i] == cfg.video_token_id && i > 0 && ids[i - 1] == cfg.vision_start_token_id);
  }
  if ((!images.empty() || !videos.empty()) && !m_.has_vision) {
    return invalid_argument(
        "this checkpoint has no vision tower: images and videos are not supported");
  }
  return !images.empty() || !videos.empty() || (has_pads && m_.has_vision);
}

Result<int64_t> InputProcessor::generation_budget(int64_t n,
                                                  std::optional<int64_t> requested) const {
  const int64_t max_context = m_.max_context;
  if (n >= max_context) {
    return out_of_range("the prompt (" + std::to_string(n) +
                        " tokens) does not fit the context of " + std::to_string(max_context) +
                        " tokens");
  }
  const int64_t max_new = requested.has_value()
                              ? *requested
                              : std::min(m_.gen->max_new_tokens.value_or(256), max_context - n);
  if (max_new < 0) return invalid_argument("max_tokens must be >= 0");
  if (max_new > max_context - n) {  // n < max_context here: no overflow whatever max_new is
    return out_of_range("the prompt (" + std::to_string(n) + " tokens) and max_tokens (" +
                        std::to_string(max_new) + ") exceed the context of " +
                        std::to_string(max_context) + " tokens (at most " +
                        std::to_string(max_context - n) + " tokens can be generated)");
  }
  return max_new;
}

Status InputProcessor::stage_media(GenerateRequest& request, EngineRequest& r) const {
  if (!request.videos.empty() && m_.tokenizer == nullptr) {
    return invalid_argument("videos need the model's tokenizer (for their timestamps)");
  }
  VLM_ASSIGN_OR_RETURN(r.runs, find_pad_runs(request.prompt_ids, *m_.cfg, request.images.size(),
                                             request.videos.size()));
  r.images.resize(r.runs.size());
  // What the items may take of the context: all of it but the text (each is a single pad until
  // expanded) and the one token every request generates. Each image is priced from its header
  // before it is decoded, each video once its frames are sampled.
  int64_t room =
      m_.max_context - 1 -
      (static_cast<int64_t>(request.prompt_ids.size()) - static_cast<int64_t>(r.runs.size()));
  size_t next_image = 0, next_video = 0;
  for (const PadRun& run : r.runs) {
    StagedImage& item = r.images[run.item];
    if (run.video) {
      ++next_video;
      VLM_RETURN_IF_ERROR(stage_video(request.videos[next_video - 1], *m_.video, cache_, nullptr,
                                      &item, std::max<int64_t>(room, 0), pixels_)
                              .with_context("video " + std::to_string(next_video)));
      r.video_decode_ms += item.decode_ms;
      // Each group adds its timestamp text ("<12.3 seconds>": about 8 tokens) and its own vision
      // start and end (an estimate: the expanded prompt is checked whole afterwards).
      room -= 10 * item.groups;
    } else {
      ++next_image;
      VLM_RETURN_IF_ERROR(stage_image(request.images[next_image - 1], *m_.preprocess, cache_,
                                      nullptr, &item, std::max<int64_t>(room, 0), pixels_)
                              .with_context("image " + std::to_string(next_image)));
      r.image_decode_ms += item.decode_ms;
    }
    room -= item.tokens;
    r.preprocess_ms += item.preprocess_ms;
  }
  if (!request.videos.empty()) {
    VLM_RETURN_IF_ERROR(
        expand_video_runs(*m_.tokenizer, r.images, *m_.cfg, &request.prompt_ids, &r.runs));
  }
  return ok_status();
}

Result<std::unique_ptr<Sampler>> InputProcessor::make_sampler(const GenerateRequest& request,
                                                              const ResolvedSampling& rs) const {
  const int64_t V = m_.cfg->text_config.vocab_size;
  auto sampler = std::make_unique<Sampler>(V, rs);
  if (request.max_thinking_tokens >= 0) {
    if (request.think_close_id < 0 || request.think_close_id >= V) {
      return invalid_argument("max_thinking_tokens needs the model's </think> token");
    }
    sampler->set_thinking_budget(request.max_thinking_tokens, request.think_open_id,
                                 request.think_close_id, request.thinking_open_in_prompt);
  }
  if (request.structured.kind != StructuredOutput::Kind::kNone) {
    if (!m_.structured) return invalid_argument("structured output needs the model's tokenizer");
    VLM_ASSIGN_OR_RETURN(auto grammar, m_.structured->compile(request.structured));
    // The grammar ends where the model's end tokens (and the request's stop tokens) may come;
    // when the prompt opened a reasoning block, it starts after that block's end.
    std::vector<int32_t> ends = m_.eos_ids;
    ends.insert(ends.end(), request.stop_token_ids.begin(), request.stop_token_ids.end());
    const int32_t after = request.thinking_open_in_prompt ? request.think_close_id : -1;
    sampler->set_grammar(
        std::make_unique<structured::GrammarMatcher>(std::move(grammar), std::move(ends), after));
  }
  return sampler;
}

Status InputProcessor::check_pooling(GenerateRequest& request, const PromptOutputs& prompt) const {
  if (!m_.on_cpu) {
    return unimplemented(
        "pooling (embeddings, reranking) runs on the CPU only; run the model with --device cpu");
  }
  if (prompt.logits != nullptr) return invalid_argument("pooling does not give prompt logits");
  if (m_.head_missing && !request.pooling.logit_ids.empty()) {
    return invalid_argument(
        "pooling: the checkpoint has no lm_head.weight (an embedding model's): it has no logits "
        "to pool");
  }
  for (const int32_t id : request.pooling.logit_ids) {
    if (id < 0 || id >= m_.cfg->text_config.vocab_size) {
      return invalid_argument("pooling: logit id " + std::to_string(id) +
                              " is outside the vocabulary");
    }
  }
  // Nothing is sampled: the generation's settings are not used (nor checked).
  request.sampling = SamplingParams{};
  request.stop.clear();
  request.stop_token_ids.clear();
  request.logprobs = -1;
  request.structured = StructuredOutput{};
  request.max_thinking_tokens = -1;
  return ok_status();
}

Result<std::unique_ptr<EngineRequest>> InputProcessor::process(GenerateRequest request,
                                                               const PromptOutputs& prompt) const {
  if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  VLM_RETURN_IF_ERROR(check_prompt_ids(request.prompt_ids));
  // Checked before any image is read (a bad request costs no decoding).
  const bool pooling = request.pooling.enabled;
  if (!pooling && m_.pooling_only) {
    return invalid_argument(
        m_.head_missing ? "the checkpoint has no lm_head.weight (an embedding model's): it pools, "
                          "it does not generate"
                        : "this engine only pools (EngineOptions::pooling_only, vlm serve --task "
                          "embed): it does not generate");
  }
  if (pooling) VLM_RETURN_IF_ERROR(check_pooling(request, prompt));
  VLM_ASSIGN_OR_RETURN(const ResolvedSampling rs, resolve_sampling(request.sampling));
  if (!request.stop.empty() && m_.tokenizer == nullptr) {
    return invalid_argument("stop strings need the model's tokenizer");
  }
  if (request.logprobs > kMaxTopLogprobs) {
    return invalid_argument("at most " + std::to_string(kMaxTopLogprobs) +
                            " top logprobs per token");
  }
  auto r = std::make_unique<EngineRequest>();
  // Images and videos: read, decode and preprocess here, on the caller's thread (or find them
  // cached).
  VLM_ASSIGN_OR_RETURN(const bool multimodal,
                       is_multimodal(request.prompt_ids, request.images, request.videos));
  if (multimodal) VLM_RETURN_IF_ERROR(stage_media(request, *r));
  r->prompt_len = r->runs.empty() ? static_cast<int64_t>(request.prompt_ids.size())
                                  : expanded_length(request.prompt_ids.size(), r->runs, r->images);
  // Pooling samples nothing: one position of room, as the scheduler keeps for every request.
  VLM_ASSIGN_OR_RETURN(r->max_new_tokens,
                       generation_budget(r->prompt_len, pooling ? std::optional<int64_t>(1)
                                                                : request.max_new_tokens));
  // The scheduler samples at least one token per request.
  if (r->max_new_tokens < 1) return invalid_argument("max_tokens must be >= 1");
  VLM_RETURN_IF_ERROR(check_kv_fits(r->prompt_len + r->max_new_tokens, num_blocks_, block_size_));

  Sequence& seq = r->seq;
  VLM_ASSIGN_OR_RETURN(seq.sampler, make_sampler(request, rs));
  seq.logprobs = request.logprobs;
  if (prompt.logits != nullptr) {
    r->kind = StepKind::kPrefillOnly;
    prompt.logits->assign(static_cast<size_t>(r->prompt_len * m_.cfg->text_config.vocab_size), 0.f);
    seq.prompt_logits = prompt.logits->data();
    r->reads_prefix_cache = prompt.read_prefix_cache;
  }
  if (pooling) {
    r->kind = StepKind::kPool;
    seq.pool_logit_ids = request.pooling.logit_ids;
  }
  r->expanded_ids = prompt.expanded_ids;
  if (!request.ignore_eos) {
    r->stop_ids = m_.eos_ids;
    r->stop_ids.insert(r->stop_ids.end(), request.stop_token_ids.begin(),
                       request.stop_token_ids.end());
  }
  r->prompt_ids = std::move(request.prompt_ids);
  r->stream = std::make_shared<RequestStreamState>();
  r->stream->reserve(r->max_new_tokens, std::max(request.logprobs, 0));
  return r;
}

Result<std::vector<int32_t>> InputProcessor::expanded_prompt(GenerateRequest request) const {
  if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  VLM_RETURN_IF_ERROR(check_prompt_ids(request.prompt_ids));
  VLM_ASSIGN_OR_RETURN(const bool multimodal,
                       is_multimodal(request.prompt_ids, request.images, request.videos));
  std::vector<int32_t> ids;
  if (multimodal) {
    EngineRequest r;
    VLM_RETURN_IF_ERROR(stage_media(request, r));
    VLM_ASSIGN_OR_RETURN(ids, expand_pad_runs(request.prompt_ids, r.runs, r.images, *m_.cfg));
  } else {
    ids = std::move(request.prompt_ids);
  }
  if (static_cast<int64_t>(ids.size()) > m_.max_context) {
    return invalid_argument("the prompt is " + std::to_string(ids.size()) +
                            " tokens, more than the model's context of " +
                            std::to_string(m_.max_context));
  }
  return ids;
}

bool InputProcessor::ready(EngineRequest& r) const {
  bool ready = true;
  for (StagedImage& img : r.images) {
    if (!img.encoded) img.encoded = cache_->get(img.key);  // encoded meanwhile?
    ready = ready && img.encoded != nullptr;
  }
  return ready;
}

Status InputProcessor::assemble(EngineRequest& r, PreparedPrompt* out) const {
  if (r.runs.empty()) {
    prepare_text_prompt(r.prompt_ids, out);
    return ok_status();
  }
  for (StagedImage& img : r.images) {
    const bool hit = !img.encoded_here;
    cache_->count(hit);
    if (img.video) {
      ++r.videos;
      r.videos_cached += hit;
      r.video_frames += img.frames;
      r.video_tokens += img.tokens;
    } else {
      ++r.num_images;
      r.images_cached += hit;
    }
  }
  const Status st = assemble_multimodal(r.prompt_ids, r.runs, r.images, *m_.cfg, out);
  r.images.clear();  // the prompt holds the features now
  return st;
}

}  // namespace vlm

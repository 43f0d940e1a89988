// vlm public API: what a generation request asks for and what comes back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace vlm {

// Unset fields take the model's generation_config.json value (transformers' defaults otherwise).
struct SamplingParams {
  std::optional<double> temperature;         // 0 → greedy
  std::optional<int64_t> top_k;              // 0 → off
  std::optional<double> top_p;               // 1 → off
  std::optional<double> min_p;               // 0 → off
  std::optional<double> repetition_penalty;  // 1 → off; HF semantics (divide positive logits)
  double presence_penalty = 0.0;             // OpenAI semantics, over generated tokens
  double frequency_penalty = 0.0;            // OpenAI semantics, over generated tokens
  std::optional<uint64_t> seed;              // same seed + same request → same output
  std::optional<bool> do_sample;             // false → greedy regardless of temperature
  // (token id, bias): added to that token's logit before the penalties and the temperature
  // (OpenAI semantics; -100 bans a token, 100 all but forces it); greedy picks see it too.
  std::vector<std::pair<int32_t, float>> logit_bias;
};

// One image of a request: a file path or the encoded bytes (JPEG, PNG, WebP, GIF, BMP).
struct ImageInput {
  std::string path;
  std::vector<uint8_t> bytes;  // used when path is empty
  // Pixel budget of the resize (smart_resize); unset: the model's preprocessor_config.json.
  std::optional<int64_t> min_pixels;
  std::optional<int64_t> max_pixels;
};

struct GenerateRequest {
  // Token ids as the chat template renders them: each image is <|vision_start|><|image_pad|>
  // <|vision_end|> with a SINGLE pad, which the engine expands to the image's token count.
  std::vector<int32_t> prompt_ids;
  std::vector<ImageInput> images;  // one per image pad, in prompt order
  SamplingParams sampling;
  std::optional<int64_t> max_new_tokens;  // default: generation_config, else 256
  std::vector<std::string> stop;          // stop strings; the reply ends before the first match
  std::vector<int32_t> stop_token_ids;    // in addition to the model's eos ids
  bool ignore_eos = false;                // keep going past eos (benchmarks)
  // >= 0 (continuous batching only): each token comes with its log-probability under the model
  // (log-softmax of the raw logits, before penalties, temperature and truncation, as vLLM
  // reports them) and the `logprobs` most likely tokens at that step.
  int32_t logprobs = -1;
};

enum class FinishReason { kNone, kStop, kLength };

// One streamed piece of the reply.
struct TokenEvent {
  int32_t token_id = -1;  // the id just sampled; -1 for the final flush of held-back text
  std::string text;       // newly complete text (never half a UTF-8 character; may be empty)
};

struct GenerateResult {
  std::vector<int32_t> output_ids;  // generated ids (including a final eos, if any)
  std::string text;                 // decoded reply without special tokens and stop string
  FinishReason finish_reason = FinishReason::kNone;
  int64_t prompt_tokens = 0;  // after image pad expansion
  int64_t vision_tokens = 0;  // image tokens among them
  double image_decode_ms = 0;
  double preprocess_ms = 0;
  double vision_encode_ms = 0;
  double prefill_ms = 0;  // the text decoder's prefill (vision encoding not included)
  double decode_ms = 0;  // from the first to the last generated token
};

}  // namespace vlm

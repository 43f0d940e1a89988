// vlm public API: what a generation request asks for and what comes back.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vlm/status.h"

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

// One video of a request: a file path or the container's bytes (MP4, MOV, WebM, MKV, AVI, GIF,
// animated WebP). Unset settings take the model's video_preprocessor_config.json (Qwen3-VL: 2
// frames a second, 4 to 768 frames, a pixel budget over all frames of 4096 to 25165824).
struct VideoInput {
  std::string path;
  std::vector<uint8_t> bytes;  // used when path is empty
  // Instead of a file: the frames themselves as images (all the same size), taken as already
  // sampled at `fps` frames a second (default: the model's sampling rate, 2) — qwen-vl-utils'
  // list of frames. Their timestamps are index ÷ fps; nothing more is sampled from them.
  std::vector<ImageInput> frames;
  std::optional<double> fps;  // frames sampled per second of video
  std::optional<int64_t> min_frames;
  std::optional<int64_t> max_frames;
  // Pixel budget of the resize over ALL sampled frames together (not per frame).
  std::optional<int64_t> min_pixels;
  std::optional<int64_t> max_pixels;
};

// Structured output: the reply is kept inside a grammar by masking, at every step, the tokens
// that would leave it; the reply may end only where the grammar does.
struct StructuredOutput {
  enum class Kind {
    kNone,
    kJsonObject,  // any JSON object
    kJsonSchema,  // spec: a JSON Schema (JSON text)
    kRegex,       // spec: a regular expression the whole reply matches
    kChoice,      // the reply is exactly one of `choices`
    kGrammar,     // spec: GBNF text (start rule `root`)
    kToolCalls,   // spec: a JSON list of {"name", "parameters"}: the reply is tool calls only
  };
  Kind kind = Kind::kNone;
  std::string spec;
  std::vector<std::string> choices;
  // kToolCalls: more than one call may follow, and how each call is wrapped in the reply
  // (the Hermes / Qwen format the chat template and the reply parser use).
  bool parallel_tool_calls = true;
  std::string tool_call_begin = "<tool_call>\n";
  std::string tool_call_end = "\n</tool_call>";
};

// Pooling instead of generating (embeddings, a reranker's score): the prompt is prefilled as a
// step kind of its own — batched with the other requests' rows, its blocks prefix-cached — and
// nothing is sampled. The final piece carries the last prompt token's hidden state after the
// final norm (what transformers' Qwen3VLModel returns as last_hidden_state[-1]) and the logits of
// `logit_ids` there (a reranker's "no" and "yes"). The CPU only.
struct PoolingParams {
  bool enabled = false;
  std::vector<int32_t> logit_ids;
};

struct GenerateRequest {
  // Token ids as the chat template renders them: each image is <|vision_start|><|image_pad|>
  // <|vision_end|> with a SINGLE pad, which the engine expands to the image's token count.
  std::vector<int32_t> prompt_ids;
  std::vector<ImageInput> images;  // one per image pad, in prompt order
  // One per video, each <|vision_start|><|video_pad|><|vision_end|> with a SINGLE pad, which the
  // engine expands into each temporal group's timestamp text and pads (needs the tokenizer).
  std::vector<VideoInput> videos;
  SamplingParams sampling;
  // The generation budget: the new tokens the request may sample (at least 1; the stop token
  // counts). Default: generation_config's, else 256, shrunk to what the context leaves.
  std::optional<int64_t> max_new_tokens;
  std::vector<std::string> stop;        // stop strings; the reply ends before the first match
  std::vector<int32_t> stop_token_ids;  // in addition to the model's eos ids
  bool ignore_eos = false;              // keep going past eos (benchmarks)
  // A thinking budget (max_thinking_tokens; < 0: none): after this many tokens of reasoning —
  // from the first token when the prompt opened it (thinking_open_in_prompt), else after the
  // reply's think_open_id — the next token is think_close_id, whatever the logits say.
  int64_t max_thinking_tokens = -1;
  int32_t think_open_id = -1, think_close_id = -1;
  bool thinking_open_in_prompt = false;
  // 0..20: each token comes with its log-probability under the model (log-softmax of the raw
  // logits, before the logit bias, penalties, temperature and truncation, as vLLM reports them)
  // and the `logprobs` most likely tokens at that step. -1: none.
  int32_t logprobs = -1;
  // A grammar the reply must follow (after the reasoning, when the prompt opened it).
  StructuredOutput structured;
  // Pooling: no reply; the sampling, stop, logprobs, grammar and budget settings are ignored.
  PoolingParams pooling;
};

// A token's log-probability as the caller sees it: `token` holds the bytes the token adds to the
// reply's text (may be part of a UTF-8 character; empty for a special token, which the text
// skips), and the most likely alternatives at its step, best first (their own bytes).
struct TopLogprob {
  std::string token;
  double logprob = 0.0;
  int32_t token_id = -1;
};
struct TokenLogprob {
  std::string token;
  double logprob = 0.0;
  std::vector<TopLogprob> top_logprobs;
  int32_t token_id = -1;
  int64_t rank = 0;  // 1: the most likely token at its step; 1 + the tokens more likely
};

// Where a request's time went, and its token counts.
struct RequestStats {
  int64_t prompt_tokens = 0;              // after image pads are expanded
  int64_t completion_tokens = 0;          // tokens sampled (a stop token included)
  int64_t vision_tokens = 0;              // image tokens among the prompt's
  int64_t cached_tokens = 0;              // prompt tokens found in the prefix cache (not computed)
  int64_t images = 0, images_cached = 0;  // cached: found in the vision-encoder cache
  int64_t videos = 0, videos_cached = 0;
  int64_t video_frames = 0;  // frames sampled from the videos
  int64_t video_tokens = 0;  // vision tokens of the videos (among vision_tokens)
  // Queued → first forward pass, less the vision tower's time for this request's images (the
  // image reading, decoding and preprocessing in submit come before the queue).
  double queue_ms = 0;
  double image_decode_ms = 0;  // reading and decoding the images (the submitting thread)
  double preprocess_ms = 0;    // resizing and normalising them (the submitting thread)
  double video_decode_ms = 0;  // reading and decoding the videos' sampled frames (same thread)
  double encode_ms = 0;        // the vision tower (images not found in the cache)
  double prefill_ms = 0;       // first forward pass → first token
  double decode_ms = 0;        // first token → last token
};

enum class FinishReason { kNone, kStop, kLength };

// One piece of a request's stream (Engine::submit): a sampled token and the text it completes, or
// the final piece. The text is whole UTF-8 characters; text that might begin a stop string is
// held back until it cannot, and a stop string and what follows it never appear.
struct RequestOutput {
  int32_t token_id = -1;  // -1: no token (the final flush, an error, a cancel)
  std::string text;       // new text (may be empty)
  // With GenerateRequest::logprobs >= 0: the entries whose bytes the text has now reached; over
  // the whole stream their bytes add up to the text exactly (a stop token, and the tokens of a
  // stop string, are not listed).
  std::vector<TokenLogprob> logprobs;
  int64_t step = 0;        // with a token: the engine step that sampled it
  int64_t sampled_ns = 0;  // when it was sampled (steady_clock, nanoseconds since its epoch)
  bool finished = false;   // the last piece
  FinishReason finish_reason = FinishReason::kNone;
  Status error;        // non-ok: the request failed (finished)
  RequestStats stats;  // complete on the final piece; token counts so far before it
  // A pooling request's final piece (GenerateRequest::pooling): the hidden state [hidden size]
  // and the logits of its logit_ids, in their order.
  std::vector<float> pooled_hidden;
  std::vector<float> pooled_logits;
};

// One streamed piece of the reply.
struct TokenEvent {
  int32_t token_id = -1;  // the id just sampled; -1: text released after the last token
  std::string text;       // newly complete text (never half a UTF-8 character; may be empty)
};

struct GenerateResult {
  std::vector<int32_t> output_ids;  // generated ids (including a final eos, if any)
  std::string text;                 // decoded reply without special tokens and stop string
  FinishReason finish_reason = FinishReason::kNone;
  int64_t prompt_tokens = 0;  // after image pad expansion
  int64_t vision_tokens = 0;  // image and video tokens among them
  int64_t video_tokens = 0;   // video tokens among those
  int64_t video_frames = 0;   // frames sampled from the videos
  double image_decode_ms = 0;
  double video_decode_ms = 0;
  double preprocess_ms = 0;
  double vision_encode_ms = 0;
  double prefill_ms = 0;  // the text decoder's prefill (vision encoding not included)
  double decode_ms = 0;   // from the first to the last generated token
};

}  // namespace vlm

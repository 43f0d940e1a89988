// OpenAI-compatible API translation: HTTP request bodies → engine structs and
// engine results → response JSON / server-sent events. Pure functions, no
// sockets: the HTTP layer calls these.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "vlm/chat.h"
#include "vlm/request.h"
#include "vlm/status.h"

namespace vlm {

// An error as the client sees it: the HTTP status and OpenAI's error object.
struct ApiError {
  int http_status = 400;
  std::string type;  // "invalid_request_error", "not_found_error",
                     // "rate_limit_error", ...
  std::string message;
  std::string param;  // the offending field ("temperature",
                      // "messages[0].content[1]"); "" → null
};

// {"error": {"message", "type", "param", "code"}}; param is null when empty,
// code is null.
std::string api_error_json(const ApiError& e);

// OpenAI's error type for an HTTP status ("invalid_request_error", "authentication_error",
// "not_found_error", "rate_limit_error", "server_error").
const char* api_error_type(int http_status);

// An engine error as the client sees it: invalid input and what does not fit are 400, a full
// queue 429 (rate limit), memory or cache running out right now 503 (the server adds Retry-After),
// a bug 500. An invalid argument whose message starts with a request field ("messages: ",
// "max_thinking_tokens: ", as Engine::chat_stream words them) names it as the param.
ApiError api_error_from(const Status& s);

// Either a value or an ApiError. Separate from Result<T> because a request
// failure needs the HTTP status and the field name, which Status does not
// carry.
template <typename T>
class ApiResult {
 public:
  ApiResult(T value) : v_(std::move(value)) {}         // NOLINT: implicit by design
  ApiResult(ApiError error) : v_(std::move(error)) {}  // NOLINT: implicit by design
  bool ok() const { return std::holds_alternative<T>(v_); }
  const ApiError& error() const { return std::get<ApiError>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, ApiError> v_;
};

struct ApiLimits {
  size_t max_body_bytes = size_t{32} << 20;  // decoded; enforced by the HTTP transport
  int max_n = 8;
  int max_images = 16;
  size_t max_image_bytes = size_t{20} << 20;  // per image, after base64 decoding
  int max_videos = 4;
  size_t max_video_bytes = size_t{256} << 20;  // per video (a data URL is also held to the body)
  int max_video_frames = 768;    // frames of a video given as a list; most min/max_frames
  int64_t max_image_pixels = 0;  // per image: min_pixels / max_pixels above it are 400s (0: none)
  int64_t vocab_size = 0;        // logit_bias / stop_token_ids ids must be below it (0: unchecked)
  int64_t max_queue = 0;         // prompts x n above it are 400s (0: unchecked)
};

// Where images may come from.
struct MediaPolicy {
  // file:// URLs are allowed only when set, and only for files whose canonical
  // path (symlinks and
  // ".." resolved) lies under this directory's canonical path.
  std::string allowed_local_path;
  // http(s):// URLs are accepted (and handed back in remote_images for the
  // caller to fetch) only when true; this layer never fetches anything.
  bool allow_remote = false;
};

// An http(s) image or video the caller must fetch and store into images[image_index].bytes
// (videos[image_index].bytes when `video`).
struct RemoteImage {
  size_t image_index = 0;
  std::string url;
  bool video = false;
  int64_t frame = -1;  // a frame of a video given as a list of frames: frames[frame].bytes
};

// The fields chat and text completions share.
struct CommonRequest {
  std::string model;
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;  // max_completion_tokens, else max_tokens
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // vLLM's extension
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // vLLM's stream_options.continuous_usage_stats (with include_usage): every chunk carries the
  // usage so far.
  bool continuous_usage = false;
  bool ignore_eos = false;  // vLLM's extension: generate max_tokens regardless of eos
  // response_format (chat), vLLM's structured_outputs or its older guided_* fields, or
  // tool_choice "required" / a named function (chat): the grammar the reply must follow.
  StructuredOutput structured;
};

struct ChatCompletionRequest : CommonRequest {
  std::vector<ChatMessage> messages;
  std::vector<std::string> tools_json;  // as ChatTemplateOptions wants them
  // chat_template_kwargs: name → value as JSON text.
  std::vector<std::pair<std::string, std::string>> template_kwargs;
  bool tool_choice_none = false;               // tool_choice "none": tool calls stay text
  bool parallel_tool_calls = true;             // false: at most one tool call is returned
  bool include_reasoning = true;               // false: reasoning is dropped from the reply
  std::optional<int64_t> max_thinking_tokens;  // close the reasoning after this many tokens
  std::vector<ImageInput> images;              // in prompt order (one per image part)
  std::vector<VideoInput> videos;              // in prompt order (one per video part)
  std::vector<RemoteImage> remote_images;      // images and videos to fetch
  bool logprobs = false;
  int top_logprobs = 0;
};

// POST /v1/completions (OpenAI's legacy text API): each prompt is text or token ids.
struct CompletionRequest : CommonRequest {
  struct Prompt {
    std::string text;  // used when ids is empty
    std::vector<int32_t> ids;
    bool is_ids = false;
  };
  std::vector<Prompt> prompts;  // one or more; choices are prompt_index * n + i
  bool echo = false;            // the reply starts with the prompt's text
  std::optional<int> logprobs;  // 0..20: logprobs with this many alternatives
};

// Parses and validates a POST /v1/chat/completions body. Every failure is an
// ApiError (400 with `param` naming the field, 413 for an image over
// limits.max_image_bytes); nothing throws.
//
// Accepted: messages (required non-empty list; content a string, null or a list
// of parts: text,
// {"type":"image_url","image_url":{"url","detail"?}} or "image_url": "<url>",
// and qwen-vl-utils'
// {"type":"image","image":"<url>"}), tools, model, stream,
// stream_options.include_usage, max_tokens / max_completion_tokens (> 0; the
// latter wins), temperature [0,2], top_p (0,1], top_k (int >= -1; -1 and 0 mean
// off and become 0), min_p [0,1], presence_penalty and frequency_penalty
// [-2,2], repetition_penalty (> 0), seed (int; negative seeds keep their
// two's-complement bits), stop (string or list of <= 4 non-empty strings), n
// (1..max_n), logprobs, top_logprobs (0..20, requires logprobs). A null value
// counts as absent; unknown fields are ignored (clients send extras such as
// "user").
//
// Pixel budgets: top-level min_pixels / max_pixels apply to every image; the
// same keys on an image part (qwen-vl-utils style: {"type":"image","image":...,
// "max_pixels": N}) override them for that image. Positive integers, min <=
// max.
//
// Image URLs: data:<mime>;base64,<strict base64> → ImageInput.bytes;
// file://[localhost]/path → ImageInput.path (see MediaPolicy); http(s):// →
// RemoteImage when allowed.
//
// Videos: {"type": "video_url", "video_url": {"url": ...}} (or "video_url": "<url>", or
// qwen-vl-utils' {"type": "video", "video": "<url>"}), the same URL forms as images, at most
// limits.max_videos of limits.max_video_bytes each, with fps (0, 1000], min_frames, max_frames
// and min_pixels / max_pixels (a budget over ALL the frames) on the part or in its video_url
// object; or qwen-vl-utils' list of frames {"type": "video", "video": [url, ...]} (image URLs,
// at most limits.max_video_frames, taken as sampled at `fps`, default 2).
ApiResult<ChatCompletionRequest> parse_chat_completion(std::string_view body,
                                                       const ApiLimits& limits,
                                                       const MediaPolicy& media);

// Parses a POST /v1/completions body: prompt (required: a string, a list of strings, a list of
// token ids or a list of such lists; at most limits.max_n prompts), the sampling fields above,
// max_tokens (default 16, as OpenAI's), n, stream, stream_options, stop, seed, echo,
// logprobs (integer 0..20), ignore_eos. suffix and best_of other than n are refused.
ApiResult<CompletionRequest> parse_completion(std::string_view body, const ApiLimits& limits);

// ---- Responses ----

struct CompletionChoice {
  int index = 0;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<std::vector<TokenLogprob>> logprobs;  // set when the request asked for them
  std::string reasoning;                              // chat: the reply's reasoning (may be empty)
  std::vector<ChatToolCall> tool_calls;               // chat: parsed tool calls
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens found in the prefix cache
};

// "stop", "length", or std::nullopt for kNone (JSON null).
std::optional<std::string> finish_reason_string(FinishReason r);

// Non-streaming response: object "chat.completion".
std::string chat_completion_json(const std::string& id, const std::string& model, int64_t created,
                                 const std::vector<CompletionChoice>& choices, const Usage& usage);

// One streaming chunk: object "chat.completion.chunk" with choices[0].delta.
// The delta holds "role" when given and "content" when delta_text is non-empty
// or a role is given (OpenAI's first chunk is
// {"role":"assistant","content":""}); the last chunk carries finish_reason and
// may have an empty delta.
// `logprobs`, when given, are the tokens this chunk covers.
// A streamed chat delta: content, reasoning (as both `reasoning` and `reasoning_content`) and
// tool call fragments (OpenAI's delta.tool_calls: index, then id, type and name on a call's
// first fragment, arguments text).
std::string chat_delta_json(const std::string& id, const std::string& model, int64_t created,
                            int index, const ChatDelta& delta,
                            const std::vector<TokenLogprob>* logprobs);

// A chat stream's finish chunk for a reply that ended with tool calls (finish_reason
// "tool_calls").
std::string chat_tool_calls_finish_json(const std::string& id, const std::string& model,
                                        int64_t created, int index);

std::string chat_chunk_json(const std::string& id, const std::string& model, int64_t created,
                            int index, const std::string& delta_text,
                            const std::optional<std::string>& role = std::nullopt,
                            const std::optional<FinishReason>& finish_reason = std::nullopt,
                            const std::vector<TokenLogprob>* logprobs = nullptr);

// The final chunk of a stream with stream_options.include_usage: empty choices
// plus usage. `object` is "chat.completion.chunk" or "text_completion".
std::string usage_chunk_json(const std::string& id, const std::string& model, int64_t created,
                             const Usage& usage, const char* object = "chat.completion.chunk");

// A stream chunk (one of the builders' JSON objects) with "usage" (the counts so far) added, as
// vLLM sends every chunk under stream_options.continuous_usage_stats.
std::string chunk_with_usage(const std::string& chunk_json, const Usage& usage);

// POST /v1/completions response: object "text_completion"; logprobs in the legacy layout
// {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}. `text_offset0` is
// where the choice's generated text starts within its text (the prompt's length with echo).
std::string completion_json(const std::string& id, const std::string& model, int64_t created,
                            const std::vector<CompletionChoice>& choices, const Usage& usage,
                            const std::vector<size_t>& text_offset0 = {});

// One streaming chunk of /v1/completions (object "text_completion", choices[0].text).
std::string completion_chunk_json(const std::string& id, const std::string& model, int64_t created,
                                  int index, const std::string& text,
                                  const std::optional<FinishReason>& finish_reason = std::nullopt,
                                  const std::vector<TokenLogprob>* logprobs = nullptr,
                                  size_t text_offset0 = 0);

// Server-sent event framing: "data: <json>\n\n" and the terminator "data:
// [DONE]\n\n".
std::string sse_event(const std::string& json);
std::string sse_done();

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"vlm",
// "max_model_len"}]} (max_model_len as vLLM reports it: the context a request may use; left out
// when 0).
std::string models_list_json(const std::vector<std::string>& ids, int64_t created,
                             int64_t max_model_len = 0);

}  // namespace vlm

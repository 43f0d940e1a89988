// The OpenAI-compatible API's requests: POST bodies parsed and validated into request structs,
// and the errors a client sees. Pure functions, no sockets: the chat route turns a parsed request
// into the chat API's (server/chat_request_builder) and its replies into JSON or server-sent
// events (server/chat_reply_writer).
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
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

// {"error": {"message", "type", "param", "code"}}; param and code are null when empty (code: a
// machine-readable reason such as "previous_response_not_found").
std::string api_error_json(const ApiError& e, const std::string& code = "");

// OpenAI's error type for an HTTP status ("invalid_request_error", "authentication_error",
// "not_found_error", "rate_limit_error", "server_error").
const char* api_error_type(int http_status);

// An engine error as the client sees it: invalid input and what does not fit are 400, a full
// queue 429 (rate limit), memory or cache running out right now 503 (the server adds Retry-After),
// a bug 500. Its param is the field the Status names (Status::field: the engine's chat API names
// "messages" for a conversation the template refuses, "max_thinking_tokens" for a budget the
// model cannot keep); the server's own checks build their ApiError where the field is checked.
ApiError api_error_from(const Status& s);

// 404 (param "model") when a request names a model other than `names` (an empty name is any);
// the first of `names` is the one the message says is served.
std::optional<ApiError> check_model_name(const std::string& model,
                                         const std::vector<std::string>& names);

// A 400 invalid_request_error naming `param` ("" → null).
ApiError bad_request(std::string message, std::string param);

// Parses a request body into a JSON object: the nesting is bounded before the parser (or anything
// recursive) sees it; malformed JSON, or a body that is not an object, is a 400 naming why.
std::optional<ApiError> parse_json_object(std::string_view body, nlohmann::ordered_json* out);

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
  // file:// URLs are allowed only when set, and only for files whose canonical path (symlinks
  // and ".." resolved) lies under this directory's canonical path.
  std::string allowed_local_path;
  // http(s):// URLs are accepted (and handed back in remote_media for the caller to fetch) only
  // when true; this layer never fetches anything.
  bool allow_remote = false;
};

// An http(s) image or video the caller must fetch into the part that names it:
// messages[message].parts[part]'s image.bytes, its video.bytes (`video`), or its
// video.frames[frame].bytes (a frame of a video given as a list of frames).
struct RemoteMedia {
  size_t message = 0;
  size_t part = 0;
  std::string url;
  bool video = false;
  int64_t frame = -1;
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
  // Each image and video part carries its media: bytes (a data: URL), a path (a file:// URL, see
  // MediaPolicy), or nothing yet (an http(s) URL: listed in remote_media).
  std::vector<ChatMessage> messages;
  std::vector<std::string> tools_json;  // as ChatTemplateOptions wants them
  // chat_template_kwargs: name → value as JSON text.
  std::vector<std::pair<std::string, std::string>> template_kwargs;
  bool tool_choice_none = false;               // tool_choice "none": tool calls stay text
  bool parallel_tool_calls = true;             // false: at most one tool call is returned
  bool include_reasoning = true;               // false: reasoning is dropped from the reply
  bool add_generation_prompt = true;           // vLLM's: false renders no assistant header
  std::optional<int64_t> max_thinking_tokens;  // close the reasoning after this many tokens
  std::vector<RemoteMedia> remote_media;       // the parts' images and videos to fetch
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
// counts as absent; a field the server does not read is refused by name, except the few that
// change nothing (such as "user").
//
// Pixel budgets: top-level min_pixels / max_pixels apply to every image; the
// same keys on an image part (qwen-vl-utils style: {"type":"image","image":...,
// "max_pixels": N}) override them for that image. Positive integers, min <=
// max.
//
// Image URLs, into the part's ImageInput: data:<mime>;base64,<strict base64> → bytes;
// file://[localhost]/path → path (see MediaPolicy); http(s):// → a RemoteMedia entry when
// allowed.
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

// POST /tokenize, vLLM's shape: either {"prompt": "text", "add_special_tokens": bool (default
// true)} or {"messages": [...] (as chat completions take them, images and videos included),
// "add_generation_prompt": bool (default true), "add_special_tokens": bool (default false),
// "tools", "chat_template_kwargs"}; both with an optional "model" and "return_token_strs".
// Qwen's tokenizers add no special tokens of their own (their tokenizer.json has no template
// post-processor), so add_special_tokens only has to be a boolean. chat_body: for messages, the
// body as the chat route's builder reads it (messages, tools, chat_template_kwargs,
// add_generation_prompt, model).
struct TokenizeRequest {
  std::string model;
  std::optional<std::string> prompt;  // unset: chat_body
  std::string chat_body;
  bool return_token_strs = false;
};
ApiResult<TokenizeRequest> parse_tokenize(std::string_view body);
// {"count", "max_model_len", "tokens", "token_strs"} (token_strs: each id's token string, or null
// when not asked for).
std::string tokenize_json(const std::vector<int32_t>& ids, int64_t max_model_len,
                          const std::vector<std::string>* token_strs);

// POST /detokenize: {"tokens": [ids] (each in [0, vocab)), "model"} → {"prompt": text}.
struct DetokenizeRequest {
  std::string model;
  std::vector<int32_t> tokens;
};
ApiResult<DetokenizeRequest> parse_detokenize(std::string_view body, int64_t vocab);
std::string detokenize_json(const std::string& prompt);

// GET /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"vlm",
// "max_model_len"}]} (max_model_len as vLLM reports it: the context a request may use; left out
// when 0).
std::string models_list_json(const std::vector<std::string>& ids, int64_t created,
                             int64_t max_model_len = 0);

}  // namespace vlm

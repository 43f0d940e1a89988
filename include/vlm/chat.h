// vlm public API: chat conversations rendered with a checkpoint's own Jinja chat template (or the
// built-in Qwen3-VL Instruct one), exactly as transformers' apply_chat_template renders them, and
// the chat-level request and reply of Engine::chat (engine.h): content, reasoning and tool calls.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "vlm/request.h"
#include "vlm/status.h"

namespace vlm {

struct ChatPart {
  enum class Type { kText, kImage, kVideo };
  Type type = Type::kText;
  std::string text;  // kText only
  // Engine::chat: the picture of a kImage part, the clip of a kVideo part (the template only
  // sees where they are).
  ImageInput image;
  VideoInput video;

  static ChatPart of_text(std::string text) {
    ChatPart p;
    p.text = std::move(text);
    return p;
  }
  static ChatPart of_image(ImageInput image) {
    ChatPart p;
    p.type = Type::kImage;
    p.image = std::move(image);
    return p;
  }
  static ChatPart of_video(VideoInput video) {
    ChatPart p;
    p.type = Type::kVideo;
    p.video = std::move(video);
    return p;
  }
};

// A tool call: of an earlier assistant turn (ChatMessage::tool_calls), or parsed from a reply
// (ChatReply::tool_calls, which an assistant message may carry back as it is).
struct ChatToolCall {
  std::string id;  // as given (may be empty); a reply's: see ChatRequest::tool_call_id_prefix
  std::string name;
  // As given: a JSON string argument, or an object's tojson (then arguments_is_object, and the
  // template sees the object). A reply's: the arguments as JSON text (Python's json.dumps), an
  // object unless the model wrote them as a string.
  std::string arguments;
  bool arguments_is_object = false;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  // content as a plain string (content_is_text) or as a list of parts.
  bool content_is_text = true;
  std::string text;
  std::vector<ChatPart> parts;
  std::vector<ChatToolCall> tool_calls;  // assistant only
  std::string reasoning;     // assistant: an earlier turn's reasoning (reasoning_content)
  std::string tool_call_id;  // tool: the call it answers (may be empty)
  std::string name;          // tool: the function's name (may be empty)
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool add_vision_id = false;  // "Picture N: " / "Video N: " before each image / video
  // Tool definitions, each already serialised as JSON (the template's `tool | tojson`).
  std::vector<std::string> tools_json;
  // Extra template variables (a request's chat_template_kwargs, e.g. enable_thinking), each
  // value as JSON text.
  std::vector<std::pair<std::string, std::string>> kwargs_json;
};

// A Jinja chat template (Hugging Face's format), parsed once.
class ChatTemplate {
 public:
  // The checkpoint's: DIR/chat_template.jinja, else DIR/chat_template.json, else
  // DIR/tokenizer_config.json's "chat_template" (transformers' order), with bos_token /
  // eos_token from tokenizer_config.json; the built-in one when the directory has none. A
  // template that does not parse, or cannot render a one-message conversation, is an error
  // naming its file, line and column.
  static Result<ChatTemplate> from_model_dir(const std::string& dir);
  // A .jinja file, or a .json file with a "chat_template" entry (--chat-template FILE).
  static Result<ChatTemplate> from_file(const std::string& path);
  static Result<ChatTemplate> from_source(const std::string& source, const std::string& origin,
                                          const std::string& bos_token,
                                          const std::string& eos_token);
  // The Qwen3-VL Instruct template.
  static const ChatTemplate& builtin();

  // The prompt text; an error when the template refuses the conversation (raise_exception) or
  // fails on it.
  Result<std::string> render(const std::vector<ChatMessage>& messages,
                             const ChatTemplateOptions& opts) const;
  // Where it came from: a file path, or "built-in Qwen3-VL Instruct template".
  const std::string& origin() const;

 private:
  struct Impl;
  std::shared_ptr<const Impl> impl_;
};

// A conversation for Engine::chat: rendered with the engine's chat template (the checkpoint's own,
// or EngineOptions::chat_template), then generated like a GenerateRequest, the reply split into
// reasoning, content and tool calls.
struct ChatRequest {
  std::vector<ChatMessage> messages;  // image and video parts carry their media
  // Tool definitions, each as JSON text (OpenAI's {"type": "function", "function": {...}}), as
  // the template's `tools` sees them. With tools, `<tool_call>` blocks of the reply become
  // ChatReply::tool_calls (Qwen's JSON form and the XML form of newer checkpoints).
  std::vector<std::string> tools_json;
  bool parse_tool_calls = true;     // false (OpenAI's tool_choice "none"): calls stay content
  bool parallel_tool_calls = true;  // false: at most one call is returned
  // The reply's call ids: prefix + index ("": "call_<request id>_", unique across the engine's
  // requests).
  std::string tool_call_id_prefix;
  // Extra template variables (chat_template_kwargs, e.g. {"enable_thinking", "false"}), each
  // value as JSON text.
  std::vector<std::pair<std::string, std::string>> template_kwargs;
  bool add_vision_id = false;     // "Picture N: " / "Video N: " before each image / video
  bool include_reasoning = true;  // false: the reasoning is dropped from the reply
  // false: the template renders no generation prompt (vLLM's add_generation_prompt), e.g. to
  // count a conversation's tokens as it stands.
  bool add_generation_prompt = true;
  // Close the reasoning after this many tokens of it (the next token is </think>); the model
  // needs a </think> token.
  std::optional<int64_t> max_thinking_tokens;

  SamplingParams sampling;
  std::optional<int64_t> max_new_tokens;  // as GenerateRequest::max_new_tokens
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int32_t logprobs = -1;  // as GenerateRequest::logprobs
  // A grammar the reply must follow (OpenAI's response_format; StructuredOutput::kToolCalls for
  // tool_choice "required" or a named function); it starts after the reasoning the template's
  // generation prompt opened.
  StructuredOutput response_format;
};

// A piece of a streamed tool call (OpenAI's delta.tool_calls[]).
struct ToolCallDelta {
  int index = 0;
  std::string id, name;   // set on a call's first delta
  std::string arguments;  // a fragment of the arguments' JSON text
};

// What a piece of the reply adds: reasoning, content, and whole tool calls (a call is released
// once its block is complete; its arguments come in one fragment).
struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

// One piece of a chat stream (Engine::chat_stream): as RequestOutput, with the text split.
struct ChatChunk {
  ChatDelta delta;
  // With ChatRequest::logprobs >= 0: the entries of the tokens this piece's text reached.
  std::vector<TokenLogprob> logprobs;
  int32_t token_id = -1;   // -1: no token (the final flush, an error, a cancel)
  int64_t step = 0;        // with a token: the engine step that sampled it
  int64_t sampled_ns = 0;  // when it was sampled (steady_clock, nanoseconds since its epoch)
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Status error;        // non-ok: the request failed (finished)
  RequestStats stats;  // complete on the final piece
};

// A whole reply (Engine::chat). A reply that ended in tool calls finished with kStop (OpenAI's
// "tool_calls" finish is a reply with tool_calls and kStop).
struct ChatReply {
  std::string content;
  std::string reasoning;
  std::vector<ChatToolCall> tool_calls;
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<TokenLogprob> logprobs;  // with ChatRequest::logprobs >= 0
  RequestStats stats;

  // Adds a streamed piece's delta: content and reasoning appended, tool call fragments joined by
  // their index (what Engine::chat does with each chunk).
  void add(const ChatDelta& delta);
};

// Renders the conversation with the built-in Qwen3-VL Instruct template (special tokens as their
// text, e.g. <|im_start|>).
std::string render_chat(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts);

}  // namespace vlm

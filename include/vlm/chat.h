// vlm public API: chat conversations rendered with a checkpoint's own Jinja chat template (or the
// built-in Qwen3-VL Instruct one), exactly as transformers' apply_chat_template renders them.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "vlm/status.h"

namespace vlm {

struct ChatPart {
  enum class Type { kText, kImage, kVideo };
  Type type = Type::kText;
  std::string text;  // kText only
};

struct ChatToolCall {
  std::string id;  // as given (may be empty)
  std::string name;
  // As given: a JSON string argument, or an object's tojson (then arguments_is_object, and the
  // template sees the object).
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

// Renders the conversation with the built-in Qwen3-VL Instruct template (special tokens as their
// text, e.g. <|im_start|>).
std::string render_chat(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts);

}  // namespace vlm

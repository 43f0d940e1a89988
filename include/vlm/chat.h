// vlm public API: chat conversations rendered with the Qwen3-VL Instruct chat template, exactly
// as transformers' apply_chat_template renders it.
#pragma once

#include <string>
#include <vector>

namespace vlm {

struct ChatPart {
  enum class Type { kText, kImage, kVideo };
  Type type = Type::kText;
  std::string text;  // kText only
};

struct ChatToolCall {
  std::string name;
  std::string arguments;  // rendered as given: a JSON string argument, or an object's tojson
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool"
  // content as a plain string (content_is_text) or as a list of parts.
  bool content_is_text = true;
  std::string text;
  std::vector<ChatPart> parts;
  std::vector<ChatToolCall> tool_calls;  // assistant only
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;
  bool add_vision_id = false;  // "Picture N: " / "Video N: " before each image / video
  // Tool definitions, each already serialised as JSON (the template's `tool | tojson`).
  std::vector<std::string> tools_json;
};

// Renders the conversation to the prompt text (special tokens as their text, e.g. <|im_start|>).
std::string render_chat(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts);

}  // namespace vlm

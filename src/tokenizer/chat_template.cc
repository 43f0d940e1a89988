// The Qwen3-VL Instruct chat template (tokenizer_config.json "chat_template" of the Qwen3-VL
// Instruct checkpoints), written out by hand. Each branch mirrors one branch of the Jinja source
// kept in tests/model/fixtures/chat_template/chat_template.jinja; the fixtures there are
// transformers' renderings.
#include <string>

#include "vlm/chat.h"

namespace vlm {
namespace {

struct VisionCounters {
  int images = 0;
  int videos = 0;
};

// Text parts only (system and assistant list content).
void append_text_parts(const ChatMessage& m, std::string* out) {
  if (m.content_is_text) {
    *out += m.text;
    return;
  }
  for (const ChatPart& p : m.parts) {
    if (p.type == ChatPart::Type::kText) *out += p.text;
  }
}

// User and tool content: images and videos become vision placeholders.
void append_vision_parts(const ChatMessage& m, bool add_vision_id, VisionCounters* n,
                         std::string* out) {
  if (m.content_is_text) {
    *out += m.text;
    return;
  }
  for (const ChatPart& p : m.parts) {
    switch (p.type) {
      case ChatPart::Type::kImage:
        ++n->images;
        if (add_vision_id) *out += "Picture " + std::to_string(n->images) + ": ";
        *out += "<|vision_start|><|image_pad|><|vision_end|>";
        break;
      case ChatPart::Type::kVideo:
        ++n->videos;
        if (add_vision_id) *out += "Video " + std::to_string(n->videos) + ": ";
        *out += "<|vision_start|><|video_pad|><|vision_end|>";
        break;
      case ChatPart::Type::kText:
        *out += p.text;
        break;
    }
  }
}

bool content_truthy(const ChatMessage& m) {
  return m.content_is_text ? !m.text.empty() : !m.parts.empty();
}

}  // namespace

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts) {
  std::string out;
  const bool first_is_system = !messages.empty() && messages[0].role == "system";
  if (!opts.tools_json.empty()) {
    out += "<|im_start|>system\n";
    if (first_is_system) {
      append_text_parts(messages[0], &out);
      out += "\n\n";
    }
    out +=
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
    for (const std::string& t : opts.tools_json) out += "\n" + t;
    out +=
        "\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
        "<function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n";
  } else if (first_is_system) {
    out += "<|im_start|>system\n";
    append_text_parts(messages[0], &out);
    out += "<|im_end|>\n";
  }

  VisionCounters counters;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (m.role == "user") {
      out += "<|im_start|>user\n";
      append_vision_parts(m, opts.add_vision_id, &counters, &out);
      out += "<|im_end|>\n";
    } else if (m.role == "assistant") {
      out += "<|im_start|>assistant\n";
      append_text_parts(m, &out);
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        if (c > 0 || content_truthy(m)) out += "\n";
        out += "<tool_call>\n{\"name\": \"" + m.tool_calls[c].name +
               "\", \"arguments\": " + m.tool_calls[c].arguments + "}\n</tool_call>";
      }
      out += "<|im_end|>\n";
    } else if (m.role == "tool") {
      if (i == 0 || messages[i - 1].role != "tool") out += "<|im_start|>user";
      out += "\n<tool_response>\n";
      append_vision_parts(m, opts.add_vision_id, &counters, &out);
      out += "\n</tool_response>";
      if (i + 1 == messages.size() || messages[i + 1].role != "tool") out += "<|im_end|>\n";
    }
    // Any other role (including a system message after the first) renders nothing, as in the
    // template.
  }
  if (opts.add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace vlm

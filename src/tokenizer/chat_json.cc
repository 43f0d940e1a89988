#include "tokenizer/chat_json.h"

#include <nlohmann/json.hpp>

#include "core/json_depth.h"
#include "jinja/json.h"

namespace vlm {
namespace {

using ojson = nlohmann::ordered_json;

Status parse_content(const ojson& c, size_t index, ChatMessage* m) {
  const std::string where = "messages[" + std::to_string(index) + "]";
  if (c.is_string()) {
    m->content_is_text = true;
    m->text = c.get<std::string>();
    return ok_status();
  }
  m->content_is_text = false;
  if (c.is_null()) return ok_status();
  if (!c.is_array()) return invalid_argument(where + ".content must be a string, a list or null");
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& part = c[i];
    if (!part.is_object()) {
      return invalid_argument(where + ".content[" + std::to_string(i) + "] must be an object");
    }
    auto t = part.find("type");
    const std::string type = t != part.end() && t->is_string() ? t->get<std::string>() : "";
    ChatPart p;
    if (type == "image" || type == "image_url" || part.contains("image") ||
        part.contains("image_url")) {
      p.type = ChatPart::Type::kImage;
    } else if (type == "video" || type == "video_url" || part.contains("video") ||
               part.contains("video_url")) {
      p.type = ChatPart::Type::kVideo;
    } else if (part.contains("text")) {
      if (!part["text"].is_string()) {
        return invalid_argument(where + ".content[" + std::to_string(i) +
                                "].text must be a string");
      }
      p.type = ChatPart::Type::kText;
      p.text = part["text"].get<std::string>();
    } else {
      return invalid_argument(where + ".content[" + std::to_string(i) + "]: unknown part type '" +
                              type + "'");
    }
    m->parts.push_back(std::move(p));
  }
  return ok_status();
}

}  // namespace

Result<std::string> python_style_json(std::string_view json_text) {
  if (json_nesting_depth(json_text, kMaxJsonDepth) > kMaxJsonDepth) {
    return invalid_argument("JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  ojson j = ojson::parse(json_text, nullptr, false);
  if (j.is_discarded()) return invalid_argument("not valid JSON");
  return jinja::json_dumps(j);
}

Result<ParsedChat> parse_chat_json(std::string_view messages_json, std::string_view tools_json) {
  for (std::string_view text : {messages_json, tools_json}) {
    if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
      return invalid_argument("JSON nested deeper than " + std::to_string(kMaxJsonDepth) +
                              " levels");
    }
  }
  ojson msgs = ojson::parse(messages_json, nullptr, false);
  if (msgs.is_discarded()) return invalid_argument("messages: not valid JSON");
  ojson tools;
  if (!tools_json.empty()) {
    tools = ojson::parse(tools_json, nullptr, false);
    if (tools.is_discarded()) return invalid_argument("tools must be a JSON list");
  }
  return parse_chat_json(msgs, tools_json.empty() ? nullptr : &tools);
}

Result<ParsedChat> parse_chat_json(const ojson& msgs, const ojson* tools) {
  if (!msgs.is_array()) return invalid_argument("messages must be a list");
  ParsedChat out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ojson& jm = msgs[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!jm.is_object()) return invalid_argument(where + " must be an object");
    auto role = jm.find("role");
    if (role == jm.end() || !role->is_string())
      return invalid_argument(where + ".role must be a string");
    ChatMessage m;
    m.role = role->get<std::string>();
    auto content = jm.find("content");
    VLM_RETURN_IF_ERROR(parse_content(content == jm.end() ? ojson() : *content, i, &m));
    if (auto tc = jm.find("tool_calls"); tc != jm.end() && !tc->is_null()) {
      if (!tc->is_array()) return invalid_argument(where + ".tool_calls must be a list");
      for (const ojson& call : *tc) {
        const ojson& f = (call.is_object() && call.contains("function")) ? call["function"] : call;
        if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) {
          return invalid_argument(where + ".tool_calls: each call needs a function name");
        }
        ChatToolCall c;
        c.name = f["name"].get<std::string>();
        if (call.is_object() && call.contains("id") && call["id"].is_string())
          c.id = call["id"].get<std::string>();
        if (auto a = f.find("arguments"); a != f.end()) {
          if (a->is_string()) {
            c.arguments = a->get<std::string>();
          } else {
            c.arguments = jinja::json_dumps(*a);
            c.arguments_is_object = a->is_object();
          }
        }
        m.tool_calls.push_back(std::move(c));
      }
    }
    // An earlier turn's reasoning, under either name clients send it; a tool result's call id
    // and function name. The template decides what to do with them.
    for (const char* key : {"reasoning_content", "reasoning"}) {
      if (auto r = jm.find(key); r != jm.end() && r->is_string() && m.reasoning.empty())
        m.reasoning = r->get<std::string>();
    }
    if (auto t = jm.find("tool_call_id"); t != jm.end() && t->is_string())
      m.tool_call_id = t->get<std::string>();
    if (auto n = jm.find("name"); n != jm.end() && n->is_string()) m.name = n->get<std::string>();
    out.messages.push_back(std::move(m));
  }
  if (tools != nullptr) {
    if (!(tools->is_array() || tools->is_null()))
      return invalid_argument("tools must be a JSON list");
    if (tools->is_array()) {
      for (const ojson& t : *tools) {
        out.tools_json.push_back(jinja::json_dumps(t));
      }
    }
  }
  return out;
}

}  // namespace vlm

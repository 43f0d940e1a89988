#include "server/responses_api.h"

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <nlohmann/json.hpp>
#include <random>
#include <utility>

#include "server/api_json.h"

namespace vlm {
namespace {

using ojson = nlohmann::ordered_json;

using api_json::dump;
using api_json::listed;

// The request fields, by what becomes of them.
// clang-format off
constexpr std::string_view kFields[] = {
    "model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "text",
    "reasoning", "max_output_tokens", "temperature", "top_p", "stream", "store", "metadata",
    "user", "service_tier", "safety_identifier", "prompt_cache_key", "truncation", "include",
    "background", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "previous_response_id"};
// Passed to the chat body as they are (vLLM's sampling extras and OpenAI's own).
constexpr std::string_view kSampling[] = {
    "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
    "frequency_penalty", "seed", "parallel_tool_calls"};
// clang-format on

// A content part of an input message as a chat part; `param` names it for errors.
ApiResult<ojson> chat_part(const ojson& p, const std::string& param) {
  if (!p.is_object() || !p.contains("type") || !p["type"].is_string()) {
    return bad_request("a content part is an object with a 'type'", param);
  }
  const std::string type = p["type"];
  if (type == "input_text" || type == "output_text" || type == "text") {
    if (!p.contains("text") || !p["text"].is_string()) {
      return bad_request("'" + type + "' needs a string 'text'", param + ".text");
    }
    return ojson{{"type", "text"}, {"text", p["text"]}};
  }
  if (type == "refusal") {
    if (!p.contains("refusal") || !p["refusal"].is_string()) {
      return bad_request("'refusal' needs a string 'refusal'", param + ".refusal");
    }
    return ojson{{"type", "text"}, {"text", p["refusal"]}};
  }
  if (type == "input_image") {
    if (p.contains("file_id") && !p["file_id"].is_null()) {
      return bad_request(
          "images by file_id need the Files API, which this server does not have: "
          "send image_url (a data: URL)",
          param + ".file_id");
    }
    if (!p.contains("image_url") || !p["image_url"].is_string()) {
      return bad_request("'input_image' needs an 'image_url' string", param + ".image_url");
    }
    ojson url = {{"url", p["image_url"]}};
    if (p.contains("detail") && !p["detail"].is_null()) url["detail"] = p["detail"];
    return ojson{{"type", "image_url"}, {"image_url", url}};
  }
  return bad_request("content parts of type '" + type + "' are not supported by this server",
                     param + ".type");
}

// A message's content (a string, or parts) as chat content.
ApiResult<ojson> chat_content(const ojson& c, const std::string& param) {
  if (c.is_string()) return c;
  if (!c.is_array()) return bad_request("'content' must be a string or a list of parts", param);
  ojson out = ojson::array();
  for (size_t i = 0; i < c.size(); ++i) {
    auto part = chat_part(c[i], param + "[" + std::to_string(i) + "]");
    if (!part.ok()) return part.error();
    out.push_back(std::move(part).value());
  }
  return out;
}

// A message's content as text: a string, or text parts joined; nullopt when it holds more.
std::optional<std::string> text_of(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  for (const ojson& p : content) {
    if (!p.is_object() || p.value("type", "") != "text" || !p.contains("text")) return std::nullopt;
    out += p["text"].get<std::string>();
  }
  return out;
}

// The instructions and the system / developer messages at the start as one system message: the
// chat template reads the first message alone as the system's.
std::optional<ApiError> merge_leading_system(ojson* messages) {
  ojson& m = *messages;
  while (m.size() > 1 && m[0]["role"] == "system" && m[1]["role"] == "system") {
    const std::optional<std::string> a = text_of(m[0]["content"]), b = text_of(m[1]["content"]);
    if (!a || !b) return bad_request("a system or developer message is text only", "input");
    m[0]["content"] = *a + "\n\n" + *b;
    m.erase(m.begin() + 1);
  }
  return std::nullopt;
}

// The input's items as chat messages, appended to `messages`.
class InputItems {
 public:
  explicit InputItems(ojson* messages) : messages_(*messages) {}

  std::optional<ApiError> add(const ojson& item, const std::string& param) {
    if (!item.is_object()) return bad_request("an input item is an object", param);
    std::string type = item.contains("type") && item["type"].is_string() ? item["type"] : "";
    if (type.empty() && item.contains("role")) type = "message";
    if (type == "message") return message(item, param);
    if (type == "function_call") return function_call(item, param);
    if (type == "function_call_output") return function_output(item, param);
    if (type == "reasoning") return reasoning(item, param);
    if (type.empty()) return bad_request("an input item needs a 'type' or a 'role'", param);
    return bad_request("input items of type '" + type + "' are not supported by this server",
                       param + ".type");
  }

  std::optional<ApiError> finish(const std::string& param) {
    if (!pending_reasoning_.empty()) {
      return bad_request("a reasoning item must come before the assistant's turn it belongs to",
                         param);
    }
    return std::nullopt;
  }

 private:
  std::optional<ApiError> message(const ojson& item, const std::string& param) {
    if (!item.contains("role") || !item["role"].is_string()) {
      return bad_request("a message needs a 'role'", param + ".role");
    }
    std::string role = item["role"];
    if (role == "developer") role = "system";
    if (role != "user" && role != "system" && role != "assistant") {
      return bad_request(
          "message roles are user, system, developer and assistant, not '" + role + "'",
          param + ".role");
    }
    if (!item.contains("content")) return bad_request("a message needs 'content'", param);
    auto content = chat_content(item["content"], param + ".content");
    if (!content.ok()) return content.error();
    if (role != "assistant" && !pending_reasoning_.empty()) {
      return bad_request(
          "a reasoning item must come just before the assistant's turn it belongs "
          "to",
          param);
    }
    ojson m = {{"role", role}, {"content", std::move(content).value()}};
    if (role == "assistant") take_reasoning(&m);
    messages_.push_back(std::move(m));
    // The assistant's text and the calls after it are one turn (a response's output order).
    calls_open_ = role == "assistant";
    return std::nullopt;
  }

  // A call the assistant made: a tool call on the assistant's message (the last one when it is
  // the assistant's, else a new one without text).
  std::optional<ApiError> function_call(const ojson& item, const std::string& param) {
    for (const char* k : {"call_id", "name", "arguments"}) {
      if (!item.contains(k) || !item[k].is_string()) {
        return bad_request(std::string("a function_call needs a string '") + k + "'",
                           param + "." + k);
      }
    }
    ojson call = {{"id", item["call_id"]},
                  {"type", "function"},
                  {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}};
    if (messages_.empty() || messages_.back()["role"] != "assistant" || !calls_open_) {
      ojson m = {{"role", "assistant"}, {"content", nullptr}};
      take_reasoning(&m);
      messages_.push_back(std::move(m));
    }
    ojson& last = messages_.back();
    if (!last.contains("tool_calls")) last["tool_calls"] = ojson::array();
    last["tool_calls"].push_back(std::move(call));
    calls_open_ = true;
    return std::nullopt;
  }

  std::optional<ApiError> function_output(const ojson& item, const std::string& param) {
    if (!item.contains("call_id") || !item["call_id"].is_string()) {
      return bad_request("a function_call_output needs a string 'call_id'", param + ".call_id");
    }
    if (!item.contains("output")) return bad_request("'output' is required", param + ".output");
    ojson content;
    if (item["output"].is_string()) {
      content = item["output"];
    } else {
      auto parts = chat_content(item["output"], param + ".output");
      if (!parts.ok()) return parts.error();
      content = std::move(parts).value();
    }
    messages_.push_back(
        ojson{{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", content}});
    calls_open_ = false;
    return std::nullopt;
  }

  // The reasoning text of a reasoning item (its content's reasoning_text parts, else its
  // summary's), kept for the assistant's next message.
  std::optional<ApiError> reasoning(const ojson& item, const std::string& param) {
    if (item.contains("encrypted_content") && !item["encrypted_content"].is_null()) {
      return bad_request("encrypted reasoning is not supported by this server",
                         param + ".encrypted_content");
    }
    std::string text;
    for (const char* key : {"content", "summary"}) {
      if (!text.empty() || !item.contains(key) || !item[key].is_array()) continue;
      for (const ojson& p : item[key]) {
        if (p.is_object() && p.contains("text") && p["text"].is_string()) {
          text += p["text"].get<std::string>();
        }
      }
    }
    pending_reasoning_ += text;
    calls_open_ = false;
    return std::nullopt;
  }

  void take_reasoning(ojson* m) {
    if (!pending_reasoning_.empty()) (*m)["reasoning_content"] = pending_reasoning_;
    pending_reasoning_.clear();
    calls_open_ = false;
  }

  ojson& messages_;
  std::string pending_reasoning_;
  bool calls_open_ = false;  // the last message's tool calls may take more
};

// Responses' function tools as chat tools.
std::optional<ApiError> read_tools(const ojson& tools, ojson* chat) {
  if (!tools.is_array()) return bad_request("'tools' must be a list", "tools");
  ojson out = ojson::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string at = "tools[" + std::to_string(i) + "]";
    const ojson& t = tools[i];
    const std::string type =
        t.is_object() && t.contains("type") && t["type"].is_string() ? t["type"] : "";
    if (type != "function") {
      return bad_request(
          "tools of type '" + type + "' are not supported by this server (function tools are)",
          at + ".type");
    }
    if (!t.contains("name") || !t["name"].is_string()) {
      return bad_request("a function tool needs a 'name'", at + ".name");
    }
    for (auto it = t.begin(); it != t.end(); ++it) {
      static constexpr std::string_view kTool[] = {"type", "name", "description", "parameters",
                                                   "strict"};
      if (!listed(it.key(), kTool) && !it->is_null()) {
        return bad_request("'" + it.key() + "' on a function tool is not supported by this server",
                           at + "." + it.key());
      }
    }
    ojson fn = {{"name", t["name"]}};
    for (const char* k : {"description", "parameters", "strict"}) {
      if (t.contains(k) && !t[k].is_null()) fn[k] = t[k];
    }
    out.push_back(ojson{{"type", "function"}, {"function", std::move(fn)}});
  }
  if (!out.empty()) (*chat)["tools"] = std::move(out);
  return std::nullopt;
}

std::optional<ApiError> read_tool_choice(const ojson& c, ojson* chat) {
  if (c.is_string()) {
    if (c != "auto" && c != "none" && c != "required") {
      return bad_request("'tool_choice' is auto, none, required or a function", "tool_choice");
    }
    (*chat)["tool_choice"] = c;
    return std::nullopt;
  }
  if (c.is_object() && c.value("type", "") == "function" && c.contains("name") &&
      c["name"].is_string()) {
    (*chat)["tool_choice"] = ojson{{"type", "function"}, {"function", {{"name", c["name"]}}}};
    return std::nullopt;
  }
  return bad_request(
      "this 'tool_choice' is not supported by this server (auto, none, required or "
      "{\"type\": \"function\", \"name\": ...} are)",
      "tool_choice");
}

// text.format as the chat's response_format.
std::optional<ApiError> read_text(const ojson& text, ojson* chat) {
  if (!text.is_object()) return bad_request("'text' must be an object", "text");
  for (auto it = text.begin(); it != text.end(); ++it) {
    if (it.key() == "format" || it->is_null()) continue;
    return bad_request("'text." + it.key() + "' is not supported by this server",
                       "text." + it.key());
  }
  if (!text.contains("format") || text["format"].is_null()) return std::nullopt;
  const ojson& f = text["format"];
  const std::string type =
      f.is_object() && f.contains("type") && f["type"].is_string() ? f["type"] : "";
  if (type == "text") return std::nullopt;
  if (type == "json_object") {
    (*chat)["response_format"] = ojson{{"type", "json_object"}};
    return std::nullopt;
  }
  if (type == "json_schema") {
    ojson schema = ojson::object();
    for (const char* k : {"name", "schema", "strict", "description"}) {
      if (f.contains(k) && !f[k].is_null()) schema[k] = f[k];
    }
    (*chat)["response_format"] = ojson{{"type", "json_schema"}, {"json_schema", schema}};
    return std::nullopt;
  }
  return bad_request("'text.format' is text, json_object or json_schema", "text.format.type");
}

// Fields that change nothing when absent, null or at these values; anything else is refused.
std::optional<ApiError> refuse_unsupported(const ojson& j) {
  auto set = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
  if (set("background") && j["background"] != false) {
    return bad_request("background mode is not supported by this server", "background");
  }
  if (set("include") && !(j["include"].is_array() && j["include"].empty())) {
    return bad_request("'include' is not supported by this server", "include");
  }
  if (set("truncation") && j["truncation"] != "disabled") {
    return bad_request("'truncation' other than \"disabled\" is not supported by this server",
                       "truncation");
  }
  if (set("store") && !j["store"].is_boolean()) {
    return bad_request("'store' must be a boolean", "store");
  }
  return std::nullopt;
}

}  // namespace

ApiResult<ResponsesRequest> parse_responses(std::string_view body) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (listed(it.key(), kFields)) continue;
    if (it->is_null()) continue;
    return bad_request("'" + it.key() + "' is not supported by this server", it.key());
  }
  if (auto e = refuse_unsupported(j)) return *e;
  ResponsesRequest r;
  ojson chat = ojson::object();
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return bad_request("'model' must be a string", "model");
    r.model = j["model"];
    chat["model"] = j["model"];
  }
  ojson messages = ojson::array();
  if (j.contains("instructions") && !j["instructions"].is_null()) {
    if (!j["instructions"].is_string()) {
      return bad_request("'instructions' must be a string", "instructions");
    }
    messages.push_back(ojson{{"role", "system"}, {"content", j["instructions"]}});
    r.instructions_json = dump(j["instructions"]);
    r.has_instructions = true;
  }
  if (!j.contains("input") || j["input"].is_null())
    return bad_request("'input' is required", "input");
  const ojson& input = j["input"];
  if (input.is_string()) {
    messages.push_back(ojson{{"role", "user"}, {"content", input}});
  } else if (input.is_array()) {
    InputItems items(&messages);
    for (size_t i = 0; i < input.size(); ++i) {
      if (auto e = items.add(input[i], "input[" + std::to_string(i) + "]")) return *e;
    }
    if (auto e = items.finish("input")) return *e;
  } else {
    return bad_request("'input' must be a string or a list of items", "input");
  }
  if (messages.size() == (r.has_instructions ? 1u : 0u)) {
    return bad_request("'input' must not be empty", "input");
  }
  r.input_json = dump(ojson(messages.begin() + (r.has_instructions ? 1 : 0), messages.end()));
  if (auto e = merge_leading_system(&messages)) return *e;
  chat["messages"] = std::move(messages);
  if (j.contains("tools") && !j["tools"].is_null()) {
    if (auto e = read_tools(j["tools"], &chat)) return *e;
    r.tools_json = dump(j["tools"]);
  }
  if (j.contains("tool_choice") && !j["tool_choice"].is_null()) {
    if (auto e = read_tool_choice(j["tool_choice"], &chat)) return *e;
    r.tool_choice_json = dump(j["tool_choice"]);
  }
  if (j.contains("text") && !j["text"].is_null()) {
    if (auto e = read_text(j["text"], &chat)) return *e;
    if (j["text"].contains("format") && !j["text"]["format"].is_null())
      r.text_json = dump(j["text"]);
  }
  if (j.contains("reasoning") && !j["reasoning"].is_null()) {
    const ojson& re = j["reasoning"];
    const ojson effort = re.is_object() ? re.value("effort", ojson()) : ojson();
    bool other = false;
    for (auto it = re.begin(); re.is_object() && it != re.end(); ++it) {
      other = other || (it.key() != "effort" && !it->is_null());
    }
    if (!re.is_object() || other || (!effort.is_null() && effort != "none")) {
      return bad_request(
          "'reasoning' is not supported beyond {\"effort\": \"none\"} (a Qwen "
          "model's thinking off)",
          "reasoning");
    }
    if (effort == "none") chat["chat_template_kwargs"] = ojson{{"enable_thinking", false}};
    r.reasoning_json = dump(ojson{{"effort", effort}, {"summary", nullptr}});
  }
  if (j.contains("max_output_tokens") && !j["max_output_tokens"].is_null()) {
    if (!j["max_output_tokens"].is_number_integer() || j["max_output_tokens"].get<int64_t>() < 1) {
      return bad_request("'max_output_tokens' must be a positive integer", "max_output_tokens");
    }
    r.max_output_tokens = j["max_output_tokens"].get<int64_t>();
    chat["max_completion_tokens"] = j["max_output_tokens"];
  }
  for (std::string_view k : kSampling) {
    const std::string key(k);
    if (j.contains(key) && !j[key].is_null()) chat[key] = j[key];
  }
  if (j.contains("temperature") && j["temperature"].is_number()) r.temperature = j["temperature"];
  if (j.contains("top_p") && j["top_p"].is_number()) r.top_p = j["top_p"];
  if (j.contains("parallel_tool_calls") && j["parallel_tool_calls"].is_boolean()) {
    r.parallel_tool_calls = j["parallel_tool_calls"];
  }
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return bad_request("'stream' must be a boolean", "stream");
    r.stream = j["stream"];
  }
  if (j.contains("metadata") && j["metadata"].is_object()) r.metadata_json = dump(j["metadata"]);
  if (j.contains("store") && j["store"].is_boolean()) r.store = j["store"];
  if (j.contains("user") && j["user"].is_string()) r.user_json = dump(j["user"]);
  if (j.contains("previous_response_id") && !j["previous_response_id"].is_null()) {
    if (!j["previous_response_id"].is_string()) {
      return bad_request("'previous_response_id' must be a string", "previous_response_id");
    }
    r.previous_response_id = j["previous_response_id"];
  }
  r.chat_body = dump(chat);
  return r;
}

std::string chat_body_after(const ResponsesRequest& r, const std::string& conversation_json) {
  ojson chat = ojson::parse(r.chat_body);
  ojson messages = ojson::array();
  if (r.has_instructions) {
    messages.push_back(ojson{{"role", "system"}, {"content", ojson::parse(r.instructions_json)}});
  }
  for (const ojson& m : ojson::parse(conversation_json)) messages.push_back(m);
  for (const ojson& m : ojson::parse(r.input_json)) messages.push_back(m);
  merge_leading_system(&messages);  // text only: checked when the request was parsed
  chat["messages"] = std::move(messages);
  return dump(chat);
}

std::string new_response_id() {
  thread_local std::random_device rd;
  std::string id = "resp_";
  char buf[9];
  for (int i = 0; i < 4; ++i) {
    std::snprintf(buf, sizeof buf, "%08x", static_cast<unsigned>(rd()));
    id += buf;
  }
  return id;
}

std::string response_deleted_json(const std::string& id) {
  return dump(ojson{{"id", id}, {"object", "response"}, {"deleted", true}});
}

std::string join_messages(const std::string& a, const std::string& b) {
  ojson out = ojson::parse(a);
  for (const ojson& m : ojson::parse(b)) out.push_back(m);
  return dump(out);
}

std::string conversation_with(const std::string& conversation_json, const ChatReply& reply) {
  ojson messages = ojson::parse(conversation_json);
  ojson m = {
      {"role", "assistant"},
      {"content",
       reply.content.empty() && !reply.tool_calls.empty() ? ojson(nullptr) : ojson(reply.content)}};
  if (!reply.reasoning.empty()) m["reasoning_content"] = reply.reasoning;
  if (!reply.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const ChatToolCall& c : reply.tool_calls) {
      calls.push_back(ojson{{"id", c.id},
                            {"type", "function"},
                            {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    m["tool_calls"] = std::move(calls);
  }
  messages.push_back(std::move(m));
  return dump(messages);
}

namespace {

// A response's output items, made piece by piece from the reply's deltas (streamed or not); each
// step also gives the typed events that announce it, which a stream sends. The same deltas make
// the same items, so a streamed response ends equal to the one not streamed.
class OutputBuilder {
 public:
  explicit OutputBuilder(std::string n) : n_(std::move(n)) {}

  // Each returns the events (type, data without type and sequence_number) it makes.
  using Events = std::vector<std::pair<std::string, ojson>>;

  Events reasoning(const std::string& text) {
    Events ev;
    if (kind_ != Kind::kReasoning) {
      ev = close();
      open(Kind::kReasoning,
           ojson{{"type", "reasoning"},
                 {"id", id("rs")},
                 {"summary", ojson::array()},
                 {"content", ojson::array()},
                 {"status", "in_progress"}},
           &ev);
      add_part(ojson{{"type", "reasoning_text"}, {"text", ""}}, &ev);
    }
    append(&items_.back()["content"][0]["text"], text);
    ev.push_back({"response.reasoning_text.delta", at({{"content_index", 0}, {"delta", text}})});
    return ev;
  }

  Events content(const std::string& text) {
    Events ev;
    if (kind_ != Kind::kMessage) {
      ev = close();
      open(Kind::kMessage,
           ojson{{"type", "message"},
                 {"id", id("msg")},
                 {"status", "in_progress"},
                 {"role", "assistant"},
                 {"content", ojson::array()}},
           &ev);
      add_part(ojson{{"type", "output_text"},
                     {"text", ""},
                     {"annotations", ojson::array()},
                     {"logprobs", ojson::array()}},
               &ev);
    }
    append(&items_.back()["content"][0]["text"], text);
    ev.push_back({"response.output_text.delta",
                  at({{"content_index", 0}, {"delta", text}, {"logprobs", ojson::array()}})});
    return ev;
  }

  Events call_start(const std::string& call_id, const std::string& name) {
    Events ev = close();
    open(Kind::kCall,
         ojson{{"type", "function_call"},
               {"id", id("fc")},
               {"call_id", call_id},
               {"name", name},
               {"arguments", ""},
               {"status", "in_progress"}},
         &ev);
    return ev;
  }

  Events call_arguments(const std::string& text) {
    if (kind_ != Kind::kCall || text.empty()) return {};
    append(&items_.back()["arguments"], text);
    return {{"response.function_call_arguments.delta", at({{"delta", text}})}};
  }

  // The open item's done events; with `last`, an empty message first when nothing was made
  // (and, `incomplete`, the last item cut short by the token budget).
  Events close(bool last = false, bool incomplete = false) {
    Events ev;
    if (last && items_.empty()) ev = content("");
    if (kind_ == Kind::kNone) return ev;
    ojson& item = items_.back();
    item["status"] = last && incomplete ? "incomplete" : "completed";
    if (kind_ == Kind::kReasoning) {
      const ojson& part = item["content"][0];
      ev.push_back(
          {"response.reasoning_text.done", at({{"content_index", 0}, {"text", part["text"]}})});
      ev.push_back({"response.content_part.done", at({{"content_index", 0}, {"part", part}})});
    } else if (kind_ == Kind::kMessage) {
      const ojson& part = item["content"][0];
      ev.push_back(
          {"response.output_text.done",
           at({{"content_index", 0}, {"text", part["text"]}, {"logprobs", ojson::array()}})});
      ev.push_back({"response.content_part.done", at({{"content_index", 0}, {"part", part}})});
    } else {
      ev.push_back({"response.function_call_arguments.done",
                    at({{"arguments", item["arguments"]}, {"name", item["name"]}})});
    }
    ev.push_back(
        {"response.output_item.done", {{"output_index", items_.size() - 1}, {"item", item}}});
    kind_ = Kind::kNone;
    return ev;
  }

  const ojson& items() const { return items_; }
  bool open_item() const { return kind_ != Kind::kNone; }

 private:
  enum class Kind { kNone, kReasoning, kMessage, kCall };

  std::string id(const char* prefix) const {
    return std::string(prefix) + "_" + n_ + "_" + std::to_string(items_.size());
  }
  void add_part(ojson part, Events* ev) {
    items_.back()["content"].push_back(part);
    ev->push_back({"response.content_part.added", at({{"content_index", 0}, {"part", part}})});
  }
  void open(Kind k, ojson item, Events* ev) {
    kind_ = k;
    items_.push_back(item);
    ev->push_back({"response.output_item.added",
                   {{"output_index", items_.size() - 1}, {"item", std::move(item)}}});
  }
  // An event's place: the open item.
  ojson at(ojson fields) const {
    ojson out = {{"item_id", items_.back()["id"]}, {"output_index", items_.size() - 1}};
    for (auto& [k, v] : fields.items()) out[k] = v;
    return out;
  }
  static void append(ojson* s, const std::string& text) { *s = s->get<std::string>() + text; }

  std::string n_;  // the response's number: item ids are PREFIX_n_index
  ojson items_ = ojson::array();
  Kind kind_ = Kind::kNone;
};

// The reply of one response, once its chat reply is complete.
struct ResponseResult {
  std::string id;  // "resp_..."
  std::string model;
  int64_t created_at = 0;
  ChatReply reply;  // content, reasoning and tool calls (their ids are the call_ids)
  int64_t input_tokens = 0, cached_tokens = 0, output_tokens = 0, reasoning_tokens = 0;
};

// The response object with these output items; `status` "in_progress", "completed" or
// "incomplete".
ojson response_object(const ResponseResult& res, const ResponsesRequest& req, ojson output,
                      const std::string& status) {
  auto opt = [](const auto& v) { return v ? ojson(*v) : ojson(nullptr); };
  const bool incomplete = status == "incomplete";
  return ojson{
      {"id", res.id},
      {"object", "response"},
      {"created_at", res.created_at},
      {"status", status},
      {"error", nullptr},
      {"incomplete_details", incomplete ? ojson{{"reason", "max_output_tokens"}} : ojson(nullptr)},
      {"instructions", ojson::parse(req.instructions_json)},
      {"max_output_tokens", opt(req.max_output_tokens)},
      {"metadata", ojson::parse(req.metadata_json)},
      {"model", res.model},
      {"output", std::move(output)},
      {"parallel_tool_calls", req.parallel_tool_calls},
      {"previous_response_id",
       req.previous_response_id.empty() ? ojson(nullptr) : ojson(req.previous_response_id)},
      {"reasoning", ojson::parse(req.reasoning_json)},
      {"store", req.store},
      {"temperature", opt(req.temperature)},
      {"text", ojson::parse(req.text_json)},
      {"tool_choice", ojson::parse(req.tool_choice_json)},
      {"tools", ojson::parse(req.tools_json)},
      {"top_p", opt(req.top_p)},
      {"truncation", "disabled"},
      {"usage", status == "in_progress"
                    ? ojson(nullptr)
                    : ojson{{"input_tokens", res.input_tokens},
                            {"input_tokens_details", {{"cached_tokens", res.cached_tokens}}},
                            {"output_tokens", res.output_tokens},
                            {"output_tokens_details", {{"reasoning_tokens", res.reasoning_tokens}}},
                            {"total_tokens", res.input_tokens + res.output_tokens}}},
      {"user", ojson::parse(req.user_json)}};
}

const char* final_status(const ResponseResult& r) {
  return r.reply.finish_reason == FinishReason::kLength ? "incomplete" : "completed";
}

// One response's reply: not streamed, the response object; streamed, the API's typed events
// ("event: TYPE", "data: {type, sequence_number, ...}") in order: response.created and
// response.in_progress, each output item's added / delta / done events as the pieces come, and
// response.completed with the whole response (its status "incomplete" when tokens ran out).
class ResponsesReplyWriter final : public ReplyWriter {
 public:
  ResponsesReplyWriter(ReplyOptions o, ResponsesRequest req, KeepResponse keep)
      : ReplyWriter(std::move(o), 1),
        req_(std::move(req)),
        keep_(std::move(keep)),
        out_(o_.id.substr(o_.id.find('_') + 1)) {}

  // An error event, then response.failed with the output so far.
  std::string stream_error(const ApiError& e) override {
    ojson failed = response_object(result(), req_, out_.items(), "failed");
    failed["error"] = ojson{{"code", e.type}, {"message", e.message}};
    failed["usage"] = nullptr;
    return event("error", ojson{{"code", e.type},
                                {"message", e.message},
                                {"param", e.param.empty() ? ojson(nullptr) : ojson(e.param)}}) +
           event("response.failed", {{"response", failed}});
  }

 private:
  ResponseResult result() const {
    ResponseResult r;
    r.id = o_.id;
    r.model = o_.model;
    r.created_at = o_.created;
    r.reply = choices_[0].reply;
    r.reply.finish_reason = choices_[0].reason;
    const Usage u = usage();
    r.input_tokens = u.prompt_tokens;
    r.cached_tokens = u.cached_tokens;
    r.output_tokens = u.completion_tokens;
    r.reasoning_tokens = choices_[0].reasoning_tokens;
    return r;
  }

  std::string event(const std::string& type, ojson data) const {
    ojson e = {{"type", type}, {"sequence_number", seq_++}};
    for (auto& [k, v] : data.items()) e[k] = v;
    return "event: " + type + "\ndata: " + dump(e) + "\n\n";
  }
  std::string events(const OutputBuilder::Events& ev) const {
    std::string s;
    for (const auto& [type, data] : ev) s += event(type, data);
    return s;
  }

  // Streamed or not, the items are made from the deltas as they come (so both end alike);
  // streaming, their events go out with the piece.
  void on_delta(size_t, const ChatDelta& d) override {
    OutputBuilder::Events ev;
    auto take = [&](OutputBuilder::Events e) {
      for (auto& x : e) ev.push_back(std::move(x));
    };
    if (!d.reasoning.empty()) take(out_.reasoning(d.reasoning));
    if (!d.content.empty()) take(out_.content(d.content));
    for (const ToolCallDelta& t : d.tool_calls) {
      if (!t.id.empty()) take(out_.call_start(t.id, t.name));
      take(out_.call_arguments(t.arguments));
    }
    if (o_.stream) pending_ += events(ev);
  }
  std::string delta_chunk(size_t, const ChatDelta&, const std::vector<TokenLogprob>*) override {
    return std::exchange(pending_, std::string());
  }
  // The last item's done events (once).
  std::string close_items() const {
    if (closed_) return {};
    closed_ = true;
    return events(out_.close(true, choices_[0].reason == FinishReason::kLength));
  }
  std::string finish_chunk(size_t) const override { return close_items(); }
  std::vector<std::string> prologue() const override {
    const ojson r = response_object(result(), req_, ojson::array(), "in_progress");
    return {event("response.created", {{"response", r}}),
            event("response.in_progress", {{"response", r}})};
  }
  std::string usage_chunk(const Usage&) const override { return {}; }
  std::string frame(const std::string& chunk) const override { return chunk; }

  ojson final_response() const {
    close_items();
    const ResponseResult r = result();
    ojson response = response_object(r, req_, out_.items(), final_status(r));
    if (keep_) keep_(dump(response), r.reply);
    return response;
  }
  std::string stream_end(const Usage&) const override {
    // response.completed also for an incomplete response (its status says so), as vLLM does:
    // the OpenAI SDK's stream helper finishes only on response.completed.
    return event("response.completed", {{"response", final_response()}});
  }
  std::string body(const Usage&) const override { return dump(final_response()); }

  ResponsesRequest req_;
  KeepResponse keep_;
  // The output so far: finish_chunk and the rest are const in ReplyWriter.
  mutable OutputBuilder out_;
  mutable bool closed_ = false;
  mutable int64_t seq_ = 0;
  std::string pending_;  // the events of the piece delta_chunk returns
};

}  // namespace

std::unique_ptr<ReplyWriter> responses_reply_writer(ReplyOptions o, ResponsesRequest req,
                                                    KeepResponse keep) {
  o.n = 1;
  o.stream = req.stream;
  return std::make_unique<ResponsesReplyWriter>(std::move(o), std::move(req), std::move(keep));
}

}  // namespace vlm

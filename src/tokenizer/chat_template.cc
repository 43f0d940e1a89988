// Chat templates: the checkpoint's own Jinja template (jinja/jinja.h), found where
// transformers looks for it, or the built-in Qwen3-VL Instruct one; conversations (ChatMessage)
// handed to it as the dicts transformers passes (content as a string or a list of parts).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "jinja/jinja.h"
#include "vlm/chat.h"

namespace vlm {
namespace {

using ojson = nlohmann::ordered_json;

// The Qwen3-VL Instruct template (tokenizer_config.json "chat_template" of
// Qwen/Qwen3-VL-*-Instruct; provenance in tests/model/fixtures/chat_template/README.md, which keeps
// the same bytes).
constexpr const char* kQwen3VlInstruct = R"vlmtpl({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' }}
        {%- if messages[0].content is string %}
            {{- messages[0].content }}
        {%- else %}
            {%- for content in messages[0].content %}
                {%- if 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set image_count = namespace(value=0) %}
{%- set video_count = namespace(value=0) %}
{%- for message in messages %}
    {%- if message.role == "user" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content_item in message.content %}
                {%- if 'text' in content_item %}
                    {{- content_item.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and message.content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {%- if message.content is string %}
            {{- message.content }}
        {%- else %}
            {%- for content in message.content %}
                {%- if content.type == 'image' or 'image' in content or 'image_url' in content %}
                    {%- set image_count.value = image_count.value + 1 %}
                    {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
                    <|vision_start|><|image_pad|><|vision_end|>
                {%- elif content.type == 'video' or 'video' in content %}
                    {%- set video_count.value = video_count.value + 1 %}
                    {%- if add_vision_id %}Video {{ video_count.value }}: {% endif -%}
                    <|vision_start|><|video_pad|><|vision_end|>
                {%- elif 'text' in content %}
                    {{- content.text }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)vlmtpl";

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return not_found("cannot read " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A JSON file, parsed with its keys' order kept.
Result<ojson> read_json(const std::string& path) {
  VLM_ASSIGN_OR_RETURN(std::string text, read_text(path));
  ojson j = ojson::parse(text, nullptr, false);
  if (j.is_discarded()) return invalid_argument(path + ": not valid JSON");
  return j;
}

// A tokenizer_config.json token entry: a string, or {"content": ...}.
std::string token_text(const ojson& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

// tokenizer_config.json's / chat_template.json's "chat_template": a string, or a list of
// {"name", "template"} whose "default" entry is the one used.
std::string template_of(const ojson& j) {
  if (!j.contains("chat_template")) return "";
  const ojson& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array()) {
    for (const ojson& e : t) {
      if (e.is_object() && e.value("name", "") == "default" && e.contains("template"))
        return e["template"].get<std::string>();
    }
  }
  return "";
}

jinja::Value message_value(const ChatMessage& m) {
  jinja::Object o;
  o.set("role", jinja::Value(m.role));
  if (m.content_is_text) {
    o.set("content", jinja::Value(m.text));
  } else {
    jinja::Array parts;
    for (const ChatPart& p : m.parts) {
      jinja::Object part;
      switch (p.type) {
        case ChatPart::Type::kText:
          part.set("type", jinja::Value("text"));
          part.set("text", jinja::Value(p.text));
          break;
        case ChatPart::Type::kImage:
          part.set("type", jinja::Value("image"));
          break;
        case ChatPart::Type::kVideo:
          part.set("type", jinja::Value("video"));
          break;
      }
      parts.push_back(jinja::Value(std::move(part)));
    }
    o.set("content", jinja::Value(std::move(parts)));
  }
  if (!m.reasoning.empty()) o.set("reasoning_content", jinja::Value(m.reasoning));
  if (!m.tool_call_id.empty()) o.set("tool_call_id", jinja::Value(m.tool_call_id));
  if (!m.name.empty()) o.set("name", jinja::Value(m.name));
  if (!m.tool_calls.empty()) {
    jinja::Array calls;
    for (const ChatToolCall& c : m.tool_calls) {
      jinja::Object fn;
      fn.set("name", jinja::Value(c.name));
      jinja::Value args(c.arguments);
      if (c.arguments_is_object) {
        const ojson parsed = ojson::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
        if (!parsed.is_discarded()) args = jinja::Value::from_json(parsed);
      }
      fn.set("arguments", args);
      jinja::Object call;
      if (!c.id.empty()) call.set("id", jinja::Value(c.id));
      call.set("type", jinja::Value("function"));
      call.set("function", jinja::Value(std::move(fn)));
      calls.push_back(jinja::Value(std::move(call)));
    }
    o.set("tool_calls", jinja::Value(std::move(calls)));
  }
  return jinja::Value(std::move(o));
}

}  // namespace

struct ChatTemplate::Impl {
  jinja::Template tpl;
  std::string origin;
  std::string bos_token, eos_token;
};

Result<ChatTemplate> ChatTemplate::from_source(const std::string& source, const std::string& origin,
                                               const std::string& bos_token,
                                               const std::string& eos_token) {
  auto t = jinja::Template::parse(source);
  if (!t.ok()) return invalid_argument(origin + ": " + t.status().message());
  ChatTemplate ct;
  ct.impl_ = std::make_shared<Impl>(Impl{std::move(t).value(), origin, bos_token, eos_token});
  // A template that cannot render a one-message conversation is refused now, not per request.
  ChatMessage hello;
  hello.role = "user";
  hello.text = "Hello";
  auto r = ct.render({hello}, {});
  if (!r.ok()) return invalid_argument(origin + ": " + r.status().message());
  return ct;
}

const ChatTemplate& ChatTemplate::builtin() {
  static const ChatTemplate t =
      from_source(kQwen3VlInstruct, "built-in Qwen3-VL Instruct template", "", "<|im_end|>")
          .value();
  return t;
}

Result<ChatTemplate> ChatTemplate::from_file(const std::string& path) {
  if (path.ends_with(".json")) {
    VLM_ASSIGN_OR_RETURN(const ojson j, read_json(path));
    const std::string t = template_of(j);
    if (t.empty()) return invalid_argument(path + ": no \"chat_template\" in it");
    return from_source(t, path, token_text(j.value("bos_token", ojson())),
                       token_text(j.value("eos_token", ojson())));
  }
  VLM_ASSIGN_OR_RETURN(std::string text, read_text(path));
  return from_source(text, path, "", "");
}

Result<ChatTemplate> ChatTemplate::from_model_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::string bos, eos;
  ojson config;
  const std::string cfg_path = dir + "/tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    VLM_ASSIGN_OR_RETURN(config, read_json(cfg_path));
    bos = token_text(config.value("bos_token", ojson()));
    eos = token_text(config.value("eos_token", ojson()));
  }
  // transformers' order: chat_template.jinja, chat_template.json, tokenizer_config.json.
  if (const std::string p = dir + "/chat_template.jinja"; fs::exists(p)) {
    VLM_ASSIGN_OR_RETURN(std::string text, read_text(p));
    return from_source(text, p, bos, eos);
  }
  if (const std::string p = dir + "/chat_template.json"; fs::exists(p)) {
    VLM_ASSIGN_OR_RETURN(const ojson j, read_json(p));
    const std::string t = template_of(j);
    if (!t.empty()) return from_source(t, p, bos, eos);
  }
  if (const std::string t = template_of(config); !t.empty())
    return from_source(t, cfg_path, bos, eos);
  return builtin();
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const ChatTemplateOptions& opts) const {
  jinja::Array msgs;
  for (const ChatMessage& m : messages) msgs.push_back(message_value(m));
  jinja::Object ctx;
  ctx.set("messages", jinja::Value(std::move(msgs)));
  if (opts.tools_json.empty()) {
    ctx.set("tools", jinja::Value::none());
  } else {
    jinja::Array tools;
    for (const std::string& t : opts.tools_json) {
      const ojson j = ojson::parse(t, nullptr, false);
      if (j.is_discarded()) return invalid_argument("a tool definition is not valid JSON");
      tools.push_back(jinja::Value::from_json(j));
    }
    ctx.set("tools", jinja::Value(std::move(tools)));
  }
  ctx.set("documents", jinja::Value::none());
  ctx.set("add_generation_prompt", jinja::Value(opts.add_generation_prompt));
  if (opts.add_vision_id) ctx.set("add_vision_id", jinja::Value(true));
  ctx.set("bos_token", jinja::Value(impl_->bos_token));
  ctx.set("eos_token", jinja::Value(impl_->eos_token));
  for (const auto& [k, v] : opts.kwargs_json) {
    const ojson j = ojson::parse(v, nullptr, false);
    if (j.is_discarded())
      return invalid_argument("chat_template_kwargs." + k + " is not valid JSON");
    ctx.set(k, jinja::Value::from_json(j));
  }
  return impl_->tpl.render(ctx);
}

const std::string& ChatTemplate::origin() const { return impl_->origin; }

std::string render_chat(const std::vector<ChatMessage>& messages, const ChatTemplateOptions& opts) {
  // NOTE(vlm): the built-in template has no raise_exception and parses once at start, so a
  // well-formed ChatMessage list always renders.
  auto r = ChatTemplate::builtin().render(messages, opts);
  return r.ok() ? std::move(r).value() : std::string();
}

}  // namespace vlm

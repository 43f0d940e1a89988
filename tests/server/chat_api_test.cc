// The library's chat API (Engine::chat) and the server's /v1/chat/completions give the same reply
// to the same conversation: the server is a JSON layer over the engine's chat stream. The
// conversation is built by hand for the engine (ChatMessage, ChatPart::of_image, tools as JSON)
// and as OpenAI JSON for the server (non-streaming and streaming), on three checkpoints: the
// default tiny model with text, the same with an image, and the forced-reply fixture, whose
// greedy reply to anything is a reasoning block and a get_weather tool call.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/base64.h"
#include "test_http_client.h"
#include "test_util.h"
#include "vlm/engine.h"
#include "vlm/server.h"

namespace vlm {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;  // the tools keep their key order, as clients send them

const std::string kRepo = VLM_REPO_DIR;
const std::string kTools =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a )"
    R"(city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, )"
    R"("required": ["city"]}}})";

EngineOptions engine_options(const std::string& dir) {
  EngineOptions o;
  o.model_dir = dir;
  o.n_threads = 2;
  o.max_context = 1024;
  return o;
}

// One server on `dir`, and an engine of its own on the same checkpoint.
class Pair {
 public:
  explicit Pair(const std::string& dir) {
    ServeOptions so;
    so.engine = engine_options(dir);
    so.port = 0;
    so.model_names = {"m"};
    auto s = Server::create(so);
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) return;
    server_ = std::move(s).value();
    EXPECT_TRUE(server_->wait_until_loaded().ok());
    thread_ = std::thread([this] { server_->run(); });
    auto e = Engine::load(engine_options(dir));
    EXPECT_TRUE(e.ok()) << e.status().message();
    if (e.ok()) engine_ = std::move(e).value();
  }
  ~Pair() {
    if (server_) {
      server_->stop();
      thread_.join();
    }
  }
  bool ok() const { return server_ && engine_; }
  Engine& engine() { return *engine_; }

  std::optional<test_http::Reply> raw(json body) {
    body["model"] = "m";
    return test_http::Client(server_->port())
        .Post("/v1/chat/completions", body.dump(), "application/json");
  }
  json post(json body) {
    const bool stream = body.value("stream", false);
    auto r = raw(std::move(body));
    EXPECT_TRUE(r.has_value());
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return stream ? json(r->body) : json::parse(r->body);
  }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::unique_ptr<Engine> engine_;
};

// What a stream's chunks add up to: content, reasoning, tool calls (by index) and the finish.
struct Streamed {
  std::string content, reasoning, finish;
  std::vector<json> tool_calls;
};
Streamed parse_stream(const std::string& sse) {
  Streamed out;
  size_t pos = 0;
  while ((pos = sse.find("data: ", pos)) != std::string::npos) {
    const size_t end = sse.find("\n\n", pos);
    const std::string payload = sse.substr(pos + 6, end - pos - 6);
    pos = end;
    if (payload == "[DONE]") continue;
    const json j = json::parse(payload);
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) out.content += d["content"];
    if (d.contains("reasoning_content")) out.reasoning += d["reasoning_content"];
    for (const json& t : d.value("tool_calls", json::array())) {
      const size_t k = t["index"].get<size_t>();
      if (out.tool_calls.size() <= k) out.tool_calls.resize(k + 1, json::object());
      json& call = out.tool_calls[k];
      if (t.contains("function")) {
        const json& f = t["function"];
        if (f.contains("name")) call["name"] = f["name"];
        call["arguments"] = call.value("arguments", "") + f.value("arguments", "");
      }
    }
    if (!c["finish_reason"].is_null()) out.finish = c["finish_reason"];
  }
  return out;
}

std::string finish_name(const ChatReply& r) {
  if (r.finish_reason == FinishReason::kLength) return "length";
  return r.tool_calls.empty() ? "stop" : "tool_calls";
}

// The engine's reply, with its streamed pieces checked to add up to it.
ChatReply engine_chat(Engine& e, ChatRequest req) {
  ChatReply streamed;
  auto r = e.chat(std::move(req), [&](const ChatChunk& c) {
    streamed.content += c.delta.content;
    streamed.reasoning += c.delta.reasoning;
    for (const ToolCallDelta& t : c.delta.tool_calls) {
      if (t.index >= static_cast<int>(streamed.tool_calls.size())) {
        streamed.tool_calls.resize(static_cast<size_t>(t.index) + 1);
      }
      streamed.tool_calls[static_cast<size_t>(t.index)].arguments += t.arguments;
    }
    return true;
  });
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (!r.ok()) return {};
  EXPECT_EQ(streamed.content, r->content);
  EXPECT_EQ(streamed.reasoning, r->reasoning);
  EXPECT_EQ(streamed.tool_calls.size(), r->tool_calls.size());
  for (size_t i = 0; i < std::min(streamed.tool_calls.size(), r->tool_calls.size()); ++i) {
    EXPECT_EQ(streamed.tool_calls[i].arguments, r->tool_calls[i].arguments);
  }
  return std::move(r).value();
}

// The server's reply (both forms) equals the engine's.
void expect_same(Pair& p, const json& body, const ChatReply& want, const std::string& what) {
  const json whole = p.post(body);
  ASSERT_TRUE(whole.is_object()) << what;
  const json& msg = whole["choices"][0]["message"];
  EXPECT_EQ(msg["content"].is_null() ? "" : msg["content"].get<std::string>(), want.content)
      << what;
  EXPECT_EQ(msg.value("reasoning_content", ""), want.reasoning) << what;
  EXPECT_EQ(whole["choices"][0]["finish_reason"], finish_name(want)) << what;
  EXPECT_EQ(whole["usage"]["prompt_tokens"], want.stats.prompt_tokens) << what;
  EXPECT_EQ(whole["usage"]["completion_tokens"], want.stats.completion_tokens) << what;
  const json calls = msg.value("tool_calls", json::array());
  ASSERT_EQ(calls.size(), want.tool_calls.size()) << what;
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i]["function"]["name"], want.tool_calls[i].name) << what;
    EXPECT_EQ(calls[i]["function"]["arguments"], want.tool_calls[i].arguments) << what;
  }
  json sbody = body;
  sbody["stream"] = true;
  const json sse = p.post(sbody);
  ASSERT_TRUE(sse.is_string()) << what;
  const Streamed s = parse_stream(sse.get<std::string>());
  EXPECT_EQ(s.content, want.content) << what << " (streamed)";
  EXPECT_EQ(s.reasoning, want.reasoning) << what << " (streamed)";
  EXPECT_EQ(s.finish, finish_name(want)) << what << " (streamed)";
  ASSERT_EQ(s.tool_calls.size(), want.tool_calls.size()) << what << " (streamed)";
  for (size_t i = 0; i < s.tool_calls.size(); ++i) {
    EXPECT_EQ(s.tool_calls[i]["name"], want.tool_calls[i].name) << what;
    EXPECT_EQ(s.tool_calls[i]["arguments"], want.tool_calls[i].arguments) << what;
  }
}

ChatMessage text_message(const std::string& role, const std::string& text) {
  ChatMessage m;
  m.role = role;
  m.text = text;
  return m;
}

TEST(ChatApi, TextAndImageRepliesEqualTheServers) {
  Pair p(kRepo + "/models/tiny-qwen3vl");
  ASSERT_TRUE(p.ok());
  // Text: a system prompt and a question, greedy, 24 tokens at most.
  ChatRequest req;
  req.messages = {text_message("system", "You answer briefly."),
                  text_message("user", "What colour is the sky?")};
  req.sampling.temperature = 0;
  req.max_new_tokens = 24;
  const ChatReply text = engine_chat(p.engine(), req);
  EXPECT_GT(text.stats.completion_tokens, 0);
  EXPECT_FALSE(text.content.empty());
  const json body = {{"messages",
                      {{{"role", "system"}, {"content", "You answer briefly."}},
                       {{"role", "user"}, {"content", "What colour is the sky?"}}}},
                     {"temperature", 0},
                     {"max_tokens", 24}};
  expect_same(p, body, text, "text");

  // An image (the same PNG: bytes for the engine, a data: URL for the server) and a question.
  const std::string png = test_util::read_file(kRepo + "/examples/shapes.png");
  ChatMessage user;
  user.role = "user";
  user.content_is_text = false;
  ImageInput image;
  image.bytes.assign(png.begin(), png.end());
  user.parts = {ChatPart::of_image(image), ChatPart::of_text("What shapes are in the picture?")};
  ChatRequest ireq;
  ireq.messages = {user};
  ireq.sampling.temperature = 0;
  ireq.max_new_tokens = 24;
  const ChatReply pic = engine_chat(p.engine(), ireq);
  EXPECT_GT(pic.stats.vision_tokens, 0);
  EXPECT_EQ(pic.stats.images, 1);
  const json ibody = {
      {"messages",
       {{{"role", "user"},
         {"content",
          {{{"type", "image_url"},
            {"image_url", {{"url", "data:image/png;base64," + base64_encode(png)}}}},
           {{"type", "text"}, {"text", "What shapes are in the picture?"}}}}}}},
      {"temperature", 0},
      {"max_tokens", 24}};
  expect_same(p, ibody, pic, "image");

  // What the engine refuses is a 400 naming the field: a thinking budget for a model without
  // </think> (this one's vocabulary has none).
  json think = body;
  think["max_thinking_tokens"] = 4;
  auto refused = p.raw(think);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["error"]["param"], "max_thinking_tokens") << refused->body;
}

TEST(ChatApi, ToolCallAndReasoningEqualTheServers) {
  // The forced-reply checkpoint with the Qwen3 tokenizer beside it.
  test_util::TempDir dir;
  const fs::path src = kRepo + "/tests/model/fixtures/forced-reply";
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
    fs::create_symlink(src / f, dir.path() / f);
  }
  fs::create_symlink(kRepo + "/tests/data/tokenizer/tokenizer.json", dir.path() / "tokenizer.json");
  Pair p(dir.str());
  ASSERT_TRUE(p.ok());
  ChatRequest req;
  req.messages = {text_message("user", "What's the weather in Oslo?")};
  req.tools_json = {kTools};
  req.sampling.temperature = 0;
  req.max_new_tokens = 64;
  const ChatReply call = engine_chat(p.engine(), req);
  ASSERT_EQ(call.tool_calls.size(), 1u);
  EXPECT_EQ(call.tool_calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(call.tool_calls[0].arguments), json({{"city", "Oslo"}}));
  EXPECT_TRUE(call.tool_calls[0].arguments_is_object);
  // Call ids differ from request to request (an id names its call across turns).
  EXPECT_EQ(call.tool_calls[0].id.rfind("call_", 0), 0u) << call.tool_calls[0].id;
  EXPECT_NE(engine_chat(p.engine(), req).tool_calls.at(0).id, call.tool_calls[0].id);
  EXPECT_EQ(call.reasoning, "Weather needs a tool.");
  EXPECT_EQ(call.finish_reason, FinishReason::kStop);
  const json body = {{"messages", {{{"role", "user"}, {"content", "What's the weather in Oslo?"}}}},
                     {"tools", {json::parse(kTools)}},
                     {"temperature", 0},
                     {"max_tokens", 64}};
  expect_same(p, body, call, "a tool call");

  // The call goes back as the assistant's turn, its result as a tool message: the template
  // renders both, and the server agrees on the reply again.
  ChatMessage assistant;
  assistant.role = "assistant";
  assistant.tool_calls = call.tool_calls;
  ChatMessage result = text_message("tool", R"({"temp": 3})");
  result.tool_call_id = call.tool_calls[0].id;
  ChatRequest again = req;
  again.messages.push_back(assistant);
  again.messages.push_back(result);
  const ChatReply next = engine_chat(p.engine(), again);
  json abody = body;
  abody["messages"].push_back(
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_0"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", call.tool_calls[0].arguments}}}}}}});
  abody["messages"].push_back(
      {{"role", "tool"}, {"tool_call_id", "call_0"}, {"content", R"({"temp": 3})"}});
  expect_same(p, abody, next, "the call's result");

  // tool_choice "none": the call stays content, on both sides.
  ChatRequest none = req;
  none.parse_tool_calls = false;
  const ChatReply text = engine_chat(p.engine(), none);
  EXPECT_TRUE(text.tool_calls.empty());
  EXPECT_NE(text.content.find("<tool_call>"), std::string::npos) << text.content;
  json nbody = body;
  nbody["tool_choice"] = "none";
  expect_same(p, nbody, text, "tool_choice none");

  // include_reasoning false: the reasoning is dropped, on both sides.
  ChatRequest quiet = req;
  quiet.include_reasoning = false;
  const ChatReply no_reasoning = engine_chat(p.engine(), quiet);
  EXPECT_TRUE(no_reasoning.reasoning.empty());
  EXPECT_EQ(no_reasoning.tool_calls.size(), 1u);
  json qbody = body;
  qbody["include_reasoning"] = false;
  expect_same(p, qbody, no_reasoning, "include_reasoning false");

  // n = 2: two choices, each the same call under its own id.
  json two = body;
  two["n"] = 2;
  const json r2 = p.post(two);
  ASSERT_EQ(r2["choices"].size(), 2u) << r2.dump();
  const json& c0 = r2["choices"][0]["message"]["tool_calls"][0];
  const json& c1 = r2["choices"][1]["message"]["tool_calls"][0];
  EXPECT_EQ(c0["function"], c1["function"]);
  EXPECT_NE(c0["id"], c1["id"]);
  EXPECT_NE(c0["id"].get<std::string>().find("_0_"), std::string::npos) << c0["id"];
  EXPECT_NE(c1["id"].get<std::string>().find("_1_"), std::string::npos) << c1["id"];
}

// Logprobs: the same entries (token bytes, log-probability, alternatives) from both.
TEST(ChatApi, LogprobsEqualTheServers) {
  Pair p(kRepo + "/models/tiny-qwen3vl");
  ASSERT_TRUE(p.ok());
  ChatRequest req;
  req.messages = {text_message("user", "Name a colour.")};
  req.sampling.temperature = 0;
  req.max_new_tokens = 8;
  req.logprobs = 2;
  const ChatReply want = engine_chat(p.engine(), req);
  ASSERT_FALSE(want.logprobs.empty());
  const json body = {{"messages", {{{"role", "user"}, {"content", "Name a colour."}}}},
                     {"temperature", 0},
                     {"max_tokens", 8},
                     {"logprobs", true},
                     {"top_logprobs", 2}};
  const json got = p.post(body);
  const json& entries = got["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(entries.size(), want.logprobs.size()) << got.dump();
  std::string joined;
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i]["token"], want.logprobs[i].token) << i;
    EXPECT_NEAR(entries[i]["logprob"].get<double>(), want.logprobs[i].logprob, 1e-6) << i;
    ASSERT_EQ(entries[i]["top_logprobs"].size(), 2u);
    EXPECT_EQ(entries[i]["top_logprobs"][0]["token"], want.logprobs[i].top_logprobs[0].token);
    joined += want.logprobs[i].token;
  }
  EXPECT_EQ(joined, want.content);  // the entries' bytes add up to the reply
}

// The engine's own errors, before anything reaches the engine core: a conversation the template
// refuses (raise_exception) names "messages"; a thinking budget on a model without </think> (the
// tiny model's vocabulary has none) names max_thinking_tokens; a template that does not parse is
// the chat API's error, not the load's.
TEST(ChatApi, RefusedConversationsAreErrors) {
  test_util::TempDir dir;
  const std::string path = (dir.path() / "t.jinja").string();
  std::ofstream(path) << "{% if messages | length > 1 %}{{ raise_exception('one message only') "
                         "}}{% endif %}<|im_start|>user\n{{ messages[0].content }}<|im_end|>\n"
                         "<|im_start|>assistant\n";
  EngineOptions o = engine_options(kRepo + "/models/tiny-qwen3vl");
  o.chat_template = path;
  auto e = Engine::load(o);
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ((*(*e)->chat_template())->origin(), path);
  ChatRequest two;
  two.messages = {text_message("user", "hi"), text_message("user", "again")};
  auto r = (*e)->chat(two);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message().rfind("messages: ", 0), 0u) << r.status().message();
  EXPECT_EQ(r.status().field(), "messages");
  EXPECT_NE(r.status().message().find("one message only"), std::string::npos);
  ASSERT_FALSE((*e)->tokenizer()->token_to_id("</think>").has_value());
  ChatRequest think;
  think.messages = {text_message("user", "hi")};
  think.max_thinking_tokens = 4;
  auto t = (*e)->chat(think);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message().rfind("max_thinking_tokens: ", 0), 0u) << t.status().message();
  EXPECT_EQ(t.status().field(), "max_thinking_tokens");
  EXPECT_EQ((*e)->core_stats().steps, 0);  // nothing ran

  // A template that does not parse: the engine loads (raw ids need no template), and the chat
  // API fails with the template's own error, naming the place.
  const std::string broken = (dir.path() / "broken.jinja").string();
  std::ofstream(broken) << "{% if %}";
  o.chat_template = broken;
  auto b = Engine::load(o);
  ASSERT_TRUE(b.ok()) << b.status().message();
  const auto tpl = (*b)->chat_template();
  ASSERT_FALSE(tpl.ok());
  EXPECT_NE(tpl.status().message().find("broken.jinja"), std::string::npos)
      << tpl.status().message();
  auto chat = (*b)->chat(think);
  ASSERT_FALSE(chat.ok());
  EXPECT_EQ(chat.status().message(), tpl.status().message());
  GenerateRequest g;
  g.prompt_ids = (*b)->tokenizer()->encode("hi");
  g.max_new_tokens = 2;
  EXPECT_TRUE((*b)->generate(g).ok());
}

}  // namespace
}  // namespace vlm

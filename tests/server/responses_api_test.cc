// The Responses API on the chat path (server/responses_api): requests become chat completion
// bodies (which the chat parser then reads), replies become response objects. End to end through
// the OpenAI client: tests/server/responses_test.py.
#include "server/responses_api.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace vlm {
namespace {

using nlohmann::json;

json chat_of(const std::string& body) {
  auto r = parse_responses(body);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? json::parse(r.value().chat_body) : json();
}

TEST(ResponsesApi, TextInputAndInstructions) {
  const json c = chat_of(R"({"model": "m", "input": "hi", "instructions": "Be brief.",
                             "max_output_tokens": 7, "temperature": 0.5, "seed": 3})");
  EXPECT_EQ(c["messages"], json::parse(R"([{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "hi"}])"));
  EXPECT_EQ(c["max_completion_tokens"], 7);
  EXPECT_EQ(c["temperature"], 0.5);
  EXPECT_EQ(c["seed"], 3);
  EXPECT_EQ(c["model"], "m");
  // What the chat parser accepts (the body goes to ChatRequestBuilder as it is).
  EXPECT_TRUE(parse_chat_completion(c.dump(), ApiLimits{}, MediaPolicy{}).ok());
}

// A response's output replayed as input ([reasoning, message, function_call]) is one assistant
// turn, as the stored conversation writes it; instructions and a developer message are one
// system message.
TEST(ResponsesApi, ReplayedOutputIsOneTurn) {
  const json c = chat_of(R"({"instructions": "Be brief.", "input": [
      {"role": "developer", "content": "Use tools."},
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "r"}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
      {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sun"}]})");
  const json& m = c["messages"];
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0], json::parse(R"({"role": "system", "content": "Be brief.\n\nUse tools."})"));
  EXPECT_EQ(m[2]["content"][0]["text"], "Let me check.");
  EXPECT_EQ(m[2]["reasoning_content"], "r");
  EXPECT_EQ(m[2]["tool_calls"][0]["id"], "c1");
  EXPECT_EQ(m[3]["role"], "tool");
  // Continued, the developer message is part of the conversation, the instructions are not.
  auto r = parse_responses(R"({"instructions": "Be brief.", "input": [
      {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
      {"role": "user", "content": "Hi"}]})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(json::parse(r->input_json)[0]["role"], "system");
  auto next = parse_responses(R"({"instructions": "New.", "input": "More"})");
  ASSERT_TRUE(next.ok());
  const json cont = json::parse(chat_body_after(next.value(), r->input_json))["messages"];
  ASSERT_EQ(cont.size(), 3u);
  EXPECT_EQ(cont[0], json::parse(R"({"role": "system", "content": "New.\n\nUse tools."})"));
  EXPECT_FALSE(parse_responses(R"({"instructions": "I", "input": [
      {"role": "developer", "content": [{"type": "input_image", "image_url": "data:x"}]},
      {"role": "user", "content": "Hi"}]})")
                   .ok());
}

TEST(ResponsesApi, ItemsBecomeMessagesToolCallsAndResults) {
  const json c = chat_of(R"({"input": [
      {"role": "developer", "content": "Use tools."},
      {"type": "message", "role": "user", "content": [
          {"type": "input_text", "text": "Weather? "},
          {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [],
       "content": [{"type": "reasoning_text", "text": "Needs a tool."}]},
      {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{\"city\":\"Oslo\"}"},
      {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "12 C"},
      {"type": "function_call_output", "call_id": "c2", "output": [
          {"type": "input_text", "text": "rain"}]},
      {"role": "assistant", "content": [{"type": "output_text", "text": "12 C, rain."}]},
      {"role": "user", "content": "Thanks"}]})");
  const json& m = c["messages"];
  ASSERT_EQ(m.size(), 7u);
  EXPECT_EQ(m[0], json::parse(R"({"role": "system", "content": "Use tools."})"));
  EXPECT_EQ(m[1]["content"][1], json::parse(R"({"type": "image_url", "image_url": {"url":
                            "data:image/png;base64,AAAA", "detail": "low"}})"));
  EXPECT_EQ(m[2]["role"], "assistant");
  EXPECT_TRUE(m[2]["content"].is_null());
  EXPECT_EQ(m[2]["reasoning_content"], "Needs a tool.");
  ASSERT_EQ(m[2]["tool_calls"].size(), 2u);  // consecutive calls: one turn
  EXPECT_EQ(m[2]["tool_calls"][0],
            json::parse(R"({"id": "c1", "type": "function", "function": {"name": "w",
                            "arguments": "{\"city\":\"Oslo\"}"}})"));
  EXPECT_EQ(m[3], json::parse(R"({"role": "tool", "tool_call_id": "c1", "content": "12 C"})"));
  EXPECT_EQ(m[4]["content"][0]["text"], "rain");
  EXPECT_EQ(m[5], json::parse(R"({"role": "assistant", "content": [
      {"type": "text", "text": "12 C, rain."}]})"));
  EXPECT_EQ(m[6], json::parse(R"({"role": "user", "content": "Thanks"})"));
  ApiLimits limits;
  EXPECT_TRUE(parse_chat_completion(c.dump(), limits, MediaPolicy{}).ok());
}

TEST(ResponsesApi, ToolsToolChoiceFormatAndReasoning) {
  const json c = chat_of(R"({"input": "x",
      "tools": [{"type": "function", "name": "w", "description": "d",
                 "parameters": {"type": "object"}, "strict": true}],
      "tool_choice": {"type": "function", "name": "w"}, "parallel_tool_calls": false,
      "text": {"format": {"type": "json_schema", "name": "s", "strict": true,
                          "schema": {"type": "object"}}},
      "reasoning": {"effort": "none"}})");
  EXPECT_EQ(c["tools"], json::parse(R"([{"type": "function", "function": {"name": "w",
      "description": "d", "parameters": {"type": "object"}, "strict": true}}])"));
  EXPECT_EQ(c["tool_choice"], json::parse(R"({"type": "function", "function": {"name": "w"}})"));
  EXPECT_EQ(c["parallel_tool_calls"], false);
  EXPECT_EQ(c["response_format"], json::parse(R"({"type": "json_schema", "json_schema":
      {"name": "s", "schema": {"type": "object"}, "strict": true}})"));
  EXPECT_EQ(c["chat_template_kwargs"], json::parse(R"({"enable_thinking": false})"));
  EXPECT_EQ(
      chat_of(R"({"input": "x", "text": {"format": {"type": "json_object"}}})")["response_format"],
      json::parse(R"({"type": "json_object"})"));
  EXPECT_FALSE(chat_of(R"({"input": "x", "text": {"format": {"type": "text"}}})")
                   .contains("response_format"));
}

TEST(ResponsesApi, WhatIsNotSupportedIsNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type"},
      {R"({"input": "x", "background": true})", "background"},
      {R"({"input": "x", "previous_response_id": 1})", "previous_response_id"},
      {R"({"input": "x", "store": "yes"})", "store"},
      {R"({"input": "x", "include": ["reasoning.encrypted_content"]})", "include"},
      {R"({"input": "x", "truncation": "auto"})", "truncation"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]})",
       "input[0].content[0].type"},
      {R"({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]})",
       "input[0].content[0].file_id"},
      {R"({"input": [{"type": "web_search_call", "id": "w"}]})", "input[0].type"},
      {R"({"input": [{"role": "tool", "content": "x"}]})", "input[0].role"},
      {R"({"input": [{"type": "function_call", "call_id": "c", "name": "w"}]})",
       "input[0].arguments"},
      {R"({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "e"}]})",
       "input[0].encrypted_content"},
      {R"({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]}]})",
       "input"},
      {R"({"input": "x", "tool_choice": {"type": "file_search"}})", "tool_choice"},
      {R"({"input": "x", "text": {"format": {"type": "grammar"}}})", "text.format.type"},
      {R"({"input": "x", "text": {"verbosity": "low"}})", "text.verbosity"},
      {R"({"input": "x", "reasoning": {"effort": "high"}})", "reasoning"},
      {R"({"input": "x", "reasoning": {"generate_summary": "auto"}})", "reasoning"},
      {R"({"input": "x", "tools": [{"type": "function", "name": "w", "defer_loading": true}]})",
       "tools[0].defer_loading"},
      {R"({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]},
                     {"role": "user", "content": "x"}]})",
       "input[1]"},
      {R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens"},
      {R"({"input": "x", "prompt": {"id": "p"}})", "prompt"},
      {R"({"input": "x", "conversation": "c"})", "conversation"},
      {R"({"input": []})", "input"},
      {R"({"instructions": "x"})", "input"},
      {R"({"input": 3})", "input"},
      {R"({"input": "x", "stream": "yes"})", "stream"},
  };
  for (const auto& [body, param] : cases) {
    auto r = parse_responses(body);
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.error().http_status, 400) << body;
    EXPECT_EQ(r.error().param, param) << body;
  }
  // What changes nothing is accepted: metadata, user, store, and the defaults of the rest.
  EXPECT_TRUE(parse_responses(R"({"input": "x", "metadata": {"k": "v"}, "user": "u",
                                  "store": true, "truncation": "disabled", "include": [],
                                  "background": false})")
                  .ok());
}

// The reply writer fed chat pieces as the engine makes them.
struct Fed {
  std::vector<json> events;  // streaming: each event's data, in order
  json response;             // the final response (the body, or response.completed's)
};

ChatChunk piece(ChatDelta d, bool last = false, FinishReason why = FinishReason::kStop) {
  ChatChunk c;
  c.delta = std::move(d);
  c.token_id = 7;
  c.finished = last;
  c.finish_reason = last ? why : FinishReason::kNone;
  c.stats.prompt_tokens = 11;
  c.stats.completion_tokens = 3;
  return c;
}

// `body`: the request (streamed when it says so).
Fed feed_body(const std::string& body, const std::vector<ChatChunk>& pieces) {
  auto req = parse_responses(body);
  EXPECT_TRUE(req.ok());
  const bool stream = req.ok() && req->stream;
  ReplyOptions o;
  o.id = "resp_ab12";
  o.model = "m";
  o.created = 5;
  std::string raw;
  int kept = 0;
  auto w =
      responses_reply_writer(o, req.value(), [&](const std::string&, const ChatReply&) { ++kept; });
  raw += w->begin();
  for (const ChatChunk& p : pieces) raw += w->add(0, p);
  EXPECT_TRUE(w->done());
  raw += w->end();
  EXPECT_EQ(kept, 1);
  Fed f;
  if (!stream) {
    f.response = json::parse(raw);
    return f;
  }
  // "event: TYPE\ndata: JSON\n\n" each.
  size_t at = 0;
  while (at < raw.size()) {
    const size_t end = raw.find("\n\n", at);
    EXPECT_NE(end, std::string::npos);
    const std::string ev = raw.substr(at, end - at);
    const size_t nl = ev.find('\n');
    const json data = json::parse(ev.substr(nl + 7));
    EXPECT_EQ(ev.substr(7, nl - 7), data["type"]);
    f.events.push_back(data);
    at = end + 2;
  }
  f.response = f.events.back()["response"];
  return f;
}

Fed feed(bool stream, const std::vector<ChatChunk>& pieces) {
  return feed_body(stream ? R"({"input": "x", "stream": true})" : R"({"input": "x"})", pieces);
}

std::vector<std::string> types(const Fed& f) {
  std::vector<std::string> t;
  for (const json& e : f.events) t.push_back(e["type"]);
  return t;
}

TEST(ResponsesApi, ResponseObject) {
  const std::string body = R"({"input": "x", "instructions": "I", "max_output_tokens": 5,
      "tools": [{"type": "function", "name": "w"}], "metadata": {"k": "v"}})";
  ChatDelta thi, nk, hello, call;
  thi.reasoning = "thi";
  nk.reasoning = "nk";
  hello.content = "hello";
  call.tool_calls = {ToolCallDelta{0, "call_9_0_0", "w", "{\"a\":1}"}};
  std::vector<ChatChunk> pieces = {piece(thi), piece(nk), piece(hello), piece(call, true)};
  pieces.back().stats.prompt_tokens = 10;
  pieces.back().stats.cached_tokens = 4;
  pieces.back().stats.completion_tokens = 6;
  json j = feed_body(body, pieces).response;
  EXPECT_EQ(j["id"], "resp_ab12");
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["status"], "completed");
  EXPECT_TRUE(j["incomplete_details"].is_null());
  ASSERT_EQ(j["output"].size(), 3u);
  EXPECT_EQ(j["output"][0]["type"], "reasoning");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], "think");
  EXPECT_EQ(j["output"][1]["type"], "message");
  EXPECT_EQ(j["output"][1]["content"][0],
            json::parse(R"({"type": "output_text", "text": "hello", "annotations": [],
                            "logprobs": []})"));
  EXPECT_EQ(j["output"][2]["call_id"], "call_9_0_0");
  EXPECT_EQ(j["output"][2]["arguments"], "{\"a\":1}");
  // Two sampled tokens carried reasoning.
  EXPECT_EQ(j["usage"], json::parse(R"({"input_tokens": 10, "input_tokens_details":
      {"cached_tokens": 4}, "output_tokens": 6, "output_tokens_details":
      {"reasoning_tokens": 2}, "total_tokens": 16})"));
  EXPECT_EQ(j["instructions"], "I");
  EXPECT_EQ(j["max_output_tokens"], 5);
  EXPECT_EQ(j["tools"][0]["name"], "w");
  EXPECT_EQ(j["metadata"]["k"], "v");
  EXPECT_EQ(j["store"], true);  // the request's (the route clears it when nothing is kept)
  EXPECT_TRUE(j["previous_response_id"].is_null());
  // Out of tokens: incomplete, and a reply of tool calls alone has no message item.
  j = feed_body(body, {piece(thi), piece(call, true, FinishReason::kLength)}).response;
  EXPECT_EQ(j["status"], "incomplete");
  EXPECT_EQ(j["incomplete_details"]["reason"], "max_output_tokens");
  ASSERT_EQ(j["output"].size(), 2u);
  EXPECT_EQ(j["output"][1]["type"], "function_call");
}

// previous_response_id: the stored conversation goes between the new instructions and the new
// input; the reply joins it as the assistant's message (reasoning, text, calls).
TEST(ResponsesApi, ContinuingAStoredConversation) {
  auto first = parse_responses(R"({"input": "Hi", "instructions": "Old."})");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(json::parse(first->input_json), json::parse(R"([{"role": "user", "content": "Hi"}])"));
  ChatReply reply;
  reply.reasoning = "r";
  reply.content = "Hello";
  const std::string stored = conversation_with(join_messages("[]", first->input_json), reply);
  EXPECT_EQ(json::parse(stored)[1], json::parse(R"({"role": "assistant", "content": "Hello",
                                                    "reasoning_content": "r"})"));
  auto next = parse_responses(
      R"({"input": [{"role": "user", "content": "More"}], "instructions": "New.",
          "previous_response_id": "resp_1", "store": false})");
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->previous_response_id, "resp_1");
  EXPECT_FALSE(next->store);
  const json chat = json::parse(chat_body_after(next.value(), stored));
  EXPECT_EQ(chat["messages"], json::parse(R"([{"role": "system", "content": "New."},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello", "reasoning_content": "r"},
      {"role": "user", "content": "More"}])"));
  // A reply of calls alone: content null, the calls as tool_calls.
  ChatReply calls;
  calls.tool_calls = {ChatToolCall{"c1", "w", "{}", false}};
  EXPECT_EQ(json::parse(conversation_with("[]", calls))[0],
            json::parse(R"({"role": "assistant", "content": null, "tool_calls": [{"id": "c1",
                "type": "function", "function": {"name": "w", "arguments": "{}"}}]})"));
  EXPECT_EQ(feed_body(R"({"input": "x", "previous_response_id": "resp_1"})", {piece({}, true)})
                .response["previous_response_id"],
            "resp_1");
}

TEST(ResponsesApi, StreamedEventsInOrder) {
  ChatDelta think, text, call, args, more;
  think.reasoning = "hm";
  text.content = "A";
  call.tool_calls = {ToolCallDelta{0, "call_1", "w", ""}};
  args.tool_calls = {ToolCallDelta{0, "", "", "{\"a\":"}};
  more.tool_calls = {ToolCallDelta{0, "", "", "1}"}};
  const std::vector<ChatChunk> pieces = {piece(think), piece(text), piece(call), piece(args),
                                         piece(more, true)};
  const Fed f = feed(true, pieces);
  EXPECT_EQ(types(f), (std::vector<std::string>{"response.created",
                                                "response.in_progress",
                                                "response.output_item.added",
                                                "response.content_part.added",
                                                "response.reasoning_text.delta",
                                                "response.reasoning_text.done",
                                                "response.content_part.done",
                                                "response.output_item.done",
                                                "response.output_item.added",
                                                "response.content_part.added",
                                                "response.output_text.delta",
                                                "response.output_text.done",
                                                "response.content_part.done",
                                                "response.output_item.done",
                                                "response.output_item.added",
                                                "response.function_call_arguments.delta",
                                                "response.function_call_arguments.delta",
                                                "response.function_call_arguments.done",
                                                "response.output_item.done",
                                                "response.completed"}));
  for (size_t i = 0; i < f.events.size(); ++i) EXPECT_EQ(f.events[i]["sequence_number"], i);
  EXPECT_EQ(f.events[0]["response"]["status"], "in_progress");
  EXPECT_EQ(f.events[14]["item"]["call_id"], "call_1");
  EXPECT_EQ(f.events[17]["arguments"], "{\"a\":1}");
  EXPECT_EQ(f.events[15]["item_id"], f.events[14]["item"]["id"]);
  const json& out = f.response["output"];
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[2]["arguments"], "{\"a\":1}");
  EXPECT_EQ(f.response["usage"]["input_tokens"], 11);
  // Not streamed: the same response.
  EXPECT_EQ(feed(false, pieces).response, f.response);
}

// Text after a call (a tool call the parser gave back as text, or words after it): streamed or
// not, the items come in the order the pieces made them.
TEST(ResponsesApi, TextAfterACallKeepsItsPlace) {
  ChatDelta call, after;
  call.tool_calls = {ToolCallDelta{0, "call_1", "w", "{}"}};
  after.content = "B";
  const std::vector<ChatChunk> pieces = {piece(call), piece(after, true)};
  const Fed s = feed(true, pieces), n = feed(false, pieces);
  EXPECT_EQ(s.response, n.response);
  ASSERT_EQ(n.response["output"].size(), 2u);
  EXPECT_EQ(n.response["output"][0]["type"], "function_call");
  EXPECT_EQ(n.response["output"][1]["content"][0]["text"], "B");
}

// Out of tokens: the last item is incomplete, the response too (still response.completed, as
// vLLM ends it); an empty reply is one empty message.
TEST(ResponsesApi, IncompleteAndEmpty) {
  ChatDelta think;
  think.reasoning = "long";
  const Fed f = feed(true, {piece(think, true, FinishReason::kLength)});
  EXPECT_EQ(f.events.back()["type"], "response.completed");
  EXPECT_EQ(f.response["status"], "incomplete");
  EXPECT_EQ(f.response["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(f.response["output"][0]["status"], "incomplete");
  const Fed e = feed(false, {piece(ChatDelta{}, true)});
  ASSERT_EQ(e.response["output"].size(), 1u);
  EXPECT_EQ(e.response["output"][0]["type"], "message");
  EXPECT_EQ(e.response["output"][0]["content"][0]["text"], "");
}

TEST(ResponsesApi, AFailureMidStreamEndsWithResponseFailed) {
  auto req = parse_responses(R"({"input": "x", "stream": true})");
  ASSERT_TRUE(req.ok());
  ReplyOptions o;
  o.id = "resp_1";
  auto w = responses_reply_writer(o, req.value());
  w->begin();
  ChatDelta text;
  text.content = "A";
  w->add(0, piece(text));
  const std::string out = w->stream_error(ApiError{503, "server_error", "out of memory", ""});
  EXPECT_NE(out.find("event: error\n"), std::string::npos);
  const size_t failed = out.find("event: response.failed\n");
  ASSERT_NE(failed, std::string::npos);
  const json data = json::parse(out.substr(out.find("data: ", failed) + 6));
  EXPECT_EQ(data["response"]["status"], "failed");
  EXPECT_EQ(data["response"]["error"]["message"], "out of memory");
  EXPECT_EQ(out.find("[DONE]"), std::string::npos);
}

TEST(ResponsesApi, IdsAreUnguessable) {
  const std::string a = new_response_id(), b = new_response_id();
  EXPECT_EQ(a.size(), 5u + 32u);
  EXPECT_EQ(a.rfind("resp_", 0), 0u);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace vlm

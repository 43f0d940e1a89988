// The reply writers: chat chunks in, the JSON body or the server-sent events out, parsed back and
// checked field by field.
#include "server/chat_reply_writer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace vlm {
namespace {

using json = nlohmann::json;

// The events of an SSE text: each "data: <json>\n\n" parsed; [DONE] as the string "[DONE]".
std::vector<json> events(const std::string& sse) {
  std::vector<json> out;
  size_t at = 0;
  while (at < sse.size()) {
    const size_t end = sse.find("\n\n", at);
    EXPECT_NE(end, std::string::npos) << "unterminated event in " << sse;
    if (end == std::string::npos) break;
    const std::string line = sse.substr(at, end - at);
    EXPECT_EQ(line.rfind("data: ", 0), 0u) << line;
    const std::string data = line.substr(6);
    out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data));
    at = end + 2;
  }
  return out;
}

ReplyOptions options(bool stream, int n = 1) {
  ReplyOptions o;
  o.id = "chatcmpl-3";
  o.model = "qwen";
  o.created = 1700000000;
  o.stream = stream;
  o.n = n;
  return o;
}

ChatChunk content(const std::string& text, int32_t token = 1) {
  ChatChunk c;
  c.delta.content = text;
  c.token_id = token;
  return c;
}

ChatChunk finish(FinishReason r, int64_t prompt, int64_t completion, int64_t cached = 0) {
  ChatChunk c;
  c.finished = true;
  c.finish_reason = r;
  c.stats.prompt_tokens = prompt;
  c.stats.completion_tokens = completion;
  c.stats.cached_tokens = cached;
  return c;
}

ChatChunk tool_call(int index, const std::string& id, const std::string& name,
                    const std::string& args) {
  ChatChunk c;
  c.delta.tool_calls.push_back(ToolCallDelta{index, id, name, args});
  return c;
}

TEST(ChatReplyWriter, WholeChatReply) {
  ReplyOptions o = options(false, 2);
  o.logprobs = true;
  auto w = chat_reply_writer(o, 2);
  EXPECT_EQ(w->begin(), "");
  ChatChunk first = content("Hel");
  first.logprobs = {{"Hel", -0.25, {{"Hel", -0.25}, {"He", -2.0}}}};
  first.delta.reasoning = "think";
  EXPECT_EQ(w->add(0, first), "");
  EXPECT_EQ(w->add(0, content("lo")), "");
  EXPECT_EQ(w->add(1, tool_call(0, "call_3_1_0", "f", "{\"a\": ")), "");
  EXPECT_EQ(w->add(1, tool_call(0, "", "", "1}")), "");
  EXPECT_FALSE(w->done());
  EXPECT_EQ(w->add(0, finish(FinishReason::kLength, 10, 2, 4)), "");
  EXPECT_TRUE(w->finished(0));
  EXPECT_FALSE(w->finished(1));
  EXPECT_EQ(w->add(1, finish(FinishReason::kStop, 10, 5, 4)), "");
  ASSERT_TRUE(w->done());
  const json j = json::parse(w->end());
  EXPECT_EQ(j["id"], "chatcmpl-3");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "qwen");
  ASSERT_EQ(j["choices"].size(), 2u);
  const json& a = j["choices"][0];
  EXPECT_EQ(a["index"], 0);
  EXPECT_EQ(a["message"]["role"], "assistant");
  EXPECT_EQ(a["message"]["content"], "Hello");
  EXPECT_EQ(a["message"]["reasoning"], "think");
  EXPECT_EQ(a["message"]["reasoning_content"], "think");
  EXPECT_FALSE(a["message"].contains("tool_calls"));
  EXPECT_EQ(a["finish_reason"], "length");
  ASSERT_EQ(a["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(a["logprobs"]["content"][0]["token"], "Hel");
  EXPECT_EQ(a["logprobs"]["content"][0]["logprob"], -0.25);
  EXPECT_EQ(a["logprobs"]["content"][0]["top_logprobs"][1]["token"], "He");
  const json& b = j["choices"][1];
  EXPECT_TRUE(b["message"]["content"].is_null());  // only tool calls
  ASSERT_EQ(b["message"]["tool_calls"].size(), 1u);
  EXPECT_EQ(b["message"]["tool_calls"][0]["id"], "call_3_1_0");
  EXPECT_EQ(b["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(b["message"]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(b["message"]["tool_calls"][0]["function"]["arguments"], "{\"a\": 1}");
  EXPECT_EQ(b["finish_reason"], "tool_calls");
  EXPECT_TRUE(b["logprobs"]["content"].empty());
  // One prompt (n = 2): its tokens once; the completions of both choices.
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 7);
  EXPECT_EQ(j["usage"]["total_tokens"], 17);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
}

TEST(ChatReplyWriter, StreamedChatReply) {
  ReplyOptions o = options(true, 2);
  o.include_usage = true;
  o.logprobs = true;
  auto w = chat_reply_writer(o, 2);
  const std::vector<json> roles = events(w->begin());
  ASSERT_EQ(roles.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(roles[i]["object"], "chat.completion.chunk");
    EXPECT_EQ(roles[i]["id"], "chatcmpl-3");
    EXPECT_EQ(roles[i]["choices"][0]["index"], i);
    EXPECT_EQ(roles[i]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
    EXPECT_TRUE(roles[i]["choices"][0]["finish_reason"].is_null());
  }
  ChatChunk hi = content("Hi");
  hi.logprobs = {{"Hi", -0.5, {}}};
  std::vector<json> e = events(w->add(1, hi));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["index"], 1);
  EXPECT_EQ(e[0]["choices"][0]["delta"], json({{"content", "Hi"}}));
  EXPECT_EQ(e[0]["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
  EXPECT_FALSE(e[0].contains("usage"));
  // A piece with nothing to say (a held-back stop string) is no event.
  EXPECT_EQ(w->add(1, content("")), "");
  ChatChunk think;
  think.delta.reasoning = "hmm";
  e = events(w->add(0, think));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["delta"],
            json({{"reasoning", "hmm"}, {"reasoning_content", "hmm"}}));
  e = events(w->add(0, tool_call(0, "call_9", "lookup", "{}")));
  ASSERT_EQ(e.size(), 1u);
  const json& call = e[0]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(call["index"], 0);
  EXPECT_EQ(call["id"], "call_9");
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"], json({{"name", "lookup"}, {"arguments", "{}"}}));
  // A later fragment of the same call: its arguments only.
  e = events(w->add(0, tool_call(0, "", "", "more")));
  EXPECT_EQ(e[0]["choices"][0]["delta"]["tool_calls"][0],
            json({{"index", 0}, {"function", {{"arguments", "more"}}}}));
  // The last piece may carry text and the finish: two events.
  ChatChunk last = finish(FinishReason::kStop, 6, 3);
  last.delta.content = "!";
  e = events(w->add(1, last));
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["choices"][0]["delta"]["content"], "!");
  EXPECT_TRUE(e[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(e[1]["choices"][0]["delta"], json::object());
  EXPECT_EQ(e[1]["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(e[1]["choices"][0]["logprobs"].is_null());
  // A reply of tool calls ends with finish_reason "tool_calls".
  e = events(w->add(0, finish(FinishReason::kStop, 6, 4)));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["index"], 0);
  EXPECT_EQ(e[0]["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_TRUE(w->done());
  e = events(w->end());
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["object"], "chat.completion.chunk");
  EXPECT_TRUE(e[0]["choices"].empty());
  EXPECT_EQ(e[0]["usage"]["prompt_tokens"], 6);
  EXPECT_EQ(e[0]["usage"]["completion_tokens"], 7);
  EXPECT_EQ(e[0]["usage"]["total_tokens"], 13);
  EXPECT_EQ(e[1], "[DONE]");
}

TEST(ChatReplyWriter, StreamWithoutUsageEndsWithDoneOnly) {
  auto w = chat_reply_writer(options(true), 1);
  events(w->add(0, finish(FinishReason::kLength, 2, 1)));
  EXPECT_EQ(w->end(), "data: [DONE]\n\n");
}

// stream_options.continuous_usage_stats: every chunk after the role chunks carries the usage so
// far.
TEST(ChatReplyWriter, ContinuousUsage) {
  ReplyOptions o = options(true);
  o.include_usage = true;
  o.continuous_usage = true;
  auto w = chat_reply_writer(o, 1);
  EXPECT_FALSE(events(w->begin())[0].contains("usage"));
  ChatChunk a = content("a");
  a.stats.prompt_tokens = 5;
  a.stats.completion_tokens = 1;
  std::vector<json> e = events(w->add(0, a));
  EXPECT_EQ(e[0]["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(e[0]["usage"]["completion_tokens"], 1);
  e = events(w->add(0, finish(FinishReason::kStop, 5, 2)));
  EXPECT_EQ(e[0]["usage"]["completion_tokens"], 2);
  EXPECT_EQ(e[0]["choices"][0]["finish_reason"], "stop");
  e = events(w->end());
  EXPECT_EQ(e[0]["usage"]["total_tokens"], 7);
}

TEST(ChatReplyWriter, ErrorEvents) {
  const std::vector<json> e = events(
      ReplyWriter::error_events(ApiError{400, "invalid_request_error", "prompt too long", ""}));
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["error"]["message"], "prompt too long");
  EXPECT_EQ(e[0]["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(e[0]["error"]["param"].is_null());
  EXPECT_EQ(e[1], "[DONE]");
}

// /v1/completions: the echoed prompt first, text chunks whose logprobs' text_offset runs on from
// it, and the text_completion objects.
TEST(ChatReplyWriter, StreamedCompletions) {
  ReplyOptions o = options(true);
  o.id = "cmpl-4";
  o.logprobs = true;
  o.include_usage = true;
  auto w = completion_reply_writer(o, {"Say: ", ""});
  std::vector<json> e = events(w->begin());
  ASSERT_EQ(e.size(), 1u);  // the second choice echoes nothing
  EXPECT_EQ(e[0]["object"], "text_completion");
  EXPECT_EQ(e[0]["choices"][0]["text"], "Say: ");
  EXPECT_EQ(e[0]["choices"][0]["index"], 0);
  ChatChunk hi = content("Hi");
  hi.logprobs = {{"H", -0.1, {}}, {"i", -0.2, {}}};
  e = events(w->add(0, hi));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["text"], "Hi");
  EXPECT_EQ(e[0]["choices"][0]["logprobs"]["text_offset"], json::array({5, 6}));
  ChatChunk there = content(" there");
  there.logprobs = {{" there", -0.3, {}}};
  e = events(w->add(0, there));
  EXPECT_EQ(e[0]["choices"][0]["logprobs"]["text_offset"], json::array({7}));
  e = events(w->add(0, finish(FinishReason::kLength, 3, 3)));
  EXPECT_EQ(e[0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(e[0]["choices"][0]["text"], "");
  events(w->add(1, finish(FinishReason::kStop, 2, 1)));
  e = events(w->end());
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["object"], "text_completion");
  EXPECT_EQ(e[0]["usage"]["prompt_tokens"], 5);  // n = 1: each choice is its own prompt
  EXPECT_EQ(e[1], "[DONE]");
}

TEST(ChatReplyWriter, WholeCompletions) {
  ReplyOptions o = options(false, 2);
  o.id = "cmpl-5";
  o.logprobs = true;
  auto w = completion_reply_writer(o, {"ab", "ab", "", ""});
  for (size_t i = 0; i < 4; ++i) {
    ChatChunk c = content("x" + std::to_string(i));
    c.logprobs = {{"x" + std::to_string(i), -1.0, {{"y", -2.0}}}};
    w->add(i, c);
    w->add(i, finish(FinishReason::kStop, i < 2 ? 4 : 6, 1));
  }
  const json j = json::parse(w->end());
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 4u);
  EXPECT_EQ(j["choices"][1]["text"], "abx1");
  EXPECT_EQ(j["choices"][2]["text"], "x2");
  EXPECT_EQ(j["choices"][1]["logprobs"]["tokens"], json::array({"x1"}));
  EXPECT_EQ(j["choices"][1]["logprobs"]["text_offset"], json::array({2}));
  EXPECT_EQ(j["choices"][3]["logprobs"]["text_offset"], json::array({0}));
  EXPECT_EQ(j["choices"][0]["logprobs"]["top_logprobs"][0]["y"], -2.0);
  EXPECT_EQ(j["choices"][3]["finish_reason"], "stop");
  // Two prompts of n = 2: 4 + 6 prompt tokens, 4 completion tokens.
  EXPECT_EQ(j["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
}

}  // namespace
}  // namespace vlm

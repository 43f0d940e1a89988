// ChatRequestBuilder: a /v1/chat/completions body becomes the chat API's request (media in their
// parts as bytes) and the reply's options, or the error that answers it, with its status, type
// and param. Media fetching is a fake: no network.
#include "server/chat_request_builder.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "server/base64.h"
#include "test_util.h"
#include "vlm/chat.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

using json = nlohmann::json;

std::string data_url(const std::string& bytes) {
  return "data:image/png;base64," + base64_encode(bytes);
}

std::string text_of(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

json user(const json& content) { return json{{"role", "user"}, {"content", content}}; }

json image_part(const std::string& url) {
  return json{{"type", "image_url"}, {"image_url", {{"url", url}}}};
}

// A fetcher that serves `bodies` by URL (anything else: a connection error) and records each
// call's URL and byte cap.
struct FakeFetch {
  std::vector<std::pair<std::string, std::string>> bodies;  // url → body
  std::vector<std::pair<std::string, size_t>> calls;
  MediaFetcher fetcher() {
    return [this](const std::string& url, size_t max_bytes) {
      calls.emplace_back(url, max_bytes);
      http::FetchResult r;
      for (const auto& [u, body] : bodies) {
        if (u != url) continue;
        if (body.size() > max_bytes) {
          r.too_large = true;
          r.error = "too large";
          return r;
        }
        r.ok = true;
        r.status = 200;
        r.body.assign(body.begin(), body.end());
        return r;
      }
      r.error = "connection refused";
      return r;
    };
  }
};

ChatRequestContext context() {
  ChatRequestContext c;
  c.model_names = {"qwen", "alias"};
  c.fetch = [](const std::string&, size_t) {
    ADD_FAILURE() << "nothing should be fetched";
    return http::FetchResult{};
  };
  return c;
}

// Remote media allowed, fetched by `fake`, with these byte caps.
ChatRequestBuilder remote_builder(FakeFetch* fake, size_t max_image_bytes, size_t max_video_bytes) {
  ChatRequestContext c = context();
  c.media.allow_remote = true;
  c.limits.max_image_bytes = max_image_bytes;
  c.limits.max_video_bytes = max_video_bytes;
  c.fetch = fake->fetcher();
  return ChatRequestBuilder(std::move(c));
}

// Expects `body` to be refused with this status, type and param, and a message containing
// `says`.
void expect_error(const ChatRequestBuilder& b, const json& body, int status,
                  const std::string& type, const std::string& param, const std::string& says) {
  auto r = b.build(body.dump());
  ASSERT_FALSE(r.ok()) << body.dump();
  EXPECT_EQ(r.error().http_status, status) << r.error().message;
  EXPECT_EQ(r.error().type, type) << r.error().message;
  EXPECT_EQ(r.error().param, param) << r.error().message;
  EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
}

TEST(ChatRequestBuilder, GoodRequestBecomesTheChatApisRequest) {
  const json body = {
      {"model", "alias"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        user(json::array(
            {{{"type", "text"}, {"text", "Compare"}},
             image_part(data_url("png-bytes")),
             {{"type", "video_url"}, {"video_url", {{"url", data_url("mp4")}, {"fps", 1.5}}}}}))}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
      {"tool_choice", "none"},
      {"parallel_tool_calls", false},
      {"chat_template_kwargs", {{"enable_thinking", false}}},
      {"include_reasoning", false},
      {"max_thinking_tokens", 5},
      {"max_completion_tokens", 9},
      {"temperature", 0.5},
      {"seed", 7},
      {"stop", "END"},
      {"stop_token_ids", {3}},
      {"ignore_eos", true},
      {"logprobs", true},
      {"top_logprobs", 2},
      {"n", 3},
      {"stream", true},
      {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}},
      {"response_format", {{"type", "json_object"}}},
  };
  ChatRequestBuilder b(context());
  auto r = b.build(body.dump());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ChatCall& call = r.value();
  const ChatRequest& q = call.chat;
  ASSERT_EQ(q.messages.size(), 2u);
  EXPECT_EQ(q.messages[0].text, "Be brief.");
  ASSERT_EQ(q.messages[1].parts.size(), 3u);
  EXPECT_EQ(q.messages[1].parts[0].text, "Compare");
  ASSERT_EQ(q.messages[1].parts[1].type, ChatPart::Type::kImage);
  EXPECT_EQ(text_of(q.messages[1].parts[1].image.bytes), "png-bytes");
  ASSERT_EQ(q.messages[1].parts[2].type, ChatPart::Type::kVideo);
  EXPECT_EQ(text_of(q.messages[1].parts[2].video.bytes), "mp4");
  EXPECT_EQ(q.messages[1].parts[2].video.fps, 1.5);
  ASSERT_EQ(q.tools_json.size(), 1u);
  EXPECT_FALSE(q.parse_tool_calls);
  EXPECT_FALSE(q.parallel_tool_calls);
  ASSERT_EQ(q.template_kwargs.size(), 1u);
  EXPECT_EQ(q.template_kwargs[0],
            (std::pair<std::string, std::string>{"enable_thinking", "false"}));
  EXPECT_FALSE(q.include_reasoning);
  EXPECT_EQ(q.max_thinking_tokens, 5);
  EXPECT_EQ(q.max_new_tokens, 9);
  EXPECT_EQ(q.sampling.temperature, 0.5);
  EXPECT_EQ(q.sampling.seed, 7u);
  EXPECT_EQ(q.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(q.stop_token_ids, std::vector<int32_t>{3});
  EXPECT_TRUE(q.ignore_eos);
  EXPECT_EQ(q.logprobs, 2);
  EXPECT_EQ(q.response_format.kind, StructuredOutput::Kind::kJsonObject);
  EXPECT_TRUE(q.tool_call_id_prefix.empty());  // per choice: take_choice
  EXPECT_EQ(call.n, 3);
  EXPECT_TRUE(call.reply.stream);
  EXPECT_TRUE(call.reply.include_usage);
  EXPECT_TRUE(call.reply.continuous_usage);
  EXPECT_TRUE(call.reply.logprobs);
  EXPECT_EQ(call.reply.n, 3);
  EXPECT_TRUE(call.reply.id.empty());  // the server names the response

  // Without logprobs or streaming, and with the defaults.
  auto plain = b.build(json{{"messages", {user("hi")}}}.dump());
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  EXPECT_EQ(plain->chat.logprobs, -1);
  EXPECT_TRUE(plain->chat.parse_tool_calls);
  EXPECT_FALSE(plain->chat.max_new_tokens.has_value());
  EXPECT_EQ(plain->n, 1);
  EXPECT_FALSE(plain->reply.stream);
  EXPECT_FALSE(plain->reply.logprobs);
}

// Each choice: its own seed and tool call ids; the last one takes the conversation.
TEST(ChatRequestBuilder, ChoicesDifferBySeedAndCallIds) {
  ChatRequestBuilder b(context());
  auto r = b.build(json{
      {"messages", {user(json::array({image_part(data_url("img"))}))}},
      {"seed", 10},
      {"n", 2}}.dump());
  ASSERT_TRUE(r.ok()) << r.error().message;
  ChatCall& call = r.value();
  const ChatRequest first = call.take_choice(0, "call_5_");
  EXPECT_EQ(first.sampling.seed, 10u);
  EXPECT_EQ(first.tool_call_id_prefix, "call_5_0_");
  EXPECT_EQ(text_of(first.messages[0].parts[0].image.bytes), "img");
  const ChatRequest second = call.take_choice(1, "call_5_");
  EXPECT_EQ(second.sampling.seed, 11u);
  EXPECT_EQ(second.tool_call_id_prefix, "call_5_1_");
  EXPECT_EQ(text_of(second.messages[0].parts[0].image.bytes), "img");
  EXPECT_TRUE(call.chat.messages.empty());  // taken by the last choice
}

// http(s) media are fetched into the part that names them, each with its kind's byte cap; a
// video's listed frames share the video's cap.
TEST(ChatRequestBuilder, RemoteMediaAreFetchedIntoTheirParts) {
  FakeFetch fake;
  fake.bodies = {{"https://x/a.png", "AAA"},
                 {"https://x/v.mp4", "VIDEO"},
                 {"https://x/f1.png", "F1"},
                 {"https://x/f2.png", "F22"}};
  const ChatRequestBuilder b = remote_builder(&fake, 100, 1000);
  const json body = {
      {"messages",
       {user("first"),
        user(json::array(
            {{{"type", "video"}, {"video", json::array({"https://x/f1.png", "https://x/f2.png"})}},
             {{"type", "text"}, {"text", "and"}},
             image_part("https://x/a.png"),
             {{"type", "video_url"}, {"video_url", "https://x/v.mp4"}}}))}}};
  auto r = b.build(body.dump());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<ChatPart>& parts = r->chat.messages[1].parts;
  ASSERT_EQ(parts[0].video.frames.size(), 2u);
  EXPECT_EQ(text_of(parts[0].video.frames[0].bytes), "F1");
  EXPECT_EQ(text_of(parts[0].video.frames[1].bytes), "F22");
  EXPECT_EQ(text_of(parts[2].image.bytes), "AAA");
  EXPECT_EQ(text_of(parts[3].video.bytes), "VIDEO");
  using Call = std::pair<std::string, size_t>;
  EXPECT_EQ(fake.calls, (std::vector<Call>{{"https://x/f1.png", 100},
                                           {"https://x/f2.png", 100},
                                           {"https://x/a.png", 100},
                                           {"https://x/v.mp4", 1000}}));
}

TEST(ChatRequestBuilder, FetchFailuresNameTheUrl) {
  FakeFetch fake;
  fake.bodies = {{"https://x/big.png", std::string(11, 'x')}, {"https://x/f.png", "12345678"}};
  const ChatRequestBuilder b = remote_builder(&fake, 10, 12);
  expect_error(b, {{"messages", {user(json::array({image_part("https://x/big.png")}))}}}, 413,
               "invalid_request_error", "messages",
               "image https://x/big.png is larger than 10 bytes");
  expect_error(b, {{"messages", {user(json::array({image_part("https://x/gone.png")}))}}}, 400,
               "invalid_request_error", "messages",
               "cannot fetch image https://x/gone.png: connection refused");
  // The second frame may have only 12 - 8 bytes: too large.
  fake.calls.clear();
  const json frames = {{"type", "video"},
                       {"video", json::array({"https://x/f.png", "https://x/f.png"})}};
  expect_error(b, {{"messages", {user(json::array({frames}))}}}, 413, "invalid_request_error",
               "messages", "image https://x/f.png is larger than 4 bytes");
  ASSERT_EQ(fake.calls.size(), 2u);
  EXPECT_EQ(fake.calls[1].second, 4u);
  fake.bodies[1].second = std::string(6, 'y');  // two fill the video's 12 bytes
  const json three = {
      {"type", "video"},
      {"video", json::array({"https://x/f.png", "https://x/f.png", "https://x/f.png"})}};
  expect_error(b, {{"messages", {user(json::array({image_part(data_url("a")), three}))}}}, 413,
               "invalid_request_error", "messages",
               "video 1: its frames are larger than 12 bytes together");
}

// file:// media are read into their bytes, so that no server path goes further.
TEST(ChatRequestBuilder, LocalFilesAreReadAndTheirPathsDropped) {
  test_util::TempDir root;
  test_util::write_bytes(root.file("a.png"), "local-image");
  test_util::write_bytes(root.file("f.png"), "0123456789");
  ChatRequestContext c = context();
  c.media.allowed_local_path = root.str();
  c.limits.max_video_bytes = 15;
  ChatRequestBuilder b(std::move(c));
  auto r = b.build(
      json{{"messages", {user(json::array({image_part("file://" + root.file("a.png"))}))}}}.dump());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ImageInput& img = r->chat.messages[0].parts[0].image;
  EXPECT_EQ(text_of(img.bytes), "local-image");
  EXPECT_TRUE(img.path.empty());
  // Two 10-byte frames of one video: over its 15 bytes.
  const std::string f = "file://" + root.file("f.png");
  expect_error(b,
               {{"messages",
                 {user(json::array({image_part(data_url("a")),
                                    {{"type", "video"}, {"video", json::array({f})}},
                                    {{"type", "video"}, {"video", json::array({f, f})}}}))}}},
               413, "invalid_request_error", "messages",
               "video 2: its frames are larger than 15 bytes together");
}

// Each kind of bad request: the status, type and param of its error, and a message that says
// what is wrong.
TEST(ChatRequestBuilder, BadRequestsCarryTheirErrorFields) {
  ChatRequestBuilder b(context());
  const json hi = {user("hi")};
  expect_error(b, {{"messages", hi}, {"temperature", 3}}, 400, "invalid_request_error",
               "temperature", "'temperature' must be in [0.0, 2.0], got 3");
  expect_error(b, {{"messages", hi}, {"model", "other"}}, 404, "not_found_error", "model",
               "model 'other' is not served here (serving 'qwen')");
  expect_error(b, {{"messages", {{{"content", "no role"}}}}}, 400, "invalid_request_error",
               "messages", "messages[0].role must be a string");
  expect_error(b, {{"messages", {user(json::array({image_part("https://x/a.png")}))}}}, 400,
               "invalid_request_error", "messages[0].content[0].image_url",
               "remote image URLs are not enabled");
  expect_error(b, {{"messages", hi}, {"tools", 5}}, 400, "invalid_request_error", "tools",
               "'tools' must be a list");
  expect_error(b, json::array({1}), 400, "invalid_request_error", "", "must be a JSON object");
}

// An engine error's param is the field its Status names (the chat API names "messages" and
// "max_thinking_tokens"; tests/server/chat_api_test.cc checks that it does), and none else.
TEST(ChatRequestBuilder, EngineErrorsNameTheirField) {
  const ApiError e = api_error_from(invalid_argument("messages: from somewhere else"));
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.param, "");
  const ApiError named = api_error_from(
      invalid_argument("the chat template refused the conversation").with_field("messages"));
  EXPECT_EQ(named.http_status, 400);
  EXPECT_EQ(named.type, "invalid_request_error");
  EXPECT_EQ(named.param, "messages");
  EXPECT_EQ(named.message, "the chat template refused the conversation");
  // The field stays as context is added.
  EXPECT_EQ(
      api_error_from(invalid_argument("x").with_field("max_thinking_tokens").with_context("c"))
          .param,
      "max_thinking_tokens");
  EXPECT_EQ(api_error_from(Status(StatusCode::kResourceExhausted, "full")).param, "");
}

TEST(ChatRequestBuilder, CompletionCallsHaveAChoicePerPromptAndN) {
  CompletionRequest r;
  r.prompts.resize(2);
  r.prompts[0].text = "ab";
  r.prompts[1].ids = {5, 6};
  r.prompts[1].is_ids = true;
  r.n = 2;
  r.echo = true;
  r.sampling.seed = 40;
  r.max_tokens = 3;
  r.stop = {"x"};
  r.logprobs = 1;
  r.stream = true;
  r.include_usage = true;
  CompletionRequest text_only = r;
  text_only.prompts.pop_back();
  text_only.echo = false;
  text_only.logprobs.reset();
  auto t = Tokenizer::load(std::string(VLM_TESTDATA_DIR) + "/tokenizer/tokenizer.json");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const CompletionCall call = completion_call(r, *t.value());
  ASSERT_EQ(call.requests.size(), 4u);
  EXPECT_EQ(call.requests[0].prompt_ids, t.value()->encode("ab"));
  EXPECT_EQ(call.requests[2].prompt_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(call.requests[0].sampling.seed, 40u);
  EXPECT_EQ(call.requests[1].sampling.seed, 41u);
  EXPECT_EQ(call.requests[2].sampling.seed, 40u);
  EXPECT_EQ(call.requests[3].sampling.seed, 41u);
  EXPECT_EQ(call.requests[3].max_new_tokens, 3);
  EXPECT_EQ(call.requests[3].stop, std::vector<std::string>{"x"});
  EXPECT_EQ(call.requests[3].logprobs, 1);
  ASSERT_EQ(call.echo.size(), 4u);
  EXPECT_EQ(call.echo[1], "ab");
  EXPECT_EQ(call.echo[2], t.value()->decode(std::vector<int32_t>{5, 6}));
  EXPECT_TRUE(call.reply.stream);
  EXPECT_TRUE(call.reply.include_usage);
  EXPECT_TRUE(call.reply.logprobs);
  EXPECT_EQ(call.reply.n, 2);
  const CompletionCall plain = completion_call(text_only, *t.value());
  EXPECT_EQ(plain.echo, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(plain.requests[0].logprobs, -1);
  EXPECT_FALSE(plain.reply.logprobs);
}

}  // namespace
}  // namespace vlm

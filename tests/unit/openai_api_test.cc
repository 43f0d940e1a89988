#include "server/openai_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "server/base64.h"
#include "server/chat_reply_writer.h"
#include "test_util.h"

namespace vlm {
namespace {

using json = nlohmann::json;

// Any bytes will do: decoding the image is not this layer's job. A PNG
// signature plus a little.
const std::string kFakePng = std::string("\x89PNG\r\n\x1a\n", 8) + "IHDR-not-really-an-image";

std::string data_url(const std::string& bytes) {
  return "data:image/png;base64," + base64_encode(bytes);
}

// A one-user-message body with the given content parts and extra top-level
// fields.
std::string body_with(const json& content, const json& extra = json::object()) {
  json b = extra;
  b["messages"] = json::array({{{"role", "user"}, {"content", content}}});
  return b.dump();
}

// The request's images (videos) in prompt order: the media its image (video) parts carry.
template <typename T>
std::vector<T> media_of(const ChatCompletionRequest& q, ChatPart::Type type, T ChatPart::*media) {
  std::vector<T> out;
  for (const ChatMessage& m : q.messages) {
    for (const ChatPart& p : m.parts) {
      if (p.type == type) out.push_back(p.*media);
    }
  }
  return out;
}

std::vector<ImageInput> images_of(const ChatCompletionRequest& q) {
  return media_of(q, ChatPart::Type::kImage, &ChatPart::image);
}

std::vector<VideoInput> videos_of(const ChatCompletionRequest& q) {
  return media_of(q, ChatPart::Type::kVideo, &ChatPart::video);
}

ApiResult<ChatCompletionRequest> parse(const std::string& body, const ApiLimits& limits = {},
                                       const MediaPolicy& media = {}) {
  return parse_chat_completion(body, limits, media);
}

// Expects a failure with this status and param.
void expect_error(const std::string& body, int status, const std::string& param,
                  const ApiLimits& limits = {}, const MediaPolicy& media = {}) {
  auto r = parse(body, limits, media);
  ASSERT_FALSE(r.ok()) << body;
  EXPECT_EQ(r.error().http_status, status) << body << " → " << r.error().message;
  EXPECT_EQ(r.error().param, param) << body << " → " << r.error().message;
  EXPECT_EQ(r.error().type, "invalid_request_error");
}

TEST(OpenAiApiTest, FullValidRequest) {
  json body = {
      {"model", "qwen3-vl"},
      {"messages",
       {{{"role", "system"}, {"content", "Be brief."}},
        {{"role", "user"},
         {"content",
          {{{"type", "text"}, {"text", "What is this?"}},
           {{"type", "image_url"},
            {"image_url", {{"url", data_url(kFakePng)}, {"detail", "high"}}}},
           {{"type", "image"}, {"image", data_url("xyz")}, {"max_pixels", 50176}}}}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}},
      {"stream", true},
      {"stream_options", {{"include_usage", true}}},
      {"max_tokens", 10},
      {"temperature", 0.7},
      {"top_p", 0.9},
      {"top_k", 20},
      {"min_p", 0.05},
      {"presence_penalty", 0.5},
      {"frequency_penalty", -0.5},
      {"repetition_penalty", 1.1},
      {"seed", 42},
      {"stop", {"END", "###"}},
      {"n", 2},
      {"logprobs", true},
      {"top_logprobs", 5},
      {"min_pixels", 3136},
      {"max_pixels", 1003520},
      {"user", "ignored-extra-field"},
  };
  auto r = parse(body.dump());
  ASSERT_TRUE(r.ok()) << r.error().message;
  const ChatCompletionRequest& q = r.value();
  EXPECT_EQ(q.model, "qwen3-vl");
  ASSERT_EQ(q.messages.size(), 2u);
  EXPECT_EQ(q.messages[0].text, "Be brief.");
  ASSERT_EQ(q.messages[1].parts.size(), 3u);
  EXPECT_EQ(q.messages[1].parts[1].type, ChatPart::Type::kImage);
  EXPECT_EQ(q.tools_json.size(), 1u);
  const std::vector<ImageInput> images = images_of(q);
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(std::string(images[0].bytes.begin(), images[0].bytes.end()), kFakePng);
  EXPECT_EQ(images[0].min_pixels, 3136);
  EXPECT_EQ(images[0].max_pixels, 1003520);
  EXPECT_EQ(std::string(images[1].bytes.begin(), images[1].bytes.end()), "xyz");
  EXPECT_EQ(images[1].min_pixels, 3136);
  EXPECT_EQ(images[1].max_pixels,
            50176);  // the part's budget overrides the request's
  EXPECT_TRUE(q.remote_media.empty());
  EXPECT_TRUE(q.stream);
  EXPECT_TRUE(q.include_usage);
  EXPECT_FALSE(q.continuous_usage);
  EXPECT_EQ(q.max_tokens, 10);
  EXPECT_EQ(q.sampling.temperature, 0.7);
  EXPECT_EQ(q.sampling.top_p, 0.9);
  EXPECT_EQ(q.sampling.top_k, 20);
  EXPECT_EQ(q.sampling.min_p, 0.05);
  EXPECT_EQ(q.sampling.presence_penalty, 0.5);
  EXPECT_EQ(q.sampling.frequency_penalty, -0.5);
  EXPECT_EQ(q.sampling.repetition_penalty, 1.1);
  EXPECT_EQ(q.sampling.seed, 42u);
  EXPECT_EQ(q.stop, (std::vector<std::string>{"END", "###"}));
  EXPECT_EQ(q.n, 2);
  EXPECT_TRUE(q.logprobs);
  EXPECT_EQ(q.top_logprobs, 5);
}

TEST(OpenAiApiTest, MinimalRequestDefaultsAndNulls) {
  auto r = parse(body_with("hi", {{"temperature", nullptr}, {"stop", nullptr}, {"top_k", -1}}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_FALSE(r->sampling.temperature.has_value());
  EXPECT_EQ(r->sampling.top_k, 0);  // -1 means off, which the engine spells 0
  EXPECT_EQ(r->n, 1);
  EXPECT_FALSE(r->stream);
  EXPECT_FALSE(r->max_tokens.has_value());
  EXPECT_TRUE(images_of(r.value()).empty());
}

TEST(OpenAiApiTest, StopAsStringAndMaxCompletionTokens) {
  auto r = parse(body_with("hi", {{"stop", "\n\n"}, {"max_completion_tokens", 7}}));
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->stop, std::vector<std::string>{"\n\n"});
  EXPECT_EQ(r->max_tokens, 7);
  // Both names: the newer max_completion_tokens wins.
  auto both = parse(body_with("hi", {{"max_tokens", 3}, {"max_completion_tokens", 9}}));
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->max_tokens, 9);
}

TEST(OpenAiApiTest, InvalidFieldsNameTheirParam) {
  const std::pair<json, std::string> cases[] = {
      {{{"model", 3}}, "model"},
      {{{"stream", "yes"}}, "stream"},
      {{{"stream_options", 1}}, "stream_options"},
      {{{"stream", true}, {"stream_options", {{"include_usage", 1}}}},
       "stream_options.include_usage"},
      {{{"max_tokens", 0}}, "max_tokens"},
      {{{"max_tokens", 1.5}}, "max_tokens"},
      {{{"max_completion_tokens", -3}}, "max_completion_tokens"},
      {{{"temperature", 2.5}}, "temperature"},
      {{{"temperature", "hot"}}, "temperature"},
      {{{"temperature", -0.1}}, "temperature"},
      {{{"top_p", 0}}, "top_p"},
      {{{"top_p", 1.01}}, "top_p"},
      {{{"top_k", -2}}, "top_k"},
      {{{"top_k", 2.5}}, "top_k"},
      {{{"min_p", 1.5}}, "min_p"},
      {{{"presence_penalty", 2.1}}, "presence_penalty"},
      {{{"frequency_penalty", -3}}, "frequency_penalty"},
      {{{"repetition_penalty", 0}}, "repetition_penalty"},
      {{{"seed", "x"}}, "seed"},
      {{{"stop", 5}}, "stop"},
      {{{"stop", {"a", "b", "c", "d", "e"}}}, "stop"},
      {{{"stop", {"a", 1}}}, "stop"},
      {{{"stop", ""}}, "stop"},
      {{{"n", 0}}, "n"},
      {{{"n", 9}}, "n"},
      {{{"logprobs", 1}}, "logprobs"},
      {{{"top_logprobs", 21}}, "top_logprobs"},
      {{{"top_logprobs", 2}}, "top_logprobs"},  // without logprobs
      {{{"min_pixels", 0}}, "min_pixels"},
      {{{"max_pixels", "big"}}, "max_pixels"},
      {{{"min_pixels", 100}, {"max_pixels", 10}}, "min_pixels"},
      {{{"tools", "none"}}, "tools"},
  };
  for (const auto& [extra, param] : cases) expect_error(body_with("hi", extra), 400, param);
}

// Fields are read or refused by name: nothing that would change the output is ignored.
TEST(OpenAiApiTest, EveryFieldIsReadOrRefusedByName) {
  const std::pair<json, std::string> refused[] = {
      {{{"temprature", 0.5}}, "temprature"},  // a typo is not silently ignored
      {{{"reasoning_effort", "high"}}, "reasoning_effort"},
      {{{"functions", json::array()}}, "functions"},
      {{{"min_tokens", 3}}, "min_tokens"},
      {{{"skip_special_tokens", false}}, "skip_special_tokens"},
      {{{"echo", true}}, "echo"},  // an extension of vLLM's chat, not served here
      {{{"audio", {{"voice", "x"}}}}, "audio"},
      {{{"response_format", {{"type", "json_schema"}}}}, "response_format"},  // no schema
      {{{"response_format", {{"type", "sound"}}}}, "response_format"},
      {{{"response_format", "text"}}, "response_format"},
      {{{"tool_choice", "required"}}, "tool_choice"},
      {{{"tool_choice", {{"type", "function"}, {"function", {{"name", "f"}}}}}}, "tool_choice"},
      {{{"parallel_tool_calls", "no"}}, "parallel_tool_calls"},
      {{{"include_reasoning", 1}}, "include_reasoning"},
      {{{"modalities", {"text", "audio"}}}, "modalities"},
      {{{"stream_options", {{"include_usage", true}}}}, "stream_options"},  // without stream
      {{{"stream", false}, {"stream_options", {{"include_usage", false}}}}, "stream_options"},
      {{{"stream", true}, {"stream_options", {{"continuous_usage_stats", 1}}}},
       "stream_options.continuous_usage_stats"},
      {{{"stream", true}, {"stream_options", {{"usage_every", 2}}}}, "stream_options.usage_every"},
      {{{"logit_bias", {{"abc", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"-5", 1}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", 101}}}}, "logit_bias"},
      {{{"logit_bias", {{"5", "x"}}}}, "logit_bias"},
      {{{"logit_bias", json::array({1})}}, "logit_bias"},
      {{{"stop_token_ids", {1, -1}}}, "stop_token_ids"},
  };
  for (const auto& [extra, param] : refused) {
    auto r = parse(body_with("hi", extra));
    ASSERT_FALSE(r.ok()) << extra.dump();
    EXPECT_EQ(r.error().http_status, 400) << extra.dump();
    EXPECT_EQ(r.error().param, param) << extra.dump() << " → " << r.error().message;
    EXPECT_NE(r.error().message.find(param.substr(0, param.find('.'))), std::string::npos)
        << r.error().message;
  }
  // Accepted: fields that do not change the output, and the one mode of each selector served.
  auto ok = parse(body_with("hi", {{"user", "u1"},
                                   {"store", false},
                                   {"metadata", {{"k", "v"}}},
                                   {"service_tier", "auto"},
                                   {"response_format", {{"type", "text"}}},
                                   {"tool_choice", "auto"},
                                   {"parallel_tool_calls", true},
                                   {"modalities", {"text"}},
                                   {"stream", true},
                                   {"stream_options", {{"include_usage", true}}},
                                   {"logit_bias", {{"7", -100}, {"12", 2.5}}},
                                   {"stop_token_ids", {3, 4}}}));
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  // tool_choice "none", parallel_tool_calls false and include_reasoning false are served too.
  auto modes = parse(body_with(
      "hi",
      {{"tool_choice", "none"}, {"parallel_tool_calls", false}, {"include_reasoning", false}}));
  ASSERT_TRUE(modes.ok()) << modes.error().message;
  EXPECT_TRUE(modes->tool_choice_none);
  EXPECT_FALSE(modes->parallel_tool_calls);
  EXPECT_FALSE(modes->include_reasoning);
  auto bias = ok->sampling.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{7, -100.f}, {12, 2.5f}}));
  EXPECT_EQ(ok->stop_token_ids, (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(ok->include_usage);
}

TEST(OpenAiApiTest, LimitsFromTheServer) {
  ApiLimits limits;
  limits.vocab_size = 100;
  limits.max_queue = 3;
  limits.max_image_pixels = 1 << 20;
  // Ids outside the vocabulary are listed.
  auto lb = parse(body_with("hi", {{"logit_bias", {{"5", 1}, {"100", 1}, {"250", -1}}}}), limits);
  ASSERT_FALSE(lb.ok());
  EXPECT_EQ(lb.error().param, "logit_bias");
  EXPECT_NE(lb.error().message.find("100, 250"), std::string::npos) << lb.error().message;
  expect_error(body_with("hi", {{"stop_token_ids", {100}}}), 400, "stop_token_ids", limits);
  // n beyond the queue could never be admitted: 400 (not a 429 that retries cannot cure).
  auto q = parse(body_with("hi", {{"n", 4}}), limits);
  ASSERT_FALSE(q.ok());
  EXPECT_EQ(q.error().http_status, 400);
  EXPECT_EQ(q.error().param, "n");
  EXPECT_NE(q.error().message.find("--max-waiting"), std::string::npos) << q.error().message;
  EXPECT_TRUE(parse(body_with("hi", {{"n", 3}}), limits).ok());
  // Pixel budgets above the server's per-image cap.
  expect_error(body_with("hi", {{"min_pixels", (1 << 20) + 1}}), 400, "min_pixels", limits);
  expect_error(body_with("hi", {{"max_pixels", int64_t{1} << 30}}), 400, "max_pixels", limits);
  expect_error(
      body_with(json::array(
          {{{"type", "image"}, {"image", data_url(kFakePng)}, {"min_pixels", 100000000}}})),
      400, "messages[0].content[0].min_pixels", limits);
  EXPECT_TRUE(parse(body_with("hi", {{"max_pixels", 1 << 20}}), limits).ok());
  // Completions: prompts x n against the queue too.
  auto c = parse_completion(R"({"prompt": ["a", "b"], "n": 2})", limits);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().param, "n");
}

// JSON nested deeper than kMaxJsonDepth is refused before anything walks it (a 60 KB body of
// 30,000 levels used to crash the server in a recursive re-serialization).
TEST(OpenAiApiTest, DeepNestingIsRefusedBeforeParsing) {
  for (const char* field : {"messages", "content", "tools"}) {
    std::string deep;
    for (int i = 0; i < 100000; ++i) deep += '[';
    for (int i = 0; i < 100000; ++i) deep += ']';
    std::string body;
    if (std::string(field) == "messages") {
      body = "{\"messages\": " + deep + "}";
    } else if (std::string(field) == "content") {
      body = "{\"messages\": [{\"role\": \"user\", \"content\": " + deep + "}]}";
    } else {
      body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": " + deep + "}";
    }
    auto r = parse(body);
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_NE(r.error().message.find("deeper than 64"), std::string::npos) << r.error().message;
    auto c = parse_completion("{\"prompt\": " + deep + "}", {});
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.error().message.find("deeper than 64"), std::string::npos) << c.error().message;
  }
  // Brackets inside strings do not count; 64 levels are fine.
  std::string tools = "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": ";
  for (int i = 0; i < 60; ++i) tools += "{\"a\": ";
  tools += "\"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"";
  for (int i = 0; i < 60; ++i) tools += "}";
  tools += "}}]";
  auto ok =
      parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": " + tools + "}");
  EXPECT_TRUE(ok.ok()) << ok.error().message;
}

TEST(OpenAiApiTest, BadMessages) {
  expect_error("{}", 400, "messages");
  expect_error(R"({"messages": []})", 400, "messages");
  expect_error(R"({"messages": "hi"})", 400, "messages");
  expect_error(R"({"messages": [{"content": "no role"}]})", 400, "messages");
  expect_error(R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages");
  expect_error("[1, 2]", 400, "");
  expect_error(body_with(json::array({{{"type", "video"}, {"video", "file:///v.mp4"}}})), 400,
               "messages[0].content[0].video");
}

// Video parts: OpenAI-style video_url (string or object) and qwen-vl-utils' {"video": url}, with
// their sampling and pixel budget on the part or in the video_url object, in prompt order beside
// the images; the errors name the field.
TEST(OpenAiApiTest, VideoParts) {
  const std::string mp4 = "data:video/mp4;base64,AAAAGGZ0eXBtcDQy";  // 12 bytes
  json content = json::array(
      {{{"type", "video_url"}, {"video_url", {{"url", mp4}, {"fps", 1.5}, {"max_frames", 8}}}},
       {{"type", "image_url"}, {"image_url", "data:image/png;base64,AAAA"}},
       {{"type", "video"},
        {"video", mp4},
        {"min_pixels", 4096},
        {"max_pixels", 65536},
        {"min_frames", 2}},
       {{"type", "text"}, {"text", "compare"}}});
  auto r = parse(body_with(content));
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<VideoInput> videos = videos_of(r.value());
  ASSERT_EQ(videos.size(), 2u);
  ASSERT_EQ(images_of(r.value()).size(), 1u);
  const VideoInput& a = videos[0];
  EXPECT_EQ(a.bytes.size(), 12u);
  EXPECT_EQ(a.fps, 1.5);
  EXPECT_EQ(a.max_frames, 8);
  EXPECT_FALSE(a.min_pixels.has_value());
  const VideoInput& b = videos[1];
  EXPECT_EQ(b.min_pixels, 4096);
  EXPECT_EQ(b.max_pixels, 65536);
  EXPECT_EQ(b.min_frames, 2);
  EXPECT_FALSE(b.fps.has_value());

  auto part = [&](json p) { return body_with(json::array({p})); };
  expect_error(part({{"type", "video_url"}, {"video_url", {{"url", mp4}, {"fps", 0}}}}), 400,
               "messages[0].content[0].video_url.fps");
  expect_error(part({{"type", "video"}, {"video", mp4}, {"max_frames", 0}}), 400,
               "messages[0].content[0].max_frames");
  expect_error(part({{"type", "video"}, {"video", mp4}, {"min_frames", 9}, {"max_frames", 8}}), 400,
               "messages[0].content[0].min_frames");
  // qwen-vl-utils' list of frames: image URLs, resolved as images.
  auto listed = parse(part(
      {{"type", "video"},
       {"video", json::array({"data:image/png;base64,AAAA", "data:image/png;base64,AAAAAAAA"})},
       {"fps", 4}}));
  ASSERT_TRUE(listed.ok()) << listed.error().message;
  const std::vector<VideoInput> listed_videos = videos_of(listed.value());
  ASSERT_EQ(listed_videos.size(), 1u);
  ASSERT_EQ(listed_videos[0].frames.size(), 2u);
  EXPECT_EQ(listed_videos[0].frames[1].bytes.size(), 6u);
  EXPECT_EQ(listed_videos[0].fps, 4);
  EXPECT_TRUE(listed_videos[0].bytes.empty());
  expect_error(part({{"type", "video"}, {"video", json::array({"a.jpg", "b.jpg"})}}), 400,
               "messages[0].content[0].video[0]");
  expect_error(part({{"type", "video"}, {"video", json::array({5})}}), 400,
               "messages[0].content[0].video[0]");
  expect_error(part({{"type", "video"}, {"video", json::array()}}), 400,
               "messages[0].content[0].video");
  expect_error(part({{"type", "video_url"}, {"video_url", 5}}), 400,
               "messages[0].content[0].video_url");
  expect_error(part({{"type", "video_url"}, {"video_url", "http://example.com/v.mp4"}}), 400,
               "messages[0].content[0].video_url");
  ApiLimits small;
  small.max_video_bytes = 8;
  expect_error(part({{"type", "video_url"}, {"video_url", mp4}}), 413,
               "messages[0].content[0].video_url", small);
  small.max_videos = 1;
  small.max_video_bytes = 1 << 20;
  expect_error(body_with(json::array({{{"type", "video_url"}, {"video_url", mp4}},
                                      {{"type", "video_url"}, {"video_url", mp4}}})),
               400, "messages", small);
  MediaPolicy remote;
  remote.allow_remote = true;
  auto fetched =
      parse(part({{"type", "video_url"}, {"video_url", "https://example.com/v.mp4"}}), {}, remote);
  ASSERT_TRUE(fetched.ok()) << fetched.error().message;
  ASSERT_EQ(fetched.value().remote_media.size(), 1u);
  EXPECT_TRUE(fetched.value().remote_media[0].video);
  EXPECT_EQ(fetched.value().remote_media[0].part, 0u);
}

TEST(OpenAiApiTest, MalformedJsonNamesThePosition) {
  auto r = parse(R"({"messages": [}")");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().http_status, 400);
  EXPECT_EQ(r.error().type, "invalid_request_error");
  EXPECT_NE(r.error().message.find("column"), std::string::npos) << r.error().message;
  // A number beyond a double is malformed too (the parser throws a different exception for it;
  // found by the fuzz target).
  for (const char* body :
       {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 1e400})",
        R"({"messages": [{"role": "user", "content": "x"}], "seed": -1e999})"}) {
    auto big = parse(body);
    ASSERT_FALSE(big.ok()) << body;
    EXPECT_EQ(big.error().http_status, 400);
    auto c = parse_completion(R"({"prompt": [[1, 41e308]]})", {});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.error().http_status, 400);
  }
}

json image_part(const std::string& url) {
  return json::array({{{"type", "image_url"}, {"image_url", {{"url", url}}}}});
}

TEST(OpenAiApiTest, BadBase64AndDataUrls) {
  const std::string param = "messages[0].content[0].image_url";
  for (const char* bad :
       {"data:image/png;base64,Zg", "data:image/png;base64,Zm9v\n", "data:image/png;base64,Zm9*"}) {
    auto r = parse(body_with(image_part(bad)));
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().http_status, 400);
    EXPECT_EQ(r.error().param, param);
    EXPECT_EQ(r.error().message.rfind("invalid base64 in " + param, 0), 0u) << r.error().message;
  }
  expect_error(body_with(image_part("data:image/png,rawbytes")), 400, param);
  expect_error(body_with(image_part("data:image/png;base64")), 400, param);
  expect_error(body_with(image_part("ftp://x/y.png")), 400, param);
  expect_error(body_with(json::array({{{"type", "image_url"}, {"image_url", 5}}})), 400, param);
  expect_error(body_with(json::array({{{"type", "image"}}})), 400, "messages[0].content[0]");
}

TEST(OpenAiApiTest, ImageUrlAsPlainString) {
  auto r = parse(body_with(json::array({{{"type", "image_url"}, {"image_url", data_url("ab")}}})));
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<ImageInput> images = images_of(r.value());
  ASSERT_EQ(images.size(), 1u);
  EXPECT_EQ(images[0].bytes.size(), 2u);
}

TEST(OpenAiApiTest, ImageLimits) {
  ApiLimits limits;
  limits.max_images = 2;
  limits.max_image_bytes = 10;
  json three = json::array();
  for (int i = 0; i < 3; ++i) three.push_back(image_part(data_url("a"))[0]);
  expect_error(body_with(three), 400, "messages", limits);
  three.erase(2);
  EXPECT_TRUE(parse(body_with(three), limits).ok());
  // 11 bytes: over the per-image limit → 413; 10 is fine.
  expect_error(body_with(image_part(data_url("12345678901"))), 413,
               "messages[0].content[0].image_url", limits);
  EXPECT_TRUE(parse(body_with(image_part(data_url("1234567890"))), limits).ok());
  // Images across messages count together, in prompt order.
  json b;
  b["messages"] = json::array({{{"role", "user"}, {"content", image_part(data_url("x"))}},
                               {{"role", "assistant"}, {"content", "ok"}},
                               {{"role", "user"}, {"content", image_part(data_url("yz"))}}});
  auto r = parse(b.dump(), limits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  const std::vector<ImageInput> images = images_of(r.value());
  ASSERT_EQ(images.size(), 2u);
  EXPECT_EQ(images[0].bytes.size(), 1u);
  EXPECT_EQ(images[1].bytes.size(), 2u);
}

TEST(OpenAiApiTest, FileUrls) {
  test_util::TempDir root, outside;
  std::filesystem::create_directories(root.path() / "sub");
  test_util::write_bytes(root.file("sub/a.png"), kFakePng);
  test_util::write_bytes(outside.file("b.png"), kFakePng);
  const std::string param = "messages[0].content[0].image_url";

  // Not enabled at all.
  expect_error(body_with(image_part("file://" + root.file("sub/a.png"))), 400, param);

  MediaPolicy media;
  media.allowed_local_path = root.str();
  auto ok = parse(body_with(image_part("file://" + root.file("sub/a.png"))), {}, media);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  const std::vector<ImageInput> images = images_of(ok.value());
  ASSERT_EQ(images.size(), 1u);
  EXPECT_EQ(std::filesystem::path(images[0].path),
            std::filesystem::weakly_canonical(root.file("sub/a.png")));
  EXPECT_TRUE(images[0].bytes.empty());
  // file://localhost/ and percent escapes.
  std::filesystem::copy_file(root.file("sub/a.png"), root.file("sub/a b.png"));
  EXPECT_TRUE(
      parse(body_with(image_part("file://localhost" + root.str() + "/sub/a%20b.png")), {}, media)
          .ok());

  // Outside the root, a ".." escape, a symlink out, a sibling whose name
  // extends the root's.
  expect_error(body_with(image_part("file://" + outside.file("b.png"))), 400, param, {}, media);
  expect_error(body_with(image_part("file://" + root.str() + "/sub/../../" +
                                    outside.path().filename().string() + "/b.png")),
               400, param, {}, media);
  std::filesystem::create_symlink(outside.file("b.png"), root.file("link.png"));
  expect_error(body_with(image_part("file://" + root.file("link.png"))), 400, param, {}, media);
  const std::string sibling = root.str() + "x";
  std::filesystem::create_directories(sibling);
  test_util::write_bytes(sibling + "/c.png", kFakePng);
  expect_error(body_with(image_part("file://" + sibling + "/c.png")), 400, param, {}, media);
  std::filesystem::remove_all(sibling);
  // ".." that stays inside is fine; a missing file and a relative URL are not.
  EXPECT_TRUE(
      parse(body_with(image_part("file://" + root.str() + "/sub/../sub/a.png")), {}, media).ok());
  expect_error(body_with(image_part("file://" + root.file("missing.png"))), 400, param, {}, media);
  expect_error(body_with(image_part("file://relative/a.png")), 400, param, {}, media);
}

TEST(OpenAiApiTest, RemoteUrls) {
  const std::string url = "https://example.com/cat.png";
  expect_error(body_with(image_part(url)), 400, "messages[0].content[0].image_url");
  MediaPolicy media;
  media.allow_remote = true;
  json parts = image_part(data_url("a"));
  parts.push_back(image_part(url)[0]);
  auto r = parse(body_with(parts), {}, media);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(images_of(r.value()).size(), 2u);
  ASSERT_EQ(r->remote_media.size(), 1u);
  EXPECT_EQ(r->remote_media[0].part, 1u);
  EXPECT_EQ(r->remote_media[0].url, url);
}

TEST(OpenAiApiTest, ErrorJson) {
  json e = json::parse(api_error_json({400, "invalid_request_error", "bad", "temperature"}));
  EXPECT_EQ(e["error"]["message"], "bad");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "temperature");
  EXPECT_TRUE(e["error"].contains("code"));
  json n = json::parse(api_error_json({404, "not_found_error", "no model", ""}));
  EXPECT_TRUE(n["error"]["param"].is_null());
}

// Engine errors by kind: a full queue is the 429, running out of memory or cache right now 503.
TEST(OpenAiApiTest, EngineErrorsMapToTheirStatus) {
  EXPECT_EQ(api_error_from(Status(StatusCode::kResourceExhausted, "queue full")).http_status, 429);
  EXPECT_EQ(api_error_from(Status(StatusCode::kResourceExhausted, "q")).type, "rate_limit_error");
  const ApiError oom = api_error_from(unavailable("PNG: out of memory"));
  EXPECT_EQ(oom.http_status, 503);
  EXPECT_EQ(oom.type, "server_error");
  EXPECT_EQ(oom.message, "PNG: out of memory");
  EXPECT_EQ(api_error_from(out_of_range("too long")).http_status, 400);
  EXPECT_EQ(api_error_from(invalid_argument("bad")).type, "invalid_request_error");
  EXPECT_EQ(api_error_from(internal_error("bug")).http_status, 500);
}

TEST(OpenAiApiTest, CompletionJson) {
  CompletionChoice c0{0, "Hello", FinishReason::kStop, std::nullopt};
  CompletionChoice c1{1, "Hi", FinishReason::kLength,
                      std::vector<TokenLogprob>{{"Hi", -0.5, {{"Hi", -0.5}, {"Hey", -1.5}}}}};
  json j = json::parse(chat_completion_json(
      ReplyHead{"chatcmpl-1", "qwen", 1700000000, "fp_0123abcd"}, {c0, c1}, {12, 3}));
  EXPECT_EQ(j["system_fingerprint"], "fp_0123abcd");
  // Every object of a reply carries it; a server without one writes null (as vLLM does).
  EXPECT_EQ(
      json::parse(usage_chunk_json(ReplyHead{"c", "m", 5, "fp_1"}, {1, 1}))["system_fingerprint"],
      "fp_1");
  EXPECT_TRUE(json::parse(chat_chunk_json(ReplyHead{"c", "m", 5, ""}, 0, "x"))["system_fingerprint"]
                  .is_null());
  EXPECT_EQ(j["id"], "chatcmpl-1");
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "qwen");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  const json& lp = j["choices"][1]["logprobs"]["content"][0];
  EXPECT_EQ(lp["token"], "Hi");
  EXPECT_EQ(lp["logprob"], -0.5);
  EXPECT_EQ(lp["bytes"], json::array({72, 105}));
  EXPECT_EQ(lp["top_logprobs"][1]["token"], "Hey");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 12);
  EXPECT_EQ(j["usage"]["completion_tokens"], 3);
  EXPECT_EQ(j["usage"]["total_tokens"], 15);
}

TEST(OpenAiApiTest, TextCompletionRequests) {
  auto one = parse_completion(R"({"prompt": "Once", "ignore_eos": true, "seed": 3, "n": 2})", {});
  ASSERT_TRUE(one.ok()) << one.error().message;
  ASSERT_EQ(one->prompts.size(), 1u);
  EXPECT_FALSE(one->prompts[0].is_ids);
  EXPECT_EQ(one->prompts[0].text, "Once");
  EXPECT_EQ(one->max_tokens, 16);  // OpenAI's default for this endpoint
  EXPECT_TRUE(one->ignore_eos);
  EXPECT_EQ(one->n, 2);
  EXPECT_EQ(*one->sampling.seed, 3u);
  EXPECT_FALSE(one->logprobs.has_value());

  auto ids = parse_completion(R"({"prompt": [1, 2, 3], "max_tokens": 4, "logprobs": 2})", {});
  ASSERT_TRUE(ids.ok()) << ids.error().message;
  ASSERT_EQ(ids->prompts.size(), 1u);
  EXPECT_TRUE(ids->prompts[0].is_ids);
  EXPECT_EQ(ids->prompts[0].ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(ids->max_tokens, 4);
  EXPECT_EQ(ids->logprobs, 2);

  auto batch = parse_completion(R"({"prompt": ["a", [7, 8]], "echo": true})", {});
  ASSERT_TRUE(batch.ok()) << batch.error().message;
  ASSERT_EQ(batch->prompts.size(), 2u);
  EXPECT_EQ(batch->prompts[0].text, "a");
  EXPECT_EQ(batch->prompts[1].ids, (std::vector<int32_t>{7, 8}));
  EXPECT_TRUE(batch->echo);

  struct Bad {
    const char* body;
    const char* param;
  } bad[] = {
      {R"({"max_tokens": 2})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": []})", "prompt"},
      {R"({"prompt": [1, "x"]})", "prompt"},
      {R"({"prompt": ["a", 5]})", "prompt[1]"},
      {R"({"prompt": "a", "logprobs": 21})", "logprobs"},
      {R"({"prompt": "a", "echo": true, "logprobs": 0})", "echo"},
      {R"({"prompt": "a", "suffix": "b"})", "suffix"},
      {R"({"prompt": "a", "best_of": 2})", "best_of"},
      {R"({"prompt": ["a", "b", "c"], "n": 3})", "n"},
      {R"({"prompt": "a", "ignore_eos": 1})", "ignore_eos"},
      {R"({"prompt": "a", "temperature": -1})", "temperature"},
  };
  for (const Bad& b : bad) {
    auto r = parse_completion(b.body, {});
    ASSERT_FALSE(r.ok()) << b.body;
    EXPECT_EQ(r.error().http_status, 400) << b.body;
    EXPECT_EQ(r.error().param, b.param) << b.body << " → " << r.error().message;
  }
  EXPECT_FALSE(parse_completion("{nope", {}).ok());
}

TEST(OpenAiApiTest, TextCompletionJsonAndChunks) {
  CompletionChoice c{
      0, "Echo: Hi", FinishReason::kLength,
      std::vector<TokenLogprob>{{"Hi", -0.5, {{"Hi", -0.5}, {"Hey", -1.5}}}, {"\xe4", -2.0, {}}}};
  json j = json::parse(completion_json(ReplyHead{"cmpl-1", "m", 7, ""}, {c}, {5, 2}, {6}));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], "Echo: Hi");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const json& lp = j["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"][0], "Hi");
  EXPECT_EQ(lp["tokens"][1], "\xef\xbf\xbd");  // half a UTF-8 character → U+FFFD, never a throw
  EXPECT_EQ(lp["token_logprobs"], json::array({-0.5, -2.0}));
  EXPECT_EQ(lp["top_logprobs"][0]["Hey"], -1.5);
  EXPECT_EQ(lp["text_offset"], json::array({6, 8}));  // after the echoed prompt, then + "Hi"
  EXPECT_EQ(j["usage"]["total_tokens"], 7);

  std::vector<TokenLogprob> one{{"Hi", -0.5, {}}};
  json chunk = json::parse(
      completion_chunk_json(ReplyHead{"cmpl-1", "m", 7, ""}, 3, "Hi", std::nullopt, &one, 10));
  EXPECT_EQ(chunk["object"], "text_completion");
  EXPECT_EQ(chunk["choices"][0]["index"], 3);
  EXPECT_EQ(chunk["choices"][0]["text"], "Hi");
  EXPECT_TRUE(chunk["choices"][0]["finish_reason"].is_null());
  EXPECT_EQ(chunk["choices"][0]["logprobs"]["text_offset"][0], 10);
  json last = json::parse(
      completion_chunk_json(ReplyHead{"cmpl-1", "m", 7, ""}, 0, "", FinishReason::kStop));
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(last["choices"][0]["logprobs"].is_null());
  json usage =
      json::parse(usage_chunk_json(ReplyHead{"cmpl-1", "m", 7, ""}, {3, 4}, "text_completion"));
  EXPECT_EQ(usage["object"], "text_completion");
  EXPECT_TRUE(usage["choices"].empty());
  // Chat chunks carry the logprobs of the token they hold.
  json cc = json::parse(
      chat_chunk_json(ReplyHead{"c", "m", 5, ""}, 1, "Hi", std::nullopt, std::nullopt, &one));
  EXPECT_EQ(cc["choices"][0]["logprobs"]["content"][0]["token"], "Hi");
}

TEST(OpenAiApiTest, ChunksAndSse) {
  json first =
      json::parse(chat_chunk_json(ReplyHead{"c", "m", 5, ""}, 0, "", std::string("assistant")));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());

  json mid = json::parse(chat_chunk_json(ReplyHead{"c", "m", 5, ""}, 1, "tok"));
  EXPECT_EQ(mid["choices"][0]["index"], 1);
  EXPECT_EQ(mid["choices"][0]["delta"]["content"], "tok");
  EXPECT_FALSE(mid["choices"][0]["delta"].contains("role"));

  json last = json::parse(
      chat_chunk_json(ReplyHead{"c", "m", 5, ""}, 0, "", std::nullopt, FinishReason::kStop));
  EXPECT_TRUE(last["choices"][0]["delta"].is_object());
  EXPECT_TRUE(last["choices"][0]["delta"].empty());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  json usage = json::parse(usage_chunk_json(ReplyHead{"c", "m", 5, ""}, {4, 2}));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 6);

  EXPECT_EQ(sse_event("{\"a\":1}"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  // Invalid UTF-8 from a buggy caller must not throw out of the builder.
  EXPECT_NO_THROW(chat_chunk_json(ReplyHead{"c", "m", 5, ""}, 0, "\xff"));
}

TEST(OpenAiApiTest, ModelsList) {
  json j = json::parse(models_list_json({"qwen3-vl-2b", "other"}, 7));
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 2u);
  EXPECT_EQ(j["data"][0]["id"], "qwen3-vl-2b");
  EXPECT_EQ(j["data"][0]["object"], "model");
  EXPECT_EQ(j["data"][1]["created"], 7);
  EXPECT_FALSE(j["data"][0].contains("max_model_len"));
  EXPECT_EQ(json::parse(models_list_json({"m"}, 7, 4096))["data"][0]["max_model_len"], 4096);
}

}  // namespace
}  // namespace vlm

namespace vlm {
namespace {

// Structured output: response_format, vLLM's structured_outputs and guided_* fields, and
// tool_choice "required" / named become one StructuredOutput; two at once are refused.
TEST(OpenAiApiTest, StructuredOutputFields) {
  using Kind = StructuredOutput::Kind;
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  {
    auto r = parse(body_with("hi", {{"response_format", {{"type", "json_object"}}}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->structured.kind, Kind::kJsonObject);
  }
  {
    auto r = parse(body_with(
        "hi", {{"response_format",
                {{"type", "json_schema"},
                 {"json_schema", {{"name", "x"}, {"schema", schema}, {"strict", true}}}}}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->structured.kind, Kind::kJsonSchema);
    EXPECT_EQ(json::parse(r->structured.spec), schema);
  }
  {
    auto r = parse(body_with("hi", {{"structured_outputs", {{"regex", "[a-z]+"}}}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->structured.kind, Kind::kRegex);
    EXPECT_EQ(r->structured.spec, "[a-z]+");
  }
  {
    auto r = parse(body_with("hi", {{"guided_choice", {"yes", "no"}}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->structured.kind, Kind::kChoice);
    EXPECT_EQ(r->structured.choices, (std::vector<std::string>{"yes", "no"}));
  }
  {
    // A schema given as JSON text (vLLM takes both).
    auto r = parse(body_with("hi", {{"structured_outputs", {{"json", schema.dump()}}}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->structured.kind, Kind::kJsonSchema);
  }
  const json tools =
      json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", schema}}}},
                   {{"type", "function"}, {"function", {{"name", "g"}}}}});
  {
    auto r = parse(body_with("hi", {{"tools", tools}, {"tool_choice", "required"}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->structured.kind, Kind::kToolCalls);
    EXPECT_TRUE(r->structured.parallel_tool_calls);
    EXPECT_EQ(json::parse(r->structured.spec).size(), 2u);
  }
  {
    auto r = parse(
        body_with("hi", {{"tools", tools},
                         {"tool_choice", {{"type", "function"}, {"function", {{"name", "g"}}}}}}));
    ASSERT_TRUE(r.ok()) << r.error().message;
    const json list = json::parse(r->structured.spec);
    ASSERT_EQ(list.size(), 1u);
    EXPECT_EQ(list[0]["name"], "g");
    EXPECT_FALSE(r->structured.parallel_tool_calls);
  }
  expect_error(
      body_with("hi", {{"tools", tools},
                       {"tool_choice", {{"type", "function"}, {"function", {{"name", "h"}}}}}}),
      400, "tool_choice");
  expect_error(body_with("hi", {{"tool_choice", "required"}}), 400, "tool_choice");
  // The second kind met is named (the body's keys come sorted here).
  expect_error(body_with("hi", {{"structured_outputs", {{"regex", "a"}, {"choice", {"b"}}}}}), 400,
               "structured_outputs.regex");
  expect_error(body_with("hi", {{"guided_regex", "a"}, {"guided_json", schema}}), 400,
               "guided_regex");
  expect_error(body_with("hi", {{"response_format", {{"type", "json_object"}}},
                                {"structured_outputs", {{"regex", "a"}}}}),
               400, "response_format");
  expect_error(body_with("hi", {{"structured_outputs", {{"whitespace_pattern", " "}}}}), 400,
               "structured_outputs");
  expect_error(body_with("hi", {{"structured_outputs", {{"choice", json::array()}}}}), 400,
               "structured_outputs.choice");
  expect_error(body_with("hi", {{"tools", tools},
                                {"tool_choice", "required"},
                                {"response_format", {{"type", "json_object"}}}}),
               400, "tool_choice");
}

TEST(OpenAiApiTest, TokenizeAndDetokenizeBodies) {
  auto p = parse_tokenize(R"({"model": "m", "prompt": "hi", "return_token_strs": true})");
  ASSERT_TRUE(p.ok()) << p.error().message;
  EXPECT_EQ(p->model, "m");
  EXPECT_EQ(p->prompt, std::optional<std::string>("hi"));
  EXPECT_TRUE(p->return_token_strs);
  // A chat: the chat route's fields only, for its builder.
  auto c = parse_tokenize(
      R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false,)"
      R"( "add_special_tokens": false})");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_FALSE(c->prompt.has_value());
  EXPECT_EQ(json::parse(c->chat_body),
            json::parse(R"({"messages": [{"role": "user", "content": "x"}],)"
                        R"( "add_generation_prompt": false})"));
  for (const char* bad :
       {R"({})", R"({"prompt": "a", "messages": []})", R"({"prompt": ["a"]})",
        R"({"prompt": "a", "tools": []})", R"({"prompt": "a", "x": 1})",
        R"({"prompt": "a", "add_special_tokens": 1})", R"({"prompt": "a", "model": 3})"}) {
    auto r = parse_tokenize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().http_status, 400) << bad;
  }
  json t = json::parse(tokenize_json({5, 7}, 4096, nullptr));
  EXPECT_EQ(t, json::parse(R"({"count": 2, "max_model_len": 4096, "tokens": [5, 7],)"
                           R"( "token_strs": null})"));
  std::vector<std::string> strs = {"a", "b"};
  EXPECT_EQ(json::parse(tokenize_json({5, 7}, 1, &strs))["token_strs"], json::array({"a", "b"}));

  auto d = parse_detokenize(R"({"tokens": [0, 9]})", 10);
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d->tokens, (std::vector<int32_t>{0, 9}));
  for (const char* bad : {R"({"tokens": [10]})", R"({"tokens": [-1]})", R"({"tokens": [1.5]})",
                          R"({"tokens": "1"})", R"({})", R"({"tokens": [1], "x": 0})"}) {
    auto r = parse_detokenize(bad, 10);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.error().http_status, 400) << bad;
  }
  EXPECT_EQ(json::parse(detokenize_json("héllo")), json::parse(R"({"prompt": "héllo"})"));
}

}  // namespace
}  // namespace vlm

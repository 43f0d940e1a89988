// render_chat against transformers' apply_chat_template renderings of the real Qwen3-VL template.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/chat_json.h"
#include "vlm/chat.h"

namespace vlm {
namespace {

nlohmann::ordered_json load_cases() {
  std::ifstream f(std::string(VLM_FIXTURES_DIR) + "/chat_template/cases.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

TEST(ChatTemplate, MatchesTransformersOnEveryCase) {
  auto cases = load_cases();
  ASSERT_GE(cases.size(), 15u);
  for (const auto& c : cases) {
    const std::string name = c["name"];
    std::string tools;
    if (c.contains("tools") && !c["tools"].is_null()) tools = c["tools"].dump();
    auto parsed = parse_chat_json(c["messages"].dump(), tools);
    ASSERT_TRUE(parsed.ok()) << name << ": " << parsed.status().message();
    ChatTemplateOptions opts;
    opts.add_generation_prompt = c.value("add_generation_prompt", false);
    opts.add_vision_id = c.value("add_vision_id", false);
    opts.tools_json = parsed->tools_json;
    EXPECT_EQ(render_chat(parsed->messages, opts), c["rendered"].get<std::string>()) << name;
  }
}

TEST(ChatJson, RejectsMalformedMessages) {
  EXPECT_FALSE(parse_chat_json("{").ok());
  EXPECT_FALSE(parse_chat_json("{\"role\": \"user\"}").ok());                    // not a list
  EXPECT_FALSE(parse_chat_json("[{\"content\": \"x\"}]").ok());                  // no role
  EXPECT_FALSE(parse_chat_json("[{\"role\": \"user\", \"content\": 3}]").ok());  // bad content
  // A part whose "type" is not a string is an error, not an exception (found by the fuzz target).
  EXPECT_FALSE(
      parse_chat_json("[{\"role\": \"user\", \"content\": [{\"type\": {\"url\": 1}}]}]").ok());
  EXPECT_FALSE(
      parse_chat_json("[{\"role\": \"user\", \"content\": [{\"type\": 7, \"x\": 1}]}]").ok());
  auto bad_part = parse_chat_json("[{\"role\": \"user\", \"content\": [{\"type\": \"audio\"}]}]");
  ASSERT_FALSE(bad_part.ok());
  EXPECT_NE(bad_part.status().message().find("messages[0].content[0]"), std::string::npos);
}

TEST(ChatJson, PythonStyleDump) {
  auto s = python_style_json(R"({"b": [1, 2.5, true, null], "a": "é\n\"x\""})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, R"({"b": [1, 2.5, true, null], "a": "é\n\"x\""})");
  EXPECT_EQ(*python_style_json("1.0"), "1.0");
  // Numbers as json.loads reads them and json.dumps writes them (Python's repr for floats).
  EXPECT_EQ(
      *python_style_json("[1e5, 1E-5, 1e16, 100000.0, 0.0001, -0.0, 3, 18446744073709551615]"),
      "[100000.0, 1e-05, 1e+16, 100000.0, 0.0001, -0.0, 3, 18446744073709551615]");
  EXPECT_FALSE(python_style_json("[1,").ok());
}

// A call's arguments and a tool's definition are kept as transformers' tojson writes them: the
// text a template prints for arguments given as a string (here a list's), and what an object's
// arguments render as.
TEST(ChatJson, ToolCallArgumentsAsTojsonWritesThem) {
  auto parsed = parse_chat_json(
      R"([{"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "f", "arguments": {"x": 1e5, "y": 1e-05, "z": 1e16, "n": 3,
                                                     "s": "é\n\"q\""}}},
            {"function": {"name": "g", "arguments": [1e5, 2]}},
            {"function": {"name": "h", "arguments": "{\"x\": 1e5}"}}]}])",
      R"([{"type": "function", "function": {"name": "f", "parameters": {"default": 1e5}}}])");
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  const auto& calls = parsed->messages.at(0).tool_calls;
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].arguments,
            R"({"x": 100000.0, "y": 1e-05, "z": 1e+16, "n": 3, "s": "é\n\"q\""})");
  EXPECT_TRUE(calls[0].arguments_is_object);
  EXPECT_EQ(calls[1].arguments, "[100000.0, 2]");
  EXPECT_FALSE(calls[1].arguments_is_object);
  EXPECT_EQ(calls[2].arguments, R"({"x": 1e5})");  // a string is the caller's text, untouched
  ASSERT_EQ(parsed->tools_json.size(), 1u);
  EXPECT_EQ(
      parsed->tools_json[0],
      R"({"type": "function", "function": {"name": "f", "parameters": {"default": 100000.0}}})");
  // The built-in template prints the list's text where transformers prints its tojson.
  const std::string out = render_chat(parsed->messages, {});
  EXPECT_NE(out.find(R"("name": "g", "arguments": [100000.0, 2]})"), std::string::npos) << out;
  EXPECT_NE(out.find(R"("arguments": {"x": 100000.0, "y": 1e-05, "z": 1e+16, "n": 3, )"),
            std::string::npos)
      << out;
}

// The conversations of the chat-template fixtures (tests/model/fixtures/chat_templates: several
// model families' templates, rendered by transformers 4.57.1) taken the way a request brings
// them: as JSON through parse_chat_json into ChatTemplate, byte for byte; among them an assistant
// tool call whose arguments hold floats (tool_call_floats). Templates that print the date are
// left to jinja_test, which fixes the clock.
TEST(ChatTemplate, FixtureConversationsThroughChatJson) {
  const std::string dir = std::string(VLM_FIXTURES_DIR) + "/chat_templates";
  std::ifstream f(dir + "/cases.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const auto cases = nlohmann::ordered_json::parse(ss.str());
  int rendered = 0, floats = 0;
  for (const auto& [name, entry] : cases["templates"].items()) {
    std::ifstream tf(dir + "/" + entry["file"].get<std::string>());
    std::stringstream ts;
    ts << tf.rdbuf();
    if (ts.str().find("strftime_now") != std::string::npos) continue;
    auto tpl = ChatTemplate::from_source(ts.str(), name, cases["bos_token"], cases["eos_token"]);
    ASSERT_TRUE(tpl.ok()) << name << ": " << tpl.status().message();
    for (const auto& run : entry["runs"]) {
      const std::string what = name + " / " + run["name"].get<std::string>();
      const auto& conversation = cases["conversations"][run["conversation"].get<std::string>()];
      auto chat =
          parse_chat_json(conversation, run["tools"].get<bool>() ? &cases["tools"] : nullptr);
      ASSERT_TRUE(chat.ok()) << what << ": " << chat.status().message();
      ChatTemplateOptions opts;
      opts.add_generation_prompt = run["add_generation_prompt"];
      opts.tools_json = chat->tools_json;
      for (const auto& [k, v] : run["kwargs"].items()) opts.kwargs_json.emplace_back(k, v.dump());
      auto out = tpl->render(chat->messages, opts);
      if (run.value("error", false)) {
        EXPECT_FALSE(out.ok()) << what << ": jinja2 refused it but it rendered";
        continue;
      }
      ASSERT_TRUE(out.ok()) << what << ": " << out.status().message();
      EXPECT_EQ(*out, run["rendered"].get<std::string>()) << what;
      ++rendered;
      if (run["name"] == "tool_call_floats") ++floats;
    }
  }
  EXPECT_GE(rendered, 100);
  EXPECT_GE(floats, 10);
}

}  // namespace
}  // namespace vlm

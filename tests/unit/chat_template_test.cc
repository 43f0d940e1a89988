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
}

}  // namespace
}  // namespace vlm

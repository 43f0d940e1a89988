// The reply splitter (src/engine/chat_output_parser): recorded model outputs — reasoning with and
// without the opening tag, Qwen tool calls in JSON and XML form, several calls, calls after text,
// malformed and unterminated blocks, lookalike tags — give the expected reasoning, content and
// tool calls, and the same result however the text is cut into streamed pieces (every single cut,
// and one character at a time).
#include "engine/chat_output_parser.h"

#include <gtest/gtest.h>

#include <map>

namespace vlm {
namespace {

struct Result {
  std::string reasoning, content;
  std::vector<ChatToolCall> calls;
  bool operator==(const Result& o) const {
    if (reasoning != o.reasoning || content != o.content || calls.size() != o.calls.size())
      return false;
    for (size_t i = 0; i < calls.size(); ++i) {
      if (calls[i].id != o.calls[i].id || calls[i].name != o.calls[i].name ||
          calls[i].arguments != o.calls[i].arguments)
        return false;
    }
    return true;
  }
};

void add(const ChatDelta& d, Result* r) {
  r->reasoning += d.reasoning;
  r->content += d.content;
  for (const ToolCallDelta& t : d.tool_calls) {
    if (t.index >= static_cast<int>(r->calls.size()))
      r->calls.resize(static_cast<size_t>(t.index) + 1);
    ChatToolCall& c = r->calls[static_cast<size_t>(t.index)];
    if (!t.id.empty()) c.id = t.id;
    if (!t.name.empty()) c.name = t.name;
    c.arguments += t.arguments;
  }
}

Result parse(const std::vector<std::string>& pieces, ChatOutputParser::Options o) {
  ChatOutputParser p(o);
  Result r;
  for (const std::string& s : pieces) {
    ChatDelta d;
    p.feed(s, &d);
    add(d, &r);
  }
  ChatDelta d;
  p.finish(&d);
  add(d, &r);
  return r;
}

std::string describe(const Result& r) {
  std::string s = "reasoning [" + r.reasoning + "] content [" + r.content + "]";
  for (const auto& c : r.calls) s += " call " + c.id + " " + c.name + " " + c.arguments;
  return s;
}

// The whole text at once must give `want`; every cut into two pieces, and one character at a
// time, the same.
void check(const std::string& text, const Result& want, ChatOutputParser::Options o = {}) {
  const Result whole = parse({text}, o);
  EXPECT_TRUE(whole == want) << "text: " << text << "\ngot:  " << describe(whole)
                             << "\nwant: " << describe(want);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const Result r = parse({text.substr(0, cut), text.substr(cut)}, o);
    ASSERT_TRUE(r == whole) << "cut at " << cut << " of: " << text << "\n" << describe(r);
  }
  std::vector<std::string> chars;
  for (char c : text) chars.push_back(std::string(1, c));
  EXPECT_TRUE(parse(chars, o) == whole) << "char by char: " << text;
}

Result content(std::string c) {
  Result r;
  r.content = std::move(c);
  return r;
}

TEST(ChatOutputParser, Reasoning) {
  Result r;
  r.reasoning = "\nLet me add.\n";
  r.content = "The answer is 4.";
  check("<think>\nLet me add.\n</think>\n\nThe answer is 4.", r);
  // The template opened <think> in the prompt: the reply holds only </think>.
  ChatOutputParser::Options open;
  open.reasoning_open = true;
  Result o;
  o.reasoning = "Hmm, 17 has no divisors.\n";
  o.content = "Yes.";
  check("Hmm, 17 has no divisors.\n</think>\n\nYes.", o, open);
  // Never closed: all reasoning (the budget ran out while thinking).
  Result unclosed;
  unclosed.reasoning = "still thinking";
  check("still thinking", unclosed, open);
  // Not at the start: ordinary text.
  check("Use <think> tags </think> like this.", content("Use <think> tags </think> like this."));
  // Reasoning off: everything is content.
  ChatOutputParser::Options off;
  off.reasoning = false;
  check("<think>x</think>y", content("<think>x</think>y"), off);
}

TEST(ChatOutputParser, ToolCallsInJsonAndXml) {
  Result one;
  one.calls = {{"call_0", "get_weather", R"({"city": "Paris", "unit": "celsius"})"}};
  check(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": "
      "\"celsius\"}}\n</tool_call>",
      one);
  Result two;
  two.content = "Checking both.\n";
  two.calls = {{"call_0", "get_weather", R"({"city": "Paris"})"},
               {"call_1", "get_time", R"({"zone": "CET", "n": [1, 2.5, true, null]})"}};
  check(
      "Checking both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": "
      "\"CET\", \"n\": [1, 2.5, true, null]}}\n</tool_call>\n",
      two);
  Result xml;
  xml.calls = {{"call_0", "get_weather", R"({"city": "New York", "days": 3, "flags": {"a": 1}})"}};
  check(
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=flags>\n{\"a\": 1}\n</parameter>\n"
      "</function>\n</tool_call>",
      xml);
  // Arguments given as a JSON string are passed on as they are; no arguments: {}.
  Result str;
  str.calls = {{"call_0", "f", R"({"x":1})"}, {"call_1", "g", "{}"}};
  check(
      "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\":1}\"}</tool_call>"
      "<tool_call>{\"name\": \"g\"}</tool_call>",
      str);
  // Reasoning, then a call.
  Result both;
  both.reasoning = "\nneed the weather\n";
  both.calls = {{"call_0", "get_weather", R"({"city": "Oslo"})"}};
  check(
      "<think>\nneed the weather\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
      both);
  // Text after a call is content (the whitespace between is not).
  Result after;
  after.calls = {{"call_0", "f", "{}"}};
  after.content = "\nDone.";
  check("<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\nDone.", after);
}

TEST(ChatOutputParser, MalformedBlocksStayText) {
  const std::string bad = "<tool_call>\n{\"name\": \"x\", \"arguments\": {bad json}\n</tool_call>";
  check(bad, content(bad));
  check("<tool_call>\n{\"arguments\": {}}\n</tool_call>",
        content("<tool_call>\n{\"arguments\": {}}\n</tool_call>"));  // no name
  check("a <tool> b <tool_ c", content("a <tool> b <tool_ c"));
  check("<tool_call>\n{\"name\": \"f\"", content("<tool_call>\n{\"name\": \"f\""));  // unterminated
  // tool_choice "none": blocks are not parsed.
  ChatOutputParser::Options none;
  none.tool_calls = false;
  const std::string call = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
  check(call, content(call), none);
}

}  // namespace
}  // namespace vlm

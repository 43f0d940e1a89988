#include "engine/chat_output_parser.h"

#include <nlohmann/json.hpp>

#include "jinja/json.h"

namespace vlm {
namespace {

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";

// Length of the longest suffix of s that is a proper prefix of tag (text that may still become
// the tag).
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

// json.dumps(x, ensure_ascii=False), as the template's tojson and vLLM's parsers write it.
std::string python_json(const nlohmann::ordered_json& j) { return jinja::json_dumps(j); }

// <function=NAME><parameter=K>value</parameter>...</function>
bool parse_xml_call(const std::string& block, std::string* name, std::string* arguments) {
  const size_t f = block.find("<function=");
  if (f == std::string::npos) return false;
  const size_t f_end = block.find('>', f);
  const size_t close = block.find("</function>", f);
  if (f_end == std::string::npos || close == std::string::npos) return false;
  *name = trim(block.substr(f + 10, f_end - f - 10));
  if (name->empty()) return false;
  nlohmann::ordered_json args = nlohmann::ordered_json::object();
  size_t p = f_end + 1;
  for (;;) {
    const size_t k = block.find("<parameter=", p);
    if (k == std::string::npos || k > close) break;
    const size_t k_end = block.find('>', k);
    const size_t v_end = block.find("</parameter>", k);
    if (k_end == std::string::npos || v_end == std::string::npos || v_end > close) return false;
    const std::string key = trim(block.substr(k + 11, k_end - k - 11));
    std::string value = block.substr(k_end + 1, v_end - k_end - 1);
    if (!value.empty() && value.front() == '\n') value.erase(0, 1);
    if (!value.empty() && value.back() == '\n') value.pop_back();
    // A value that reads as JSON (numbers, booleans, objects, lists) is that value; else text.
    const auto parsed = nlohmann::ordered_json::parse(value, nullptr, false);
    args[key] =
        parsed.is_discarded() || parsed.is_string() ? nlohmann::ordered_json(value) : parsed;
    p = v_end + 12;
  }
  *arguments = python_json(args);
  return true;
}

}  // namespace

bool parse_tool_call_block(const std::string& block, std::string* name, std::string* arguments) {
  const std::string body = trim(block);
  if (body.rfind("<function=", 0) == 0) return parse_xml_call(body, name, arguments);
  const auto j = nlohmann::ordered_json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return false;
  auto n = j.find("name");
  if (n == j.end() || !n->is_string() || n->get<std::string>().empty()) return false;
  *name = n->get<std::string>();
  auto a = j.find("arguments");
  if (a == j.end() || a->is_null()) {
    *arguments = "{}";
  } else if (a->is_string()) {
    *arguments = a->get<std::string>();
  } else if (a->is_object()) {
    *arguments = python_json(*a);
  } else {
    return false;
  }
  return true;
}

ChatOutputParser::ChatOutputParser(Options options) : opt_(std::move(options)) {
  state_ = !opt_.reasoning       ? State::kContent
           : opt_.reasoning_open ? State::kReasoning
                                 : State::kStart;
}

void ChatOutputParser::emit_content(std::string text, ChatDelta* out) {
  if (strip_newlines_) {
    size_t k = 0;
    while (k < text.size() && (text[k] == '\n' || text[k] == '\r')) ++k;
    text.erase(0, k);
    if (text.empty()) return;
    strip_newlines_ = false;
  }
  if (calls_ > 0) {
    // After a tool call, whitespace waits for text to follow it.
    pending_ws_ += text;
    size_t k = 0;
    while (k < pending_ws_.size() && is_space(pending_ws_[k])) ++k;
    if (k == pending_ws_.size()) return;
    text = std::move(pending_ws_);
    pending_ws_.clear();
  }
  out->content += text;
}

void ChatOutputParser::close_block(const std::string& block, ChatDelta* out) {
  std::string name, arguments;
  if (!parse_tool_call_block(block, &name, &arguments)) {
    emit_content(std::string(kCallOpen) + block + std::string(kCallClose), out);
    return;
  }
  pending_ws_.clear();  // whitespace between calls goes
  if (opt_.max_tool_calls > 0 && calls_ >= opt_.max_tool_calls) return;  // one call asked for
  ToolCallDelta first;
  first.index = calls_;
  first.id = opt_.id_prefix + std::to_string(calls_);
  first.name = name;
  out->tool_calls.push_back(first);
  ToolCallDelta args;
  args.index = calls_;
  args.arguments = arguments;
  out->tool_calls.push_back(args);
  ++calls_;
}

void ChatOutputParser::feed(std::string_view text, ChatDelta* out) {
  buf_.append(text);
  for (;;) {
    switch (state_) {
      case State::kStart: {
        size_t k = 0;
        while (k < buf_.size() && is_space(buf_[k])) ++k;
        const std::string_view rest = std::string_view(buf_).substr(k);
        if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) {
          return;  // could still open <think>
        }
        if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
          buf_.erase(0, k + kThinkOpen.size());
          state_ = State::kReasoning;
        } else {
          state_ = State::kContent;
        }
        continue;
      }
      case State::kReasoning: {
        const size_t close = buf_.find(kThinkClose);
        if (close == std::string::npos) {
          const size_t keep = partial_tag(buf_, kThinkClose);
          out->reasoning += buf_.substr(0, buf_.size() - keep);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        out->reasoning += buf_.substr(0, close);
        buf_.erase(0, close + kThinkClose.size());
        state_ = State::kContent;
        strip_newlines_ = true;
        continue;
      }
      case State::kContent: {
        if (!opt_.tool_calls) {
          emit_content(std::move(buf_), out);
          buf_.clear();
          return;
        }
        const size_t open = buf_.find(kCallOpen);
        if (open == std::string::npos) {
          const size_t keep = partial_tag(buf_, kCallOpen);
          if (buf_.size() > keep) emit_content(buf_.substr(0, buf_.size() - keep), out);
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        if (open > 0) emit_content(buf_.substr(0, open), out);
        buf_.erase(0, open + kCallOpen.size());
        state_ = State::kToolCall;
        continue;
      }
      case State::kToolCall: {
        const size_t close = buf_.find(kCallClose);
        if (close == std::string::npos) return;  // the block is released whole
        const std::string block = buf_.substr(0, close);
        buf_.erase(0, close + kCallClose.size());
        state_ = State::kContent;
        close_block(block, out);
        continue;
      }
    }
  }
}

void ChatOutputParser::finish(ChatDelta* out) {
  switch (state_) {
    case State::kStart:
    case State::kContent:
      if (!buf_.empty()) emit_content(std::move(buf_), out);
      break;
    case State::kReasoning:
      out->reasoning += buf_;  // never closed: all of it was reasoning
      break;
    case State::kToolCall:
      emit_content(std::string(kCallOpen) + buf_, out);  // an unterminated block is text
      break;
  }
  buf_.clear();
  pending_ws_.clear();  // whitespace after the last call goes
  state_ = State::kContent;
}

}  // namespace vlm

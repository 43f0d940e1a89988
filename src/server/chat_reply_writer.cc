#include "server/chat_reply_writer.h"

#include <nlohmann/json.hpp>
#include <utility>

namespace vlm {
namespace {

// Ordered, so responses list "id" first as OpenAI's do.
using ojson = nlohmann::ordered_json;

// Dumps without throwing on invalid UTF-8 (model text is checked upstream; never crash here).
std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson usage_object(const Usage& u) {
  ojson j;
  j["prompt_tokens"] = u.prompt_tokens;
  j["completion_tokens"] = u.completion_tokens;
  j["total_tokens"] = u.prompt_tokens + u.completion_tokens;
  j["prompt_tokens_details"] = {{"cached_tokens", u.cached_tokens}};
  return j;
}

ojson token_bytes(const std::string& t) {
  ojson b = ojson::array();
  for (unsigned char c : t) b.push_back(static_cast<int>(c));
  return b;
}

ojson logprobs_object(const std::vector<TokenLogprob>& lps) {
  ojson content = ojson::array();
  for (const TokenLogprob& t : lps) {
    ojson e;
    e["token"] = t.token;
    e["logprob"] = t.logprob;
    e["bytes"] = token_bytes(t.token);
    ojson tops = ojson::array();
    for (const TopLogprob& tp : t.top_logprobs) {
      ojson o;
      o["token"] = tp.token;
      o["logprob"] = tp.logprob;
      o["bytes"] = token_bytes(tp.token);
      tops.push_back(std::move(o));
    }
    e["top_logprobs"] = std::move(tops);
    content.push_back(std::move(e));
  }
  ojson j;
  j["content"] = std::move(content);
  return j;
}

// The legacy completions layout: parallel lists, alternatives as {token: logprob} objects.
ojson legacy_logprobs_object(const std::vector<TokenLogprob>& lps, size_t offset) {
  ojson tokens = ojson::array(), values = ojson::array(), tops = ojson::array(),
        offsets = ojson::array();
  for (const TokenLogprob& t : lps) {
    tokens.push_back(t.token);
    values.push_back(t.logprob);
    ojson top = ojson::object();
    for (const TopLogprob& tp : t.top_logprobs) top[tp.token] = tp.logprob;
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.token.size();
  }
  ojson j;
  j["tokens"] = std::move(tokens);
  j["token_logprobs"] = std::move(values);
  j["top_logprobs"] = std::move(tops);
  j["text_offset"] = std::move(offsets);
  return j;
}

ojson finish_json(std::optional<FinishReason> r) {
  if (!r) return nullptr;
  auto s = finish_reason_string(*r);
  return s ? ojson(*s) : ojson(nullptr);
}

ojson envelope(const ReplyHead& head, const char* object) {
  ojson j;
  j["id"] = head.id;
  j["object"] = object;
  j["created"] = head.created;
  j["model"] = head.model;
  j["system_fingerprint"] =
      head.system_fingerprint.empty() ? ojson(nullptr) : ojson(head.system_fingerprint);
  return j;
}

// A response or usage chunk: the envelope with its choices and the usage, as text.
std::string with_choices(ojson j, ojson choices, const Usage& usage) {
  j["choices"] = std::move(choices);
  j["usage"] = usage_object(usage);
  return dump(j);
}

}  // namespace

std::optional<std::string> finish_reason_string(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kNone:
      break;
  }
  return std::nullopt;
}

std::string chat_completion_json(const ReplyHead& head,
                                 const std::vector<CompletionChoice>& choices, const Usage& usage) {
  ojson j = envelope(head, "chat.completion");
  ojson arr = ojson::array();
  for (const CompletionChoice& c : choices) {
    ojson msg;
    msg["role"] = "assistant";
    // OpenAI: content null when the reply is only tool calls.
    msg["content"] = c.text.empty() && !c.tool_calls.empty() ? ojson(nullptr) : ojson(c.text);
    if (!c.reasoning.empty()) {
      msg["reasoning"] = c.reasoning;          // vLLM >= 0.12, OpenRouter
      msg["reasoning_content"] = c.reasoning;  // DeepSeek's name
    }
    if (!c.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const ChatToolCall& t : c.tool_calls) {
        calls.push_back({{"id", t.id},
                         {"type", "function"},
                         {"function", {{"name", t.name}, {"arguments", t.arguments}}}});
      }
      msg["tool_calls"] = std::move(calls);
    }
    ojson o;
    o["index"] = c.index;
    o["message"] = std::move(msg);
    o["logprobs"] = c.logprobs ? logprobs_object(*c.logprobs) : ojson(nullptr);
    o["finish_reason"] = !c.tool_calls.empty() && c.finish_reason == FinishReason::kStop
                             ? ojson("tool_calls")
                             : finish_json(c.finish_reason);
    arr.push_back(std::move(o));
  }
  return with_choices(std::move(j), std::move(arr), usage);
}

std::string chat_chunk_json(const ReplyHead& head, int index, const std::string& delta_text,
                            const std::optional<std::string>& role,
                            const std::optional<FinishReason>& finish_reason,
                            const std::vector<TokenLogprob>* logprobs) {
  ojson j = envelope(head, "chat.completion.chunk");
  ojson delta = ojson::object();
  if (role) delta["role"] = *role;
  if (role || !delta_text.empty()) delta["content"] = delta_text;
  ojson c;
  c["index"] = index;
  c["delta"] = std::move(delta);
  c["logprobs"] = logprobs ? logprobs_object(*logprobs) : ojson(nullptr);
  c["finish_reason"] = finish_json(finish_reason);
  j["choices"] = ojson::array({std::move(c)});
  return dump(j);
}

std::string chat_delta_json(const ReplyHead& head, int index, const ChatDelta& d,
                            const std::vector<TokenLogprob>* logprobs) {
  ojson j = envelope(head, "chat.completion.chunk");
  ojson delta = ojson::object();
  if (!d.content.empty()) delta["content"] = d.content;
  if (!d.reasoning.empty()) {
    delta["reasoning"] = d.reasoning;
    delta["reasoning_content"] = d.reasoning;
  }
  if (!d.tool_calls.empty()) {
    ojson calls = ojson::array();
    for (const ToolCallDelta& t : d.tool_calls) {
      ojson c;
      c["index"] = t.index;
      ojson fn = ojson::object();
      if (!t.id.empty()) {
        c["id"] = t.id;
        c["type"] = "function";
        fn["name"] = t.name;
      }
      fn["arguments"] = t.arguments;
      c["function"] = std::move(fn);
      calls.push_back(std::move(c));
    }
    delta["tool_calls"] = std::move(calls);
  }
  ojson c;
  c["index"] = index;
  c["delta"] = std::move(delta);
  c["logprobs"] = logprobs ? logprobs_object(*logprobs) : ojson(nullptr);
  c["finish_reason"] = nullptr;
  j["choices"] = ojson::array({std::move(c)});
  return dump(j);
}

std::string chat_tool_calls_finish_json(const ReplyHead& head, int index) {
  ojson j = envelope(head, "chat.completion.chunk");
  ojson c;
  c["index"] = index;
  c["delta"] = ojson::object();
  c["logprobs"] = nullptr;
  c["finish_reason"] = "tool_calls";
  j["choices"] = ojson::array({std::move(c)});
  return dump(j);
}

std::string chunk_with_usage(const std::string& chunk_json, const Usage& usage) {
  ojson j = ojson::parse(chunk_json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return chunk_json;
  j["usage"] = usage_object(usage);
  return dump(j);
}

std::string usage_chunk_json(const ReplyHead& head, const Usage& usage, const char* object) {
  return with_choices(envelope(head, object), ojson::array(), usage);
}

std::string completion_json(const ReplyHead& head, const std::vector<CompletionChoice>& choices,
                            const Usage& usage, const std::vector<size_t>& text_offset0) {
  ojson j = envelope(head, "text_completion");
  ojson arr = ojson::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionChoice& c = choices[i];
    ojson o;
    o["text"] = c.text;
    o["index"] = c.index;
    o["logprobs"] = c.logprobs ? legacy_logprobs_object(
                                     *c.logprobs, i < text_offset0.size() ? text_offset0[i] : 0)
                               : ojson(nullptr);
    o["finish_reason"] = finish_json(c.finish_reason);
    arr.push_back(std::move(o));
  }
  return with_choices(std::move(j), std::move(arr), usage);
}

std::string completion_chunk_json(const ReplyHead& head, int index, const std::string& text,
                                  const std::optional<FinishReason>& finish_reason,
                                  const std::vector<TokenLogprob>* logprobs, size_t text_offset0) {
  ojson j = envelope(head, "text_completion");
  ojson c;
  c["text"] = text;
  c["index"] = index;
  c["logprobs"] = logprobs ? legacy_logprobs_object(*logprobs, text_offset0) : ojson(nullptr);
  c["finish_reason"] = finish_json(finish_reason);
  j["choices"] = ojson::array({std::move(c)});
  return dump(j);
}

std::string sse_event(const std::string& json) { return "data: " + json + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

// ---- The writers ----

ReplyWriter::ReplyWriter(ReplyOptions o, size_t choices) : o_(std::move(o)), choices_(choices) {}

std::string ReplyWriter::begin() const {
  std::string out;
  if (!o_.stream) return out;
  for (const std::string& c : prologue()) out += frame(c);
  return out;
}

std::string ReplyWriter::event(const std::string& chunk) const {
  return frame(o_.continuous_usage ? chunk_with_usage(chunk, usage()) : chunk);
}

std::string ReplyWriter::add(size_t i, const ChatChunk& p) {
  Choice& c = choices_[i];
  if (o_.logprobs) c.logprobs.insert(c.logprobs.end(), p.logprobs.begin(), p.logprobs.end());
  const std::vector<TokenLogprob>* lp = o_.logprobs ? &p.logprobs : nullptr;
  // The counts so far (complete on the last piece).
  c.prompt_tokens = p.stats.prompt_tokens;
  c.completion_tokens = p.stats.completion_tokens;
  c.cached_tokens = p.stats.cached_tokens;
  if (p.token_id >= 0 && !p.delta.reasoning.empty()) ++c.reasoning_tokens;
  c.reply.add(p.delta);
  if (!p.delta.empty()) on_delta(i, p.delta);
  std::string out;
  if (o_.stream && (!p.delta.empty() || (lp && !lp->empty()))) {
    out += event(delta_chunk(i, p.delta, lp));
  }
  if (!p.finished) return out;
  c.finished = true;
  c.reason = p.finish_reason;
  ++finished_;
  if (o_.stream) out += event(finish_chunk(i));
  return out;
}

std::string ReplyWriter::end() const {
  const Usage u = usage();
  if (!o_.stream) return body(u);
  std::string out;
  if (o_.include_usage) out += frame(usage_chunk(u));
  return out + stream_end(u);
}

Usage ReplyWriter::usage() const {
  Usage u;
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (i % static_cast<size_t>(o_.n) == 0) {
      u.prompt_tokens += choices_[i].prompt_tokens;
      u.cached_tokens += choices_[i].cached_tokens;
    }
    u.completion_tokens += choices_[i].completion_tokens;
  }
  return u;
}

std::string ReplyWriter::frame(const std::string& chunk) const { return sse_event(chunk); }

std::string ReplyWriter::stream_end(const Usage&) const { return sse_done(); }

std::string ReplyWriter::stream_error(const ApiError& e) { return error_events(e); }

std::string ReplyWriter::error_events(const ApiError& e) {
  return sse_event(api_error_json(e)) + sse_done();
}

namespace {

class ChatReplyWriter final : public ReplyWriter {
 public:
  ChatReplyWriter(ReplyOptions o, size_t choices) : ReplyWriter(std::move(o), choices) {}

 private:
  std::vector<std::string> prologue() const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < choices_.size(); ++i) {
      out.push_back(chat_chunk_json(o_, static_cast<int>(i), "", std::string("assistant")));
    }
    return out;
  }
  std::string delta_chunk(size_t i, const ChatDelta& d,
                          const std::vector<TokenLogprob>* lp) override {
    return chat_delta_json(o_, static_cast<int>(i), d, lp);
  }
  std::string finish_chunk(size_t i) const override {
    const Choice& c = choices_[i];
    if (!c.reply.tool_calls.empty() && c.reason == FinishReason::kStop) {
      // OpenAI's finish for a reply of tool calls.
      return chat_tool_calls_finish_json(o_, static_cast<int>(i));
    }
    return chat_chunk_json(o_, static_cast<int>(i), "", std::nullopt, c.reason);
  }
  std::string usage_chunk(const Usage& u) const override { return usage_chunk_json(o_, u); }
  std::string body(const Usage& u) const override {
    std::vector<CompletionChoice> out;
    for (size_t i = 0; i < choices_.size(); ++i) {
      const Choice& c = choices_[i];
      CompletionChoice r;
      r.index = static_cast<int>(i);
      r.text = c.reply.content;
      r.reasoning = c.reply.reasoning;
      r.tool_calls = c.reply.tool_calls;
      r.finish_reason = c.reason;
      if (o_.logprobs) r.logprobs = c.logprobs;
      out.push_back(std::move(r));
    }
    return chat_completion_json(o_, out, u);
  }
};

class CompletionReplyWriter final : public ReplyWriter {
 public:
  CompletionReplyWriter(ReplyOptions o, std::vector<std::string> echo)
      : ReplyWriter(std::move(o), echo.size()), echo_(std::move(echo)) {
    for (const std::string& e : echo_) offset_.push_back(e.size());
  }

 private:
  std::vector<std::string> prologue() const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < echo_.size(); ++i) {
      if (!echo_[i].empty()) {
        out.push_back(completion_chunk_json(o_, static_cast<int>(i), echo_[i]));
      }
    }
    return out;
  }
  std::string delta_chunk(size_t i, const ChatDelta& d,
                          const std::vector<TokenLogprob>* lp) override {
    std::string c =
        completion_chunk_json(o_, static_cast<int>(i), d.content, std::nullopt, lp, offset_[i]);
    if (lp) {
      for (const TokenLogprob& e : *lp) offset_[i] += e.token.size();
    }
    return c;
  }
  std::string finish_chunk(size_t i) const override {
    return completion_chunk_json(o_, static_cast<int>(i), "", choices_[i].reason);
  }
  std::string usage_chunk(const Usage& u) const override {
    return usage_chunk_json(o_, u, "text_completion");
  }
  std::string body(const Usage& u) const override {
    std::vector<CompletionChoice> out;
    std::vector<size_t> offsets;
    for (size_t i = 0; i < choices_.size(); ++i) {
      CompletionChoice c;
      c.index = static_cast<int>(i);
      c.text = echo_[i] + choices_[i].reply.content;
      c.finish_reason = choices_[i].reason;
      if (o_.logprobs) c.logprobs = choices_[i].logprobs;
      offsets.push_back(echo_[i].size());
      out.push_back(std::move(c));
    }
    return completion_json(o_, out, u, offsets);
  }

  std::vector<std::string> echo_;
  // Streaming: the text_offset of each choice's next token (where its text has reached).
  std::vector<size_t> offset_;
};

}  // namespace

std::unique_ptr<ReplyWriter> chat_reply_writer(ReplyOptions o, size_t choices) {
  return std::make_unique<ChatReplyWriter>(std::move(o), choices);
}

std::unique_ptr<ReplyWriter> completion_reply_writer(ReplyOptions o,
                                                     std::vector<std::string> echo) {
  return std::make_unique<CompletionReplyWriter>(std::move(o), std::move(echo));
}

}  // namespace vlm

// Replies as the client reads them: each choice's pieces (the chat API's ChatChunks, or for
// /v1/completions an engine stream's text as their content) in, OpenAI's JSON body or its
// server-sent events out. Pure: no sockets, no engine; the HTTP layer writes what it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/openai_api.h"
#include "vlm/chat.h"
#include "vlm/request.h"

namespace vlm {

struct CompletionChoice {
  int index = 0;
  std::string text;
  FinishReason finish_reason = FinishReason::kNone;
  std::optional<std::vector<TokenLogprob>> logprobs;  // set when the request asked for them
  std::string reasoning;                              // chat: the reply's reasoning (may be empty)
  std::vector<ChatToolCall> tool_calls;               // chat: parsed tool calls
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens found in the prefix cache
};

// What every object of a reply starts with.
struct ReplyHead {
  std::string id;  // "chatcmpl-7", "cmpl-7"
  std::string model;
  int64_t created = 0;  // Unix seconds
  // OpenAI's system_fingerprint: what the replies ran on (the server's build and the engine's
  // configuration), the same for every reply of one server; "" writes null.
  std::string system_fingerprint;
};

// How one response is written.
struct ReplyOptions : ReplyHead {
  bool stream = false;
  bool logprobs = false;       // the choices carry their tokens' logprobs
  bool include_usage = false;  // streaming: a usage chunk before [DONE]
  // vLLM's stream_options.continuous_usage_stats: every chunk after the first ones carries the
  // usage so far.
  bool continuous_usage = false;
  int n = 1;  // choices per prompt: usage counts each prompt's tokens once
};

// The reply to one request, choice by choice. Not thread-safe: one thread (the connection's
// strand) feeds it.
class ReplyWriter {
 public:
  virtual ~ReplyWriter() = default;

  // Streaming: the events before any piece (chat: each choice's role chunk; completions: each
  // echoed prompt). "" otherwise.
  std::string begin() const;
  // Adds choice i's piece to its reply (text, reasoning, tool calls, logprobs, token counts).
  // Streaming, returns its events: the delta when it has any, then the finish chunk when it ends
  // the choice. "" otherwise.
  std::string add(size_t i, const ChatChunk& piece);
  bool streaming() const { return o_.stream; }
  bool finished(size_t i) const { return choices_[i].finished; }
  bool done() const { return finished_ == choices_.size(); }
  // Once done(): streaming, the usage chunk (with include_usage) and [DONE]; else the JSON body.
  std::string end() const;
  // Prompt tokens once per prompt (choices p*n .. p*n+n-1 share one), completion tokens over all
  // choices: the counts so far.
  Usage usage() const;
  // A request that failed while streaming: the error object as an event, then [DONE].
  static std::string error_events(const ApiError& e);
  // This writer's events for a failure while streaming (error_events unless it says otherwise).
  virtual std::string stream_error(const ApiError& e);

 protected:
  struct Choice {
    ChatReply reply;                     // content, and for chat its reasoning and tool calls
    std::vector<TokenLogprob> logprobs;  // with logprobs: their bytes add up to reply.content
    FinishReason reason = FinishReason::kNone;
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    // Sampled tokens whose piece carried reasoning text (the detokenizer may hold a token's
    // text back to a later piece: a close count, not an exact one).
    int64_t reasoning_tokens = 0;
    bool finished = false;
  };
  ReplyWriter(ReplyOptions o, size_t choices);

  // Every piece's delta, streamed or not, before delta_chunk (which only a stream calls).
  virtual void on_delta(size_t /*i*/, const ChatDelta& /*delta*/) {}
  virtual std::vector<std::string> prologue() const = 0;
  // Choice i's new piece, with the logprobs of its tokens (null without logprobs).
  virtual std::string delta_chunk(size_t i, const ChatDelta& delta,
                                  const std::vector<TokenLogprob>* logprobs) = 0;
  virtual std::string finish_chunk(size_t i) const = 0;
  virtual std::string usage_chunk(const Usage& usage) const = 0;
  virtual std::string body(const Usage& usage) const = 0;
  // A chunk as the stream carries it ("data: CHUNK", a blank line), and what ends the stream
  // ("data: [DONE]"); a writer whose chunks are whole events already (the Responses API's typed
  // events) passes them through and ends with its own.
  virtual std::string frame(const std::string& chunk) const;
  virtual std::string stream_end(const Usage& usage) const;

  ReplyOptions o_;
  std::vector<Choice> choices_;

 private:
  std::string event(const std::string& chunk) const;  // with the usage so far when continuous
  size_t finished_ = 0;
};

// POST /v1/chat/completions: `choices` (= n) replies.
std::unique_ptr<ReplyWriter> chat_reply_writer(ReplyOptions o, size_t choices);
// POST /v1/completions: one choice per entry of `echo` (prompt p's n choices at p*n ..), each
// reply's text after its echo (the prompt's text with echo, else "").
std::unique_ptr<ReplyWriter> completion_reply_writer(ReplyOptions o, std::vector<std::string> echo);

// ---- The JSON objects the writers put together ----

// "stop", "length", or std::nullopt for kNone (JSON null).
std::optional<std::string> finish_reason_string(FinishReason r);

// Non-streaming response: object "chat.completion".
std::string chat_completion_json(const ReplyHead& head,
                                 const std::vector<CompletionChoice>& choices, const Usage& usage);

// A streamed chat delta (object "chat.completion.chunk"): content, reasoning (as both `reasoning`
// and `reasoning_content`) and tool call fragments (OpenAI's delta.tool_calls: index, then id,
// type and name on a call's first fragment, arguments text). `logprobs`, when given, are the
// tokens this chunk covers.
std::string chat_delta_json(const ReplyHead& head, int index, const ChatDelta& delta,
                            const std::vector<TokenLogprob>* logprobs);

// A chat stream's finish chunk for a reply that ended with tool calls (finish_reason
// "tool_calls").
std::string chat_tool_calls_finish_json(const ReplyHead& head, int index);

// One streaming chunk: object "chat.completion.chunk" with choices[0].delta. The delta holds
// "role" when given and "content" when delta_text is non-empty or a role is given (OpenAI's first
// chunk is {"role":"assistant","content":""}); the last chunk carries finish_reason and may have
// an empty delta. `logprobs`, when given, are the tokens this chunk covers.
std::string chat_chunk_json(const ReplyHead& head, int index, const std::string& delta_text,
                            const std::optional<std::string>& role = std::nullopt,
                            const std::optional<FinishReason>& finish_reason = std::nullopt,
                            const std::vector<TokenLogprob>* logprobs = nullptr);

// The final chunk of a stream with stream_options.include_usage: empty choices plus usage.
// `object` is "chat.completion.chunk" or "text_completion".
std::string usage_chunk_json(const ReplyHead& head, const Usage& usage,
                             const char* object = "chat.completion.chunk");

// A stream chunk (one of the builders' JSON objects) with "usage" (the counts so far) added, as
// vLLM sends every chunk under stream_options.continuous_usage_stats.
std::string chunk_with_usage(const std::string& chunk_json, const Usage& usage);

// POST /v1/completions response: object "text_completion"; logprobs in the legacy layout
// {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}. `text_offset0` is
// where the choice's generated text starts within its text (the prompt's length with echo).
std::string completion_json(const ReplyHead& head, const std::vector<CompletionChoice>& choices,
                            const Usage& usage, const std::vector<size_t>& text_offset0 = {});

// One streaming chunk of /v1/completions (object "text_completion", choices[0].text).
std::string completion_chunk_json(const ReplyHead& head, int index, const std::string& text,
                                  const std::optional<FinishReason>& finish_reason = std::nullopt,
                                  const std::vector<TokenLogprob>* logprobs = nullptr,
                                  size_t text_offset0 = 0);

// Server-sent event framing: "data: <json>\n\n" and the terminator "data: [DONE]\n\n".
std::string sse_event(const std::string& json);
std::string sse_done();

}  // namespace vlm

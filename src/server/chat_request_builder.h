// The chat route's request: a POST /v1/chat/completions body, parsed and validated
// (server/openai_api) and its media made bytes (remote ones fetched, file:// ones read), becomes
// the chat API's ChatRequest and what the reply needs beside it. Runs on an HTTP worker thread;
// errors are ApiErrors made where each check is, naming the field.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/chat_reply_writer.h"
#include "server/http_client.h"
#include "server/openai_api.h"
#include "vlm/chat.h"
#include "vlm/request.h"

namespace vlm {

class Tokenizer;

// GETs an http(s) URL whose body may be at most max_bytes (the server's: http::fetch_url with
// its timeout). Injected, so that tests need no network.
using MediaFetcher = std::function<http::FetchResult(const std::string& url, size_t max_bytes)>;

// What the server checks a request against.
struct ChatRequestContext {
  ApiLimits limits;
  MediaPolicy media;
  std::vector<std::string> model_names;  // a request's model must be one of them (or none)
  MediaFetcher fetch;                    // called only for the http(s) URLs media allows
};

// A chat completion to run: the conversation for Engine::chat_stream (each image and video part
// carrying its bytes) and how its reply is written (ReplyOptions without id, model, created and
// system_fingerprint, which the server sets).
struct ChatCall {
  ChatRequest chat;
  int n = 1;
  ReplyOptions reply;

  // Choice i's request: the conversation (the last choice takes it, the others copy it), its
  // seed + i when seeded, and its tool call ids `call_prefix` + "<i>_<k>".
  ChatRequest take_choice(int i, const std::string& call_prefix);
};

class ChatRequestBuilder {
 public:
  explicit ChatRequestBuilder(ChatRequestContext context) : ctx_(std::move(context)) {}

  // The body's ChatCall, or the error that answers it: the parser's 400s and 413s, 404 for a
  // model not served, a media fetch's 400 / 413, an unreadable file:// image or video (400).
  // What only the engine can judge (the template's refusal of the conversation, a thinking
  // budget the model cannot close) is Engine::chat_stream's error, which names its field.
  ApiResult<ChatCall> build(std::string_view body) const;

 private:
  std::optional<ApiError> fetch_remote(ChatCompletionRequest* r) const;
  std::optional<ApiError> read_local(ChatCompletionRequest* r) const;

  ChatRequestContext ctx_;
};

// POST /v1/completions: one GenerateRequest per prompt and choice (prompt p's n choices at
// p*n .., choice i sampling with seed + i when seeded), each choice's echo (the prompt's text
// with echo, else ""), and how the reply is written (as ChatCall's).
struct CompletionCall {
  std::vector<GenerateRequest> requests;
  std::vector<std::string> echo;
  ReplyOptions reply;
};
CompletionCall completion_call(const CompletionRequest& r, const Tokenizer& tokenizer);

}  // namespace vlm

// OpenAI's Responses API (POST /v1/responses) on the chat path: a request becomes the chat
// completion body it amounts to (ChatRequestBuilder then checks it and reads its media, as for
// /v1/chat/completions: one request path), and the chat reply becomes a response object. Pure
// functions, no sockets.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/chat_reply_writer.h"
#include "server/openai_api.h"
#include "vlm/chat.h"

namespace vlm {

struct ResponsesRequest {
  std::string model;
  // The chat completion body: messages (instructions first, as a system message; the input's
  // items as messages, tool calls and tool results), tools, tool_choice, response_format,
  // max_completion_tokens and the sampling settings.
  std::string chat_body;
  std::string input_json = "[]";  // the input's messages alone (what a stored conversation adds)
  bool has_instructions = false;  // chat_body's first message is the instructions
  bool stream = false;
  // store (default true): the response is kept for GET and previous_response_id when the
  // server keeps responses (the response says whether it was).
  bool store = true;
  std::string previous_response_id;  // "": none
  // What the response object echoes back, as JSON text (the request's own values).
  std::string instructions_json = "null";
  std::string tools_json = "[]";
  std::string tool_choice_json = "\"auto\"";
  std::string text_json = R"({"format":{"type":"text"}})";
  std::string reasoning_json = R"({"effort":null,"summary":null})";
  std::string metadata_json = "{}";
  std::string user_json = "null";
  std::optional<double> temperature, top_p;
  std::optional<int64_t> max_output_tokens;
  bool parallel_tool_calls = true;
};

// Parses a POST /v1/responses body. Accepted: model, input (a string, or items: messages with
// roles user, system, developer (a system message) and assistant, their content a string or
// input_text / input_image / output_text parts; function_call and function_call_output items;
// reasoning items, which become the next assistant message's reasoning), instructions, tools
// (function tools), tool_choice, parallel_tool_calls, text.format (text, json_object,
// json_schema), reasoning (effort "none" turns a Qwen model's thinking off; null or absent
// leaves it as the template has it), max_output_tokens, temperature, top_p, stream, store,
// previous_response_id (the route splices the stored conversation in), and vLLM's extras top_k,
// min_p, repetition_penalty, presence_penalty, frequency_penalty, seed; metadata, user and the
// like change nothing. What is not supported (built-in tools, background mode, include, file
// inputs, ...) is a 400 naming it.
ApiResult<ResponsesRequest> parse_responses(std::string_view body);

// The chat body of a request that continues a stored conversation (chat messages, a JSON array):
// its instructions (those of the earlier responses are not carried, as OpenAI's are not), the
// conversation, then its input.
std::string chat_body_after(const ResponsesRequest& r, const std::string& conversation_json);

// A new response id: "resp_" and 128 random bits in hex (std::random_device: the kernel's
// generator), unguessable, since a stored response is read, continued and deleted by it alone.
std::string new_response_id();

// DELETE /v1/responses/{id}'s reply.
std::string response_deleted_json(const std::string& id);

// Two lists of chat messages (JSON arrays) as one.
std::string join_messages(const std::string& a, const std::string& b);

// A conversation (chat messages, a JSON array) with a reply appended as the assistant's message
// (its reasoning, text and tool calls): what a later previous_response_id continues.
std::string conversation_with(const std::string& conversation_json, const ChatReply& reply);

// The reply of one response (`o`: its id "resp_...", model and created): the chat reply's one
// choice as the response object (object "response": status "completed", or "incomplete" with
// incomplete_details {"reason": "max_output_tokens"} when the reply ran out of tokens; the output
// items in the order the reply made them: reasoning, message, function calls; the request's
// settings echoed; usage in the Responses API's names), or streamed as the API's typed events
// (response.created, response.in_progress; each output item's output_item.added,
// content_part.added, output_text.delta / reasoning_text.delta / function_call_arguments.delta and
// their .done events, output_item.done; response.completed with the whole response (status
// "incomplete" when it ran out of tokens); an "error" event when the request fails meanwhile), each
// with its sequence_number. `keep` (may be empty) is called once the response is complete (not when
// it fails) with the response object as JSON and the reply: the route stores them (req.store says
// it will).
using KeepResponse = std::function<void(const std::string& response_json, const ChatReply& reply)>;
std::unique_ptr<ReplyWriter> responses_reply_writer(ReplyOptions o, ResponsesRequest req,
                                                    KeepResponse keep = {});

}  // namespace vlm

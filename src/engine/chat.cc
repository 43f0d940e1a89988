// Engine::chat: a conversation rendered with the engine's chat template, tokenized and submitted
// like a GenerateRequest; its stream's text split into reasoning, content and tool calls by a
// ChatOutputParser on the consuming thread. The server's /v1/chat/completions is JSON around it.
#include "vlm/chat.h"

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/chat_output_parser.h"
#include "engine/engine_impl.h"
#include "vlm/engine.h"

namespace vlm {

Result<const ChatTemplate*> Engine::chat_template() const {
  if (impl_->chat_template) return &*impl_->chat_template;
  if (!impl_->chat_template_error.ok()) return impl_->chat_template_error;
  return invalid_argument("chat: the model directory has no tokenizer");
}

namespace {

// The conversation rendered with `tpl` (its tools, template variables and media moved out of
// `request`), its ids and media into *g.
Result<std::string> render_chat(const ChatTemplate& tpl, const Tokenizer& tok, ChatRequest& request,
                                GenerateRequest* g) {
  ChatTemplateOptions topts;
  topts.tools_json = std::move(request.tools_json);
  topts.kwargs_json = std::move(request.template_kwargs);
  topts.add_vision_id = request.add_vision_id;
  topts.add_generation_prompt = request.add_generation_prompt;
  auto prompt = tpl.render(request.messages, topts);
  if (!prompt.ok()) {
    return invalid_argument("messages: the chat template refused the conversation: " +
                            prompt.status().message())
        .with_field("messages");
  }
  g->prompt_ids = tok.encode(*prompt);
  // The media in prompt order: the template renders one pad per image or video part.
  for (ChatMessage& msg : request.messages) {
    for (ChatPart& part : msg.parts) {
      if (part.type == ChatPart::Type::kImage) g->images.push_back(std::move(part.image));
      if (part.type == ChatPart::Type::kVideo) g->videos.push_back(std::move(part.video));
    }
  }
  return prompt;
}

}  // namespace

Result<std::vector<int32_t>> Engine::chat_prompt_tokens(ChatRequest request) const {
  VLM_ASSIGN_OR_RETURN(const ChatTemplate* tpl, chat_template());
  GenerateRequest g;
  VLM_RETURN_IF_ERROR(render_chat(*tpl, *impl_->tokenizer, request, &g).status());
  auto ids = prompt_tokens(std::move(g));
  if (!ids.ok() && ids.status().field().empty()) return ids.status().with_field("messages");
  return ids;
}

Result<std::unique_ptr<ChatStream>> Engine::chat_stream(ChatRequest request,
                                                        std::function<void()> notify) {
  const Impl& m = *impl_;
  VLM_ASSIGN_OR_RETURN(const ChatTemplate* tpl, chat_template());
  const bool has_tools = !request.tools_json.empty();
  GenerateRequest g;
  VLM_ASSIGN_OR_RETURN(const std::string prompt, render_chat(*tpl, *m.tokenizer, request, &g));
  g.sampling = std::move(request.sampling);
  g.max_new_tokens = request.max_new_tokens;
  g.stop = std::move(request.stop);
  g.stop_token_ids = std::move(request.stop_token_ids);
  g.ignore_eos = request.ignore_eos;
  g.logprobs = request.logprobs;
  g.structured = std::move(request.response_format);
  // Qwen3 Thinking templates end the generation prompt with <think>: the reply starts in its
  // reasoning, and a grammar or a thinking budget counts from the prompt's end.
  const bool think_open = prompt.ends_with("<think>") || prompt.ends_with("<think>\n");
  const auto close = m.tokenizer->token_to_id("</think>");
  if (request.max_thinking_tokens) {
    if (!close) {
      return invalid_argument("max_thinking_tokens: this model has no </think> token")
          .with_field("max_thinking_tokens");
    }
    g.max_thinking_tokens = *request.max_thinking_tokens;
    g.think_open_id = m.tokenizer->token_to_id("<think>").value_or(-1);
    g.think_close_id = *close;
    g.thinking_open_in_prompt = think_open;
  }
  // A grammar starts after the reasoning block the prompt opened.
  if (g.structured.kind != StructuredOutput::Kind::kNone && think_open && close) {
    g.think_close_id = *close;
    g.thinking_open_in_prompt = true;
  }
  ChatOutputParser::Options po;
  po.reasoning_open = think_open;
  po.tool_calls = has_tools && request.parse_tool_calls;
  po.max_tool_calls = request.parallel_tool_calls ? 0 : 1;
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<RequestStream> stream,
                       submit(std::move(g), std::move(notify)));
  // Call ids unique across the engine's requests unless the caller names them.
  po.id_prefix = request.tool_call_id_prefix.empty() ? "call_" + std::to_string(stream->id()) + "_"
                                                     : std::move(request.tool_call_id_prefix);
  return std::unique_ptr<ChatStream>(new ChatStream(
      std::move(stream), std::make_unique<ChatOutputParser>(po), request.include_reasoning));
}

void ChatReply::add(const ChatDelta& delta) {
  content += delta.content;
  reasoning += delta.reasoning;
  for (const ToolCallDelta& t : delta.tool_calls) {
    if (t.index >= static_cast<int>(tool_calls.size())) {
      tool_calls.resize(static_cast<size_t>(t.index) + 1);
    }
    ChatToolCall& call = tool_calls[static_cast<size_t>(t.index)];
    if (!t.id.empty()) call.id = t.id;
    if (!t.name.empty()) call.name = t.name;
    if (t.arguments.empty()) continue;
    call.arguments += t.arguments;
    call.arguments_is_object = nlohmann::json::parse(call.arguments, nullptr, false).is_object();
  }
}

Result<ChatReply> Engine::chat(ChatRequest request,
                               const std::function<bool(const ChatChunk&)>& on_chunk) {
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<ChatStream> stream, chat_stream(std::move(request)));
  ChatReply reply;
  ChatChunk chunk;
  while (stream->next(&chunk)) {
    if (!chunk.error.ok()) return chunk.error;
    reply.add(chunk.delta);
    reply.logprobs.insert(reply.logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
    reply.stats = chunk.stats;
    if (chunk.finished) reply.finish_reason = chunk.finish_reason;
    if (on_chunk && !on_chunk(chunk)) {
      if (chunk.finished) break;  // it ended anyway
      stream->cancel();
      reply.finish_reason = FinishReason::kNone;
      break;
    }
  }
  return reply;
}

ChatStream::ChatStream(std::unique_ptr<RequestStream> stream,
                       std::unique_ptr<ChatOutputParser> parser, bool keep_reasoning)
    : stream_(std::move(stream)), parser_(std::move(parser)), keep_reasoning_(keep_reasoning) {}

ChatStream::~ChatStream() = default;

int64_t ChatStream::id() const { return stream_->id(); }
bool ChatStream::next(ChatChunk* out) { return take(out, true); }
bool ChatStream::try_next(ChatChunk* out) { return take(out, false); }
void ChatStream::cancel() { stream_->cancel(); }

bool ChatStream::take(ChatChunk* out, bool wait) {
  RequestOutput p;
  if (!(wait ? stream_->next(&p) : stream_->try_next(&p))) return false;
  *out = ChatChunk{};
  parser_->feed(p.text, &out->delta);
  if (p.finished) parser_->finish(&out->delta);
  if (!keep_reasoning_) out->delta.reasoning.clear();
  take_piece(std::move(p), out);
  return true;
}

void take_piece(RequestOutput&& piece, ChatChunk* out) {
  out->logprobs = std::move(piece.logprobs);
  out->token_id = piece.token_id;
  out->step = piece.step;
  out->sampled_ns = piece.sampled_ns;
  out->finished = piece.finished;
  out->finish_reason = piece.finish_reason;
  out->error = std::move(piece.error);
  out->stats = piece.stats;
}

}  // namespace vlm

#include "server/chat_request_builder.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "vision/image_decode.h"
#include "vlm/tokenizer.h"

namespace vlm {
namespace {

ApiError messages_error(int status, std::string message) {
  return ApiError{status, "invalid_request_error", std::move(message), "messages"};
}

// The fields of a reply both endpoints read from the request the same way.
ReplyOptions reply_options(const CommonRequest& c) {
  ReplyOptions o;
  o.stream = c.stream;
  o.include_usage = c.include_usage;
  o.continuous_usage = c.continuous_usage;
  o.n = c.n;
  return o;
}

// Choice i of a seeded request samples with seed + i, so the n choices differ.
void seed_choice(int i, SamplingParams* s) {
  if (s->seed) s->seed = *s->seed + static_cast<uint64_t>(i);
}

// The bytes a video given as a list of frames holds so far (frames not read yet hold none).
size_t frame_bytes(const VideoInput& v) {
  size_t n = 0;
  for (const ImageInput& f : v.frames) n += f.bytes.size();
  return n;
}

// A video's frames may hold at most limits.max_video_bytes together (each frame at most
// max_image_bytes): counted as they are fetched or read, so that no more is held. `video` counts
// from 1 in prompt order.
ApiError frames_over(size_t video, size_t max_bytes) {
  return messages_error(413, "video " + std::to_string(video) + ": its frames are larger than " +
                                 std::to_string(max_bytes) + " bytes together");
}

// Calls fn(part, k) for each part of `type`, k counting them from 1 in prompt order; stops at
// the first error.
template <typename Fn>
std::optional<ApiError> for_each_part(std::vector<ChatMessage>* messages, ChatPart::Type type,
                                      Fn fn) {
  size_t k = 0;
  for (ChatMessage& m : *messages) {
    for (ChatPart& part : m.parts) {
      if (part.type != type) continue;
      if (auto e = fn(part, ++k)) return e;
    }
  }
  return std::nullopt;
}

// The place of messages[message].parts[part] among the parts of its type, from 1.
size_t ordinal(const std::vector<ChatMessage>& messages, size_t message, size_t part) {
  const ChatPart::Type type = messages[message].parts[part].type;
  size_t k = 0;
  for (size_t i = 0; i <= message; ++i) {
    const std::vector<ChatPart>& parts = messages[i].parts;
    const size_t end = i == message ? part + 1 : parts.size();
    for (size_t j = 0; j < end; ++j) k += parts[j].type == type ? 1 : 0;
  }
  return k;
}

// Reads a file:// image or video into its bytes and clears its path, so that nothing later
// (messages included) sees the server's path: a failure names the media by its place in the
// request (`what`), never by the path.
std::optional<ApiError> read_file_media(std::string* path, std::vector<uint8_t>* bytes,
                                        const std::string& what,
                                        const ImageDecodeLimits& limits = {}) {
  auto read = read_image_file(*path, limits);
  if (!read.ok()) return messages_error(400, what + " cannot be read");
  *bytes = std::move(read).value();
  path->clear();
  return std::nullopt;
}

}  // namespace

ChatRequest ChatCall::take_choice(int i, const std::string& call_prefix) {
  ChatRequest q = i + 1 == n ? std::move(chat) : chat;
  seed_choice(i, &q.sampling);
  q.tool_call_id_prefix = call_prefix + std::to_string(i) + "_";
  return q;
}

ApiResult<ChatCall> ChatRequestBuilder::build(std::string_view body) const {
  auto parsed = parse_chat_completion(body, ctx_.limits, ctx_.media);
  if (!parsed.ok()) return parsed.error();
  ChatCompletionRequest& r = parsed.value();
  if (auto e = check_model_name(r.model, ctx_.model_names)) return *e;
  if (auto e = fetch_remote(&r)) return *e;
  if (auto e = read_local(&r)) return *e;
  ChatCall call;
  ChatRequest& chat = call.chat;
  chat.messages = std::move(r.messages);
  chat.tools_json = std::move(r.tools_json);
  chat.parse_tool_calls = !r.tool_choice_none;
  chat.parallel_tool_calls = r.parallel_tool_calls;
  chat.template_kwargs = std::move(r.template_kwargs);
  chat.include_reasoning = r.include_reasoning;
  chat.add_generation_prompt = r.add_generation_prompt;
  chat.max_thinking_tokens = r.max_thinking_tokens;
  chat.sampling = std::move(r.sampling);
  chat.max_new_tokens = r.max_tokens;
  chat.stop = std::move(r.stop);
  chat.stop_token_ids = std::move(r.stop_token_ids);
  chat.ignore_eos = r.ignore_eos;
  chat.logprobs = r.logprobs ? r.top_logprobs : -1;
  chat.response_format = std::move(r.structured);
  call.n = r.n;
  call.reply = reply_options(r);
  call.reply.logprobs = r.logprobs;
  return call;
}

// The http(s) images and videos (only there with MediaPolicy::allow_remote), in prompt order.
std::optional<ApiError> ChatRequestBuilder::fetch_remote(ChatCompletionRequest* r) const {
  const ApiLimits& limits = ctx_.limits;
  for (const RemoteMedia& rm : r->remote_media) {
    ChatPart& part = r->messages[rm.message].parts[rm.part];
    const bool whole_video = rm.video && rm.frame < 0;
    size_t max_bytes = whole_video ? limits.max_video_bytes : limits.max_image_bytes;
    if (rm.video && !whole_video) {
      const size_t held = frame_bytes(part.video);
      if (held >= limits.max_video_bytes) {
        return frames_over(ordinal(r->messages, rm.message, rm.part), limits.max_video_bytes);
      }
      max_bytes = std::min(max_bytes, limits.max_video_bytes - held);
    }
    const std::string kind = whole_video ? "video" : "image";
    http::FetchResult f = ctx_.fetch(rm.url, max_bytes);
    if (f.too_large) {
      return messages_error(
          413, kind + " " + rm.url + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
    if (!f.ok) return messages_error(400, "cannot fetch " + kind + " " + rm.url + ": " + f.error);
    std::vector<uint8_t>& to = !rm.video ? part.image.bytes
                               : whole_video
                                   ? part.video.bytes
                                   : part.video.frames[static_cast<size_t>(rm.frame)].bytes;
    to = std::move(f.body);
  }
  return std::nullopt;
}

// The file:// images, then the file:// videos and frames (only there with
// MediaPolicy::allowed_local_path), each read into its bytes.
std::optional<ApiError> ChatRequestBuilder::read_local(ChatCompletionRequest* r) const {
  const ApiLimits& limits = ctx_.limits;
  auto image = [](ChatPart& part, size_t k) -> std::optional<ApiError> {
    ImageInput& img = part.image;
    if (img.path.empty()) return std::nullopt;
    return read_file_media(&img.path, &img.bytes,
                           "image " + std::to_string(k) + ": the file:// image");
  };
  auto video = [&limits](ChatPart& part, size_t k) -> std::optional<ApiError> {
    VideoInput& v = part.video;
    for (size_t f = 0; f < v.frames.size(); ++f) {
      ImageInput& frame = v.frames[f];
      if (frame.path.empty()) continue;
      std::error_code ec;
      const auto size = std::filesystem::file_size(frame.path, ec);
      if (!ec && frame_bytes(v) + size > limits.max_video_bytes) {
        return frames_over(k, limits.max_video_bytes);
      }
      if (auto e = read_file_media(&frame.path, &frame.bytes,
                                   "video " + std::to_string(k) + ", frame " +
                                       std::to_string(f + 1) + ": the file:// image")) {
        return e;
      }
    }
    if (v.path.empty()) return std::nullopt;
    ImageDecodeLimits read_limits;
    read_limits.max_bytes = static_cast<int64_t>(limits.max_video_bytes);
    return read_file_media(&v.path, &v.bytes, "video " + std::to_string(k) + ": the file:// video",
                           read_limits);
  };
  if (auto e = for_each_part(&r->messages, ChatPart::Type::kImage, image)) return e;
  return for_each_part(&r->messages, ChatPart::Type::kVideo, video);
}

CompletionCall completion_call(const CompletionRequest& r, const Tokenizer& tokenizer) {
  CompletionCall call;
  for (const CompletionRequest::Prompt& p : r.prompts) {
    GenerateRequest g;
    g.prompt_ids = p.is_ids ? p.ids : tokenizer.encode(p.text);
    g.sampling = r.sampling;
    g.max_new_tokens = r.max_tokens;
    g.stop = r.stop;
    g.stop_token_ids = r.stop_token_ids;
    g.ignore_eos = r.ignore_eos;
    g.logprobs = r.logprobs.value_or(-1);
    g.structured = r.structured;
    for (int i = 0; i < r.n; ++i) {
      call.requests.push_back(g);
      seed_choice(i, &call.requests.back().sampling);
    }
    const std::string echo = !r.echo ? "" : p.is_ids ? tokenizer.decode(p.ids) : p.text;
    call.echo.insert(call.echo.end(), r.n, echo);
  }
  call.reply = reply_options(r);
  call.reply.logprobs = r.logprobs.has_value();
  return call;
}

}  // namespace vlm

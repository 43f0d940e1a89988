#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/json_depth.h"
#include "server/api_json.h"
#include "server/base64.h"
#include "tokenizer/chat_json.h"

namespace vlm {
namespace {

// Ordered, so messages and tools are handed to parse_chat_json (and rendered by
// the template's tojson) with the client's key order.
using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

using api_json::dump;
using api_json::listed;

// The request fields, by endpoint. Every field a request carries is one of these, or it is
// refused by name: a parameter that would change the output must never be ignored silently.
// clang-format off
constexpr std::string_view kCommonFields[] = {
    "model", "stream", "stream_options", "max_tokens", "temperature", "top_p", "top_k", "min_p",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop",
    "stop_token_ids", "n", "logit_bias", "ignore_eos", "structured_outputs", "guided_json",
    "guided_regex", "guided_choice", "guided_grammar"};
constexpr std::string_view kChatFields[] = {
    "messages", "tools", "tool_choice", "parallel_tool_calls", "max_completion_tokens",
    "chat_template_kwargs", "include_reasoning", "max_thinking_tokens", "add_generation_prompt",
    "logprobs", "top_logprobs", "response_format", "modalities", "min_pixels", "max_pixels"};
constexpr std::string_view kCompletionFields[] = {"prompt", "echo", "logprobs", "best_of",
                                                  "suffix"};
// Accepted and ignored: they do not change the output.
constexpr std::string_view kNoOpFields[] = {
    "user", "store", "metadata", "service_tier", "safety_identifier", "prompt_cache_key"};
// OpenAI and vLLM parameters that would change the output and are not implemented.
constexpr std::string_view kUnsupportedFields[] = {
    "audio", "prediction", "reasoning_effort", "web_search_options", "functions",
    "function_call", "verbosity", "echo", "skip_special_tokens", "include_stop_str_in_output",
    "min_tokens", "guided_decoding_backend", "guided_whitespace_pattern", "response_format",
    "chat_template",
    "continue_final_message", "use_beam_search", "length_penalty", "prompt_logprobs",
    "truncate_prompt_tokens", "allowed_token_ids", "bad_words", "documents",
    "mm_processor_kwargs", "priority", "return_tokens_as_token_ids",
    "spaces_between_special_tokens", "return_token_ids", "thinking"};
// clang-format on

// 400 for the first field of `body` the endpoint does not read (after the common ones).
template <size_t N>
std::optional<ApiError> check_fields(const ojson& body, const std::string_view (&endpoint)[N]) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& k = it.key();
    if (listed(k, kCommonFields) || listed(k, endpoint) || listed(k, kNoOpFields)) continue;
    if (listed(k, kUnsupportedFields)) {
      return bad_request("'" + k + "' is not supported by this server", k);
    }
    return bad_request("unknown field '" + k + "'", k);
  }
  return std::nullopt;
}

// Field readers: absent and null leave *out untouched; a wrong type or range is
// a 400 naming it.
std::optional<ApiError> read_bool(const ojson& obj, const char* key, const std::string& param,
                                  bool* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return bad_request("'" + param + "' must be a boolean", param);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> read_int(const ojson& obj, const char* key, const std::string& param,
                                 int64_t lo, int64_t hi, std::optional<int64_t>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer()) return bad_request("'" + param + "' must be an integer", param);
  // Unsigned values above int64 range do not fit any of our fields.
  if (it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{INT64_MAX}) {
    return bad_request("'" + param + "' is out of range", param);
  }
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) {
    return bad_request("'" + param + "' must be in [" + std::to_string(lo) + ", " +
                           std::to_string(hi) + "], got " + std::to_string(v),
                       param);
  }
  *out = v;
  return std::nullopt;
}

// Reads a number in [lo, hi] (or (lo, hi] when lo_open).
std::optional<ApiError> read_number(const ojson& obj, const char* key, double lo, bool lo_open,
                                    double hi, std::optional<double>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  const std::string param = key;
  if (!it->is_number()) return bad_request("'" + param + "' must be a number", param);
  const double v = it->get<double>();
  if (!std::isfinite(v) || v > hi || (lo_open ? v <= lo : v < lo)) {
    // Appended piecewise: GCC 12's -Wrestrict misfires on `"(" + std::string`
    // chains.
    std::string range(lo_open ? "(" : "[");
    range.append(ojson(lo).dump()).append(", ");
    range.append(std::isinf(hi) ? std::string("inf") : ojson(hi).dump());
    range.append(std::isinf(hi) ? ")" : "]");
    return bad_request("'" + param + "' must be in " + range + ", got " + it->dump(), param);
  }
  *out = v;
  return std::nullopt;
}

// min_pixels / max_pixels of a resize budget, each at most the server's per-image cap.
std::optional<ApiError> read_pixels(const ojson& obj, const std::string& prefix,
                                    const ApiLimits& limits, std::optional<int64_t>* min_px,
                                    std::optional<int64_t>* max_px) {
  const int64_t kMax = limits.max_image_pixels > 0 ? limits.max_image_pixels : int64_t{1} << 40;
  if (auto e = read_int(obj, "min_pixels", prefix + "min_pixels", 1, kMax, min_px)) return e;
  if (auto e = read_int(obj, "max_pixels", prefix + "max_pixels", 1, kMax, max_px)) return e;
  if (*min_px && *max_px && **min_px > **max_px) {
    return bad_request("'" + prefix + "min_pixels' exceeds max_pixels", prefix + "min_pixels");
  }
  return std::nullopt;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes a file URL path; false on a bad escape or an encoded NUL.
bool percent_decode(std::string_view in, std::string* out) {
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      *out += in[i];
      continue;
    }
    if (i + 2 >= in.size()) return false;
    const int hi = hex_value(in[i + 1]), lo = hex_value(in[i + 2]);
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) return false;
    *out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return true;
}

// True when `p` equals `root` or lies below it, comparing whole path components
// (so /data2 is not under /data).
bool path_under(const fs::path& p, const fs::path& root) {
  auto [root_end, p_it] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  if (root_end == root.end()) return true;
  // weakly_canonical keeps a trailing separator as an empty last component.
  return std::next(root_end) == root.end() && root_end->empty();
}

// Resolves one image or video URL into `path` / `bytes` (or a RemoteMedia entry, `where` with the
// URL). `param` names the part for errors; `kind` is "image" or "video".
std::optional<ApiError> resolve_media_url(const std::string& url, const std::string& param,
                                          const std::string& kind, size_t max_bytes,
                                          const MediaPolicy& media, RemoteMedia where,
                                          std::string* path, std::vector<uint8_t>* bytes,
                                          std::vector<RemoteMedia>* remote) {
  if (url.rfind("data:", 0) == 0) {
    const size_t comma = url.find(',');
    if (comma == std::string::npos) return bad_request("malformed data URL in " + param, param);
    const std::string_view header = std::string_view(url).substr(5, comma - 5);
    if (header.size() < 7 || header.substr(header.size() - 7) != ";base64") {
      return bad_request(
          "data URL in " + param + " must be base64 (data:" + kind + "/...;base64,...)", param);
    }
    const std::string_view payload = std::string_view(url).substr(comma + 1);
    // Checked before decoding so an oversized image is never allocated.
    if (base64_decoded_size(payload) > max_bytes) {
      return ApiError{
          413, "invalid_request_error",
          kind + " in " + param + " is larger than " + std::to_string(max_bytes) + " bytes", param};
    }
    auto decoded = base64_decode(payload);
    if (!decoded.ok()) {
      return bad_request("invalid base64 in " + param + ": " + decoded.status().message(), param);
    }
    *bytes = std::move(decoded).value();
    return std::nullopt;
  }
  if (url.rfind("file://", 0) == 0) {
    if (media.allowed_local_path.empty()) {
      return bad_request("file:// " + kind + " URLs are not enabled on this server (" + param + ")",
                         param);
    }
    std::string_view rest = std::string_view(url).substr(7);
    if (rest.rfind("localhost/", 0) == 0) rest.remove_prefix(9);
    std::string raw;
    if (rest.empty() || rest[0] != '/' || !percent_decode(rest, &raw)) {
      return bad_request("malformed file URL in " + param + " (want file:///absolute/path)", param);
    }
    std::error_code ec;
    const fs::path root = fs::weakly_canonical(media.allowed_local_path, ec);
    if (ec) return ApiError{500, "internal_error", "cannot resolve the allowed media path", ""};
    // Resolves ".." and every symlink of the existing prefix, so neither can
    // escape the root.
    const fs::path p = fs::weakly_canonical(fs::path(raw), ec);
    if (ec || !path_under(p, root)) {
      return bad_request("file URL in " + param + " is outside the allowed directory", param);
    }
    if (!fs::is_regular_file(p, ec)) return bad_request("no such " + kind + " file: " + url, param);
    const auto size = fs::file_size(p, ec);
    if (!ec && size > max_bytes) {
      return ApiError{
          413, "invalid_request_error",
          kind + " in " + param + " is larger than " + std::to_string(max_bytes) + " bytes", param};
    }
    *path = p.string();
    return std::nullopt;
  }
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) {
    if (!media.allow_remote) {
      return bad_request("remote " + kind + " URLs are not enabled on this server; send the " +
                             kind + " as a data:" + kind + "/...;base64 URL (" + param + ")",
                         param);
    }
    where.url = url;
    remote->push_back(std::move(where));
    return std::nullopt;
  }
  return bad_request("unsupported " + kind + " URL in " + param + " (use data:" + kind +
                         "/...;base64,..., file:// or http(s)://)",
                     param);
}

// The URL of an image or video part: part[key] as a string or {"url": string} (`detail` beside it
// is accepted for compatibility: the pixel budget decides), else part[alt] as a string
// (qwen-vl-utils' {"type": "image", "image": url}). Sets *url_param to the field read.
std::optional<ApiError> part_url(const ojson& part, const std::string& param, const char* key,
                                 const char* alt, std::string* url, std::string* url_param) {
  if (auto it = part.find(key); it != part.end()) {
    *url_param = param + "." + key;
    if (it->is_string()) {
      *url = it->get<std::string>();
    } else if (it->is_object() && it->contains("url") && (*it)["url"].is_string()) {
      *url = (*it)["url"].get<std::string>();
      if (auto d = it->find("detail"); d != it->end() && !d->is_null() && !d->is_string()) {
        return bad_request("'" + *url_param + ".detail' must be a string", *url_param + ".detail");
      }
    } else {
      return bad_request("'" + *url_param + "' must be a string or {\"url\": string}", *url_param);
    }
    return std::nullopt;
  }
  if (auto it = part.find(alt); it != part.end() && it->is_string()) {
    *url_param = param + "." + alt;
    *url = it->get<std::string>();
    return std::nullopt;
  }
  return bad_request(
      std::string(alt) + " part " + param + " needs a " + key + " or " + alt + " string", param);
}

// A video part's sampling (fps, min_frames, max_frames) and pixel budget over all its frames
// (min_pixels, max_pixels), on the part or in its video_url object.
std::optional<ApiError> read_video_settings(const ojson& obj, const std::string& prefix,
                                            int64_t max_frames, VideoInput* v) {
  std::optional<double> fps;
  if (auto e = read_number(obj, "fps", 0, true, 1000, &fps)) {
    e->param = prefix + "fps";
    return e;
  }
  if (fps) v->fps = fps;
  std::optional<int64_t> n;
  if (auto e = read_int(obj, "min_frames", prefix + "min_frames", 1, max_frames, &n)) return e;
  if (n) v->min_frames = n;
  n.reset();
  if (auto e = read_int(obj, "max_frames", prefix + "max_frames", 1, max_frames, &n)) return e;
  if (n) v->max_frames = n;
  constexpr int64_t kMax = int64_t{1} << 40;
  n.reset();
  if (auto e = read_int(obj, "min_pixels", prefix + "min_pixels", 1, kMax, &n)) return e;
  if (n) v->min_pixels = n;
  n.reset();
  if (auto e = read_int(obj, "max_pixels", prefix + "max_pixels", 1, kMax, &n)) return e;
  if (n) v->max_pixels = n;
  return std::nullopt;
}

// One image or video part being read: the part as sent, the field that names it, where its
// media goes, and how many images and videos the request holds before it.
struct MediaPart {
  const ojson& json;
  std::string param;  // "messages[i].content[j]"
  RemoteMedia where;  // message and part, for a URL to fetch
  const ApiLimits& limits;
  const MediaPolicy& media;
  int64_t* images;
  int64_t* videos;
  std::vector<RemoteMedia>* remote;
};

// 400 when the request already holds `max` images (or videos): counted once the part's URL is
// known to be there, before anything of it is read.
std::optional<ApiError> count_media(int64_t* count, int64_t max, const char* kind) {
  if (*count >= max) {
    return bad_request(
        std::string("too many ") + kind + "s: at most " + std::to_string(max) + " per request",
        "messages");
  }
  ++*count;
  return std::nullopt;
}

// A video part: its URL, or qwen-vl-utils' list of frames {"type": "video", "video": [url, ...]};
// then its sampling and pixel budget.
std::optional<ApiError> read_video_part(const MediaPart& p, VideoInput* v) {
  const std::string& param = p.param;
  const auto frames = p.json.find("video");
  const bool listed = frames != p.json.end() && frames->is_array();
  std::string url, url_param;
  if (!listed) {
    if (auto e = part_url(p.json, param, "video_url", "video", &url, &url_param)) return e;
  }
  if (auto e = count_media(p.videos, p.limits.max_videos, "video")) return e;
  RemoteMedia where = p.where;
  where.video = true;
  if (listed) {
    if (frames->empty() || frames->size() > static_cast<size_t>(p.limits.max_video_frames)) {
      return bad_request("'" + param + ".video' must list 1 to " +
                             std::to_string(p.limits.max_video_frames) + " frames",
                         param + ".video");
    }
    for (size_t f = 0; f < frames->size(); ++f) {
      const std::string fp = param + ".video[" + std::to_string(f) + "]";
      if (!(*frames)[f].is_string()) return bad_request("'" + fp + "' must be a URL", fp);
      ImageInput& frame = v->frames.emplace_back();
      where.frame = static_cast<int64_t>(f);
      if (auto e = resolve_media_url((*frames)[f].get<std::string>(), fp, "image",
                                     p.limits.max_image_bytes, p.media, where, &frame.path,
                                     &frame.bytes, p.remote)) {
        return e;
      }
    }
  }
  const int64_t max_frames = p.limits.max_video_frames;
  if (auto e = read_video_settings(p.json, param + ".", max_frames, v)) return e;
  if (auto it = p.json.find("video_url"); it != p.json.end() && it->is_object()) {
    if (auto e = read_video_settings(*it, param + ".video_url.", max_frames, v)) return e;
  }
  if (v->min_pixels && v->max_pixels && *v->min_pixels > *v->max_pixels) {
    return bad_request("min_pixels exceeds max_pixels for " + param, param + ".min_pixels");
  }
  if (v->min_frames && v->max_frames && *v->min_frames > *v->max_frames) {
    return bad_request("min_frames exceeds max_frames for " + param, param + ".min_frames");
  }
  if (listed) return std::nullopt;
  where.frame = -1;
  return resolve_media_url(url, url_param, "video", p.limits.max_video_bytes, p.media, where,
                           &v->path, &v->bytes, p.remote);
}

// An image part: its URL and pixel budget (the part's min_pixels / max_pixels over the
// request's).
std::optional<ApiError> read_image_part(const MediaPart& p, const std::optional<int64_t>& min_px,
                                        const std::optional<int64_t>& max_px, ImageInput* img) {
  std::string url, url_param;
  if (auto e = part_url(p.json, p.param, "image_url", "image", &url, &url_param)) return e;
  if (auto e = count_media(p.images, p.limits.max_images, "image")) return e;
  img->min_pixels = min_px;
  img->max_pixels = max_px;
  std::optional<int64_t> part_min, part_max;
  if (auto e = read_pixels(p.json, p.param + ".", p.limits, &part_min, &part_max)) return e;
  if (part_min) img->min_pixels = part_min;
  if (part_max) img->max_pixels = part_max;
  if (img->min_pixels && img->max_pixels && *img->min_pixels > *img->max_pixels) {
    return bad_request("min_pixels exceeds max_pixels for " + p.param, p.param + ".min_pixels");
  }
  return resolve_media_url(url, url_param, "image", p.limits.max_image_bytes, p.media, p.where,
                           &img->path, &img->bytes, p.remote);
}

// Reads every image and video part's media into its ChatPart, in prompt order (the order the
// template renders their pads). parse_chat_json made one part per content entry, so
// messages[i].content[j] is req->messages[i].parts[j].
std::optional<ApiError> collect_media(const ojson& messages, const ApiLimits& limits,
                                      const MediaPolicy& media,
                                      const std::optional<int64_t>& min_px,
                                      const std::optional<int64_t>& max_px,
                                      ChatCompletionRequest* req) {
  int64_t images = 0, videos = 0;
  for (size_t i = 0; i < req->messages.size(); ++i) {
    std::vector<ChatPart>& parts = req->messages[i].parts;
    for (size_t j = 0; j < parts.size(); ++j) {
      ChatPart& part = parts[j];
      if (part.type == ChatPart::Type::kText) continue;
      const MediaPart p{messages[i].at("content")[j],
                        "messages[" + std::to_string(i) + "].content[" + std::to_string(j) + "]",
                        RemoteMedia{i, j, "", false, -1},
                        limits,
                        media,
                        &images,
                        &videos,
                        &req->remote_media};
      if (auto e = part.type == ChatPart::Type::kVideo
                       ? read_video_part(p, &part.video)
                       : read_image_part(p, min_px, max_px, &part.image)) {
        return e;
      }
    }
  }
  return std::nullopt;
}

// vLLM's stop_token_ids: a list of token ids within the vocabulary (when it is known).
std::optional<ApiError> read_token_ids(const ojson& body, const char* key, const ApiLimits& limits,
                                       std::vector<int32_t>* out) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return std::nullopt;
  const std::string param = key;
  if (!it->is_array()) return bad_request("'" + param + "' must be a list of token ids", param);
  for (const ojson& t : *it) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
        (limits.vocab_size > 0 ? t.get<int64_t>() >= limits.vocab_size
                               : t.get<int64_t>() > INT32_MAX)) {
      return bad_request(
          "'" + param + "' must hold token ids in [0, " +
              std::to_string(limits.vocab_size > 0 ? limits.vocab_size : int64_t{INT32_MAX} + 1) +
              "), got " + t.dump(),
          param);
    }
    out->push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}; ids outside the vocabulary are a 400
// that lists them.
std::optional<ApiError> read_logit_bias(const ojson& body, const ApiLimits& limits,
                                        std::vector<std::pair<int32_t, float>>* out) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_object()) {
    return bad_request("'logit_bias' must be an object of token id to bias", "logit_bias");
  }
  std::string bad_keys, out_of_vocab;
  for (auto b = it->begin(); b != it->end(); ++b) {
    const std::string& k = b.key();
    int64_t id = -1;
    const bool digits = !k.empty() && k.size() <= 10 && std::all_of(k.begin(), k.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    if (digits) id = std::stoll(k);
    if (!digits || id > INT32_MAX) {
      bad_keys += (bad_keys.empty() ? "'" : ", '") + k + "'";
      continue;
    }
    if (limits.vocab_size > 0 && id >= limits.vocab_size) {
      out_of_vocab += (out_of_vocab.empty() ? "" : ", ") + k;
      continue;
    }
    if (!b->is_number() || !(b->get<double>() >= -100 && b->get<double>() <= 100)) {
      return bad_request("'logit_bias' values must be numbers in [-100, 100], got " + b->dump() +
                             " for token " + k,
                         "logit_bias");
    }
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(b->get<double>()));
  }
  if (!bad_keys.empty()) {
    return bad_request(
        "'logit_bias' keys must be token ids (non-negative integers), got " + bad_keys,
        "logit_bias");
  }
  if (!out_of_vocab.empty()) {
    return bad_request("'logit_bias' token ids " + out_of_vocab +
                           " are outside the vocabulary of " + std::to_string(limits.vocab_size) +
                           " tokens",
                       "logit_bias");
  }
  return std::nullopt;
}

std::optional<ApiError> read_stop(const ojson& body, std::vector<std::string>* out) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) {
    if (it->get<std::string>().empty()) return bad_request("'stop' must not be empty", "stop");
    out->push_back(it->get<std::string>());
    return std::nullopt;
  }
  if (!it->is_array()) return bad_request("'stop' must be a string or a list of strings", "stop");
  if (it->size() > 4) return bad_request("'stop' takes at most 4 sequences", "stop");
  for (const ojson& s : *it) {
    // An empty stop string would end every reply before its first token.
    if (!s.is_string() || s.get<std::string>().empty()) {
      return bad_request("'stop' must be a list of non-empty strings", "stop");
    }
    out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

// The fields chat and text completions share (model, streaming, budget, sampling, stop, n).
// vLLM's structured_outputs object ({"json" | "regex" | "choice" | "grammar" | "json_object"})
// or its older top-level guided_json / guided_regex / guided_choice / guided_grammar fields: one
// kind per request.
std::optional<ApiError> read_structured_outputs(const ojson& body, StructuredOutput* out) {
  using Kind = StructuredOutput::Kind;
  std::vector<std::pair<std::string, const ojson*>> asked;  // (parameter name, value)
  if (auto so = body.find("structured_outputs"); so != body.end() && !so->is_null()) {
    if (!so->is_object()) {
      return bad_request("'structured_outputs' must be an object", "structured_outputs");
    }
    for (auto it = so->begin(); it != so->end(); ++it) {
      static const std::string_view kKnown[] = {"json", "regex", "choice", "grammar",
                                                "json_object"};
      if (std::find(std::begin(kKnown), std::end(kKnown), it.key()) == std::end(kKnown)) {
        return bad_request("structured_outputs." + it.key() + " is not supported by this server",
                           "structured_outputs");
      }
      if (it->is_null() || (it.key() == "json_object" && *it == false)) continue;
      asked.emplace_back("structured_outputs." + it.key(), &*it);
    }
  }
  for (const char* k : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (auto it = body.find(k); it != body.end() && !it->is_null()) asked.emplace_back(k, &*it);
  }
  if (asked.empty()) return std::nullopt;
  if (asked.size() > 1) {
    return bad_request("only one kind of structured output per request ('" + asked[0].first +
                           "' and '" + asked[1].first + "')",
                       asked[1].first);
  }
  const std::string& param = asked[0].first;
  const ojson& v = *asked[0].second;
  const std::string kind =
      param.substr(param.find('.') != std::string::npos ? param.find('.') + 1
                                                        : std::string_view("guided_").size());
  if (kind == "json") {
    // A schema object, or a schema as JSON text (vLLM takes both).
    if (v.is_string()) {
      const std::string& text = v.get_ref<const std::string&>();
      if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
        return bad_request(
            "'" + param + "' nests deeper than " + std::to_string(kMaxJsonDepth) + " levels",
            param);
      }
      const ojson parsed = ojson::parse(text, nullptr, false);
      if (parsed.is_discarded()) return bad_request("'" + param + "' is not valid JSON", param);
      out->spec = parsed.dump();
    } else if (v.is_object() || v.is_boolean()) {
      out->spec = v.dump();
    } else {
      return bad_request("'" + param + "' must be a JSON Schema", param);
    }
    out->kind = Kind::kJsonSchema;
  } else if (kind == "json_object") {
    if (v != true) return bad_request("'" + param + "' must be true", param);
    out->kind = Kind::kJsonObject;
  } else if (kind == "regex" || kind == "grammar") {
    if (!v.is_string()) return bad_request("'" + param + "' must be a string", param);
    out->spec = v.get<std::string>();
    out->kind = kind == "regex" ? Kind::kRegex : Kind::kGrammar;
  } else {  // choice
    if (!v.is_array() || v.empty()) {
      return bad_request("'" + param + "' must be a non-empty list of strings", param);
    }
    for (const ojson& c : v) {
      if (!c.is_string()) {
        return bad_request("'" + param + "' must be a non-empty list of strings", param);
      }
      out->choices.push_back(c.get<std::string>());
    }
    out->kind = Kind::kChoice;
  }
  return std::nullopt;
}

std::optional<ApiError> parse_common(const ojson& body, const ApiLimits& limits,
                                     CommonRequest* req) {
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) return bad_request("'model' must be a string", "model");
    req->model = it->get<std::string>();
  }
  if (auto e = read_bool(body, "stream", "stream", &req->stream)) return e;
  if (auto so = body.find("stream_options"); so != body.end() && !so->is_null()) {
    if (!req->stream) {
      return bad_request("'stream_options' is only allowed with 'stream': true", "stream_options");
    }
    if (!so->is_object()) {
      return bad_request("'stream_options' must be an object", "stream_options");
    }
    for (auto it = so->begin(); it != so->end(); ++it) {
      if (it.key() != "include_usage" && it.key() != "continuous_usage_stats") {
        return bad_request("'stream_options." + it.key() + "' is not supported by this server",
                           "stream_options." + it.key());
      }
    }
    if (auto e =
            read_bool(*so, "include_usage", "stream_options.include_usage", &req->include_usage)) {
      return e;
    }
    bool continuous = false;
    if (auto e = read_bool(*so, "continuous_usage_stats", "stream_options.continuous_usage_stats",
                           &continuous)) {
      return e;
    }
    // As vLLM: usage in every chunk only when the stream reports usage at all.
    req->continuous_usage = continuous && req->include_usage;
  }

  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  std::optional<int64_t> max_tokens, max_completion_tokens;
  if (auto e = read_int(body, "max_tokens", "max_tokens", 1, kI64Max, &max_tokens)) return e;
  if (auto e = read_int(body, "max_completion_tokens", "max_completion_tokens", 1, kI64Max,
                        &max_completion_tokens)) {
    return e;
  }
  // max_completion_tokens is OpenAI's newer name; it wins when a client sends
  // both.
  if (max_completion_tokens || max_tokens)
    req->max_tokens = max_completion_tokens ? max_completion_tokens : max_tokens;

  SamplingParams& s = req->sampling;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (auto e = read_number(body, "temperature", 0.0, false, 2.0, &s.temperature)) return e;
  if (auto e = read_number(body, "top_p", 0.0, true, 1.0, &s.top_p)) return e;
  if (auto e = read_number(body, "min_p", 0.0, false, 1.0, &s.min_p)) return e;
  if (auto e = read_number(body, "repetition_penalty", 0.0, true, kInf, &s.repetition_penalty)) {
    return e;
  }
  std::optional<double> presence, frequency;
  if (auto e = read_number(body, "presence_penalty", -2.0, false, 2.0, &presence)) return e;
  if (auto e = read_number(body, "frequency_penalty", -2.0, false, 2.0, &frequency)) return e;
  if (presence) s.presence_penalty = *presence;
  if (frequency) s.frequency_penalty = *frequency;
  std::optional<int64_t> top_k;
  if (auto e = read_int(body, "top_k", "top_k", -1, kI64Max, &top_k)) return e;
  if (top_k) s.top_k = *top_k < 0 ? 0 : *top_k;  // vLLM's -1 "off" is our 0
  std::optional<int64_t> seed;
  if (auto e =
          read_int(body, "seed", "seed", std::numeric_limits<int64_t>::min(), kI64Max, &seed)) {
    return e;
  }
  if (seed) s.seed = static_cast<uint64_t>(*seed);

  if (auto e = read_stop(body, &req->stop)) return e;
  if (auto e = read_token_ids(body, "stop_token_ids", limits, &req->stop_token_ids)) return e;
  if (auto e = read_logit_bias(body, limits, &s.logit_bias)) return e;

  std::optional<int64_t> n;
  if (auto e = read_int(body, "n", "n", 1, limits.max_n, &n)) return e;
  if (n) req->n = static_cast<int>(*n);
  if (auto e = read_structured_outputs(body, &req->structured)) return e;
  return read_bool(body, "ignore_eos", "ignore_eos", &req->ignore_eos);
}

// Requests (prompts x n) beyond what the server's queue holds could never be admitted: a 400
// saying so, not a 429 that retrying cannot cure.
std::optional<ApiError> check_queue(int64_t requests, const ApiLimits& limits) {
  if (limits.max_queue > 0 && requests > limits.max_queue) {
    return bad_request("the request needs " + std::to_string(requests) +
                           " sequences (prompts x n) but this server queues at most " +
                           std::to_string(limits.max_queue) + " (--max-waiting)",
                       "n");
  }
  return std::nullopt;
}

// Chat-only parameters that select behaviour this server has one way of: accepted when they ask
// for that way, refused by name otherwise.
std::optional<ApiError> check_chat_modes(const ojson& body) {
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string()) {
      return bad_request("'response_format' must be an object with a string 'type'",
                         "response_format");
    }
    const std::string type = (*rf)["type"].get<std::string>();
    if (type != "text" && type != "json_object" && type != "json_schema") {
      return bad_request(
          "response_format type '" + type + "' is not supported (text, json_object or json_schema)",
          "response_format");
    }
  }
  // tool_choice: "auto" (default) parses the reply's tool calls, "none" leaves them as text,
  // "required" and a named function are enforced by a grammar (read in read_chat_structured).
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
    const bool word = tc->is_string() && (*tc == "auto" || *tc == "none" || *tc == "required");
    const bool named = tc->is_object() && tc->value("type", ojson()) == "function" &&
                       tc->contains("function") && (*tc)["function"].is_object() &&
                       (*tc)["function"].contains("name") && (*tc)["function"]["name"].is_string();
    if (!word && !named) {
      return bad_request("tool_choice " + dump(*tc) +
                             " is not valid (\"auto\", \"none\", \"required\" or {\"type\": "
                             "\"function\", \"function\": {\"name\": ...}})",
                         "tool_choice");
    }
  }
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) {
      return bad_request("'parallel_tool_calls' must be a boolean", "parallel_tool_calls");
    }
  }
  if (auto m = body.find("modalities"); m != body.end() && !m->is_null()) {
    if (*m != ojson::array({"text"})) {
      return bad_request("modalities " + m->dump() + " are not supported (only [\"text\"])",
                         "modalities");
    }
  }
  return std::nullopt;
}

// response_format and tool_choice "required" / named: the chat endpoint's grammars. After
// parse_common (structured_outputs) and with the request's tools read.
std::optional<ApiError> read_chat_structured(const ojson& body, ChatCompletionRequest* req) {
  using Kind = StructuredOutput::Kind;
  StructuredOutput so;
  std::string param;
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    const std::string type = (*rf)["type"].get<std::string>();
    if (type == "json_object") {
      so.kind = Kind::kJsonObject;
      param = "response_format";
      // Some clients put a schema beside json_object: it is used (a JSON object that follows it),
      // never dropped; the engine refuses one it cannot compile.
      if (auto schema = rf->find("schema"); schema != rf->end() && !schema->is_null()) {
        if (!schema->is_object() || schema->value("type", ojson()) != "object") {
          return bad_request(
              "response_format json_object's schema must be a JSON Schema of an object "
              "(\"type\": \"object\"); json_schema takes any other",
              "response_format");
        }
        so.kind = Kind::kJsonSchema;
        so.spec = schema->dump();
      }
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object()) {
        return bad_request("response_format json_schema needs a 'json_schema' object",
                           "response_format");
      }
      auto schema = js->find("schema");
      if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
        return bad_request("response_format.json_schema needs a 'schema' object",
                           "response_format");
      }
      if (auto st = js->find("strict"); st != js->end() && !st->is_null() && !st->is_boolean()) {
        return bad_request("response_format.json_schema.strict must be a boolean",
                           "response_format");
      }
      so.kind = Kind::kJsonSchema;  // strict or not, the schema is enforced
      so.spec = schema->dump();
      param = "response_format";
    }
  }
  auto tc = body.find("tool_choice");
  const bool required = tc != body.end() && *tc == "required";
  const bool named = tc != body.end() && tc->is_object();
  if (required || named) {
    const ojson* tools = nullptr;
    if (auto t = body.find("tools"); t != body.end() && t->is_array() && !t->empty()) tools = &*t;
    if (tools == nullptr) {
      return bad_request("tool_choice " + dump(*tc) + " needs a non-empty 'tools' list",
                         "tool_choice");
    }
    const std::string want = named ? (*tc)["function"]["name"].get<std::string>() : "";
    ojson list = ojson::array();
    for (const ojson& t : *tools) {
      // parse_chat_json has checked each tool's shape: {"type": "function", "function": {...}}.
      const ojson& fn = t.contains("function") ? t["function"] : t;
      if (!fn.is_object() || !fn.contains("name") || !fn["name"].is_string()) continue;
      if (named && fn["name"] != want) continue;
      ojson entry = {{"name", fn["name"]}};
      if (auto p = fn.find("parameters"); p != fn.end() && !p->is_null()) {
        entry["parameters"] = *p;
      }
      list.push_back(std::move(entry));
    }
    if (list.empty()) {
      return bad_request("tool_choice names the function '" + want + "', which is not in 'tools'",
                         "tool_choice");
    }
    if (so.kind != Kind::kNone) {
      return bad_request("tool_choice " + dump(*tc) + " and response_format " +
                             (*body.find("response_format"))["type"].get<std::string>() +
                             " cannot both be enforced",
                         "tool_choice");
    }
    so.kind = Kind::kToolCalls;
    so.spec = list.dump();
    so.parallel_tool_calls = req->parallel_tool_calls && !named;
    param = "tool_choice";
  }
  if (so.kind == Kind::kNone) return std::nullopt;
  if (req->structured.kind != Kind::kNone) {
    return bad_request("'" + param + "' and structured_outputs (or guided_*) cannot both be given",
                       param);
  }
  req->structured = std::move(so);
  return std::nullopt;
}

std::optional<ApiError> parse_into(const ojson& body, const ApiLimits& limits,
                                   const MediaPolicy& media, ChatCompletionRequest* req) {
  if (auto e = check_fields(body, kChatFields)) return e;
  if (auto e = check_chat_modes(body)) return e;
  auto msgs = body.find("messages");
  if (msgs == body.end() || msgs->is_null()) {
    return bad_request("'messages' is required", "messages");
  }
  if (!msgs->is_array() || msgs->empty()) {
    return bad_request("'messages' must be a non-empty list", "messages");
  }
  const ojson* tools = nullptr;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return bad_request("'tools' must be a list", "tools");
    tools = &*t;
  }
  // The tools are a list here, so each error of parse_chat_json is about the messages.
  auto chat = parse_chat_json(*msgs, tools);
  if (!chat.ok()) return bad_request(chat.status().message(), "messages");
  req->messages = std::move(chat->messages);
  req->tools_json = std::move(chat->tools_json);
  if (auto tc = body.find("tool_choice"); tc != body.end() && tc->is_string())
    req->tool_choice_none = tc->get<std::string>() == "none";
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && p->is_boolean())
    req->parallel_tool_calls = p->get<bool>();
  if (auto e = read_bool(body, "add_generation_prompt", "add_generation_prompt",
                         &req->add_generation_prompt)) {
    return e;
  }
  if (auto e = read_bool(body, "include_reasoning", "include_reasoning", &req->include_reasoning))
    return e;
  if (auto e = read_int(body, "max_thinking_tokens", "max_thinking_tokens", 0,
                        std::numeric_limits<int64_t>::max(), &req->max_thinking_tokens)) {
    return e;
  }
  // vLLM's chat_template_kwargs: extra variables for the checkpoint's template
  // (e.g. enable_thinking), passed through as given.
  if (auto k = body.find("chat_template_kwargs"); k != body.end() && !k->is_null()) {
    if (!k->is_object()) {
      return bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    }
    for (auto it = k->begin(); it != k->end(); ++it) {
      static const std::string_view kReserved[] = {
          "messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"};
      if (std::find(std::begin(kReserved), std::end(kReserved), it.key()) != std::end(kReserved)) {
        return bad_request("chat_template_kwargs." + it.key() + " is set by the server",
                           "chat_template_kwargs");
      }
      req->template_kwargs.emplace_back(it.key(), it.value().dump());
    }
  }
  if (auto e = parse_common(body, limits, req)) return e;
  if (auto e = read_chat_structured(body, req)) return e;
  if (auto e = check_queue(req->n, limits)) return e;

  std::optional<int64_t> top_logprobs;
  if (auto e = read_bool(body, "logprobs", "logprobs", &req->logprobs)) return e;
  if (auto e = read_int(body, "top_logprobs", "top_logprobs", 0, 20, &top_logprobs)) return e;
  if (top_logprobs) {
    if (*top_logprobs > 0 && !req->logprobs) {
      return bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs");
    }
    req->top_logprobs = static_cast<int>(*top_logprobs);
  }

  std::optional<int64_t> min_px, max_px;
  if (auto e = read_pixels(body, "", limits, &min_px, &max_px)) return e;
  return collect_media(*msgs, limits, media, min_px, max_px, req);
}

// One prompt of /v1/completions: a string or a non-empty list of token ids.
std::optional<ApiError> read_prompt(const ojson& p, const std::string& param,
                                    CompletionRequest::Prompt* out) {
  if (p.is_string()) {
    out->text = p.get<std::string>();
    return std::nullopt;
  }
  if (!p.is_array() || p.empty()) {
    return bad_request("'" + param + "' must be a string or a non-empty list of token ids", param);
  }
  out->is_ids = true;
  for (const ojson& t : p) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
      return bad_request("'" + param + "' must hold non-negative integer token ids", param);
    }
    out->ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return std::nullopt;
}

std::optional<ApiError> parse_completion_into(const ojson& body, const ApiLimits& limits,
                                              CompletionRequest* req) {
  if (auto e = check_fields(body, kCompletionFields)) return e;
  auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null())
    return bad_request("'prompt' is required", "prompt");
  // A list of strings or of id lists is a batch; a list of integers is one prompt.
  const bool batch = prompt->is_array() && !prompt->empty() && !(*prompt)[0].is_number();
  if (batch) {
    if (prompt->size() > static_cast<size_t>(limits.max_n)) {
      return bad_request("'prompt' takes at most " + std::to_string(limits.max_n) + " prompts",
                         "prompt");
    }
    for (size_t i = 0; i < prompt->size(); ++i) {
      CompletionRequest::Prompt p;
      if (auto e = read_prompt((*prompt)[i], "prompt[" + std::to_string(i) + "]", &p)) return e;
      req->prompts.push_back(std::move(p));
    }
  } else {
    CompletionRequest::Prompt p;
    if (auto e = read_prompt(*prompt, "prompt", &p)) return e;
    req->prompts.push_back(std::move(p));
  }
  req->max_tokens = 16;  // OpenAI's default for this endpoint
  if (auto e = parse_common(body, limits, req)) return e;
  if (req->prompts.size() * static_cast<size_t>(req->n) > static_cast<size_t>(limits.max_n)) {
    return bad_request("prompts x n must not exceed " + std::to_string(limits.max_n), "n");
  }
  if (auto e = check_queue(static_cast<int64_t>(req->prompts.size()) * req->n, limits)) return e;
  if (auto e = read_bool(body, "echo", "echo", &req->echo)) return e;
  std::optional<int64_t> logprobs;
  if (auto e = read_int(body, "logprobs", "logprobs", 0, 20, &logprobs)) return e;
  if (logprobs) req->logprobs = static_cast<int>(*logprobs);
  if (req->echo && req->logprobs) {
    return bad_request("'echo' with 'logprobs' (prompt logprobs) is not supported", "echo");
  }
  if (auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
    return bad_request("'suffix' is not supported", "suffix");
  }
  std::optional<int64_t> best_of;
  if (auto e = read_int(body, "best_of", "best_of", 1, limits.max_n, &best_of)) return e;
  if (best_of && *best_of != req->n)
    return bad_request("'best_of' other than n is not supported", "best_of");
  return std::nullopt;
}

}  // namespace

ApiError bad_request(std::string message, std::string param) {
  return ApiError{400, "invalid_request_error", std::move(message), std::move(param)};
}

std::optional<ApiError> parse_json_object(std::string_view body, nlohmann::ordered_json* out) {
  if (json_nesting_depth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return bad_request(
        "the request JSON nests deeper than " + std::to_string(kMaxJsonDepth) + " levels", "");
  }
  try {
    *out = ojson::parse(body);
  } catch (const ojson::exception& e) {
    // A syntax error names the byte position ("parse error at line 1, column 12: ..."); a number
    // too large for a double (1e400) is an out_of_range.
    return bad_request(std::string("malformed JSON body: ") + e.what(), "");
  }
  if (!out->is_object()) return bad_request("the request body must be a JSON object", "");
  return std::nullopt;
}

const char* api_error_type(int http_status) {
  return http_status == 401   ? "authentication_error"
         : http_status == 404 ? "not_found_error"
         : http_status == 429 ? "rate_limit_error"
         : http_status >= 500 ? "server_error"
                              : "invalid_request_error";
}

ApiError api_error_from(const Status& s) {
  int status = 500;
  switch (s.code()) {
    case StatusCode::kOk:
      status = 200;
      break;
    case StatusCode::kInvalidArgument:
    case StatusCode::kDataLoss:
    case StatusCode::kOutOfRange:
      status = 400;
      break;
    case StatusCode::kNotFound:
      status = 404;
      break;
    case StatusCode::kResourceExhausted:
      status = 429;
      break;
    case StatusCode::kUnavailable:
      status = 503;
      break;
    case StatusCode::kUnimplemented:
      status = 501;
      break;
    case StatusCode::kInternal:
      status = 500;
      break;
  }
  return ApiError{status, api_error_type(status), s.message(), s.field()};
}

std::optional<ApiError> check_model_name(const std::string& model,
                                         const std::vector<std::string>& names) {
  if (model.empty() || std::find(names.begin(), names.end(), model) != names.end()) {
    return std::nullopt;
  }
  return ApiError{404, "not_found_error",
                  "model '" + model + "' is not served here (serving '" +
                      (names.empty() ? std::string() : names.front()) + "')",
                  "model"};
}

std::string api_error_json(const ApiError& e, const std::string& code) {
  ojson err;
  err["message"] = e.message;
  err["type"] = e.type;
  err["param"] = e.param.empty() ? ojson(nullptr) : ojson(e.param);
  err["code"] = code.empty() ? ojson(nullptr) : ojson(code);
  ojson j;
  j["error"] = std::move(err);
  return dump(j);
}

ApiResult<ChatCompletionRequest> parse_chat_completion(std::string_view body,
                                                       const ApiLimits& limits,
                                                       const MediaPolicy& media) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  ChatCompletionRequest req;
  if (auto e = parse_into(j, limits, media, &req)) return *e;
  return req;
}

ApiResult<CompletionRequest> parse_completion(std::string_view body, const ApiLimits& limits) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  CompletionRequest req;
  if (auto e = parse_completion_into(j, limits, &req)) return *e;
  return req;
}

namespace {

// "model", when given, as a string (checked against the served names by the caller).
std::optional<ApiError> read_model(const ojson& j, std::string* model) {
  if (auto m = j.find("model"); m != j.end() && !m->is_null()) {
    if (!m->is_string()) return bad_request("'model' must be a string", "model");
    *model = m->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

ApiResult<TokenizeRequest> parse_tokenize(std::string_view body) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  TokenizeRequest r;
  if (auto e = read_model(j, &r.model)) return *e;
  const bool has_prompt = j.contains("prompt"), has_messages = j.contains("messages");
  if (has_prompt == has_messages) {
    return bad_request("give either 'prompt' (a string) or 'messages' (a chat), not both",
                       has_prompt ? "messages" : "prompt");
  }
  bool add_special = has_prompt;
  if (auto e = read_bool(j, "add_special_tokens", "add_special_tokens", &add_special)) return *e;
  if (auto e = read_bool(j, "return_token_strs", "return_token_strs", &r.return_token_strs)) {
    return *e;
  }
  for (const auto& [key, value] : j.items()) {
    static constexpr std::string_view kKnown[] = {"model",
                                                  "prompt",
                                                  "messages",
                                                  "add_special_tokens",
                                                  "return_token_strs",
                                                  "tools",
                                                  "add_generation_prompt",
                                                  "chat_template_kwargs",
                                                  "min_pixels",
                                                  "max_pixels"};
    if (!listed(key, kKnown)) return bad_request("unknown field '" + key + "'", key);
  }
  if (has_prompt) {
    if (!j["prompt"].is_string()) return bad_request("'prompt' must be a string", "prompt");
    for (const char* k :
         {"tools", "add_generation_prompt", "chat_template_kwargs", "min_pixels", "max_pixels"}) {
      if (j.contains(k)) return bad_request(std::string("'") + k + "' goes with 'messages'", k);
    }
    r.prompt = j["prompt"].get<std::string>();
    return r;
  }
  ojson chat = ojson::object();
  for (const char* k : {"model", "messages", "tools", "add_generation_prompt",
                        "chat_template_kwargs", "min_pixels", "max_pixels"}) {
    if (j.contains(k)) chat[k] = j[k];
  }
  r.chat_body = dump(chat);
  return r;
}

std::string tokenize_json(const std::vector<int32_t>& ids, int64_t max_model_len,
                          const std::vector<std::string>* token_strs) {
  ojson j;
  j["count"] = ids.size();
  j["max_model_len"] = max_model_len;
  j["tokens"] = ids;
  j["token_strs"] = token_strs ? ojson(*token_strs) : ojson(nullptr);
  return dump(j);
}

ApiResult<DetokenizeRequest> parse_detokenize(std::string_view body, int64_t vocab) {
  ojson j;
  if (auto e = parse_json_object(body, &j)) return *e;
  DetokenizeRequest r;
  if (auto e = read_model(j, &r.model)) return *e;
  for (const auto& [key, value] : j.items()) {
    if (key != "model" && key != "tokens") return bad_request("unknown field '" + key + "'", key);
  }
  auto t = j.find("tokens");
  if (t == j.end() || !t->is_array()) {
    return bad_request("'tokens' must be a list of token ids", "tokens");
  }
  for (const ojson& v : *t) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
      return bad_request("'tokens' holds " + dump(v) + ", not a token id of this model (0.." +
                             std::to_string(vocab - 1) + ")",
                         "tokens");
    }
    r.tokens.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return r;
}

std::string detokenize_json(const std::string& prompt) {
  ojson j;
  j["prompt"] = prompt;
  return dump(j);
}

std::string models_list_json(const std::vector<std::string>& ids, int64_t created,
                             int64_t max_model_len) {
  ojson data = ojson::array();
  for (const std::string& id : ids) {
    ojson m;
    m["id"] = id;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "vlm";
    if (max_model_len > 0) m["max_model_len"] = max_model_len;
    data.push_back(std::move(m));
  }
  ojson j;
  j["object"] = "list";
  j["data"] = std::move(data);
  return dump(j);
}

}  // namespace vlm

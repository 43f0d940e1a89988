// The prompts and the arithmetic of Qwen3-VL-Embedding and Qwen3-VL-Reranker (vlm/pooling.h).
#include "vlm/pooling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/utf8.h"

namespace vlm {
namespace {

constexpr std::string_view kImage = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr std::string_view kVideo = "<|vision_start|><|video_pad|><|vision_end|>";
constexpr std::string_view kRerankSystem =
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".";

// Whether the last character of (non-empty) UTF-8 text is Unicode punctuation.
bool ends_in_punctuation(std::string_view s) {
  uint32_t last = 0;
  for (size_t pos = 0; pos < s.size();) last = tok::utf8_next(s, &pos);
  return tok::is_punctuation(last);
}

std::string_view trim(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// A side's parts as the chat template joins them: its videos, images, then its text.
std::string content(const PoolingInput& in) {
  std::string out;
  for (size_t i = 0; i < in.videos.size(); ++i) out += kVideo;
  for (size_t i = 0; i < in.images.size(); ++i) out += kImage;
  out += in.text;
  return out;
}

std::string content_or_null(const PoolingInput& in) {
  const std::string c = content(in);
  return c.empty() ? std::string("NULL") : c;
}

void take_media(PoolingInput& in, GenerateRequest* r) {
  apply_pooling_media_limits(&in);
  for (auto& v : in.videos) r->videos.push_back(std::move(v));
  for (auto& i : in.images) r->images.push_back(std::move(i));
}

}  // namespace

void apply_pooling_media_limits(PoolingInput* in) {
  for (ImageInput& im : in->images) {
    if (!im.min_pixels) im.min_pixels = kPoolingImageMinPixels;
    if (!im.max_pixels) im.max_pixels = kPoolingImageMaxPixels;
  }
  for (VideoInput& v : in->videos) {
    if (v.frames.empty()) {
      if (!v.fps) v.fps = kPoolingVideoFps;
      if (!v.max_frames) v.max_frames = kPoolingVideoMaxFrames;
      continue;
    }
    const auto n = static_cast<int64_t>(v.frames.size());
    if (n > kPoolingVideoMaxFrames) {
      // numpy.linspace(0, n - 1, 64, dtype=int), as numpy computes it: i * step rounded down,
      // the last index n - 1.
      const double step =
          static_cast<double>(n - 1) / static_cast<double>(kPoolingVideoMaxFrames - 1);
      std::vector<ImageInput> kept;
      kept.reserve(kPoolingVideoMaxFrames);
      for (int64_t i = 0; i < kPoolingVideoMaxFrames; ++i) {
        const auto at = i + 1 == kPoolingVideoMaxFrames
                            ? n - 1
                            : static_cast<int64_t>(static_cast<double>(i) * step);
        kept.push_back(std::move(v.frames[static_cast<size_t>(at)]));
      }
      v.frames = std::move(kept);
    }
    // qwen-vl-utils' fetch_video on a list: the count padded to even with the last frame, then
    // each frame within [min, max(min(768·32², total / count · 2), int(1.05 · min))]. Given as
    // the budget over all (even) frames, smart_resize_video's scale is the per-frame one.
    if (v.frames.size() % 2 != 0) v.frames.push_back(v.frames.back());
    const auto even = static_cast<int64_t>(v.frames.size());
    const int64_t frame_max =
        std::max(std::min(kPoolingFrameMaxPixels, kPoolingFramesTotalPixels * 2 / even),
                 kPoolingFrameMinPixels * 105 / 100);
    if (!v.min_pixels) v.min_pixels = kPoolingFrameMinPixels * even;
    if (!v.max_pixels) v.max_pixels = frame_max * even;
  }
}

std::string embedding_prompt(const PoolingInput& in, std::string_view instruction) {
  std::string instr(trim(instruction));
  if (!instr.empty() && !ends_in_punctuation(instr)) instr += '.';
  if (instr.empty()) instr = kEmbedDefaultInstruction;
  return "<|im_start|>system\n" + instr + "<|im_end|>\n<|im_start|>user\n" + content_or_null(in) +
         "<|im_end|>\n<|im_start|>assistant\n";
}

Result<GenerateRequest> embedding_request(const Tokenizer& tok, PoolingInput in,
                                          std::string_view instruction) {
  GenerateRequest r;
  r.prompt_ids = tok.encode(embedding_prompt(in, instruction));
  take_media(in, &r);
  r.pooling.enabled = true;
  return r;
}

std::string rerank_prompt(const PoolingInput& query, const PoolingInput& document,
                          std::string_view instruction) {
  std::string out = "<|im_start|>system\n";
  out += kRerankSystem;
  out += "<|im_end|>\n<|im_start|>user\n<Instruct>: ";
  out += instruction.empty() ? kRerankDefaultInstruction : instruction;
  out += "<Query>:" + content_or_null(query) + "\n<Document>:" + content_or_null(document);
  return out + "<|im_end|>\n<|im_start|>assistant\n";
}

Result<GenerateRequest> rerank_request(const Tokenizer& tok, PoolingInput query,
                                       PoolingInput document, std::string_view instruction) {
  const std::optional<int32_t> no = tok.token_to_id("no"), yes = tok.token_to_id("yes");
  if (!no || !yes) {
    return invalid_argument(
        "the tokenizer has no \"yes\" and \"no\" tokens: not a Qwen reranker's");
  }
  GenerateRequest r;
  r.prompt_ids = tok.encode(rerank_prompt(query, document, instruction));
  // The query's media come first in the prompt, the document's after.
  take_media(query, &r);
  take_media(document, &r);
  r.pooling.enabled = true;
  r.pooling.logit_ids = {*no, *yes};
  return r;
}

Result<std::vector<float>> embedding_from_hidden(std::span<const float> hidden,
                                                 int64_t dimensions) {
  const auto n = static_cast<int64_t>(hidden.size());
  if (dimensions < 0 || dimensions > n) {
    return invalid_argument("dimensions must be between 1 and " + std::to_string(n) + ", got " +
                            std::to_string(dimensions));
  }
  const int64_t d = dimensions == 0 ? n : dimensions;
  std::vector<float> out(hidden.begin(), hidden.begin() + d);
  double sq = 0;
  for (const float v : out) sq += static_cast<double>(v) * v;
  // As torch's F.normalize: divided by max(norm, 1e-12).
  const double norm = std::max(std::sqrt(sq), 1e-12);
  for (float& v : out) v = static_cast<float>(v / norm);
  return out;
}

double rerank_score(std::span<const float> no_yes_logits) {
  if (no_yes_logits.size() != 2) return std::nan("");
  const double x = static_cast<double>(no_yes_logits[1]) - no_yes_logits[0];
  return 1.0 / (1.0 + std::exp(-x));
}

}  // namespace vlm

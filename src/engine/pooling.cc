// The prompts and the arithmetic of Qwen3-VL-Embedding and Qwen3-VL-Reranker (vlm/pooling.h).
#include "vlm/pooling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace vlm {
namespace {

constexpr std::string_view kImage = "<|vision_start|><|image_pad|><|vision_end|>";
constexpr std::string_view kVideo = "<|vision_start|><|video_pad|><|vision_end|>";
constexpr std::string_view kRerankSystem =
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    "provided. Note that the answer can only be \"yes\" or \"no\".";

// The last code point of UTF-8 text (0 when empty or malformed).
char32_t last_code_point(std::string_view s) {
  size_t i = s.size();
  while (i > 0 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i;
  if (i == 0) return 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i - 1;
  const size_t n = s.size() - (i - 1);
  if (p[0] < 0x80) return n == 1 ? p[0] : 0;
  const int len = (p[0] >> 5) == 0x6 ? 2 : (p[0] >> 4) == 0xE ? 3 : (p[0] >> 3) == 0x1E ? 4 : 0;
  if (len == 0 || static_cast<size_t>(len) != n) return 0;
  char32_t c = p[0] & (0x7F >> len);
  for (int k = 1; k < len; ++k) c = (c << 6) | (p[k] & 0x3F);
  return c;
}

// Whether Unicode puts `c` in a punctuation category (P*): ASCII exactly (its $ + < = > ^ ` | ~
// are symbols), and the punctuation of the General Punctuation, CJK and full-width blocks.
bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    constexpr std::string_view p = "!\"#%&'()*,-./:;?@[\\]_{}";
    return p.find(static_cast<char>(c)) != std::string_view::npos;
  }
  if (c == 0xA1 || c == 0xA7 || c == 0xAB || c == 0xB6 || c == 0xB7 || c == 0xBB || c == 0xBF) {
    return true;
  }
  if (c >= 0x2010 && c <= 0x2027) return true;
  if (c >= 0x2030 && c <= 0x205E) return c != 0x2044 && c != 0x2052;  // those two are math
  if ((c >= 0x3001 && c <= 0x3003) || (c >= 0x3008 && c <= 0x3011) ||
      (c >= 0x3014 && c <= 0x301F)) {
    return true;
  }
  if (c >= 0xFF01 && c <= 0xFF65) {        // full-width ASCII punctuation, CJK half-width marks
    const char32_t a = c - 0xFF01 + 0x21;  // its ASCII twin
    if (c >= 0xFF5F) return true;
    return a < 0x80 && is_punctuation(a);
  }
  return false;
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
  for (auto& v : in.videos) r->videos.push_back(std::move(v));
  for (auto& i : in.images) r->images.push_back(std::move(i));
}

}  // namespace

std::string embedding_prompt(const PoolingInput& in, std::string_view instruction) {
  std::string instr(trim(instruction));
  if (!instr.empty() && !is_punctuation(last_code_point(instr))) instr += '.';
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

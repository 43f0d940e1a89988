// vlm public API: the prompts and the arithmetic of Qwen3-VL-Embedding and Qwen3-VL-Reranker, on
// top of pooling requests (GenerateRequest::pooling).
//
// Embedding: the prompt is a system message with the instruction (default "Represent the user's
// input."; a final full stop added when it ends without punctuation), the user's videos, images
// and text in that order ("NULL" when there is nothing), and the generation prompt; the pooled
// hidden state is L2-normalised, or cut to its first `dimensions` values (Matryoshka) and then
// normalised. Reranking: a fixed system message, then "<Instruct>: INSTRUCTION<Query>:QUERY
// \n<Document>:DOCUMENT" (each side's videos, images, then text), and the generation prompt; the
// score is sigmoid(logit("yes") − logit("no")) at the last token.
// Images and videos become one pad each in the prompt (the engine expands them), and the
// request carries them in prompt order.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "vlm/request.h"
#include "vlm/status.h"
#include "vlm/tokenizer.h"

namespace vlm {

// One input of an embedding, or one side of a rerank.
struct PoolingInput {
  std::string text;
  std::vector<ImageInput> images;
  std::vector<VideoInput> videos;
};

inline constexpr std::string_view kEmbedDefaultInstruction = "Represent the user's input.";
inline constexpr std::string_view kRerankDefaultInstruction =
    "Given a search query, retrieve relevant candidates that answer the query.";

// The media limits of the models' own code (its qwen-vl-utils settings), applied by the request
// builders below to what an input leaves unset: an image resized to 4·32² .. 1800·32² pixels; a
// video file sampled at 1 frame a second, at most 64 frames; a video given as frames keeps at
// most 64 of them (evenly spaced, as the models' sample_frames), padded to an even count with
// its last frame, and gets qwen-vl-utils' budget for a list of frames: each frame 128·32² ..
// max(min(768·32², 2·10·768·32² / n), 1.05·128·32²) pixels for n frames (given here as the
// budget over all n frames). A video file keeps the checkpoint's pixel budget.
inline constexpr int64_t kPoolingImageMinPixels = 4 * 32 * 32;
inline constexpr int64_t kPoolingImageMaxPixels = 1800 * 32 * 32;
inline constexpr double kPoolingVideoFps = 1;
inline constexpr int64_t kPoolingVideoMaxFrames = 64;
inline constexpr int64_t kPoolingFrameMinPixels = 128 * 32 * 32;
inline constexpr int64_t kPoolingFrameMaxPixels = 768 * 32 * 32;
inline constexpr int64_t kPoolingFramesTotalPixels = 10 * 768 * 32 * 32;
void apply_pooling_media_limits(PoolingInput* in);

// The prompt text of an embedding (image and video pads single) and the request for it.
std::string embedding_prompt(const PoolingInput& in, std::string_view instruction);
Result<GenerateRequest> embedding_request(const Tokenizer& tok, PoolingInput in,
                                          std::string_view instruction);

// The prompt text of a rerank of `document` for `query`, and the request for it (pooling the
// logits of "no" and "yes", in that order).
std::string rerank_prompt(const PoolingInput& query, const PoolingInput& document,
                          std::string_view instruction);
Result<GenerateRequest> rerank_request(const Tokenizer& tok, PoolingInput query,
                                       PoolingInput document, std::string_view instruction);

// The embedding of a pooled hidden state: its first `dimensions` values (0: all of them),
// L2-normalised. InvalidArgument for dimensions outside [0, hidden.size()].
Result<std::vector<float>> embedding_from_hidden(std::span<const float> hidden,
                                                 int64_t dimensions = 0);
// The reranker's relevance from the pooled logits of "no" and "yes": sigmoid(yes − no).
double rerank_score(std::span<const float> no_yes_logits);

}  // namespace vlm

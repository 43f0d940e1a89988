// The pooling API's requests and replies in vLLM's shapes: POST /v1/embeddings (OpenAI's `input`,
// or vLLM's multimodal `messages`), /v1/score and /v1/rerank (= /rerank, /v2/rerank; Cohere's and
// Jina's `top_n`). Pure functions, no sockets: server/pooling_route turns a parsed request into
// pooling requests for the engine and their results into these replies.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "server/openai_api.h"

namespace vlm {

// One input of a pooling request as the client gave it.
struct PoolingItem {
  enum class Kind { kText, kTokens, kParts };
  Kind kind = Kind::kText;
  std::string text;          // kText
  std::vector<int32_t> ids;  // kTokens: the whole prompt, pooled as it is
  // kParts: chat content parts (text, image_url, video_url), a JSON array, read by the chat
  // route's builder (its media rules); `param` names the field for its errors.
  std::string parts_json;
  std::string param;
  bool single_part = false;  // one part of a side given as {"content": [...]}
};

// At most this many inputs in one request (OpenAI's limit for embeddings).
inline constexpr size_t kMaxPoolingInputs = 2048;

struct EmbeddingsRequest {
  std::string model;
  std::vector<PoolingItem> inputs;  // `input`: each text wrapped in the embedder's prompt
  // `messages` instead: a chat completion body ({"model", "messages", "min_pixels",
  // "max_pixels"}) for the chat builder; its system text is the instruction, its user parts
  // the input.
  std::string chat_body;
  bool base64 = false;      // encoding_format "base64": little-endian float32, base64
  int64_t dimensions = 0;   // Matryoshka: the first `dimensions` values (0: all)
  bool normalize = true;    // vLLM's: false returns the pooled state as it is (cut, not scaled)
  std::string instruction;  // vlm's: the embedder's instruction ("": its default)
};
// `vocab`: token ids given as input must be below it.
ApiResult<EmbeddingsRequest> parse_embeddings(std::string_view body, int64_t vocab);

// /v1/score (queries and documents paired 1:1, 1:N or N:N; the field pairs queries/documents,
// queries/items, data_1/data_2, text_1/text_2) and /v1/rerank (one query, its documents).
struct ScoreRequest {
  std::string model;
  std::vector<PoolingItem> queries;  // one, or as many as documents
  std::vector<PoolingItem> documents;
  // rerank: each result's "document" ({"text": ...} or {"multi_modal": [parts]}), as JSON.
  std::vector<std::string> document_json;
  int64_t top_n = 0;  // rerank: the best top_n results (0: all)
  bool return_documents = true;
  bool use_activation = true;  // vLLM's: false scores with the raw logit difference yes − no
  std::string instruction;     // vlm's: the reranker's instruction ("": its default)
  std::string documents_field = "documents";  // the second side's name, for errors
};
ApiResult<ScoreRequest> parse_score(std::string_view body);
ApiResult<ScoreRequest> parse_rerank(std::string_view body);

// What every pooling reply carries.
struct PoolingReplyInfo {
  std::string id;
  std::string model;
  int64_t created = 0;
  int64_t prompt_tokens = 0;  // all the prompts' tokens (image and video tokens included)
};

// {"id", "object": "list", "created", "model", "data": [{"index", "object": "embedding",
// "embedding"}], "usage"}; each embedding a list of numbers, or its float32 bytes in base64.
std::string embeddings_json(const PoolingReplyInfo& info,
                            const std::vector<std::vector<float>>& embeddings, bool base64);
// {"id", "object": "list", "created", "model", "data": [{"index", "object": "score", "score"}],
// "usage"}.
std::string score_json(const PoolingReplyInfo& info, const std::vector<double>& scores);
// {"id", "model", "usage", "results": [{"index", "document", "relevance_score"}]}, the results
// by score, best first (ties by index), at most top_n of them.
std::string rerank_json(const PoolingReplyInfo& info, const ScoreRequest& request,
                        const std::vector<double>& scores);

}  // namespace vlm

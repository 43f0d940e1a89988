// The pooling routes of `vlm serve --task embed|rerank`: POST /v1/embeddings, /v1/score and
// /v1/rerank (also /rerank, /v2/rerank, /score). A worker thread parses the request
// (server/pooling_api), makes each input's prompt (vlm/pooling.h: the embedder's or the
// reranker's format, media read by the chat route's builder) and submits one pooling request per
// prompt; the engine schedules them as prefill-only work beside any other; the connection's
// strand collects the pooled states as they finish and answers once all have.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/chat_request_builder.h"
#include "server/http_transport.h"
#include "server/pooling_api.h"
#include "server/server_metrics.h"
#include "vlm/engine.h"
#include "vlm/server.h"

namespace vlm {

struct PoolingContext {
  Engine* engine = nullptr;
  ServerMetrics* metrics = nullptr;
  const ChatRequestBuilder* chat_builder = nullptr;  // media parts and `messages`
  std::vector<std::string> model_names;
  ServeTask task = ServeTask::kEmbed;  // kEmbed or kRerank
  std::atomic<int64_t>* next_id = nullptr;
  int64_t max_inputs = 0;  // inputs (prompts) one request may submit: the engine's queue
};

class PoolingRoutes {
 public:
  explicit PoolingRoutes(PoolingContext c) : c_(std::move(c)) {}
  void embeddings(const std::shared_ptr<http::HttpExchange>& ex) const;
  void score(const std::shared_ptr<http::HttpExchange>& ex) const;
  void rerank(const std::shared_ptr<http::HttpExchange>& ex) const;

 private:
  // Score and rerank alike (`parsed`: the body as their parser read it): the prompts of the
  // pairs, then the reply of their scores.
  void score_pairs(const std::shared_ptr<http::HttpExchange>& ex, ApiResult<ScoreRequest> parsed,
                   bool rerank) const;

  PoolingContext c_;
};

}  // namespace vlm

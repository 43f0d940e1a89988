#include "server/pooling_route.h"

#include <chrono>
#include <cmath>
#include <ctime>
#include <functional>
#include <utility>

#include "server/api_response.h"
#include "server/fanout.h"
#include "server/pooling_api.h"
#include "vlm/pooling.h"

namespace vlm {
namespace {

using Clock = std::chrono::steady_clock;
using http::HttpExchange;

// A pooling request's engine request: its stream, as the fan-out keeps it.
struct PoolStream {
  std::unique_ptr<RequestStream> s;
  explicit operator bool() const { return s != nullptr; }
  void cancel() { s->cancel(); }
};

// One HTTP request's pooling requests: the strand keeps each one's final piece (its pooled
// state); once all have come, `finish` makes the reply of them (given their prompt tokens in
// all). A failed one fails the reply and cancels the others.
class PoolingFanout final : public Fanout<PoolStream> {
 public:
  using Finish =
      std::function<ApiResult<std::string>(std::vector<RequestOutput>&, int64_t prompt_tokens)>;
  PoolingFanout(std::shared_ptr<HttpExchange> ex, ServerMetrics& m, Clock::time_point t0,
                Finish finish)
      : Fanout(std::move(ex), m, t0), finish_(std::move(finish)) {}

  // Submits `requests` (each moved to the engine as its turn comes).
  void run(Engine& engine, std::vector<GenerateRequest> requests) {
    start(requests.size(), [&](size_t i, std::function<void()> notify) -> Result<PoolStream> {
      VLM_ASSIGN_OR_RETURN(auto s, engine.submit(std::move(requests[i]), std::move(notify)));
      return PoolStream{std::move(s)};
    });
  }

 private:
  void sized(size_t count) override {
    results_.resize(count);
    remaining_ = count;
  }

  void drain_streams() override {
    RequestOutput p;
    for (size_t i = 0; i < streams_.size(); ++i) {
      while (!results_[i].finished && streams_[i].s->try_next(&p)) {
        if (!p.error.ok()) return fail(api_error_from(p.error));
        if (!p.finished) continue;
        m_.record_finished(p.stats, true);
        results_[i] = std::move(p);
        --remaining_;
      }
    }
    if (remaining_ == 0) answer();
  }

  void answer() {
    set_done(false);
    int64_t prompt = 0, cached = 0;
    for (const RequestOutput& r : results_) {
      prompt += r.stats.prompt_tokens;
      cached += r.stats.cached_tokens;
    }
    ex_->set_usage(prompt, cached, 0);
    ApiResult<std::string> body = finish_(results_, prompt);
    m_.observe_e2e(seconds_since_start());
    if (!body.ok()) {
      m_.requests->inc("failed");
      return ex_->respond(error_response(body.error()));
    }
    m_.requests->inc("ok");
    ex_->respond(json_response(200, std::move(body).value()));
  }

  void fail(const ApiError& e) {
    set_done(true);
    m_.requests->inc("failed");
    ex_->respond(error_response(e));
  }

  Finish finish_;
  // The strand's own.
  std::vector<RequestOutput> results_;
  size_t remaining_ = 0;
};

// The text, images and videos of chat messages' parts, in their order within each kind.
void add_parts(ChatMessage& m, PoolingInput* in) {
  if (m.content_is_text) {
    in->text += m.text;
    return;
  }
  for (ChatPart& p : m.parts) {
    if (p.type == ChatPart::Type::kText) in->text += p.text;
    if (p.type == ChatPart::Type::kImage) in->images.push_back(std::move(p.image));
    if (p.type == ChatPart::Type::kVideo) in->videos.push_back(std::move(p.video));
  }
}

// An error of the chat builder about "messages[0].content…", renamed to the item's field (its
// one part's, when the item is a single part of a {"content": [...]} side).
ApiError renamed(ApiError e, const PoolingItem& it) {
  const std::string prefix = it.single_part ? "messages[0].content[0]" : "messages[0].content";
  if (e.param.rfind(prefix, 0) == 0) e.param = it.param + e.param.substr(prefix.size());
  return e;
}

// A text laid out as a whole prompt already: it begins with <|im_start|> (vLLM's clients of Qwen
// embedders and rerankers format the prompt themselves, and vLLM pools it as it is).
bool preformatted(const PoolingInput& in) {
  return in.images.empty() && in.videos.empty() && in.text.starts_with("<|im_start|>");
}

// A pooling request of `text` tokenized as it is (with the reranker's "no" and "yes" logits).
Result<GenerateRequest> raw_request(const Tokenizer& tok, const std::string& text, bool logits) {
  GenerateRequest r;
  r.prompt_ids = tok.encode(text);
  r.pooling.enabled = true;
  if (logits) {
    const std::optional<int32_t> no = tok.token_to_id("no"), yes = tok.token_to_id("yes");
    if (!no || !yes) return invalid_argument("the tokenizer has no \"yes\" and \"no\" tokens");
    r.pooling.logit_ids = {*no, *yes};
  }
  return r;
}

// An embedding's request: the embedder's prompt around the input, or a preformatted text as is.
Result<GenerateRequest> embed_request(const Tokenizer& tok, PoolingInput in,
                                      const std::string& instruction) {
  if (preformatted(in)) return raw_request(tok, in.text, false);
  return embedding_request(tok, std::move(in), instruction);
}

// A pair's request: the reranker's prompt, or a preformatted query followed by its (text)
// document, as vLLM joins them.
ApiResult<GenerateRequest> pair_request(const Tokenizer& tok, PoolingInput q, PoolingInput d,
                                        const ScoreRequest& req) {
  const std::string& instruction = req.instruction;
  Result<GenerateRequest> g = invalid_argument("");
  if (preformatted(q)) {
    if (!d.images.empty() || !d.videos.empty()) {
      return bad_request(
          "a query laid out as a whole prompt (it begins with <|im_start|>) is joined to its "
          "documents' text: give text documents, or a plain query and vlm writes the prompt",
          req.documents_field);
    }
    if (!instruction.empty()) {
      return bad_request("a query laid out as a whole prompt holds its own instruction",
                         "instruction");
    }
    g = raw_request(tok, q.text + d.text, true);
  } else {
    g = rerank_request(tok, std::move(q), std::move(d), instruction);
  }
  if (!g.ok()) return api_error_from(g.status());
  return std::move(g).value();
}

std::string reply_id(const char* kind, std::atomic<int64_t>* next) {
  return std::string(kind) + "-" + std::to_string((*next)++);
}

// A text input as it is; a parts input through the chat builder (its media rules and errors).
ApiResult<PoolingInput> to_input(const ChatRequestBuilder& builder, const PoolingItem& it) {
  PoolingInput in;
  if (it.kind == PoolingItem::Kind::kText) {
    in.text = it.text;
    return in;
  }
  auto built =
      builder.build(R"({"messages": [{"role": "user", "content": )" + it.parts_json + "}]}");
  if (!built.ok()) return renamed(built.error(), it);
  add_parts(built.value().chat.messages.at(0), &in);
  return in;
}

}  // namespace

void PoolingRoutes::embeddings(const std::shared_ptr<HttpExchange>& ex) const {
  const auto t0 = Clock::now();
  auto reject = [&](const ApiError& e) {
    ex->respond(error_response(e));
    c_.metrics->requests->inc("bad_request");
  };
  if (c_.task != ServeTask::kEmbed) {
    return reject(bad_request(std::string("this server was started with --task ") +
                                  serve_task_name(c_.task) +
                                  ": embeddings need a model served with --task embed",
                              ""));
  }
  auto parsed = parse_embeddings(ex->request().body, c_.engine->vocab_size());
  if (!parsed.ok()) return reject(parsed.error());
  EmbeddingsRequest& r = parsed.value();
  if (auto e = check_model_name(r.model, c_.model_names)) return reject(*e);
  const size_t prompts = r.chat_body.empty() ? r.inputs.size() : 1;
  if (static_cast<int64_t>(prompts) > c_.max_inputs) {
    return reject(bad_request("'input' has " + std::to_string(prompts) +
                                  " entries; this server queues at most " +
                                  std::to_string(c_.max_inputs) + " requests (--max-waiting)",
                              "input"));
  }
  const Tokenizer& tok = *c_.engine->tokenizer();
  std::vector<GenerateRequest> requests;
  if (!r.chat_body.empty()) {
    auto built = c_.chat_builder->build(r.chat_body);
    if (!built.ok()) return reject(built.error());
    PoolingInput in;
    std::string instruction;
    auto& msgs = built.value().chat.messages;
    for (size_t i = 0; i < msgs.size(); ++i) {
      if (msgs[i].role == "system") {
        PoolingInput sys;
        add_parts(msgs[i], &sys);
        if (!sys.images.empty() || !sys.videos.empty()) {
          return reject(bad_request("the system message (the instruction) is text only",
                                    "messages[" + std::to_string(i) + "]"));
        }
        instruction += sys.text;
      } else if (msgs[i].role == "user") {
        add_parts(msgs[i], &in);
      } else {
        return reject(
            bad_request("an embedding's messages are a system message (the "
                        "instruction) and user messages (the input), not '" +
                            msgs[i].role + "'",
                        "messages[" + std::to_string(i) + "].role"));
      }
    }
    auto req = embedding_request(tok, std::move(in), instruction);
    if (!req.ok()) return reject(api_error_from(req.status()));
    requests.push_back(std::move(req).value());
  }
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const PoolingItem& it = r.inputs[i];
    const bool as_is = it.kind == PoolingItem::Kind::kTokens || it.text.starts_with("<|im_start|>");
    if (as_is && !r.instruction.empty()) {
      return reject(bad_request("input " + std::to_string(i) +
                                    " is a whole prompt (token ids, or a text that begins with "
                                    "<|im_start|>): the instruction would not be in it",
                                "instruction"));
    }
    if (it.kind == PoolingItem::Kind::kTokens) {
      GenerateRequest g;
      g.prompt_ids = it.ids;
      g.pooling.enabled = true;
      requests.push_back(std::move(g));
      continue;
    }
    auto req = embed_request(tok, PoolingInput{it.text, {}, {}}, r.instruction);
    if (!req.ok()) return reject(api_error_from(req.status()));
    requests.push_back(std::move(req).value());
  }
  c_.metrics->pooling_requests->inc("embeddings");
  PoolingReplyInfo info{reply_id("embd", c_.next_id), c_.model_names.front(),
                        static_cast<int64_t>(std::time(nullptr)), 0};
  auto finish = [info, dims = r.dimensions, normalize = r.normalize, base64 = r.base64](
                    std::vector<RequestOutput>& outs,
                    int64_t prompt_tokens) mutable -> ApiResult<std::string> {
    info.prompt_tokens = prompt_tokens;
    std::vector<std::vector<float>> embeddings;
    for (RequestOutput& o : outs) {
      std::vector<float>& h = o.pooled_hidden;
      if (h.empty()) return ApiError{500, "server_error", "a prompt pooled no state", ""};
      if (dims > static_cast<int64_t>(h.size())) {
        return bad_request("'dimensions' is " + std::to_string(dims) +
                               "; the model's embeddings have " + std::to_string(h.size()),
                           "dimensions");
      }
      if (!normalize) {
        if (dims > 0) h.resize(static_cast<size_t>(dims));
        embeddings.push_back(std::move(h));
        continue;
      }
      auto e = embedding_from_hidden(h, dims);
      if (!e.ok()) return api_error_from(e.status());
      embeddings.push_back(std::move(e).value());
    }
    return embeddings_json(info, embeddings, base64);
  };
  std::make_shared<PoolingFanout>(ex, *c_.metrics, t0, std::move(finish))
      ->run(*c_.engine, std::move(requests));
}

void PoolingRoutes::score(const std::shared_ptr<HttpExchange>& ex) const {
  score_pairs(ex, parse_score(ex->request().body), false);
}

void PoolingRoutes::rerank(const std::shared_ptr<HttpExchange>& ex) const {
  score_pairs(ex, parse_rerank(ex->request().body), true);
}

// The reranker: one prompt per pair, scored from its "no" and "yes" logits. The embedder: the
// queries' and the documents' embeddings (the instruction for the queries; the documents take
// the default), scored by cosine similarity.
void PoolingRoutes::score_pairs(const std::shared_ptr<HttpExchange>& ex,
                                ApiResult<ScoreRequest> parsed, bool rerank) const {
  const auto t0 = Clock::now();
  auto reject = [&](const ApiError& e) {
    ex->respond(error_response(e));
    c_.metrics->requests->inc("bad_request");
  };
  if (!parsed.ok()) return reject(parsed.error());
  ScoreRequest req = std::move(parsed).value();
  if (auto e = check_model_name(req.model, c_.model_names)) return reject(*e);
  const size_t pairs = req.documents.size();
  const bool cross = c_.task == ServeTask::kRerank;
  const size_t prompts = cross ? pairs : req.queries.size() + pairs;
  if (static_cast<int64_t>(prompts) > c_.max_inputs) {
    return reject(bad_request("the request makes " + std::to_string(prompts) +
                                  " prompts; this server queues at most " +
                                  std::to_string(c_.max_inputs) + " requests (--max-waiting)",
                              req.documents_field));
  }
  const Tokenizer& tok = *c_.engine->tokenizer();
  std::vector<PoolingInput> queries, documents;
  for (const PoolingItem& it : req.queries) {
    auto in = to_input(*c_.chat_builder, it);
    if (!in.ok()) return reject(in.error());
    queries.push_back(std::move(in).value());
  }
  for (const PoolingItem& it : req.documents) {
    auto in = to_input(*c_.chat_builder, it);
    if (!in.ok()) return reject(in.error());
    documents.push_back(std::move(in).value());
  }
  std::vector<GenerateRequest> requests;
  for (size_t i = 0; cross && i < pairs; ++i) {
    PoolingInput q = queries.size() == 1 ? queries[0] : std::move(queries[i]);
    auto g = pair_request(tok, std::move(q), std::move(documents[i]), req);
    if (!g.ok()) return reject(g.error());
    requests.push_back(std::move(g).value());
  }
  if (!cross) {
    if (!req.instruction.empty() && !queries.empty() && preformatted(queries[0])) {
      return reject(bad_request("a query laid out as a whole prompt holds its own instruction",
                                "instruction"));
    }
    for (auto* side : {&queries, &documents}) {
      for (PoolingInput& in : *side) {
        auto g = embed_request(tok, std::move(in), side == &queries ? req.instruction : "");
        if (!g.ok()) return reject(api_error_from(g.status()));
        requests.push_back(std::move(g).value());
      }
    }
  }
  c_.metrics->pooling_requests->inc(rerank ? "rerank" : "score");
  // Only what the reply needs: the documents' echo (not their parts' JSON, media included).
  ScoreRequest echo;
  echo.use_activation = req.use_activation;
  echo.top_n = req.top_n;
  echo.return_documents = req.return_documents;
  echo.document_json = std::move(req.document_json);
  PoolingReplyInfo info{reply_id(rerank ? "rerank" : "score", c_.next_id), c_.model_names.front(),
                        static_cast<int64_t>(std::time(nullptr)), 0};
  const size_t nq = queries.size();
  auto finish = [info, cross, nq, pairs, rerank, req = std::move(echo)](
                    std::vector<RequestOutput>& outs,
                    int64_t prompt_tokens) mutable -> ApiResult<std::string> {
    info.prompt_tokens = prompt_tokens;
    const ApiError broken{500, "server_error", "a prompt pooled no state of the expected size", ""};
    std::vector<double> scores;
    for (size_t i = 0; i < pairs; ++i) {
      if (cross) {
        const std::vector<float>& l = outs[i].pooled_logits;
        if (l.size() != 2) return broken;
        scores.push_back(req.use_activation
                             ? rerank_score(l)
                             : static_cast<double>(l[1]) - static_cast<double>(l[0]));
        continue;
      }
      const std::vector<float>& a = outs[nq == 1 ? 0 : i].pooled_hidden;
      const std::vector<float>& b = outs[nq + i].pooled_hidden;
      if (a.empty() || a.size() != b.size()) return broken;
      double dot = 0, na = 0, nb = 0;
      for (size_t k = 0; k < a.size(); ++k) {
        dot += static_cast<double>(a[k]) * b[k];
        na += static_cast<double>(a[k]) * a[k];
        nb += static_cast<double>(b[k]) * b[k];
      }
      scores.push_back(na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : 0.0);
    }
    return rerank ? rerank_json(info, req, scores) : score_json(info, scores);
  };
  std::make_shared<PoolingFanout>(ex, *c_.metrics, t0, std::move(finish))
      ->run(*c_.engine, std::move(requests));
}

}  // namespace vlm

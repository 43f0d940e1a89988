// `vlm serve`: the OpenAI API over the event-driven transport (server/http_transport); routing
// and the glue between the transport and the engine. Worker threads build each request
// (server/chat_request_builder) and submit its choices (the engine renders, tokenizes and stages
// the media there); the engine thread schedules, runs and samples; its wake-ups are posted to the
// request's connection, which reads the choices' streams (detokenizing there) and writes what a
// ReplyWriter (server/chat_reply_writer) makes of them: JSON or server-sent events
// (docs/architecture.md, "Serving").
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <thread>

#include "engine/chat_output_parser.h"
#include "server/api_response.h"
#include "server/chat_reply_writer.h"
#include "server/chat_request_builder.h"
#include "server/fanout.h"
#include "server/http_client.h"
#include "server/http_transport.h"
#include "server/kv_event_publisher.h"
#include "server/openai_api.h"
#include "server/pooling_route.h"
#include "server/response_store.h"
#include "server/responses_api.h"
#include "server/router_api.h"
#include "server/server_metrics.h"
#include "server/web_ui.h"
#include "vlm/chat.h"
#include "vlm/log.h"
#include "vlm/server.h"

namespace vlm {
namespace {

using Clock = std::chrono::steady_clock;
using http::HttpExchange;
using http::HttpResponse;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

// Server's friend: names its private parts for this file.
struct ServerAccess {
  using Impl = Server::Impl;
};
using ServerImpl = ServerAccess::Impl;

struct Server::Impl {
  ServeOptions opts;
  // Before the transport, so destroyed after it: connections torn down with it still count
  // their outcome.
  std::unique_ptr<ServerMetrics> metrics;
  // The Responses API's stored responses (the replies being written keep theirs here).
  std::unique_ptr<ResponseStore> response_store;
  // Declared before the members below, so destroyed after them: connections still being torn
  // down may hold callbacks into them only until the engine (whose thread calls them) is gone.
  std::unique_ptr<http::HttpServer> http;
  // The engine thread hands it the KV events: it outlives the engine.
  std::unique_ptr<KvEventPublisher> kv_events;
  std::unique_ptr<Engine> engine;
  // Loading runs on `loader`; `ready` turns true once the engine exists (then it never
  // changes), so handlers check it before touching it.
  std::thread loader;
  std::atomic<bool> ready{false};
  std::atomic<bool> draining{false};
  std::mutex load_mu;
  std::condition_variable load_cv;
  bool load_done = false;
  Status load_status;
  std::unique_ptr<boost::asio::signal_set> signals;
  std::unique_ptr<boost::asio::steady_timer> drain_timer;
  Clock::time_point drain_deadline;
  std::string model_name;                // the first of model_names
  std::string system_fingerprint;        // what every reply says it ran on (describe_replica)
  std::vector<std::string> model_names;  // every name a request may use
  int64_t created = 0;
  std::atomic<int64_t> next_id{1};
  ApiLimits limits;
  MediaPolicy media;
  ReplicaInfo replica;  // /server_info, /model_info, /v1/loads; set by load() before `ready`
  std::mutex loads_mu;  // the previous /v1/loads poll, for its generation rate
  double loads_generated = 0;
  Clock::time_point loads_polled{};

  // Set by load() before `ready`: the chat route's requests are checked against the engine.
  std::unique_ptr<ChatRequestBuilder> chat_builder;
  // Set by load() before `ready`: what the server does (never kAuto), and with kEmbed or kRerank
  // the pooling routes.
  ServeTask task = ServeTask::kGenerate;
  std::unique_ptr<PoolingRoutes> pooling;

  void reply_error(HttpExchange& ex, const ApiError& e, const char* outcome) {
    ex.respond(error_response(e));
    metrics->requests->inc(outcome);
  }

  // The loader thread: the engine, then what depends on it; `ready` once all of it is there.
  void load() {
    if (opts.before_load) opts.before_load();
    const Status st = load_engine();
    ready = st.ok();
    std::lock_guard<std::mutex> lock(load_mu);
    load_status = st;
    load_done = true;
    load_cv.notify_all();
  }

  Status load_engine() {
    EngineOptions eo = opts.engine;
    eo.on_step = [h = metrics->step_time](double s) { h->observe(s); };
    eo.on_encode = [n = metrics->encoder_slices, t = metrics->encoder_time](int64_t slices,
                                                                            double s) {
      n->observe(static_cast<double>(slices));
      t->observe(s);
    };
    if (!opts.kv_events.endpoint.empty()) {
      if (!eo.batching.prefix_caching) {
        return invalid_argument("KV events describe the prefix cache, which is off");
      }
      VLM_ASSIGN_OR_RETURN(kv_events, KvEventPublisher::start(opts.kv_events));
      eo.batching.on_kv_events = [p = kv_events.get()](KvEventBatch b) {
        p->publish(std::move(b));
      };
    }
    // The task first: an embedding server's engine only pools (an embedding checkpoint may
    // lack lm_head).
    // What the checkpoint says: the task with --task auto; with --task embed, a pooling mode
    // other than the last token's is still refused.
    const Result<ServeTask> said = detect_serve_task(opts.engine.model_dir);
    const bool pools_here = opts.task == ServeTask::kAuto || opts.task == ServeTask::kEmbed;
    if (!said.ok() && pools_here) return said.status();
    task = opts.task == ServeTask::kAuto ? *said : opts.task;
    if (task != ServeTask::kGenerate && opts.engine.device == Device::kCuda) {
      return unimplemented(std::string("--task ") + serve_task_name(task) +
                           ": pooling runs on the CPU only for now (--device cpu)");
    }
    eo.pooling_only = task == ServeTask::kEmbed;
    VLM_ASSIGN_OR_RETURN(engine, Engine::load(eo));
    for (const std::string& n : engine->load_notes()) log_printf(LogLevel::kInfo, "%s", n.c_str());
    if (engine->tokenizer() == nullptr)
      return not_found("the model has no tokenizer (tokenizer.json, or a GGUF file's)");
    // The checkpoint's template (or --chat-template): one that does not parse or render fails
    // the load, never falls back silently.
    VLM_ASSIGN_OR_RETURN(const ChatTemplate* tpl, engine->chat_template());
    log_printf(LogLevel::kInfo, "chat template: %s", tpl->origin().c_str());
    limits.vocab_size = engine->vocab_size();  // set before `ready`, read after it
    chat_builder = make_chat_builder();
    VLM_RETURN_IF_ERROR(start_pooling());
    const Engine::CoreStats st = engine->core_stats();
    log_printf(LogLevel::kInfo, "KV cache: %lld blocks of %lld tokens = %lld tokens, %s, %.1f MiB",
               static_cast<long long>(st.kv_blocks_total), static_cast<long long>(st.kv_block_size),
               static_cast<long long>(st.kv_blocks_total * st.kv_block_size),
               kv_cache_dtype_name(st.kv_cache_dtype),
               static_cast<double>(st.kv_cache_bytes) / (1 << 20));
    if (st.state_slots > 0 && st.state_snapshots == 0) {
      log_printf(LogLevel::kInfo,
                 "linear-attention state: %lld slots of %.1f MiB (no prefix caching)",
                 static_cast<long long>(st.state_slots),
                 static_cast<double>(st.state_slot_bytes) / (1 << 20));
    } else if (st.state_slots > 0) {
      const double kib = static_cast<double>(st.state_slot_bytes) / 1024;
      log_printf(LogLevel::kInfo,
                 "linear-attention state: %lld slots and %lld prefix-cache snapshots (every "
                 "%lld tokens) of %.1f %s each (reserved: resident as used)",
                 static_cast<long long>(st.state_slots), static_cast<long long>(st.state_snapshots),
                 static_cast<long long>(st.state_snapshot_interval), kib >= 1024 ? kib / 1024 : kib,
                 kib >= 1024 ? "MiB" : "KiB");
    }
    const int64_t spec_states =
        st.state_memory_bytes - (st.state_slots + st.state_snapshots) * st.state_slot_bytes;
    if (spec_states > 0) {
      log_printf(LogLevel::kInfo, "speculative decoding's states: %.1f MiB",
                 static_cast<double>(spec_states) / (1 << 20));
    }
    metrics->loaded(st, st.prefix_caching);
    describe_replica(st);
    return ok_status();
  }

  // For embed and rerank (`task`, set before the engine loads), the pooling routes; a reranker
  // needs its "no" and "yes" tokens.
  Status start_pooling() {
    if (task == ServeTask::kGenerate) return ok_status();
    const Tokenizer& tok = *engine->tokenizer();
    if (task == ServeTask::kRerank && (!tok.token_to_id("yes") || !tok.token_to_id("no"))) {
      return invalid_argument(
          "--task rerank: the tokenizer has no \"yes\" and \"no\" tokens, which a Qwen "
          "reranker scores");
    }
    log_printf(LogLevel::kInfo, "task: %s (%s)", serve_task_name(task),
               task == ServeTask::kEmbed ? "/v1/embeddings; /v1/score, /v1/rerank by cosine"
                                         : "/v1/score, /v1/rerank");
    PoolingContext c;
    c.engine = engine.get();
    c.metrics = metrics.get();
    c.chat_builder = chat_builder.get();
    c.model_names = model_names;
    c.task = task;
    c.next_id = &next_id;
    c.max_inputs = opts.engine.batching.max_waiting;
    pooling = std::make_unique<PoolingRoutes>(std::move(c));
    return ok_status();
  }

  // The chat route's requests, checked against the limits (the loaded vocabulary's among them);
  // remote media fetched within ServeOptions::remote_media_timeout_s.
  std::unique_ptr<ChatRequestBuilder> make_chat_builder() const {
    ChatRequestContext c;
    c.limits = limits;
    c.media = media;
    c.model_names = model_names;
    c.fetch = [timeout_s = opts.remote_media_timeout_s](const std::string& url, size_t max_bytes) {
      return http::fetch_url(url, max_bytes, timeout_s);
    };
    return std::make_unique<ChatRequestBuilder>(std::move(c));
  }

  // What /server_info, /model_info and /v1/loads say of this replica.
  void describe_replica(const Engine::CoreStats& st) {
    replica.model_path = opts.engine.model_dir;
    replica.served_model_name = model_name;
    read_model_config(opts.engine.model_dir, &replica);
    replica.version = std::string("vlm ") + VLM_VERSION;
    replica.has_vision = engine->has_vision();
    replica.context_length = engine->max_context();
    replica.max_total_tokens = st.kv_blocks_total * st.kv_block_size;
    replica.max_running_requests = opts.engine.batching.max_num_seqs;
    // OpenAI's system_fingerprint: FNV-1a (64 bits) of the version and what the engine runs.
    const std::string config = replica.version + "|" + opts.engine.model_dir + "|" +
                               engine->device() + "|" + cpu_isa_name(engine->cpu_isa()) + "|" +
                               engine->cpu_kernel_choice() + "|" + quant_name(engine->quant()) +
                               "|" + std::to_string(opts.engine.int4_group) + "|" +
                               std::to_string(static_cast<int>(opts.engine.kv_cache_dtype)) + "|" +
                               std::to_string(engine->max_context());
    uint64_t h = 14695981039346656037ull;
    for (unsigned char c : config) h = (h ^ c) * 1099511628211ull;
    char fp[24];
    std::snprintf(fp, sizeof(fp), "fp_%016llx", static_cast<unsigned long long>(h));
    system_fingerprint = fp;
  }

  // Before an API request's body is read: loading or draining (503, and close while draining),
  // then the API key (401, compared in constant time).
  std::optional<HttpResponse> gate(const http::HttpRequest& head) {
    if (draining) {
      HttpResponse r =
          error_response(ApiError{503, "server_error", "the server is shutting down", ""});
      r.close = true;
      metrics->requests->inc("rejected");
      return r;
    }
    if (!ready) {
      return error_response(ApiError{503, "server_error", "the model is loading", ""});
    }
    if (!opts.api_key.empty() &&
        !http::constant_time_equal(head.header("Authorization"), "Bearer " + opts.api_key)) {
      metrics->requests->inc("unauthorized");
      return error_response(ApiError{401, "authentication_error", "missing or wrong API key", ""});
    }
    return std::nullopt;
  }

  // /health: 200 only while loaded, not draining, and the engine loop beats.
  HttpResponse health() const {
    auto status = [](int code, const std::string& s, const std::string& reason = "") {
      std::string body = "{\"status\": \"" + s + "\"";
      if (!reason.empty()) body += ", \"reason\": \"" + reason + "\"";
      HttpResponse r = json_response(code, body + "}");
      if (code != 200) r.headers.push_back({"Retry-After", "1"});
      return r;
    };
    if (!ready) return status(503, "loading");
    if (draining) return status(503, "draining");
    const double silent = seconds_since(engine->last_heartbeat());
    if (silent > opts.health_timeout_s) {
      return status(503, "unhealthy",
                    "the engine loop has made no progress for " +
                        std::to_string(static_cast<int>(silent)) + " s");
    }
    return status(200, "ok");
  }

  void scrape_metrics() {
    metrics->scrape(http->open_connections(), http->rejected_connections(),
                    ready ? engine.get() : nullptr);
  }
  std::string loads();  // GET /v1/loads
  // A generation request to a pooling server: answered with a 400 (true).
  bool pooling_task_refuses(HttpExchange& ex) {
    if (!pooling) return false;
    reply_error(ex,
                ApiError{400, "invalid_request_error",
                         std::string("this server was started with --task ") +
                             serve_task_name(task) + " and generates no text: it answers " +
                             (task == ServeTask::kEmbed ? "/v1/embeddings, " : "") +
                             "/v1/score and /v1/rerank",
                         ""},
                "bad_request");
    return true;
  }
  void chat(const std::shared_ptr<HttpExchange>& ex);
  void completions(const std::shared_ptr<HttpExchange>& ex);
  void responses(const std::shared_ptr<HttpExchange>& ex);
  void stored_response(const std::shared_ptr<HttpExchange>& ex);  // GET / DELETE
  void tokenize(const std::shared_ptr<HttpExchange>& ex);
  void detokenize(const std::shared_ptr<HttpExchange>& ex);
  void register_routes();
  void begin_drain();
  void check_drained();
};

namespace {

// One choice's stream: the engine's own (/v1/completions: the text is the content) or a chat
// stream (its text split into reasoning, content and tool calls as it is taken).
struct ChoiceStream {
  std::unique_ptr<RequestStream> raw;
  std::unique_ptr<ChatStream> chat;
  bool try_next(ChatChunk* out) {
    if (chat) return chat->try_next(out);
    RequestOutput p;
    if (!raw->try_next(&p)) return false;
    *out = ChatChunk{};
    out->delta.content = std::move(p.text);
    take_piece(std::move(p), out);
    return true;
  }
  void cancel() {
    if (chat) chat->cancel();
    if (raw) raw->cancel();
  }
  explicit operator bool() const { return raw || chat; }
};

// A chat's or a completion's choices (n, and prompts for /v1/completions): the strand takes each
// stream's pieces (text and logprob entries, made there by the stream), records the latency
// metrics and writes what the ReplyWriter makes of them.
class ChatFanout final : public Fanout<ChoiceStream> {
 public:
  ChatFanout(std::shared_ptr<HttpExchange> ex, ServerMetrics& m, Clock::time_point t0,
             std::unique_ptr<ReplyWriter> writer)
      : Fanout(std::move(ex), m, t0), writer_(std::move(writer)) {}

 private:
  void sized(size_t count) override { last_token_.resize(count); }

  void started() override {
    if (!writer_->streaming()) return;
    ex_->start_stream(200, "text/event-stream");
    if (std::string begin = writer_->begin(); !begin.empty()) ex_->write(std::move(begin));
  }

  // Every piece that is ready, in one write.
  void drain_streams() override {
    std::string out;
    ChatChunk piece;
    for (size_t i = 0; i < streams_.size(); ++i) {
      while (!writer_->finished(i) && streams_[i].try_next(&piece)) {
        if (!handle(i, piece, &out)) return;
      }
    }
    if (!out.empty()) ex_->write(std::move(out));
  }

  // Choice i's piece: its latency metrics, then its part of the reply. False once the reply is
  // complete (or failed).
  bool handle(size_t i, const ChatChunk& p, std::string* out) {
    if (!p.error.ok()) {
      fail(api_error_from(p.error), out);
      return false;
    }
    if (p.token_id >= 0) {
      const auto now = Clock::now();
      if (!any_token_) {
        m_.observe_ttft(seconds_since_start());
        ex_->mark_first_token();
      }
      if (last_token_[i])
        m_.observe_itl(std::chrono::duration<double>(now - *last_token_[i]).count());
      any_token_ = true;
      last_token_[i] = now;
    }
    *out += writer_->add(i, p);
    if (!p.finished) return true;
    m_.record_finished(p.stats);
    if (!writer_->done()) return true;
    const Usage u = writer_->usage();  // the reply's own usage, for the access log
    ex_->set_usage(u.prompt_tokens, u.cached_tokens, u.completion_tokens);
    set_done(false);
    m_.observe_e2e(seconds_since_start());
    m_.requests->inc("ok");
    if (writer_->streaming()) {
      *out += writer_->end();
      ex_->write(std::move(*out));
      ex_->finish();
    } else {
      ex_->respond(json_response(200, writer_->end()));
    }
    return false;
  }

  // A choice failed: the others are cancelled, and the error is the reply (or, streaming, its
  // last event).
  void fail(const ApiError& e, std::string* out) {
    set_done(true);
    m_.requests->inc("failed");
    if (writer_->streaming()) {
      *out += writer_->stream_error(e);
      ex_->write(std::move(*out));
      ex_->finish();
    } else {
      ex_->respond(error_response(e));
    }
  }

  std::unique_ptr<ReplyWriter> writer_;  // the strand's own
  // The strand's own: when each choice's last token came, and whether any has come.
  std::vector<std::optional<Clock::time_point>> last_token_;
  bool any_token_ = false;
};

}  // namespace

std::string Server::Impl::loads() {
  const Engine::CoreStats st = engine->core_stats();
  ReplicaLoad load;
  load.running = st.running;
  load.waiting = st.waiting;
  load.used_tokens = st.kv_blocks_used * st.kv_block_size;
  load.cache_hit_rate =
      st.prefix_cache_queries > 0
          ? static_cast<double>(st.prefix_cache_hits) / static_cast<double>(st.prefix_cache_queries)
          : 0.0;
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(loads_mu);
    const double generated = metrics->generated_tokens->value();
    const double dt = std::chrono::duration<double>(now - loads_polled).count();
    if (loads_polled != Clock::time_point{} && dt > 0) {
      load.gen_throughput = (generated - loads_generated) / dt;
    }
    loads_generated = generated;
    loads_polled = now;
  }
  const auto wall = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(wall);
  const int64_t us =
      std::chrono::duration_cast<std::chrono::microseconds>(wall.time_since_epoch()).count() %
      1000000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char stamp[48];
  std::snprintf(stamp, sizeof stamp, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                static_cast<long long>(us));
  return loads_json(replica, load, stamp);
}

void Server::Impl::register_routes() {
  using http::RunOn;
  auto api_gate = [this](const http::HttpRequest& head) { return gate(head); };
  http->route("GET", "/health", RunOn::kIoThread,
              [this](std::shared_ptr<HttpExchange> ex) { ex->respond(health()); });
  http->route("GET", "/metrics", RunOn::kIoThread, [this](std::shared_ptr<HttpExchange> ex) {
    scrape_metrics();
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = metrics->registry.render();
    ex->respond(std::move(r));
  });
  http->route(
      "GET", "/v1/models", RunOn::kIoThread,
      [this](std::shared_ptr<HttpExchange> ex) {
        ex->respond(
            json_response(200, models_list_json(model_names, created, replica.context_length)));
      },
      api_gate);
  // SGLang's worker endpoints, which smg reads to register a replica and balance by load.
  http->route(
      "GET", "/server_info", RunOn::kIoThread,
      [this](std::shared_ptr<HttpExchange> ex) {
        ex->respond(json_response(200, server_info_json(replica)));
      },
      api_gate);
  http->route(
      "GET", "/model_info", RunOn::kIoThread,
      [this](std::shared_ptr<HttpExchange> ex) {
        ex->respond(json_response(200, model_info_json(replica)));
      },
      api_gate);
  http->route(
      "GET", "/v1/loads", RunOn::kIoThread,
      [this](std::shared_ptr<HttpExchange> ex) { ex->respond(json_response(200, loads())); },
      api_gate);
  if (opts.webui) {
    // The chat page, the dashboard and their scripts; the dashboard polls /dashboard/metrics,
    // the registry /metrics renders, as JSON (no API key, like /metrics).
    for (const WebAsset& a : web_assets()) {
      http->route("GET", std::string(a.path), RunOn::kIoThread,
                  [&a](std::shared_ptr<HttpExchange> ex) { ex->respond(web_asset_response(a)); });
    }
    http->route("GET", "/dashboard/metrics", RunOn::kIoThread,
                [this](std::shared_ptr<HttpExchange> ex) {
                  scrape_metrics();
                  HttpResponse r = json_response(200, metrics->registry.render_json());
                  r.headers.push_back({"Cache-Control", "no-store"});
                  ex->respond(std::move(r));
                });
  }
  http->route(
      "POST", "/v1/chat/completions", RunOn::kWorker,
      [this](std::shared_ptr<HttpExchange> ex) {
        if (!pooling_task_refuses(*ex)) chat(ex);
      },
      api_gate);
  http->route(
      "POST", "/v1/completions", RunOn::kWorker,
      [this](std::shared_ptr<HttpExchange> ex) {
        if (!pooling_task_refuses(*ex)) completions(ex);
      },
      api_gate);
  http->route(
      "POST", "/v1/responses", RunOn::kWorker,
      [this](std::shared_ptr<HttpExchange> ex) {
        if (!pooling_task_refuses(*ex)) responses(ex);
      },
      api_gate);
  for (const char* method : {"GET", "DELETE"}) {
    http->route(
        method, "/v1/responses/*", RunOn::kIoThread,
        [this](std::shared_ptr<HttpExchange> ex) { stored_response(ex); }, api_gate);
  }
  // The pooling routes (vLLM's paths); a generating server refuses them.
  using PoolingHandler = void (PoolingRoutes::*)(const std::shared_ptr<HttpExchange>&) const;
  const std::pair<const char*, PoolingHandler> pooling_routes[] = {
      {"/v1/embeddings", &PoolingRoutes::embeddings},
      {"/v1/score", &PoolingRoutes::score},
      {"/score", &PoolingRoutes::score},
      {"/v1/rerank", &PoolingRoutes::rerank},
      {"/rerank", &PoolingRoutes::rerank},
      {"/v2/rerank", &PoolingRoutes::rerank}};
  for (const auto& [path, handler] : pooling_routes) {
    http->route(
        "POST", path, RunOn::kWorker,
        [this, h = handler](std::shared_ptr<HttpExchange> ex) {
          if (pooling) return ((*pooling).*h)(ex);
          reply_error(*ex,
                      ApiError{400, "invalid_request_error",
                               "this server generates text: serve an embedding model with --task "
                               "embed, a reranker with --task rerank",
                               ""},
                      "bad_request");
        },
        api_gate);
  }
  // vLLM's tokenizer endpoints (media are decoded to count their tokens: a worker thread).
  http->route(
      "POST", "/tokenize", RunOn::kWorker,
      [this](std::shared_ptr<HttpExchange> ex) { tokenize(ex); }, api_gate);
  http->route(
      "POST", "/detokenize", RunOn::kWorker,
      [this](std::shared_ptr<HttpExchange> ex) { detokenize(ex); }, api_gate);
}

void Server::Impl::tokenize(const std::shared_ptr<HttpExchange>& ex) {
  // (Errors are answered without the generation requests' metrics.)
  auto parsed = parse_tokenize(ex->request().body);
  if (!parsed.ok()) return ex->respond(error_response(parsed.error()));
  if (auto e = check_model_name(parsed->model, model_names)) {
    return ex->respond(error_response(*e));
  }
  const Tokenizer& tok = *engine->tokenizer();
  Result<std::vector<int32_t>> ids = std::vector<int32_t>{};
  if (parsed->prompt) {
    ids = tok.encode(*parsed->prompt);
    if (static_cast<int64_t>(ids->size()) > engine->max_context()) {
      ids = invalid_argument("the prompt is " + std::to_string(ids->size()) +
                             " tokens, more than the model's context of " +
                             std::to_string(engine->max_context()))
                .with_field("prompt");
    }
  } else {
    auto built = chat_builder->build(parsed->chat_body);
    if (!built.ok()) return ex->respond(error_response(built.error()));
    ids = engine->chat_prompt_tokens(std::move(built.value().chat));
  }
  if (!ids.ok()) return ex->respond(error_response(api_error_from(ids.status())));
  std::vector<std::string> strs;
  if (parsed->return_token_strs) {
    for (int32_t id : *ids) strs.push_back(tok.id_to_token(id));
  }
  ex->respond(json_response(200, tokenize_json(*ids, engine->max_context(),
                                               parsed->return_token_strs ? &strs : nullptr)));
}

void Server::Impl::detokenize(const std::shared_ptr<HttpExchange>& ex) {
  const Tokenizer& tok = *engine->tokenizer();
  // The model's vocabulary (ids past the tokenizer's decode to nothing, as in replies).
  auto parsed = parse_detokenize(ex->request().body, engine->vocab_size());
  if (!parsed.ok()) return ex->respond(error_response(parsed.error()));
  if (auto e = check_model_name(parsed->model, model_names)) {
    return ex->respond(error_response(*e));
  }
  ex->respond(json_response(200, detokenize_json(tok.decode(parsed->tokens))));
}

void Server::Impl::chat(const std::shared_ptr<HttpExchange>& ex) {
  const auto t0 = Clock::now();
  auto built = chat_builder->build(ex->request().body);
  if (!built.ok()) return reply_error(*ex, built.error(), "bad_request");
  ChatCall& call = built.value();
  const int64_t number = next_id++;
  call.reply.id = "chatcmpl-" + std::to_string(number);
  call.reply.model = model_name;
  call.reply.system_fingerprint = system_fingerprint;
  call.reply.created = static_cast<int64_t>(std::time(nullptr));
  // Each choice decodes and preprocesses the images and videos as it is submitted (a copy of the
  // request made then); the vision encoder runs once, the later choices finding the first's
  // output in the vision cache when their turn comes.
  const std::string call_prefix = "call_" + std::to_string(number) + "_";
  std::make_shared<ChatFanout>(ex, *metrics, t0, chat_reply_writer(call.reply, call.n))
      ->start(call.n, [&](size_t i, std::function<void()> notify) -> Result<ChoiceStream> {
        ChoiceStream cs;
        VLM_ASSIGN_OR_RETURN(cs.chat,
                             engine->chat_stream(call.take_choice(static_cast<int>(i), call_prefix),
                                                 std::move(notify)));
        return cs;
      });
}

void Server::Impl::completions(const std::shared_ptr<HttpExchange>& ex) {
  const auto t0 = Clock::now();
  auto parsed = parse_completion(ex->request().body, limits);
  if (!parsed.ok()) return reply_error(*ex, parsed.error(), "bad_request");
  if (auto e = check_model_name(parsed->model, model_names)) {
    return reply_error(*ex, *e, "bad_request");
  }
  CompletionCall call = completion_call(parsed.value(), *engine->tokenizer());
  call.reply.id = "cmpl-" + std::to_string(next_id++);
  call.reply.model = model_name;
  call.reply.system_fingerprint = system_fingerprint;
  call.reply.created = static_cast<int64_t>(std::time(nullptr));
  const size_t count = call.requests.size();
  std::make_shared<ChatFanout>(ex, *metrics, t0,
                               completion_reply_writer(std::move(call.reply), std::move(call.echo)))
      ->start(count, [&](size_t i, std::function<void()> notify) -> Result<ChoiceStream> {
        ChoiceStream cs;
        VLM_ASSIGN_OR_RETURN(cs.raw,
                             engine->submit(std::move(call.requests[i]), std::move(notify)));
        return cs;
      });
}

// OpenAI's Responses API on the chat path: the request becomes a chat completion body, which the
// chat builder checks (its media read as for a chat), and the chat reply a response object.
void Server::Impl::responses(const std::shared_ptr<HttpExchange>& ex) {
  const auto t0 = Clock::now();
  auto parsed = parse_responses(ex->request().body);
  if (!parsed.ok()) return reply_error(*ex, parsed.error(), "bad_request");
  ResponsesRequest& r = parsed.value();
  // A continuation: the stored conversation between the instructions and the input.
  std::string conversation = "[]";
  if (!r.previous_response_id.empty()) {
    auto prev = response_store->get(r.previous_response_id);
    if (!prev) {  // OpenAI's answer, whose code clients read to send the whole conversation
      const ApiError e{400, "invalid_request_error",
                       "no response '" + r.previous_response_id +
                           "' is stored here (not stored, deleted, or evicted by "
                           "--responses-store)",
                       "previous_response_id"};
      metrics->requests->inc("bad_request");
      return ex->respond(json_response(400, api_error_json(e, "previous_response_not_found")));
    }
    conversation = std::move(prev->conversation_json);
    r.chat_body = chat_body_after(r, conversation);
  }
  r.store = r.store && response_store->enabled();
  auto built = chat_builder->build(r.chat_body);
  if (!built.ok()) return reply_error(*ex, built.error(), "bad_request");
  ChatCall& call = built.value();
  const int64_t number = next_id++;
  ReplyOptions o;
  // Unguessable: a stored response is read, continued and deleted by its id alone.
  o.id = new_response_id();
  o.model = model_name;
  o.created = static_cast<int64_t>(std::time(nullptr));
  KeepResponse keep;
  if (r.store) {
    keep = [store = response_store.get(), id = o.id,
            before = join_messages(conversation, r.input_json)](const std::string& json,
                                                                const ChatReply& reply) {
      store->put(id, {json, conversation_with(before, reply)});
    };
  }
  const std::string call_prefix = "call_" + std::to_string(number) + "_";
  r.chat_body.clear();  // the writer does not need the request's media
  r.input_json.clear();
  std::make_shared<ChatFanout>(ex, *metrics, t0,
                               responses_reply_writer(std::move(o), std::move(r), std::move(keep)))
      ->start(1, [&](size_t, std::function<void()> notify) -> Result<ChoiceStream> {
        ChoiceStream cs;
        VLM_ASSIGN_OR_RETURN(
            cs.chat, engine->chat_stream(call.take_choice(0, call_prefix), std::move(notify)));
        return cs;
      });
}

// GET /v1/responses/{id}: the stored response; DELETE: forgets it.
void Server::Impl::stored_response(const std::shared_ptr<HttpExchange>& ex) {
  const http::HttpRequest& q = ex->request();
  const std::string id = q.path.substr(std::string("/v1/responses/").size());
  const ApiError missing{404, "not_found_error", "no response '" + id + "' is stored here", ""};
  if (q.method == "DELETE") {
    if (!response_store->erase(id)) return ex->respond(error_response(missing));
    return ex->respond(json_response(200, response_deleted_json(id)));
  }
  auto e = response_store->get(id);
  if (!e) return ex->respond(error_response(missing));
  ex->respond(json_response(200, std::move(e->response_json)));
}

// Draining: every 50 ms, stop once no request is being answered; at the deadline, stop anyway
// (closing the connections cancels what is left).
void Server::Impl::begin_drain() {
  if (draining.exchange(true)) return;
  drain_deadline = Clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(opts.shutdown_timeout_s * 1000));
  drain_timer = std::make_unique<boost::asio::steady_timer>(http->io_context());
  check_drained();
}

void Server::Impl::check_drained() {
  if (http->active_requests() == 0 || Clock::now() >= drain_deadline) {
    http->stop();
    return;
  }
  drain_timer->expires_after(std::chrono::milliseconds(50));
  drain_timer->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) check_drained();
  });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (!impl_) return;
  stop();
  if (impl_->loader.joinable()) impl_->loader.join();
  impl_->engine.reset();  // no more engine wake-ups into the connections
}

namespace {

// The names a request's "model" may use: --served-model-name's, each once, else the model
// directory's name.
Result<std::vector<std::string>> served_model_names(const ServeOptions& options) {
  std::vector<std::string> names;
  for (const std::string& n : options.model_names) {
    if (n.empty()) return invalid_argument("--served-model-name: a name may not be empty");
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  if (names.empty()) {
    std::string dir = std::filesystem::path(options.engine.model_dir).filename().string();
    names.push_back(dir.empty() ? "vlm" : dir);
  }
  return names;
}

// The access log: one line per request once answered (--log-level info and up).
void log_access(const http::AccessRecord& r) {
  if (!log_enabled(LogLevel::kInfo)) return;
  auto number = [](const std::string& name, double v, int decimals) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return LogField{name, buf, true};
  };
  std::vector<LogField> f;
  if (log_format() == LogFormat::kText) f.push_back({"time", log_timestamp()});
  f.push_back({"request_id", r.request_id});
  f.push_back({"method", r.method});
  f.push_back({"path", r.path});
  f.push_back(number("status", r.status, 0));
  if (r.prompt_tokens >= 0) {
    f.push_back(number("prompt_tokens", static_cast<double>(r.prompt_tokens), 0));
    f.push_back(number("cached_tokens", static_cast<double>(r.cached_tokens), 0));
    f.push_back(number("completion_tokens", static_cast<double>(r.completion_tokens), 0));
  }
  if (r.ttft_s >= 0) f.push_back(number("ttft_ms", r.ttft_s * 1000, 1));
  f.push_back(number("total_ms", r.total_s * 1000, 1));
  f.push_back({"client", r.client});
  log(LogLevel::kInfo, "access", f);
}

http::TransportOptions transport_options(const ServeOptions& options, const ApiLimits& limits) {
  http::TransportOptions t;
  t.on_access = log_access;
  t.limits.max_body_bytes = limits.max_body_bytes;
  t.io_threads = options.io_threads;
  t.worker_threads = options.http_threads;
  t.max_connections = options.max_connections;
  t.header_timeout_s = options.header_timeout_s;
  t.keep_alive_timeout_s = options.keep_alive_timeout_s;
  t.body_timeout_s = options.body_timeout_s;
  t.write_timeout_s = options.write_timeout_s;
  t.error_content_type = "application/json";
  t.error_body = [](int status, const std::string& message) {
    return api_error_json(ApiError{status, api_error_type(status), message, ""});
  };
  return t;
}

}  // namespace

// The stages of a server's start: its options checked, its metrics registered, the transport
// made, routed and listening; then the engine loads on its own thread (load()), the routes
// answering 503 until it is ready.
Result<std::unique_ptr<Server>> Server::create(const ServeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  VLM_ASSIGN_OR_RETURN(impl->model_names, served_model_names(options));
  impl->model_name = impl->model_names.front();
  impl->created = static_cast<int64_t>(std::time(nullptr));
  impl->media.allowed_local_path = options.allowed_media_path;
  impl->media.allow_remote = options.allow_remote_media;
  impl->limits.max_image_pixels = options.max_image_pixels;
  impl->limits.max_queue = options.engine.batching.max_waiting;
  impl->metrics =
      std::make_unique<ServerMetrics>(impl->model_name, options.engine.device == Device::kCuda);
  if (options.responses_store < 0 || options.responses_store_mib < 0) {
    return invalid_argument("--responses-store and --responses-store-mib must not be negative");
  }
  impl->response_store =
      std::make_unique<ResponseStore>(static_cast<size_t>(options.responses_store),
                                      static_cast<size_t>(options.responses_store_mib) << 20);
  impl->http = std::make_unique<http::HttpServer>(transport_options(options, impl->limits));
  impl->register_routes();
  VLM_RETURN_IF_ERROR(impl->http->listen(options.host, options.port));
  Impl* raw = impl.get();
  impl->loader = std::thread([raw] { raw->load(); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->http->port(); }

Status Server::wait_until_loaded() {
  std::unique_lock<std::mutex> lock(impl_->load_mu);
  impl_->load_cv.wait(lock, [&] { return impl_->load_done; });
  return impl_->load_status;
}

Status Server::run() {
  Impl& m = *impl_;
  if (m.opts.handle_signals) {
    // The first SIGTERM / SIGINT drains; a second one stops at once.
    m.signals = std::make_unique<boost::asio::signal_set>(m.http->io_context(), SIGINT, SIGTERM);
    std::function<void(const boost::system::error_code&, int)> on_signal =
        [&m, &on_signal](const boost::system::error_code& ec, int sig) {
          if (ec) return;
          if (m.draining) {
            log_printf(LogLevel::kInfo, "signal %d again: stopping now", sig);
            m.http->stop();
            return;
          }
          log_printf(LogLevel::kInfo, "signal %d: draining (at most %.0f s)", sig,
                     m.opts.shutdown_timeout_s);
          m.begin_drain();
          m.signals->async_wait(on_signal);
        };
    m.signals->async_wait(on_signal);
  }
  // A failed load stops the server, so run() returns the load error.
  std::thread watcher([&] {
    if (!wait_until_loaded().ok()) m.http->stop();
  });
  m.http->run();
  // run() returns after stop() (or the end of a drain); the watcher ends once loading has.
  watcher.join();
  m.signals.reset();
  Status load = wait_until_loaded();
  if (!load.ok()) return load;
  return ok_status();
}

void Server::stop() {
  if (impl_ && impl_->http) impl_->http->stop();
}

void Server::drain() {
  boost::asio::post(impl_->http->io_context(), [m = impl_.get()] { m->begin_drain(); });
}

}  // namespace vlm

// `vlm serve`: the OpenAI API over the event-driven transport (server/http_transport). Worker
// threads parse, render the chat template, tokenize and submit; the engine thread schedules,
// runs and samples; its wake-ups are posted to the request's connection, which reads the
// requests' streams (detokenizing there) and writes them as JSON or server-sent events
// (docs/architecture.md, "Serving").
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <filesystem>
#include <mutex>
#include <thread>

#include "engine/chat_output_parser.h"
#include "server/http_client.h"
#include "server/http_transport.h"
#include "server/kv_event_publisher.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/router_api.h"
#include "server/web_ui.h"
#include "vision/image_decode.h"
#include "vlm/chat.h"
#include "vlm/server.h"

namespace vlm {
namespace {

using Clock = std::chrono::steady_clock;
using http::HttpExchange;
using http::HttpResponse;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

HttpResponse json_response(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.http_status, api_error_json(e));
  if (e.http_status == 429 || e.http_status == 503) r.headers.push_back({"Retry-After", "1"});
  return r;
}

// GETs an http(s) image URL; failures are 400s (413 when too large) that name the URL.
ApiResult<std::vector<uint8_t>> fetch_media(const std::string& url, const std::string& kind,
                                            size_t max_bytes, int timeout_s) {
  http::FetchResult f = http::fetch_url(url, max_bytes, timeout_s);
  if (f.ok) return std::move(f.body);
  if (f.too_large) {
    return ApiError{413, "invalid_request_error",
                    kind + " " + url + " is larger than " + std::to_string(max_bytes) + " bytes",
                    "messages"};
  }
  return ApiError{400, "invalid_request_error", "cannot fetch " + kind + " " + url + ": " + f.error,
                  "messages"};
}

}  // namespace

// Server's friend: names its private parts for this file.
struct ServerAccess {
  using Impl = Server::Impl;
};
using ServerImpl = ServerAccess::Impl;

struct Server::Impl {
  ServeOptions opts;
  // Declared first, so destroyed last: connections still being torn down may hold callbacks
  // into the members below only until the engine (whose thread calls them) is gone.
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
  std::vector<std::string> model_names;  // every name a request may use
  int64_t created = 0;
  std::atomic<int64_t> next_id{1};
  ApiLimits limits;
  MediaPolicy media;
  ReplicaInfo replica;  // /server_info, /model_info, /v1/loads; set by load() before `ready`
  std::mutex loads_mu;  // the previous /v1/loads poll, for its generation rate
  double loads_generated = 0;
  Clock::time_point loads_polled{};

  MetricsRegistry metrics;
  Counter* requests = nullptr;
  Counter* prompt_tokens = nullptr;
  Counter* generated_tokens = nullptr;
  Counter* image_tokens = nullptr;
  Counter* images = nullptr;
  Counter* video_tokens = nullptr;
  Counter* videos = nullptr;
  Counter* video_frames = nullptr;
  Histogram* video_decode_time = nullptr;
  Counter* cache_hits = nullptr;
  Counter* cache_misses = nullptr;
  Counter* preemptions = nullptr;
  Counter* prefix_queries = nullptr;
  Counter* prefix_hits = nullptr;
  Counter* prefix_evictions = nullptr;
  Counter* conns_rejected = nullptr;
  Histogram* ttft = nullptr;
  Histogram* itl = nullptr;
  Histogram* e2e = nullptr;
  Histogram* queue_time = nullptr;
  Histogram* preprocess_time = nullptr;
  Histogram* encode_time = nullptr;
  Histogram* step_time = nullptr;
  Histogram* encoder_slices = nullptr;  // per step that ran part of an image encode
  Histogram* encoder_time = nullptr;
  // The same signals under vLLM's names, types, units and buckets, labelled model_name and
  // engine as vLLM labels them: what routers and gateways read (the endpoint picker of the
  // Gateway API Inference Extension, vLLM's production-stack router, SGLang's gateway).
  struct VllmMetrics {
    std::string labels;  // model_name="...",engine="0"
    Gauge* running = nullptr;
    Gauge* waiting = nullptr;
    Gauge* kv_usage = nullptr;  // 0..1
    Counter* prefix_queries = nullptr;
    Counter* prefix_hits = nullptr;
    Counter* prompt_tokens = nullptr;
    Counter* generation_tokens = nullptr;
    Histogram* ttft = nullptr;
    Histogram* itl = nullptr;
    Histogram* e2e = nullptr;
  } vllm;
  Gauge* running = nullptr;
  Gauge* waiting = nullptr;
  Gauge* kv_used = nullptr;
  Gauge* kv_total = nullptr;
  Gauge* kv_tokens_total = nullptr;
  Gauge* kv_bytes = nullptr;
  Gauge* prefix_blocks = nullptr;
  Gauge* conns_open = nullptr;
  Gauge* gpu_util = nullptr;  // these three: only with --device cuda
  Gauge* gpu_mem_used = nullptr;
  Gauge* gpu_mem_total = nullptr;
  Gauge* gpu_power = nullptr;
  Counter* process_cpu = nullptr;  // the process_* metrics of Prometheus' client libraries
  Gauge* process_rss = nullptr;
  Gauge* process_start = nullptr;
  std::mutex mirror_mu;  // counters mirrored from Engine::CoreStats at scrape time
  Engine::CoreStats mirrored;
  int64_t mirrored_rejected = 0;
  double mirrored_cpu = 0;

  void reply_error(HttpExchange& ex, const ApiError& e, const char* outcome) {
    ex.respond(error_response(e));
    requests->inc(outcome);
  }

  void load() {
    if (opts.before_load) opts.before_load();
    Status st = [&]() -> Status {
      EngineOptions eo = opts.engine;
      eo.on_step = [h = step_time](double s) { h->observe(s); };
      eo.on_encode = [n = encoder_slices, t = encoder_time](int64_t slices, double s) {
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
      VLM_ASSIGN_OR_RETURN(engine, Engine::load(eo));
      if (engine->tokenizer() == nullptr)
        return not_found("the model directory has no tokenizer.json");
      // The checkpoint's template (or --chat-template): one that does not parse or render fails
      // the load, never falls back silently.
      VLM_ASSIGN_OR_RETURN(const ChatTemplate* tpl, engine->chat_template());
      std::fprintf(stderr, "vlm: chat template: %s\n", tpl->origin().c_str());
      limits.vocab_size = engine->vocab_size();  // set before `ready`, read after it
      const Engine::CoreStats st = engine->core_stats();
      std::fprintf(
          stderr, "vlm: KV cache: %lld blocks of %lld tokens = %lld tokens, %s, %.1f MiB\n",
          static_cast<long long>(st.kv_blocks_total), static_cast<long long>(st.kv_block_size),
          static_cast<long long>(st.kv_blocks_total * st.kv_block_size),
          kv_cache_dtype_name(st.kv_cache_dtype),
          static_cast<double>(st.kv_cache_bytes) / (1 << 20));
      kv_tokens_total->set(static_cast<double>(st.kv_blocks_total * st.kv_block_size));
      replica.model_path = opts.engine.model_dir;
      replica.served_model_name = model_name;
      read_model_config(opts.engine.model_dir, &replica);
      replica.version = std::string("vlm ") + VLM_VERSION;
      replica.has_vision = engine->has_vision();
      replica.context_length = engine->max_context();
      replica.max_total_tokens = st.kv_blocks_total * st.kv_block_size;
      replica.max_running_requests = opts.engine.batching.max_num_seqs;
      kv_bytes->set(static_cast<double>(st.kv_cache_bytes));
      // vLLM's info gauge of the cache configuration (a gauge held at 1), known once loaded.
      const std::string block_size = std::to_string(st.kv_block_size);
      const std::string blocks = std::to_string(st.kv_blocks_total);
      metrics
          .gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 prometheus_labels({{"block_size", block_size},
                                    {"cache_dtype", kv_cache_dtype_name(st.kv_cache_dtype)},
                                    {"enable_prefix_caching",
                                     opts.engine.batching.prefix_caching ? "True" : "False"},
                                    {"engine", "0"},
                                    {"num_gpu_blocks", blocks}}))
          .set(1);
      return ok_status();
    }();
    ready = st.ok();
    std::lock_guard<std::mutex> lock(load_mu);
    load_status = st;
    load_done = true;
    load_cv.notify_all();
  }

  // Before an API request's body is read: loading or draining (503, and close while draining),
  // then the API key (401, compared in constant time).
  std::optional<HttpResponse> gate(const http::HttpRequest& head) {
    if (draining) {
      HttpResponse r =
          error_response(ApiError{503, "server_error", "the server is shutting down", ""});
      r.close = true;
      requests->inc("rejected");
      return r;
    }
    if (!ready) {
      return error_response(ApiError{503, "server_error", "the model is loading", ""});
    }
    if (!opts.api_key.empty() &&
        !http::constant_time_equal(head.header("Authorization"), "Bearer " + opts.api_key)) {
      requests->inc("unauthorized");
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

  bool check_model(const std::string& model, HttpExchange& ex) {
    if (model.empty() ||
        std::find(model_names.begin(), model_names.end(), model) != model_names.end()) {
      return true;
    }
    reply_error(ex,
                ApiError{404, "not_found_error",
                         "model '" + model + "' is not served here (serving '" + model_name + "')",
                         "model"},
                "bad_request");
    return false;
  }

  GenerateRequest base_request(const CommonRequest& c) const {
    GenerateRequest g;
    g.sampling = c.sampling;
    g.max_new_tokens = c.max_tokens;
    g.stop = c.stop;
    g.stop_token_ids = c.stop_token_ids;
    g.ignore_eos = c.ignore_eos;
    g.structured = c.structured;
    return g;
  }

  void scrape_metrics();
  std::string loads();  // GET /v1/loads
  void chat(const std::shared_ptr<HttpExchange>& ex);
  void completions(const std::shared_ptr<HttpExchange>& ex);
  void register_routes();
  void begin_drain();
  void check_drained();
};

namespace {

// One choice of a response (one engine request).
struct ChoiceState {
  // The reply: its text (reply.content), and for chat its reasoning and tool calls.
  ChatReply reply;
  std::vector<TokenLogprob> logprobs;  // with logprobs: their bytes add up to reply.content
  FinishReason reason = FinishReason::kNone;
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  bool finished = false;
  Clock::time_point last_token;
  bool has_token = false;
};

// Usage: prompt tokens once per distinct prompt (choices p*n .. p*n+n-1 share one), completion
// tokens over all choices.
Usage usage_of(const std::vector<ChoiceState>& choices, int n) {
  Usage u;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i % static_cast<size_t>(n) == 0) {
      u.prompt_tokens += choices[i].prompt_tokens;
      u.cached_tokens += choices[i].cached_tokens;
    }
    u.completion_tokens += choices[i].completion_tokens;
  }
  return u;
}

// How one endpoint words its reply.
struct ReplyFormat {
  bool stream = false;
  bool logprobs = false;
  int n = 1;  // choices per prompt
  // Streaming: chunks before any token (chat: each choice's role), a chunk for choice i's new
  // text (with logprobs, the token it came with), choice i's finish, the usage chunk (empty:
  // none).
  std::vector<std::string> prologue;
  std::function<std::string(int, const std::string&, const std::vector<TokenLogprob>*)> chunk;
  // Chat: the pieces are deltas (reasoning, content, tool calls), streamed as these chunks.
  bool chat = false;
  std::function<std::string(int, const ChatDelta&, const std::vector<TokenLogprob>*)> delta_chunk;
  // Choice i's finish (tool_calls: it ended with tool calls).
  std::function<std::string(int, FinishReason, bool tool_calls)> finish;
  std::function<std::string(const Usage&)> usage;
  bool continuous_usage = false;  // every chunk after the prologue carries the usage so far
  // Not streaming: the whole response.
  std::function<std::string(const std::vector<ChoiceState>&, const Usage&)> whole;
};

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

// One HTTP request fanned out to its choices (n, and prompts for /v1/completions). Submits them
// to the engine (on the worker thread that parsed the request) and keeps their streams; when the
// engine has new tokens it wakes the connection's strand, which takes each stream's pieces (text
// and logprob entries, made there by the stream), records the latency metrics and writes the
// reply. A client that goes away cancels every unfinished choice. The exchange holds the Fanout
// until it is answered or closed.
class Fanout : public std::enable_shared_from_this<Fanout> {
 public:
  Fanout(ServerImpl& s, std::shared_ptr<HttpExchange> ex, Clock::time_point t0, ReplyFormat f)
      : s_(s), ex_(std::move(ex)), t0_(t0), f_(std::move(f)) {}

  // Submits `count` requests, each by `submit(i, notify)` (which makes its request just before,
  // so that n choices of a request with videos hold one more copy of their bytes at a time, not
  // n), and starts the reply; an error cancels the ones already submitted and is the reply.
  using Submit = std::function<Result<ChoiceStream>(size_t, std::function<void()>)>;
  void start(size_t count, const Submit& submit) {
    // Sized before on_close can fire: client_gone() walks streams_ from an I/O thread.
    choices_.resize(count);
    streams_.resize(count);
    ex_->hold(shared_from_this());
    ex_->on_close([w = weak_from_this()] {
      if (auto self = w.lock()) self->client_gone();
    });
    if (ex_->closed()) {  // gone while the request was parsed: nothing to run
      s_.requests->inc("cancelled");
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      auto stream = submit(i, [w = weak_from_this()] {
        if (auto self = w.lock()) self->wake();
      });
      std::lock_guard<std::mutex> lock(mu_);
      if (!stream.ok()) {
        cancel_locked();
        if (!done_) {
          done_ = true;
          s_.reply_error(*ex_, api_error_from(stream.status()), "rejected");
        }
        return;
      }
      streams_[i] = std::move(stream).value();
      if (done_) {  // the client left meanwhile
        cancel_locked();
        return;
      }
    }
    if (f_.stream) {
      ex_->start_stream(200, "text/event-stream");
      std::string pro;
      for (const std::string& c : f_.prologue) pro += sse_event(c);
      if (!pro.empty()) ex_->write(std::move(pro));
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      started_ = true;
      scheduled_ = true;
    }
    ex_->post([self = shared_from_this()] { self->drain(); });  // tokens that came meanwhile
  }

 private:
  // Engine thread: new tokens on some stream.
  void wake() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (scheduled_ || !started_ || done_) return;
      scheduled_ = true;
    }
    ex_->post([self = shared_from_this()] { self->drain(); });
  }

  // The connection's strand: every piece that is ready, in one write.
  void drain() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      scheduled_ = false;
      if (done_) return;
    }
    std::string out;
    ChatChunk piece;
    for (size_t i = 0; i < streams_.size(); ++i) {
      while (!choices_[i].finished && streams_[i].try_next(&piece)) {
        if (!handle(static_cast<int>(i), piece, &out)) return;
      }
    }
    if (!out.empty()) ex_->write(std::move(out));
  }

  // False once the reply is complete (or failed).
  bool handle(int i, const ChatChunk& p, std::string* out) {
    ChoiceState& c = choices_[i];
    if (!p.error.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_ = true;
        cancel_locked();
      }
      s_.requests->inc("failed");
      if (f_.stream) {
        *out += sse_event(api_error_json(api_error_from(p.error))) + sse_done();
        ex_->write(std::move(*out));
        ex_->finish();
      } else {
        ex_->respond(error_response(api_error_from(p.error)));
      }
      return false;
    }
    if (p.token_id >= 0) {
      const auto now = Clock::now();
      if (!any_token_) {
        s_.ttft->observe(seconds_since(t0_));
        s_.vllm.ttft->observe(seconds_since(t0_));
      }
      if (c.has_token) {
        const double gap = std::chrono::duration<double>(now - c.last_token).count();
        s_.itl->observe(gap);
        s_.vllm.itl->observe(gap);
      }
      any_token_ = c.has_token = true;
      c.last_token = now;
    }
    if (f_.logprobs) c.logprobs.insert(c.logprobs.end(), p.logprobs.begin(), p.logprobs.end());
    const std::vector<TokenLogprob>* lp = f_.logprobs ? &p.logprobs : nullptr;
    // The counts so far (complete on the last piece).
    const RequestStats& st = p.stats;
    c.prompt_tokens = st.prompt_tokens;
    c.completion_tokens = st.completion_tokens;
    c.cached_tokens = st.cached_tokens;
    auto event = [&](std::string chunk) {
      if (f_.continuous_usage) chunk = chunk_with_usage(chunk, usage_of(choices_, f_.n));
      return sse_event(chunk);
    };
    if (f_.chat) {
      c.reply.add(p.delta);
      if (f_.stream && (!p.delta.empty() || (lp && !lp->empty()))) {
        *out += event(f_.delta_chunk(i, p.delta, lp));
      }
    } else {
      c.reply.content += p.delta.content;
      if (f_.stream && (!p.delta.content.empty() || (lp && !lp->empty()))) {
        *out += event(f_.chunk(i, p.delta.content, lp));
      }
    }
    if (!p.finished) return true;
    c.finished = true;
    c.reason = p.finish_reason;
    s_.prompt_tokens->inc(static_cast<double>(st.prompt_tokens));
    s_.generated_tokens->inc(static_cast<double>(st.completion_tokens));
    s_.vllm.prompt_tokens->inc(static_cast<double>(st.prompt_tokens));
    s_.vllm.generation_tokens->inc(static_cast<double>(st.completion_tokens));
    s_.queue_time->observe(st.queue_ms / 1e3);
    if (st.images > 0) {
      s_.images->inc(static_cast<double>(st.images));
      s_.image_tokens->inc(static_cast<double>(st.vision_tokens - st.video_tokens));
      const double pre = st.image_decode_ms + st.preprocess_ms;
      if (st.images > st.images_cached || pre > 0) s_.preprocess_time->observe(pre / 1e3);
    }
    if (st.videos > 0) {
      s_.videos->inc(static_cast<double>(st.videos));
      s_.video_tokens->inc(static_cast<double>(st.video_tokens));
      s_.video_frames->inc(static_cast<double>(st.video_frames));
      if (st.videos > st.videos_cached) s_.video_decode_time->observe(st.video_decode_ms / 1e3);
    }
    if (st.images > st.images_cached || st.videos > st.videos_cached) {
      s_.encode_time->observe(st.encode_ms / 1e3);
    }
    if (f_.stream) *out += event(f_.finish(i, p.finish_reason, !c.reply.tool_calls.empty()));
    if (++finished_ < choices_.size()) return true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    s_.e2e->observe(seconds_since(t0_));
    s_.vllm.e2e->observe(seconds_since(t0_));
    s_.requests->inc("ok");
    const Usage usage = usage_of(choices_, f_.n);
    if (f_.stream) {
      if (f_.usage) *out += sse_event(f_.usage(usage));
      *out += sse_done();
      ex_->write(std::move(*out));
      ex_->finish();
    } else {
      ex_->respond(json_response(200, f_.whole(choices_, usage)));
    }
    return false;
  }

  // The connection closed before the reply was complete.
  void client_gone() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return;
      done_ = true;
      cancel_locked();
    }
    s_.requests->inc("cancelled");
  }

  void cancel_locked() {
    for (auto& st : streams_) {
      if (st) st.cancel();  // finished streams ignore it
    }
  }

  ServerImpl& s_;
  std::shared_ptr<HttpExchange> ex_;
  Clock::time_point t0_;
  ReplyFormat f_;
  std::mutex mu_;  // started_, scheduled_, done_, and streams_ while start() fills it
  std::vector<ChoiceStream> streams_;
  bool started_ = false, scheduled_ = false, done_ = false;
  // The strand's own.
  std::vector<ChoiceState> choices_;
  size_t finished_ = 0;
  bool any_token_ = false;
};

// The n choices of one prompt; with a seed, choice i samples with seed + i.
void add_choices(const GenerateRequest& g, int n, std::vector<GenerateRequest>* out) {
  for (int i = 0; i < n; ++i) {
    out->push_back(g);
    if (g.sampling.seed) out->back().sampling.seed = *g.sampling.seed + static_cast<uint64_t>(i);
  }
}

}  // namespace

void Server::Impl::scrape_metrics() {
  conns_open->set(static_cast<double>(http->open_connections()));
  {
    std::lock_guard<std::mutex> lock(mirror_mu);
    const int64_t rej = http->rejected_connections();
    conns_rejected->inc(static_cast<double>(rej - mirrored_rejected));
    mirrored_rejected = rej;
    const ProcessStats ps = read_process_stats();
    process_cpu->inc(std::max(0.0, ps.cpu_seconds - mirrored_cpu));
    mirrored_cpu = std::max(mirrored_cpu, ps.cpu_seconds);
    process_rss->set(ps.resident_bytes);
    process_start->set(ps.start_time_seconds);
  }
  if (!ready) return;
  Engine::CoreStats st = engine->core_stats();
  running->set(static_cast<double>(st.running));
  waiting->set(static_cast<double>(st.waiting));
  kv_used->set(static_cast<double>(st.kv_blocks_used));
  kv_total->set(static_cast<double>(st.kv_blocks_total));
  vllm.running->set(static_cast<double>(st.running));
  vllm.waiting->set(static_cast<double>(st.waiting));
  vllm.kv_usage->set(st.kv_blocks_total > 0 ? static_cast<double>(st.kv_blocks_used) /
                                                  static_cast<double>(st.kv_blocks_total)
                                            : 0.0);
  Engine::GpuStats g;
  if (gpu_util != nullptr && engine->gpu_stats(&g)) {  // on "cuda": NVML's view of the device
    gpu_util->set(g.utilization_percent);
    gpu_mem_used->set(static_cast<double>(g.memory_used));
    gpu_mem_total->set(static_cast<double>(g.memory_total));
    gpu_power->set(g.power_watts);
  }
  std::lock_guard<std::mutex> lock(mirror_mu);
  cache_hits->inc(static_cast<double>(st.vision_cache_hits - mirrored.vision_cache_hits));
  cache_misses->inc(static_cast<double>(st.vision_cache_misses - mirrored.vision_cache_misses));
  preemptions->inc(static_cast<double>(st.preemptions - mirrored.preemptions));
  prefix_queries->inc(static_cast<double>(st.prefix_cache_queries - mirrored.prefix_cache_queries));
  prefix_hits->inc(static_cast<double>(st.prefix_cache_hits - mirrored.prefix_cache_hits));
  vllm.prefix_queries->inc(
      static_cast<double>(st.prefix_cache_queries - mirrored.prefix_cache_queries));
  vllm.prefix_hits->inc(static_cast<double>(st.prefix_cache_hits - mirrored.prefix_cache_hits));
  prefix_evictions->inc(
      static_cast<double>(st.prefix_cache_evictions - mirrored.prefix_cache_evictions));
  prefix_blocks->set(static_cast<double>(st.prefix_cache_blocks));
  mirrored = st;
}

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
    const double generated = generated_tokens->value();
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
    r.body = metrics.render();
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
                  HttpResponse r = json_response(200, metrics.render_json());
                  r.headers.push_back({"Cache-Control", "no-store"});
                  ex->respond(std::move(r));
                });
  }
  http->route(
      "POST", "/v1/chat/completions", RunOn::kWorker,
      [this](std::shared_ptr<HttpExchange> ex) { chat(ex); }, api_gate);
  http->route(
      "POST", "/v1/completions", RunOn::kWorker,
      [this](std::shared_ptr<HttpExchange> ex) { completions(ex); }, api_gate);
}

void Server::Impl::chat(const std::shared_ptr<HttpExchange>& ex) {
  const auto t0 = Clock::now();
  auto parsed = parse_chat_completion(ex->request().body, limits, media);
  if (!parsed.ok()) return reply_error(*ex, parsed.error(), "bad_request");
  ChatCompletionRequest& cr = parsed.value();
  if (!check_model(cr.model, *ex)) return;
  // A video's frames given as a list hold at most max_video_bytes together (each frame at most
  // max_image_bytes): counted as they are fetched or read, so that no more is held.
  std::vector<size_t> frame_bytes(cr.videos.size(), 0);
  for (size_t k = 0; k < cr.videos.size(); ++k) {
    for (const ImageInput& f : cr.videos[k].frames) frame_bytes[k] += f.bytes.size();
  }
  auto frames_over = [&](size_t k) {
    return ApiError{413, "invalid_request_error",
                    "video " + std::to_string(k + 1) + ": its frames are larger than " +
                        std::to_string(limits.max_video_bytes) + " bytes together",
                    "messages"};
  };
  for (const RemoteImage& ri : cr.remote_images) {  // only present with --allow-remote-media
    const bool whole_video = ri.video && ri.frame < 0;
    size_t max_bytes = whole_video ? limits.max_video_bytes : limits.max_image_bytes;
    if (ri.video && !whole_video) {
      if (frame_bytes[ri.image_index] >= limits.max_video_bytes) {
        return reply_error(*ex, frames_over(ri.image_index), "bad_request");
      }
      max_bytes = std::min(max_bytes, limits.max_video_bytes - frame_bytes[ri.image_index]);
    }
    auto bytes = fetch_media(ri.url, whole_video ? "video" : "image", max_bytes,
                             opts.remote_media_timeout_s);
    if (!bytes.ok()) return reply_error(*ex, bytes.error(), "bad_request");
    if (ri.video && !whole_video) frame_bytes[ri.image_index] += bytes.value().size();
    std::vector<uint8_t>& to = !ri.video     ? cr.images[ri.image_index].bytes
                               : whole_video ? cr.videos[ri.image_index].bytes
                                             : cr.videos[ri.image_index].frames[ri.frame].bytes;
    to = std::move(bytes).value();
  }
  // file:// images and videos are read here, so that nothing below (messages included) sees the
  // server's path: errors name the image or video by its place in the request. read_local reads
  // one into its bytes and clears its path; false once the 400 saying `what` is the reply.
  auto read_local = [&](std::string* path, std::vector<uint8_t>* bytes, const std::string& what,
                        const ImageDecodeLimits& read_limits = {}) {
    auto read = read_image_file(*path, read_limits);
    if (!read.ok()) {
      reply_error(*ex, ApiError{400, "invalid_request_error", what + " cannot be read", "messages"},
                  "bad_request");
      return false;
    }
    *bytes = std::move(read).value();
    path->clear();
    return true;
  };
  for (size_t k = 0; k < cr.images.size(); ++k) {
    ImageInput& img = cr.images[k];
    if (!img.path.empty() &&
        !read_local(&img.path, &img.bytes,
                    "image " + std::to_string(k + 1) + ": the file:// image")) {
      return;
    }
  }
  for (size_t k = 0; k < cr.videos.size(); ++k) {
    VideoInput& v = cr.videos[k];
    for (size_t f = 0; f < v.frames.size(); ++f) {
      ImageInput& frame = v.frames[f];
      if (frame.path.empty()) continue;
      std::error_code ec;
      const auto size = std::filesystem::file_size(frame.path, ec);
      if (!ec && frame_bytes[k] + size > limits.max_video_bytes) {
        return reply_error(*ex, frames_over(k), "bad_request");
      }
      if (!read_local(&frame.path, &frame.bytes,
                      "video " + std::to_string(k + 1) + ", frame " + std::to_string(f + 1) +
                          ": the file:// image")) {
        return;
      }
      frame_bytes[k] += frame.bytes.size();
    }
    ImageDecodeLimits read_limits;
    read_limits.max_bytes = static_cast<int64_t>(limits.max_video_bytes);
    if (!v.path.empty() &&
        !read_local(&v.path, &v.bytes, "video " + std::to_string(k + 1) + ": the file:// video",
                    read_limits)) {
      return;
    }
  }
  // The conversation for the engine's chat API: each image and video part carries its media.
  ChatRequest chat;
  chat.messages = std::move(cr.messages);
  size_t next_image = 0, next_video = 0;
  for (ChatMessage& m : chat.messages) {
    for (ChatPart& part : m.parts) {
      if (part.type == ChatPart::Type::kImage && next_image < cr.images.size()) {
        part.image = std::move(cr.images[next_image++]);
      } else if (part.type == ChatPart::Type::kVideo && next_video < cr.videos.size()) {
        part.video = std::move(cr.videos[next_video++]);
      } else if (part.type != ChatPart::Type::kText) {
        return reply_error(*ex, api_error_from(internal_error("a media part without its media")),
                           "failed");
      }
    }
  }
  if (next_image != cr.images.size() || next_video != cr.videos.size()) {
    return reply_error(*ex, api_error_from(internal_error("media without a part")), "failed");
  }
  chat.tools_json = std::move(cr.tools_json);
  chat.parse_tool_calls = !cr.tool_choice_none;
  chat.parallel_tool_calls = cr.parallel_tool_calls;
  chat.template_kwargs = std::move(cr.template_kwargs);
  chat.include_reasoning = cr.include_reasoning;
  chat.max_thinking_tokens = cr.max_thinking_tokens;
  chat.sampling = cr.sampling;
  chat.max_new_tokens = cr.max_tokens;
  chat.stop = cr.stop;
  chat.stop_token_ids = cr.stop_token_ids;
  chat.ignore_eos = cr.ignore_eos;
  chat.logprobs = cr.logprobs ? cr.top_logprobs : -1;
  chat.response_format = cr.structured;
  // Each choice decodes and preprocesses the images and videos as it is submitted (a copy of the
  // request made then); the vision encoder runs once, the later choices finding the first's
  // output in the vision cache when their turn comes.
  const std::string rid = "chatcmpl-" + std::to_string(next_id++);
  const int64_t created_now = static_cast<int64_t>(std::time(nullptr));
  const int n = cr.n;

  ReplyFormat f;
  f.chat = true;
  f.stream = cr.stream;
  f.logprobs = cr.logprobs;
  f.n = n;
  if (cr.stream) {
    for (int i = 0; i < n; ++i)
      f.prologue.push_back(
          chat_chunk_json(rid, model_name, created_now, i, "", std::string("assistant")));
    f.finish = [=, this](int i, FinishReason r, bool tool_calls) {
      if (tool_calls && r == FinishReason::kStop) {  // OpenAI's finish for a reply of calls
        return chat_tool_calls_finish_json(rid, model_name, created_now, i);
      }
      return chat_chunk_json(rid, model_name, created_now, i, "", std::nullopt, r);
    };
    f.delta_chunk = [=, this](int i, const ChatDelta& d, const std::vector<TokenLogprob>* lp) {
      return chat_delta_json(rid, model_name, created_now, i, d, lp);
    };
    if (cr.include_usage) {
      f.usage = [=, this](const Usage& u) {
        return usage_chunk_json(rid, model_name, created_now, u);
      };
    }
    f.continuous_usage = cr.continuous_usage;
  } else {
    f.whole = [=, this, want_logprobs = cr.logprobs](const std::vector<ChoiceState>& choices,
                                                     const Usage& u) {
      std::vector<CompletionChoice> out;
      for (int i = 0; i < n; ++i) {
        CompletionChoice c;
        c.index = i;
        c.text = choices[i].reply.content;
        c.reasoning = choices[i].reply.reasoning;
        c.tool_calls = choices[i].reply.tool_calls;
        c.finish_reason = choices[i].reason;
        if (want_logprobs) c.logprobs = choices[i].logprobs;
        out.push_back(std::move(c));
      }
      return chat_completion_json(rid, model_name, created_now, out, u);
    };
  }
  const std::string call_prefix = "call_" + rid.substr(rid.find('-') + 1) + "_";
  std::make_shared<Fanout>(*this, ex, t0, std::move(f))
      ->start(n, [&](size_t i, std::function<void()> notify) -> Result<ChoiceStream> {
        ChatRequest q = i + 1 == static_cast<size_t>(n) ? std::move(chat) : chat;
        if (q.sampling.seed) q.sampling.seed = *q.sampling.seed + static_cast<uint64_t>(i);
        q.tool_call_id_prefix = call_prefix + std::to_string(i) + "_";
        ChoiceStream cs;
        VLM_ASSIGN_OR_RETURN(cs.chat, engine->chat_stream(std::move(q), std::move(notify)));
        return cs;
      });
}

void Server::Impl::completions(const std::shared_ptr<HttpExchange>& ex) {
  const auto t0 = Clock::now();
  auto parsed = parse_completion(ex->request().body, limits);
  if (!parsed.ok()) return reply_error(*ex, parsed.error(), "bad_request");
  CompletionRequest& cr = parsed.value();
  if (!check_model(cr.model, *ex)) return;
  const Tokenizer& tok = *engine->tokenizer();
  std::vector<GenerateRequest> reqs;
  std::vector<std::string> echo;  // per choice: the prompt's text when echo is on
  for (const CompletionRequest::Prompt& p : cr.prompts) {
    GenerateRequest g = base_request(cr);
    g.prompt_ids = p.is_ids ? p.ids : tok.encode(p.text);
    g.logprobs = cr.logprobs.value_or(-1);
    add_choices(g, cr.n, &reqs);
    echo.insert(echo.end(), cr.n, !cr.echo ? std::string() : p.is_ids ? tok.decode(p.ids) : p.text);
  }
  const std::string rid = "cmpl-" + std::to_string(next_id++);
  const int64_t created_now = static_cast<int64_t>(std::time(nullptr));
  const bool want_logprobs = cr.logprobs.has_value();

  ReplyFormat f;
  f.stream = cr.stream;
  f.logprobs = want_logprobs;
  f.n = cr.n;
  if (cr.stream) {
    // text_offset of each choice's next token: where its generated text has reached (only the
    // connection's strand touches it).
    auto offset = std::make_shared<std::vector<size_t>>();
    for (size_t i = 0; i < echo.size(); ++i) {
      offset->push_back(echo[i].size());
      if (!echo[i].empty())
        f.prologue.push_back(
            completion_chunk_json(rid, model_name, created_now, static_cast<int>(i), echo[i]));
    }
    f.chunk = [=, this](int i, const std::string& text, const std::vector<TokenLogprob>* lp) {
      std::string c = completion_chunk_json(rid, model_name, created_now, i, text, std::nullopt, lp,
                                            (*offset)[i]);
      if (lp) {
        for (const TokenLogprob& e : *lp) (*offset)[i] += e.token.size();
      }
      return c;
    };
    f.finish = [=, this](int i, FinishReason r, bool) {
      return completion_chunk_json(rid, model_name, created_now, i, "", r);
    };
    if (cr.include_usage) {
      f.usage = [=, this](const Usage& u) {
        return usage_chunk_json(rid, model_name, created_now, u, "text_completion");
      };
    }
    f.continuous_usage = cr.continuous_usage;
  } else {
    f.whole = [=, this](const std::vector<ChoiceState>& choices, const Usage& u) {
      std::vector<CompletionChoice> out;
      std::vector<size_t> offsets;
      for (size_t i = 0; i < choices.size(); ++i) {
        CompletionChoice c;
        c.index = static_cast<int>(i);
        c.text = echo[i] + choices[i].reply.content;
        c.finish_reason = choices[i].reason;
        if (want_logprobs) c.logprobs = choices[i].logprobs;
        offsets.push_back(echo[i].size());
        out.push_back(std::move(c));
      }
      return completion_json(rid, model_name, created_now, out, u, offsets);
    };
  }
  std::make_shared<Fanout>(*this, ex, t0, std::move(f))
      ->start(reqs.size(), [&](size_t i, std::function<void()> notify) -> Result<ChoiceStream> {
        ChoiceStream cs;
        VLM_ASSIGN_OR_RETURN(cs.raw, engine->submit(std::move(reqs[i]), std::move(notify)));
        return cs;
      });
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

Result<std::unique_ptr<Server>> Server::create(const ServeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  for (const std::string& n : options.model_names) {
    if (n.empty()) return invalid_argument("--served-model-name: a name may not be empty");
    if (std::find(impl->model_names.begin(), impl->model_names.end(), n) ==
        impl->model_names.end()) {
      impl->model_names.push_back(n);
    }
  }
  if (impl->model_names.empty()) {
    std::string dir = std::filesystem::path(options.engine.model_dir).filename().string();
    impl->model_names.push_back(dir.empty() ? "vlm" : dir);
  }
  impl->model_name = impl->model_names.front();
  impl->created = static_cast<int64_t>(std::time(nullptr));
  impl->media.allowed_local_path = options.allowed_media_path;
  impl->media.allow_remote = options.allow_remote_media;
  impl->limits.max_image_pixels = options.max_image_pixels;
  impl->limits.max_queue = options.engine.batching.max_waiting;
  auto& m = impl->metrics;
  impl->requests = &m.counter("vlm_requests_total", "Requests by outcome", "outcome");
  impl->prompt_tokens =
      &m.counter("vlm_prompt_tokens_total", "Prompt tokens (image tokens included)");
  impl->generated_tokens = &m.counter("vlm_generation_tokens_total", "Generated tokens");
  impl->image_tokens = &m.counter("vlm_image_tokens_total", "Image tokens among the prompt tokens");
  impl->images = &m.counter("vlm_images_total", "Images in requests");
  impl->video_tokens = &m.counter("vlm_video_tokens_total", "Video tokens among the prompt tokens");
  impl->videos = &m.counter("vlm_videos_total", "Videos in requests");
  impl->video_frames = &m.counter("vlm_video_frames_total", "Frames sampled from the videos");
  impl->cache_hits = &m.counter("vlm_vision_cache_hits_total",
                                "Images and videos served from the vision-encoder cache");
  impl->cache_misses = &m.counter("vlm_vision_cache_misses_total",
                                  "Images and videos run through the vision encoder");
  impl->preemptions =
      &m.counter("vlm_preemptions_total", "Requests preempted (KV cache full) and recomputed");
  impl->prefix_queries =
      &m.counter("vlm_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache");
  impl->prefix_hits = &m.counter("vlm_prefix_cache_hits_total",
                                 "Prompt tokens found in the prefix cache (not computed)");
  impl->prefix_evictions =
      &m.counter("vlm_prefix_cache_evictions_total", "Cached KV blocks evicted to make room");
  impl->prefix_blocks =
      &m.gauge("vlm_prefix_cache_blocks", "KV blocks holding cached contents (in use or free)");
  impl->conns_rejected = &m.counter("vlm_http_connections_rejected_total",
                                    "Connections turned away with 503 at --max-connections");
  const std::vector<double> lat = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  impl->ttft = &m.histogram("vlm_time_to_first_token_seconds", "Time to first token", lat);
  impl->itl = &m.histogram("vlm_inter_token_latency_seconds", "Time between tokens", lat);
  impl->e2e = &m.histogram("vlm_e2e_request_latency_seconds", "End-to-end request latency", lat);
  impl->queue_time = &m.histogram("vlm_request_queue_time_seconds",
                                  "Submit to first forward pass, image encoding excluded", lat);
  impl->preprocess_time = &m.histogram(
      "vlm_image_preprocess_seconds", "Image decode + preprocess per request (worker thread)", lat);
  impl->encode_time = &m.histogram("vlm_vision_encode_seconds",
                                   "Vision encoder time per request (cache misses)", lat);
  impl->video_decode_time = &m.histogram(
      "vlm_video_decode_seconds",
      "Video reading and frame decoding per request (worker thread; cache misses)", lat);
  impl->step_time =
      &m.histogram("vlm_engine_step_seconds", "Engine step wall time (steps that ran the model)",
                   {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  impl->encoder_slices = &m.histogram(
      "vlm_encoder_slices_per_step",
      "Units of image encoding (row blocks of a vision-tower stage) per engine step that ran any",
      {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128});
  impl->encoder_time =
      &m.histogram("vlm_encoder_step_seconds", "Image-encoding time per engine step that ran any",
                   {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10});
  impl->running = &m.gauge("vlm_num_requests_running", "Requests in the running batch");
  impl->waiting = &m.gauge("vlm_num_requests_waiting", "Requests waiting to be scheduled");
  impl->kv_used = &m.gauge("vlm_kv_cache_blocks_used", "KV cache blocks in use");
  impl->kv_total = &m.gauge("vlm_kv_cache_blocks_capacity", "KV cache blocks in total");
  impl->kv_tokens_total =
      &m.gauge("vlm_kv_cache_tokens_capacity", "KV cache capacity in tokens (blocks x block size)");
  impl->kv_bytes = &m.gauge("vlm_kv_cache_memory_bytes",
                            "KV cache memory reserved (K, V and INT8 scales of every layer)");
  impl->conns_open = &m.gauge("vlm_http_connections_open", "Open HTTP connections");
  impl->process_cpu =
      &m.counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.");
  impl->process_rss = &m.gauge("process_resident_memory_bytes", "Resident memory size in bytes.");
  impl->process_start = &m.gauge("process_start_time_seconds",
                                 "Start time of the process since unix epoch in seconds.");
  if (options.engine.device == Device::kCuda) {
    impl->gpu_util = &m.gauge("vlm_gpu_utilization_percent",
                              "GPU busy share over NVML's last sample period (-1: not reported)");
    impl->gpu_mem_used = &m.gauge("vlm_gpu_memory_used_bytes",
                                  "GPU memory in use, all processes (-1: not read yet)");
    impl->gpu_mem_total =
        &m.gauge("vlm_gpu_memory_total_bytes", "GPU memory in total (-1: not read yet)");
    impl->gpu_power = &m.gauge("vlm_gpu_power_watts", "GPU board power draw (-1: not reported)");
    for (Gauge* g : {impl->gpu_util, impl->gpu_mem_used, impl->gpu_mem_total, impl->gpu_power}) {
      g->set(-1);  // until NVML is first read
    }
  }
  {
    // vLLM's buckets (its v1 metrics loggers): TTFT; inter-token latency as its time per
    // output token; end-to-end as its request latencies.
    Impl::VllmMetrics& v = impl->vllm;
    v.labels = prometheus_labels({{"model_name", impl->model_name}, {"engine", "0"}});
    v.running = &m.gauge("vllm:num_requests_running",
                         "Number of requests in model execution batches.", v.labels);
    v.waiting = &m.gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                         v.labels);
    v.kv_usage = &m.gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                          v.labels);
    v.prefix_queries =
        &m.counter("vllm:prefix_cache_queries_total",
                   "Prefix cache queries, in terms of number of queried tokens.", "", v.labels);
    v.prefix_hits =
        &m.counter("vllm:prefix_cache_hits_total",
                   "Prefix cache hits, in terms of number of cached tokens.", "", v.labels);
    v.prompt_tokens =
        &m.counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", "", v.labels);
    v.generation_tokens = &m.counter("vllm:generation_tokens_total",
                                     "Number of generation tokens processed.", "", v.labels);
    v.ttft = &m.histogram("vllm:time_to_first_token_seconds",
                          "Histogram of time to first token in seconds.",
                          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                           1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0},
                          v.labels);
    v.itl = &m.histogram("vllm:inter_token_latency_seconds",
                         "Histogram of inter-token latency in seconds.",
                         {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                          5.0, 7.5, 10.0, 20.0, 40.0, 80.0},
                         v.labels);
    v.e2e = &m.histogram("vllm:e2e_request_latency_seconds",
                         "Histogram of e2e request latency in seconds.",
                         {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0},
                         v.labels);
  }
  http::TransportOptions t;
  t.limits.max_body_bytes = impl->limits.max_body_bytes;
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
  impl->http = std::make_unique<http::HttpServer>(std::move(t));
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
            std::fprintf(stderr, "vlm: signal %d again: stopping now\n", sig);
            m.http->stop();
            return;
          }
          std::fprintf(stderr, "vlm: signal %d: draining (at most %.0f s)\n", sig,
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

// `vlm serve`: HTTP threads parse, render the chat template and tokenize; the EngineCore thread
// schedules, runs and samples; tokens come back through a per-request channel and are written
// as JSON or server-sent events (design/style.md §3, "one request, from HTTP to token").
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <mutex>

#include "engine/engine_core.h"
#include "server/httplib_config.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "vlm/chat.h"
#include "vlm/server.h"

namespace vlm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Events of one request, from the engine thread to the HTTP thread that waits for them.
struct Channel {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<CoreEvent> events;

  void push(const CoreEvent& ev) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(ev);
    }
    cv.notify_one();
  }
  CoreEvent pop() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return !events.empty(); });
    CoreEvent ev = std::move(events.front());
    events.pop_front();
    return ev;
  }
};

int status_for(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk: return 200;
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kDataLoss: return 400;
    case StatusCode::kOutOfRange: return 400;
    case StatusCode::kResourceExhausted: return 429;
    case StatusCode::kUnimplemented: return 501;
    case StatusCode::kInternal: return 500;
  }
  return 500;
}

ApiError error_from(const Status& s) {
  ApiError e;
  e.http_status = status_for(s);
  e.type = e.http_status == 429 ? "rate_limit_error"
           : e.http_status >= 500 ? "server_error"
                                  : "invalid_request_error";
  e.message = s.message();
  return e;
}

}  // namespace

struct Server::Impl {
  ServeOptions opts;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineCore> core;
  httplib::Server http;
  int port = 0;
  std::string model_name;
  int64_t created = 0;
  std::atomic<int64_t> next_id{1};
  ApiLimits limits;
  MediaPolicy media;

  MetricsRegistry metrics;
  Counter* requests = nullptr;
  Counter* prompt_tokens = nullptr;
  Counter* generated_tokens = nullptr;
  Histogram* ttft = nullptr;
  Histogram* itl = nullptr;
  Histogram* e2e = nullptr;
  Gauge* running = nullptr;
  Gauge* waiting = nullptr;
  Gauge* kv_used = nullptr;
  Gauge* kv_total = nullptr;

  void reply_error(httplib::Response& res, const ApiError& e, const char* outcome) {
    res.status = e.http_status;
    if (e.http_status == 429) res.set_header("Retry-After", "1");
    res.set_content(api_error_json(e), "application/json");
    requests->inc(outcome);
  }

  bool authorized(const httplib::Request& req, httplib::Response& res) {
    if (opts.api_key.empty()) return true;
    if (req.get_header_value("Authorization") == "Bearer " + opts.api_key) return true;
    ApiError e{401, "authentication_error", "missing or wrong API key", ""};
    reply_error(res, e, "unauthorized");
    return false;
  }

  void chat(const httplib::Request& req, httplib::Response& res);
  void register_routes();
};

void Server::Impl::register_routes() {
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\": \"ok\"}", "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!authorized(req, res)) return;
    res.set_content(models_list_json({model_name}, created), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    EngineCore::Stats st = core->stats();
    running->set(static_cast<double>(st.running));
    waiting->set(static_cast<double>(st.waiting));
    kv_used->set(static_cast<double>(st.kv_blocks_used));
    kv_total->set(static_cast<double>(st.kv_blocks_total));
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { chat(req, res); });
}

void Server::Impl::chat(const httplib::Request& req, httplib::Response& res) {
  const auto t0 = Clock::now();
  if (!authorized(req, res)) return;
  if (req.body.size() > limits.max_body_bytes) return reply_error(res, body_too_large(limits), "bad_request");
  auto parsed = parse_chat_completion(req.body, limits, media);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "bad_request");
  ChatCompletionRequest& cr = parsed.value();
  if (!cr.model.empty() && cr.model != model_name) {
    return reply_error(res, ApiError{404, "not_found_error", "model '" + cr.model + "' is not served here (serving '" + model_name + "')", "model"}, "bad_request");
  }
  if (cr.n != 1) {
    return reply_error(res, ApiError{400, "invalid_request_error", "n > 1 is not supported yet", "n"}, "bad_request");
  }
  if (cr.logprobs) {
    return reply_error(res, ApiError{400, "invalid_request_error", "logprobs are not supported yet", "logprobs"}, "bad_request");
  }
  if (!cr.remote_images.empty()) {
    return reply_error(res, ApiError{400, "invalid_request_error", "remote image URLs are not fetched", "messages"}, "bad_request");
  }
  ChatTemplateOptions topts;
  topts.tools_json = cr.tools_json;
  const std::string prompt = render_chat(cr.messages, topts);
  GenerateRequest g;
  g.prompt_ids = engine->tokenizer()->encode(prompt);
  g.images = std::move(cr.images);
  g.sampling = cr.sampling;
  g.max_new_tokens = cr.max_tokens;
  g.stop = cr.stop;

  auto channel = std::make_shared<Channel>();
  auto id = core->submit(std::move(g), [channel](const CoreEvent& ev) { channel->push(ev); });
  if (!id.ok()) return reply_error(res, error_from(id.status()), "rejected");
  const std::string rid = "chatcmpl-" + std::to_string(next_id++);
  const int64_t created_now = static_cast<int64_t>(std::time(nullptr));

  if (!cr.stream) {
    std::string text;
    CoreEvent ev;
    bool first = true;
    auto last = t0;
    do {
      ev = channel->pop();
      if (ev.token_id >= 0) {
        (first ? ttft : itl)->observe(seconds_since(first ? t0 : last));
        first = false;
        last = Clock::now();
      }
      text += ev.text;
    } while (!ev.finished);
    if (!ev.error.ok()) return reply_error(res, error_from(ev.error), "failed");
    prompt_tokens->inc(static_cast<double>(ev.prompt_tokens));
    generated_tokens->inc(static_cast<double>(ev.completion_tokens));
    e2e->observe(seconds_since(t0));
    requests->inc("ok");
    CompletionChoice choice;
    choice.text = text;
    choice.finish_reason = ev.reason;
    res.set_content(chat_completion_json(rid, model_name, created_now, {choice},
                                         Usage{ev.prompt_tokens, ev.completion_tokens}),
                    "application/json");
    return;
  }

  // Streaming: one SSE chunk per event; a failed write means the client left → abort.
  const bool include_usage = cr.include_usage;
  const int64_t core_id = *id;
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, channel, rid, created_now, include_usage, core_id, t0](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
        if (!write(sse_event(chat_chunk_json(rid, model_name, created_now, 0, "", std::string("assistant"))))) {
          core->abort(core_id);
          requests->inc("cancelled");
          return false;
        }
        bool first = true;
        auto last = t0;
        for (;;) {
          CoreEvent ev = channel->pop();
          if (ev.token_id >= 0) {
            (first ? ttft : itl)->observe(seconds_since(first ? t0 : last));
            first = false;
            last = Clock::now();
          }
          if (!ev.error.ok()) {
            write(sse_event(api_error_json(error_from(ev.error))));
            write(sse_done());
            requests->inc("failed");
            sink.done();
            return true;
          }
          if (!ev.text.empty() && !write(sse_event(chat_chunk_json(rid, model_name, created_now, 0, ev.text)))) {
            core->abort(core_id);
            requests->inc("cancelled");
            return false;
          }
          if (ev.finished) {
            write(sse_event(chat_chunk_json(rid, model_name, created_now, 0, "", std::nullopt, ev.reason)));
            if (include_usage) {
              write(sse_event(usage_chunk_json(rid, model_name, created_now,
                                               Usage{ev.prompt_tokens, ev.completion_tokens})));
            }
            write(sse_done());
            prompt_tokens->inc(static_cast<double>(ev.prompt_tokens));
            generated_tokens->inc(static_cast<double>(ev.completion_tokens));
            e2e->observe(seconds_since(t0));
            requests->inc("ok");
            sink.done();
            return true;
          }
        }
      });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() { stop(); }

Result<std::unique_ptr<Server>> Server::create(const ServeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  VLM_ASSIGN_OR_RETURN(impl->engine, Engine::load(options.engine));
  if (impl->engine->tokenizer() == nullptr) return not_found("the model directory has no tokenizer.json");
  VLM_ASSIGN_OR_RETURN(impl->core, EngineCore::create(*impl->engine, options.batching));
  impl->model_name = options.model_name.empty()
                         ? std::filesystem::path(options.engine.model_dir).filename().string()
                         : options.model_name;
  if (impl->model_name.empty()) impl->model_name = "vlm";
  impl->created = static_cast<int64_t>(std::time(nullptr));
  impl->media.allowed_local_path = options.allowed_media_path;
  auto& m = impl->metrics;
  impl->requests = &m.counter("vlm_requests_total", "Requests by outcome", "outcome");
  impl->prompt_tokens = &m.counter("vlm_prompt_tokens_total", "Prompt tokens (image tokens included)");
  impl->generated_tokens = &m.counter("vlm_generation_tokens_total", "Generated tokens");
  const std::vector<double> lat = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  impl->ttft = &m.histogram("vlm_time_to_first_token_seconds", "Time to first token", lat);
  impl->itl = &m.histogram("vlm_inter_token_latency_seconds", "Time between tokens", lat);
  impl->e2e = &m.histogram("vlm_e2e_request_latency_seconds", "End-to-end request latency", lat);
  impl->running = &m.gauge("vlm_num_requests_running", "Requests in the running batch");
  impl->waiting = &m.gauge("vlm_num_requests_waiting", "Requests waiting to be scheduled");
  impl->kv_used = &m.gauge("vlm_kv_cache_blocks_used", "KV cache blocks in use");
  impl->kv_total = &m.gauge("vlm_kv_cache_blocks_total", "KV cache blocks in total");
  impl->http.new_task_queue = [n = options.http_threads] { return new httplib::ThreadPool(n); };
  impl->http.set_payload_max_length(impl->limits.max_body_bytes + 1);
  impl->register_routes();
  if (options.port == 0) {
    impl->port = impl->http.bind_to_any_port(options.host);
  } else {
    impl->port = impl->http.bind_to_port(options.host, options.port) ? options.port : -1;
  }
  if (impl->port <= 0) {
    return invalid_argument("cannot listen on " + options.host + ":" + std::to_string(options.port));
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }

Status Server::run() {
  if (!impl_->http.listen_after_bind()) return internal_error("the HTTP server stopped with an error");
  return ok_status();
}

void Server::stop() {
  if (impl_) impl_->http.stop();
}

}  // namespace vlm

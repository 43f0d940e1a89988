// `vlm serve`: HTTP threads parse, render the chat template and tokenize; the EngineCore thread
// schedules, runs and samples; tokens come back through a per-request channel and are written
// as JSON or server-sent events (docs/architecture.md).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>

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

// GETs an http(s) image URL (redirects followed, at most `max_bytes`); failures are 400s that
// name the URL.
ApiResult<std::vector<uint8_t>> fetch_image(const std::string& url, size_t max_bytes, int timeout_s) {
  auto fail = [&](const std::string& why) {
    return ApiError{400, "invalid_request_error", "cannot fetch image " + url + ": " + why, "messages"};
  };
  const size_t scheme_end = url.find("://");
  const size_t path_start = url.find('/', scheme_end + 3);
  const std::string origin = url.substr(0, path_start);
  const std::string path = path_start == std::string::npos ? "/" : url.substr(path_start);
  if (origin.size() <= scheme_end + 3) return fail("no host");
  httplib::Client client(origin);
  if (!client.is_valid()) return fail("bad URL");
  client.set_connection_timeout(timeout_s, 0);
  client.set_read_timeout(timeout_s, 0);
  client.set_follow_location(true);
  std::vector<uint8_t> bytes;
  bool too_large = false;
  auto r = client.Get(path, [&](const char* data, size_t n) {
    if (bytes.size() + n > max_bytes) {
      too_large = true;
      return false;
    }
    bytes.insert(bytes.end(), data, data + n);
    return true;
  });
  if (too_large) {
    return ApiError{413, "invalid_request_error",
                    "image " + url + " is larger than " + std::to_string(max_bytes) + " bytes", "messages"};
  }
  if (!r) return fail(httplib::to_string(r.error()));
  if (r->status != 200) return fail("HTTP status " + std::to_string(r->status));
  return bytes;
}

}  // namespace

struct Server::Impl {
  ServeOptions opts;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineCore> core;
  // Loading runs on `loader`; `ready` turns true once engine and core exist (then they never
  // change), so handlers check it before touching them.
  std::thread loader;
  std::atomic<bool> ready{false};
  std::mutex load_mu;
  std::condition_variable load_cv;
  bool load_done = false;
  Status load_status;
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
  Counter* image_tokens = nullptr;
  Counter* images = nullptr;
  Counter* cache_hits = nullptr;
  Counter* cache_misses = nullptr;
  Counter* preemptions = nullptr;
  Histogram* ttft = nullptr;
  Histogram* itl = nullptr;
  Histogram* e2e = nullptr;
  Histogram* queue_time = nullptr;
  Histogram* preprocess_time = nullptr;
  Histogram* encode_time = nullptr;
  Gauge* running = nullptr;
  Gauge* waiting = nullptr;
  Gauge* kv_used = nullptr;
  Gauge* kv_total = nullptr;
  Gauge* gpu_util = nullptr;  // these three: only with --device cuda
  Gauge* gpu_mem_used = nullptr;
  Gauge* gpu_mem_total = nullptr;
  std::mutex mirror_mu;  // counters mirrored from EngineCore::Stats at scrape time
  EngineCore::Stats mirrored;

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

  void load() {
    if (opts.before_load) opts.before_load();
    Status st = [&]() -> Status {
      VLM_ASSIGN_OR_RETURN(engine, Engine::load(opts.engine));
      if (engine->tokenizer() == nullptr) return not_found("the model directory has no tokenizer.json");
      VLM_ASSIGN_OR_RETURN(core, EngineCore::create(*engine, opts.batching));
      return ok_status();
    }();
    ready = st.ok();
    std::lock_guard<std::mutex> lock(load_mu);
    load_status = st;
    load_done = true;
    load_cv.notify_all();
  }

  // 503 while the model loads (or after it failed to); false when that reply was written.
  bool check_ready(httplib::Response& res) {
    if (ready) return true;
    res.status = 503;
    res.set_header("Retry-After", "1");
    res.set_content(api_error_json(ApiError{503, "service_unavailable", "the model is loading", ""}),
                    "application/json");
    return false;
  }

  // Checks shared by both endpoints; false when an error reply was written.
  bool check_common(const httplib::Request& req, httplib::Response& res) {
    if (!check_ready(res)) return false;
    if (!authorized(req, res)) return false;
    if (req.body.size() > limits.max_body_bytes) {
      reply_error(res, body_too_large(limits), "bad_request");
      return false;
    }
    return true;
  }
  bool check_model(const std::string& model, httplib::Response& res) {
    if (model.empty() || model == model_name) return true;
    reply_error(res, ApiError{404, "not_found_error", "model '" + model + "' is not served here (serving '" + model_name + "')", "model"}, "bad_request");
    return false;
  }

  GenerateRequest base_request(const CommonRequest& c) const {
    GenerateRequest g;
    g.sampling = c.sampling;
    g.max_new_tokens = c.max_tokens;
    g.stop = c.stop;
    g.ignore_eos = c.ignore_eos;
    return g;
  }

  void scrape_metrics();
  void chat(const httplib::Request& req, httplib::Response& res);
  void completions(const httplib::Request& req, httplib::Response& res);
  void register_routes();
};

namespace {

// One choice of a response (one engine request).
struct ChoiceState {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  FinishReason reason = FinishReason::kNone;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  bool finished = false;
  Clock::time_point last_token;
  bool has_token = false;
};

// One HTTP request fanned out to its choices (n, and prompts for /v1/completions): submits them
// to the engine core, receives their events on one channel, keeps each choice's text and
// logprobs, and records the latency metrics.
class Fanout {
 public:
  Fanout(Server::Impl& s, Clock::time_point t0) : s_(s), t0_(t0), channel_(std::make_shared<Channel>()) {}
  ~Fanout() { abort_unfinished(); }

  // Submits every request; on an error the ones already submitted are aborted.
  Status submit(std::vector<GenerateRequest> reqs) {
    for (GenerateRequest& g : reqs) {
      auto id = s_.core->submit(std::move(g), [ch = channel_](const CoreEvent& ev) { ch->push(ev); });
      if (!id.ok()) {
        abort_unfinished();
        return id.status();
      }
      index_[*id] = static_cast<int>(ids_.size());
      ids_.push_back(*id);
    }
    choices.resize(ids_.size());
    return ok_status();
  }

  bool done() const { return finished_ == ids_.size(); }

  // Waits for the next event; returns its choice index (the event is in *ev).
  int next(CoreEvent* ev) {
    *ev = channel_->pop();
    const int i = index_.at(ev->request_id);
    ChoiceState& c = choices[i];
    if (ev->token_id >= 0) {
      const auto now = Clock::now();
      if (!any_token_) s_.ttft->observe(seconds_since(t0_));
      if (c.has_token) s_.itl->observe(std::chrono::duration<double>(now - c.last_token).count());
      any_token_ = c.has_token = true;
      c.last_token = now;
      if (ev->has_logprobs) {
        const Tokenizer& tok = *s_.engine->tokenizer();
        TokenLogprob t{tok.token_bytes(ev->token_id), ev->logprob, {}};
        for (const auto& [id, lp] : ev->top_logprobs) t.top_logprobs.push_back(TopLogprob{tok.token_bytes(id), lp});
        c.logprobs.push_back(std::move(t));
      }
    }
    c.text += ev->text;
    if (ev->finished) {
      c.finished = true;
      ++finished_;
      c.reason = ev->reason;
      c.prompt_tokens = ev->prompt_tokens;
      c.completion_tokens = ev->completion_tokens;
      if (ev->error.ok()) {
        s_.prompt_tokens->inc(static_cast<double>(ev->prompt_tokens));
        s_.generated_tokens->inc(static_cast<double>(ev->completion_tokens));
        s_.queue_time->observe(ev->queue_ms / 1e3);
        if (ev->images > 0) {
          s_.images->inc(static_cast<double>(ev->images));
          s_.image_tokens->inc(static_cast<double>(ev->image_tokens));
          if (ev->images > ev->images_cached || ev->preprocess_ms > 0) s_.preprocess_time->observe(ev->preprocess_ms / 1e3);
          if (ev->images > ev->images_cached) s_.encode_time->observe(ev->encode_ms / 1e3);
        }
      }
    }
    return i;
  }

  void abort_unfinished() {
    for (size_t i = 0; i < ids_.size(); ++i) {
      if (i >= choices.size() || !choices[i].finished) s_.core->abort(ids_[i]);
    }
    finished_ = ids_.size();
  }

  void observe_e2e() const { s_.e2e->observe(seconds_since(t0_)); }

  std::vector<ChoiceState> choices;

 private:
  Server::Impl& s_;
  Clock::time_point t0_;
  std::shared_ptr<Channel> channel_;
  std::vector<int64_t> ids_;
  std::unordered_map<int64_t, int> index_;
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

// Usage: prompt tokens once per distinct prompt (choices p*n .. p*n+n-1 share one), completion
// tokens over all choices.
Usage usage_of(const std::vector<ChoiceState>& choices, int n) {
  Usage u;
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i % static_cast<size_t>(n) == 0) u.prompt_tokens += choices[i].prompt_tokens;
    u.completion_tokens += choices[i].completion_tokens;
  }
  return u;
}

// Waits for every choice to finish; the first error aborts the rest and is returned.
Status collect(Fanout& fan) {
  CoreEvent ev;
  while (!fan.done()) {
    fan.next(&ev);
    if (!ev.error.ok()) {
      fan.abort_unfinished();
      return ev.error;
    }
  }
  return ok_status();
}

// How one endpoint words its stream.
struct SseFormat {
  std::vector<std::string> prologue;  // chunks before any token (chat: each choice's role)
  bool logprobs = false;
  // A chunk for choice i: new text and, with logprobs, the token it came with.
  std::function<std::string(int, const std::string&, const std::vector<TokenLogprob>*)> chunk;
  std::function<std::string(int, FinishReason)> finish;  // choice i finished
  std::function<std::string(const Usage&)> usage;          // empty: no usage chunk
};

// Streams a fanned-out request as server-sent events, ending with [DONE]. A failed write means
// the client left: the requests are aborted (their KV blocks freed at the next step).
bool stream_sse(Server::Impl& s, Fanout& fan, int n, const SseFormat& f, httplib::DataSink& sink) {
  auto write = [&](const std::string& str) { return sink.write(str.data(), str.size()); };
  auto cancelled = [&] {
    fan.abort_unfinished();
    s.requests->inc("cancelled");
    return false;
  };
  for (const std::string& c : f.prologue) {
    if (!write(sse_event(c))) return cancelled();
  }
  CoreEvent ev;
  while (!fan.done()) {
    const int i = fan.next(&ev);
    if (!ev.error.ok()) {
      fan.abort_unfinished();
      write(sse_event(api_error_json(error_from(ev.error))));
      write(sse_done());
      s.requests->inc("failed");
      sink.done();
      return true;
    }
    const bool has_lp = f.logprobs && ev.token_id >= 0;
    std::vector<TokenLogprob> lp;
    if (has_lp) lp.push_back(fan.choices[i].logprobs.back());
    if ((!ev.text.empty() || has_lp) && !write(sse_event(f.chunk(i, ev.text, has_lp ? &lp : nullptr)))) {
      return cancelled();
    }
    if (ev.finished && !write(sse_event(f.finish(i, ev.reason)))) return cancelled();
  }
  if (f.usage) write(sse_event(f.usage(usage_of(fan.choices, n))));
  write(sse_done());
  fan.observe_e2e();
  s.requests->inc("ok");
  sink.done();
  return true;
}

}  // namespace

void Server::Impl::scrape_metrics() {
  EngineCore::Stats st = core->stats();
  running->set(static_cast<double>(st.running));
  waiting->set(static_cast<double>(st.waiting));
  kv_used->set(static_cast<double>(st.kv_blocks_used));
  kv_total->set(static_cast<double>(st.kv_blocks_total));
  Engine::GpuStats g;
  if (gpu_util != nullptr && engine->gpu_stats(&g)) {  // on "cuda": NVML's view of the device
    gpu_util->set(g.utilization_percent);
    gpu_mem_used->set(static_cast<double>(g.memory_used));
    gpu_mem_total->set(static_cast<double>(g.memory_total));
  }
  std::lock_guard<std::mutex> lock(mirror_mu);
  cache_hits->inc(static_cast<double>(st.vision_cache_hits - mirrored.vision_cache_hits));
  cache_misses->inc(static_cast<double>(st.vision_cache_misses - mirrored.vision_cache_misses));
  preemptions->inc(static_cast<double>(st.preemptions - mirrored.preemptions));
  mirrored = st;
}

void Server::Impl::register_routes() {
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready) return res.set_content("{\"status\": \"ok\"}", "application/json");
    res.status = 503;
    res.set_content("{\"status\": \"loading\"}", "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (!check_ready(res) || !authorized(req, res)) return;
    res.set_content(models_list_json({model_name}, created), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    if (ready) scrape_metrics();
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  http.Post("/v1/chat/completions",
            [this](const httplib::Request& req, httplib::Response& res) { chat(req, res); });
  http.Post("/v1/completions",
            [this](const httplib::Request& req, httplib::Response& res) { completions(req, res); });
}

void Server::Impl::chat(const httplib::Request& req, httplib::Response& res) {
  const auto t0 = Clock::now();
  if (!check_common(req, res)) return;
  auto parsed = parse_chat_completion(req.body, limits, media);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "bad_request");
  ChatCompletionRequest& cr = parsed.value();
  if (!check_model(cr.model, res)) return;
  for (const RemoteImage& ri : cr.remote_images) {  // only present with --allow-remote-media
    auto bytes = fetch_image(ri.url, limits.max_image_bytes, opts.remote_media_timeout_s);
    if (!bytes.ok()) return reply_error(res, bytes.error(), "bad_request");
    cr.images[ri.image_index].bytes = std::move(bytes).value();
  }
  ChatTemplateOptions topts;
  topts.tools_json = cr.tools_json;
  GenerateRequest g = base_request(cr);
  g.prompt_ids = engine->tokenizer()->encode(render_chat(cr.messages, topts));
  g.images = std::move(cr.images);
  g.logprobs = cr.logprobs ? cr.top_logprobs : -1;
  // The first choice stages (preprocesses) the images; the vision cache serves the others.
  std::vector<GenerateRequest> reqs;
  add_choices(g, cr.n, &reqs);
  auto fan = std::make_shared<Fanout>(*this, t0);
  if (Status st = fan->submit(std::move(reqs)); !st.ok()) return reply_error(res, error_from(st), "rejected");
  const std::string rid = "chatcmpl-" + std::to_string(next_id++);
  const int64_t created_now = static_cast<int64_t>(std::time(nullptr));
  const bool want_logprobs = cr.logprobs;
  const int n = cr.n;

  if (!cr.stream) {
    if (Status st = collect(*fan); !st.ok()) return reply_error(res, error_from(st), "failed");
    std::vector<CompletionChoice> out;
    for (int i = 0; i < n; ++i) {
      CompletionChoice c;
      c.index = i;
      c.text = fan->choices[i].text;
      c.finish_reason = fan->choices[i].reason;
      if (want_logprobs) c.logprobs = fan->choices[i].logprobs;
      out.push_back(std::move(c));
    }
    fan->observe_e2e();
    requests->inc("ok");
    res.set_content(chat_completion_json(rid, model_name, created_now, out, usage_of(fan->choices, n)),
                    "application/json");
    return;
  }

  auto f = std::make_shared<SseFormat>();
  for (int i = 0; i < n; ++i) f->prologue.push_back(chat_chunk_json(rid, model_name, created_now, i, "", std::string("assistant")));
  f->logprobs = want_logprobs;
  f->chunk = [=, this](int i, const std::string& text, const std::vector<TokenLogprob>* lp) {
    return chat_chunk_json(rid, model_name, created_now, i, text, std::nullopt, std::nullopt, lp);
  };
  f->finish = [=, this](int i, FinishReason r) {
    return chat_chunk_json(rid, model_name, created_now, i, "", std::nullopt, r);
  };
  if (cr.include_usage) {
    f->usage = [=, this](const Usage& u) { return usage_chunk_json(rid, model_name, created_now, u); };
  }
  res.set_chunked_content_provider("text/event-stream", [this, fan, f, n](size_t, httplib::DataSink& sink) {
    return stream_sse(*this, *fan, n, *f, sink);
  });
}

void Server::Impl::completions(const httplib::Request& req, httplib::Response& res) {
  const auto t0 = Clock::now();
  if (!check_common(req, res)) return;
  auto parsed = parse_completion(req.body, limits);
  if (!parsed.ok()) return reply_error(res, parsed.error(), "bad_request");
  CompletionRequest& cr = parsed.value();
  if (!check_model(cr.model, res)) return;
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
  auto fan = std::make_shared<Fanout>(*this, t0);
  if (Status st = fan->submit(std::move(reqs)); !st.ok()) return reply_error(res, error_from(st), "rejected");
  const std::string rid = "cmpl-" + std::to_string(next_id++);
  const int64_t created_now = static_cast<int64_t>(std::time(nullptr));
  const bool want_logprobs = cr.logprobs.has_value();
  const int n = cr.n;

  if (!cr.stream) {
    if (Status st = collect(*fan); !st.ok()) return reply_error(res, error_from(st), "failed");
    std::vector<CompletionChoice> out;
    std::vector<size_t> offsets;
    for (size_t i = 0; i < fan->choices.size(); ++i) {
      CompletionChoice c;
      c.index = static_cast<int>(i);
      c.text = echo[i] + fan->choices[i].text;
      c.finish_reason = fan->choices[i].reason;
      if (want_logprobs) c.logprobs = fan->choices[i].logprobs;
      offsets.push_back(echo[i].size());
      out.push_back(std::move(c));
    }
    fan->observe_e2e();
    requests->inc("ok");
    res.set_content(completion_json(rid, model_name, created_now, out, usage_of(fan->choices, n), offsets),
                    "application/json");
    return;
  }

  // text_offset of each choice's next token: where its generated text has reached.
  auto offset = std::make_shared<std::vector<size_t>>();
  auto f = std::make_shared<SseFormat>();
  for (size_t i = 0; i < echo.size(); ++i) {
    offset->push_back(echo[i].size());
    if (!echo[i].empty()) f->prologue.push_back(completion_chunk_json(rid, model_name, created_now, static_cast<int>(i), echo[i]));
  }
  f->logprobs = want_logprobs;
  f->chunk = [=, this](int i, const std::string& text, const std::vector<TokenLogprob>* lp) {
    std::string c = completion_chunk_json(rid, model_name, created_now, i, text, std::nullopt, lp, (*offset)[i]);
    if (lp) (*offset)[i] += (*lp)[0].token.size();
    return c;
  };
  f->finish = [=, this](int i, FinishReason r) {
    return completion_chunk_json(rid, model_name, created_now, i, "", r);
  };
  if (cr.include_usage) {
    f->usage = [=, this](const Usage& u) {
      return usage_chunk_json(rid, model_name, created_now, u, "text_completion");
    };
  }
  res.set_chunked_content_provider("text/event-stream", [this, fan, f, n](size_t, httplib::DataSink& sink) {
    return stream_sse(*this, *fan, n, *f, sink);
  });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  stop();
  if (impl_ && impl_->loader.joinable()) impl_->loader.join();
}

Result<std::unique_ptr<Server>> Server::create(const ServeOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opts = options;
  impl->model_name = options.model_name.empty()
                         ? std::filesystem::path(options.engine.model_dir).filename().string()
                         : options.model_name;
  if (impl->model_name.empty()) impl->model_name = "vlm";
  impl->created = static_cast<int64_t>(std::time(nullptr));
  impl->media.allowed_local_path = options.allowed_media_path;
  impl->media.allow_remote = options.allow_remote_media;
  auto& m = impl->metrics;
  impl->requests = &m.counter("vlm_requests_total", "Requests by outcome", "outcome");
  impl->prompt_tokens = &m.counter("vlm_prompt_tokens_total", "Prompt tokens (image tokens included)");
  impl->generated_tokens = &m.counter("vlm_generation_tokens_total", "Generated tokens");
  impl->image_tokens = &m.counter("vlm_image_tokens_total", "Image tokens among the prompt tokens");
  impl->images = &m.counter("vlm_images_total", "Images in requests");
  impl->cache_hits = &m.counter("vlm_vision_cache_hits_total", "Images served from the vision-encoder cache");
  impl->cache_misses = &m.counter("vlm_vision_cache_misses_total", "Images run through the vision encoder");
  impl->preemptions = &m.counter("vlm_preemptions_total", "Requests preempted (KV cache full) and recomputed");
  const std::vector<double> lat = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  impl->ttft = &m.histogram("vlm_time_to_first_token_seconds", "Time to first token", lat);
  impl->itl = &m.histogram("vlm_inter_token_latency_seconds", "Time between tokens", lat);
  impl->e2e = &m.histogram("vlm_e2e_request_latency_seconds", "End-to-end request latency", lat);
  impl->queue_time = &m.histogram("vlm_request_queue_time_seconds",
                                  "Submit to first forward pass, image encoding excluded", lat);
  impl->preprocess_time = &m.histogram("vlm_image_preprocess_seconds",
                                       "Image decode + preprocess per request (HTTP thread)", lat);
  impl->encode_time = &m.histogram("vlm_vision_encode_seconds",
                                   "Vision encoder time per request (cache misses)", lat);
  impl->running = &m.gauge("vlm_num_requests_running", "Requests in the running batch");
  impl->waiting = &m.gauge("vlm_num_requests_waiting", "Requests waiting to be scheduled");
  impl->kv_used = &m.gauge("vlm_kv_cache_blocks_used", "KV cache blocks in use");
  impl->kv_total = &m.gauge("vlm_kv_cache_blocks_capacity", "KV cache blocks in total");
  if (options.engine.device == "cuda") {
    impl->gpu_util = &m.gauge("vlm_gpu_utilization_percent",
                              "GPU busy share over NVML's last sample period (-1: not reported)");
    impl->gpu_mem_used = &m.gauge("vlm_gpu_memory_used_bytes", "GPU memory in use (all processes)");
    impl->gpu_mem_total = &m.gauge("vlm_gpu_memory_total_bytes", "GPU memory in total");
  }
  // Each SSE chunk is its own small write: without TCP_NODELAY, Nagle's algorithm holds the
  // first token back ~40 ms behind the headers.
  impl->http.set_tcp_nodelay(true);
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
  Impl* raw = impl.get();
  impl->loader = std::thread([raw] { raw->load(); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

int Server::port() const { return impl_->port; }

Status Server::wait_until_loaded() {
  std::unique_lock<std::mutex> lock(impl_->load_mu);
  impl_->load_cv.wait(lock, [&] { return impl_->load_done; });
  return impl_->load_status;
}

Status Server::run() {
  // A failed load stops the listener, so run() returns the load error.
  std::atomic<bool> listening_done{false};
  std::thread watcher([&] {
    if (wait_until_loaded().ok()) return;
    while (!listening_done && !impl_->http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    impl_->http.stop();
  });
  const bool ok = impl_->http.listen_after_bind();
  listening_done = true;
  watcher.join();
  Status load = wait_until_loaded();
  if (!load.ok()) return load;
  if (!ok) return internal_error("the HTTP server stopped with an error");
  return ok_status();
}

void Server::stop() {
  if (impl_) impl_->http.stop();
}

}  // namespace vlm

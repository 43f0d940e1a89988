#include "engine/engine_core.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>

#include "core/clock.h"
#include "engine/engine_impl.h"
#include "engine/stop_matcher.h"
#include "engine/vision_cache.h"

namespace vlm {

namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One request as the engine thread sees it.
struct Req {
  int64_t id = 0;
  GenerateRequest request;
  std::function<void(const CoreEvent&)> on_event;
  // Made on the submitting thread: image pad runs and the staged images (pixels or cached
  // features); the expanded prompt length and the token budget.
  std::vector<std::pair<size_t, size_t>> runs;
  std::vector<StagedImage> images;
  int64_t prompt_len = 0;
  int64_t max_new = 0;
  Clock::time_point submitted;
  double preprocess_ms = 0, encode_ms = 0, queue_ms = -1;
  int64_t images_cached = 0;

  PreparedPrompt prompt;
  std::vector<int32_t> ids;          // prompt + generated
  std::vector<int32_t> feature_row;  // [ids.size()]: image feature row or -1
  std::vector<int64_t> pos_t, pos_h, pos_w;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<StopMatcher> stops;
  int64_t generated = 0;
  bool admitted = false;
};

// log-softmax of `row` at `chosen` and the k best entries (id, log-probability), best first
// (ties: the lower id).
void token_logprobs(const float* row, int64_t V, int32_t chosen, int32_t k, CoreEvent* ev) {
  float mx = row[0];
  for (int64_t i = 1; i < V; ++i) mx = std::max(mx, row[i]);
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(row[i] - mx));
  const float lse = mx + static_cast<float>(std::log(sum));
  ev->has_logprobs = true;
  ev->logprob = row[chosen] - lse;
  ev->top_logprobs.clear();
  if (k <= 0) return;
  auto better = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  auto& top = ev->top_logprobs;  // a min-heap of the k best under `better`
  for (int64_t i = 0; i < V; ++i) {
    std::pair<int32_t, float> c{static_cast<int32_t>(i), row[i]};
    if (static_cast<int32_t>(top.size()) < k) {
      top.push_back(c);
      std::push_heap(top.begin(), top.end(), better);
    } else if (better(c, top.front())) {
      std::pop_heap(top.begin(), top.end(), better);
      top.back() = c;
      std::push_heap(top.begin(), top.end(), better);
    }
  }
  std::sort_heap(top.begin(), top.end(), better);
  for (auto& t : top) t.second -= lse;
}

}  // namespace

struct EngineCore::State {
  std::unique_ptr<Scheduler> sched;
  KvCache cache;
  std::vector<float> logits;          // [max_num_seqs, vocab]
  std::vector<float> raw_row;         // [vocab]: a row before the sampler's penalties (logprobs)
  std::vector<int32_t> argmax;        // [max_num_seqs]: each logit row's argmax or draw (GPU)
  std::vector<DeviceSample> samples;  // per chunk: a draw on the GPU
  std::vector<std::vector<DevicePenalty>> penalties;  // its penalties
  std::unique_ptr<VisionCache> vision_cache;
  // Per-step scratch of the engine thread, kept so that their memory is reused: steady-state
  // decode steps allocate nothing (tests/model/alloc_test.cc).
  SchedulerOutput sched_out;
  std::vector<SeqChunk> chunks;
  std::vector<VisionRows> vision;
  std::vector<std::pair<int64_t, int64_t>> computed;
  std::vector<std::pair<int32_t, float>> top_logprobs;  // lent to each token event
  std::vector<StagedImage*> batch_images;  // admit(): images encoded together on the GPU
  std::vector<double*> batch_ms;           // their requests' encode_ms

  mutable std::mutex mu;
  std::condition_variable cv;       // wakes the engine thread
  std::condition_variable cv_idle;  // wakes wait_idle()
  std::deque<std::unique_ptr<Req>> inbox;
  std::vector<int64_t> aborts;
  bool stop = false;
  std::atomic<int64_t> heartbeat_ns{0};  // steady_clock, set by the engine thread
  int64_t next_id = 1;
  int64_t in_flight = 0;  // submitted and not yet finished / aborted
  Stats stats;

  std::unordered_map<int64_t, std::unique_ptr<Req>> reqs;  // engine thread only
};

EngineCore::EngineCore(Engine& engine, const BatchingOptions& opts, Scheduler sched)
    : engine_(engine), opts_(opts), st_(std::make_unique<State>()) {
  st_->sched = std::make_unique<Scheduler>(std::move(sched));
}

Result<std::unique_ptr<EngineCore>> EngineCore::create(Engine& engine, const BatchingOptions& o,
                                                       std::function<void(double)> on_step) {
  Engine::Impl& m = *engine.impl_;
  const Qwen3VLTextConfig& t = m.cfg.text_config;
  BatchingOptions opts = o;
  if (opts.max_batched_tokens > m.max_chunk()) {
    return invalid_argument("max_batched_tokens (" + std::to_string(opts.max_batched_tokens) +
                            ") exceeds the engine's prefill chunk (" +
                            std::to_string(m.max_chunk()) + ")");
  }
  if (opts.block_size <= 0) return invalid_argument("block_size must be positive");
  const int64_t blocks_per_seq = (m.max_context + opts.block_size - 1) / opts.block_size;
  if (opts.num_blocks <= 0 && m.gpu != nullptr) {
    // Every sequence at full context, within the share of GPU memory the options allow (vLLM's
    // gpu_memory_utilization): the KV cache takes what the weights and scratch leave.
    const int64_t fit = m.gpu->cache_budget_bytes(m.opts.gpu_memory_utilization) /
                        m.gpu->block_bytes(opts.block_size);
    opts.num_blocks = static_cast<int32_t>(std::min<int64_t>(
        {opts.max_num_seqs * blocks_per_seq, fit, std::numeric_limits<int32_t>::max()}));
    if (opts.num_blocks <= 0) {
      return Status(StatusCode::kResourceExhausted,
                    "no GPU memory is left for the KV cache under the memory utilization " +
                        std::to_string(m.opts.gpu_memory_utilization));
    }
  }
  if (opts.num_blocks <= 0) {
    // Room for every sequence at full context, capped at 2 GiB of f32 K and V.
    const int64_t per_block =
        t.num_hidden_layers * opts.block_size * t.num_key_value_heads * t.head_dim * 4 * 2;
    const int64_t want = opts.max_num_seqs * blocks_per_seq;
    opts.num_blocks = static_cast<int32_t>(std::min<int64_t>(want, (int64_t{2} << 30) / per_block));
  }
  SchedulerConfig sc;
  sc.num_blocks = opts.num_blocks;
  sc.block_size = opts.block_size;
  sc.max_num_seqs = opts.max_num_seqs;
  sc.max_batched_tokens = opts.max_batched_tokens;
  // submit() bounds the queue (429 there); preempted requests may take the scheduler's waiting
  // queue past it, which must not fail them.
  sc.max_waiting = opts.max_waiting + opts.max_num_seqs + 1;
  VLM_ASSIGN_OR_RETURN(Scheduler sched, Scheduler::create(sc));
  std::unique_ptr<EngineCore> core(new EngineCore(engine, opts, std::move(sched)));
  core->on_step_ = std::move(on_step);
  if (m.gpu != nullptr) {
    VLM_RETURN_IF_ERROR(m.gpu->allocate_cache(opts.num_blocks, opts.block_size, blocks_per_seq));
  } else {
    core->st_->cache.allocate(t, opts.num_blocks, opts.block_size);
  }
  core->st_->logits.resize(static_cast<size_t>(opts.max_num_seqs * t.vocab_size));
  core->st_->raw_row.resize(static_cast<size_t>(t.vocab_size));
  core->st_->argmax.resize(static_cast<size_t>(opts.max_num_seqs));
  core->st_->vision_cache = std::make_unique<VisionCache>(
      static_cast<size_t>(std::max<int64_t>(opts.vision_cache_mib, 0)) << 20);
  core->st_->stats.kv_blocks_total = opts.num_blocks;
  core->st_->heartbeat_ns = steady_now_ns();
  core->thread_ = std::thread([c = core.get()] { c->loop(); });
  return core;
}

EngineCore::~EngineCore() {
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    st_->stop = true;
  }
  st_->cv.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<int64_t> EngineCore::submit(GenerateRequest request,
                                   std::function<void(const CoreEvent&)> on_event) {
  Engine::Impl& m = *engine_.impl_;
  const auto submitted = Clock::now();
  if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  VLM_RETURN_IF_ERROR(m.check_prompt_ids(request.prompt_ids));
  VLM_ASSIGN_OR_RETURN(ResolvedSampling rs, m.resolve_sampling(request.sampling));
  if (!request.stop.empty() && m.tokenizer == nullptr) {
    return invalid_argument("stop strings need the model's tokenizer");
  }
  if (request.logprobs > 20) return invalid_argument("at most 20 top logprobs per token");
  auto r = std::make_unique<Req>();
  r->submitted = submitted;

  // Images: read, decode and preprocess here, on the caller's thread (or find them cached).
  VLM_ASSIGN_OR_RETURN(const bool multimodal, m.is_multimodal(request.prompt_ids, request.images));
  if (multimodal) {
    VLM_ASSIGN_OR_RETURN(r->runs,
                         find_image_runs(request.prompt_ids, m.cfg, request.images.size()));
    r->images.resize(request.images.size());
    // What the images may take of the context: all of it but the text (each image is a single
    // pad until expanded) and the one token every request generates. Each image is priced from
    // its header before it is decoded.
    int64_t room =
        m.max_context - 1 -
        (static_cast<int64_t>(request.prompt_ids.size()) - static_cast<int64_t>(r->runs.size()));
    for (size_t k = 0; k < request.images.size(); ++k) {
      VLM_RETURN_IF_ERROR(stage_image(request.images[k], m.preprocess, st_->vision_cache.get(),
                                      nullptr, &r->images[k], std::max<int64_t>(room, 0))
                              .with_context("image " + std::to_string(k + 1)));
      room -= r->images[k].tokens;
      r->preprocess_ms += r->images[k].decode_ms + r->images[k].preprocess_ms;
    }
    request.images.clear();  // the staged copies are all that is needed now
  }
  r->prompt_len = r->runs.empty() ? static_cast<int64_t>(request.prompt_ids.size())
                                  : expanded_length(request.prompt_ids.size(), r->runs, r->images);
  VLM_ASSIGN_OR_RETURN(r->max_new, m.generation_budget(r->prompt_len, request.max_new_tokens));
  // The scheduler samples at least one token per request.
  if (r->max_new < 1) return invalid_argument("max_new_tokens must be >= 1");
  VLM_RETURN_IF_ERROR(st_->sched->check_fits(r->prompt_len + r->max_new));

  r->sampler = std::make_unique<Sampler>(m.cfg.text_config.vocab_size, rs);
  r->request = std::move(request);
  r->on_event = std::move(on_event);
  std::lock_guard<std::mutex> lock(st_->mu);
  // Queued = submitted and not running: the inbox, plus what the engine thread holds but has
  // not scheduled yet.
  if (st_->in_flight - st_->stats.running >= opts_.max_waiting) {
    return Status(StatusCode::kResourceExhausted,
                  "the request queue is full (" + std::to_string(opts_.max_waiting) + " waiting)");
  }
  r->id = st_->next_id++;
  const int64_t id = r->id;
  st_->inbox.push_back(std::move(r));
  ++st_->in_flight;
  st_->cv.notify_all();
  return id;
}

void EngineCore::abort(int64_t id) {
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->aborts.push_back(id);
  st_->cv.notify_all();
}

EngineCore::Stats EngineCore::stats() const {
  Stats out;
  {
    std::lock_guard<std::mutex> lock(st_->mu);
    out = st_->stats;
  }
  const VisionCache::Stats vc = st_->vision_cache->stats();
  out.vision_cache_hits = vc.hits;
  out.vision_cache_misses = vc.misses;
  out.vision_cache_entries = vc.entries;
  out.vision_cache_bytes = static_cast<int64_t>(vc.bytes);
  return out;
}

void EngineCore::wait_idle() {
  std::unique_lock<std::mutex> lock(st_->mu);
  st_->cv_idle.wait(lock, [&] { return st_->in_flight == 0; });
}

std::chrono::steady_clock::time_point EngineCore::last_heartbeat() const {
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(st_->heartbeat_ns.load()));
}

void EngineCore::loop() {
  for (;;) {
    st_->heartbeat_ns = steady_now_ns();
    {
      std::unique_lock<std::mutex> lock(st_->mu);
      auto has_work = [&] {
        return st_->stop || !st_->inbox.empty() || !st_->aborts.empty() || !st_->reqs.empty();
      };
      // An idle engine still wakes every second, so that its heartbeat shows it is alive.
      if (!st_->cv.wait_for(lock, std::chrono::seconds(1), has_work)) continue;
      if (st_->stop) return;
      // The batching window: an idle engine gives a first arrival's companions a moment.
      if (opts_.batch_wait_ms > 0 && st_->reqs.empty()) {
        st_->cv.wait_for(lock, std::chrono::milliseconds(opts_.batch_wait_ms), [&] {
          return st_->stop || static_cast<int64_t>(st_->inbox.size()) >= opts_.max_num_seqs;
        });
        if (st_->stop) return;
      }
    }
    step();
  }
}

// Delivers the final event of `r` and forgets it (its blocks go back to the pool).
void EngineCore::finish(void* req, CoreEvent ev) {
  State& s = *st_;
  Req& r = *static_cast<Req*>(req);
  ev.request_id = r.id;
  ev.finished = true;
  ev.prompt_tokens = r.prompt_len;
  ev.completion_tokens = r.generated;
  ev.queue_ms = std::max(r.queue_ms, 0.0);
  ev.preprocess_ms = r.preprocess_ms;
  ev.encode_ms = r.encode_ms;
  ev.images = static_cast<int64_t>(r.runs.size());
  ev.images_cached = r.images_cached;
  ev.image_tokens = r.prompt.vision_tokens;
  if (r.admitted) s.sched->finish(r.id);
  {
    // Published before the final event: a client that reads /metrics right after its reply
    // sees the request's blocks returned.
    std::lock_guard<std::mutex> lock(s.mu);
    publish_stats_locked();
  }
  r.on_event(ev);
  const int64_t id = r.id;
  s.reqs.erase(id);
  std::lock_guard<std::mutex> lock(s.mu);
  if (--s.in_flight == 0) s.cv_idle.notify_all();
}

void EngineCore::publish_stats_locked() {
  State& s = *st_;
  s.stats.running = s.sched->num_running();
  s.stats.waiting = s.sched->num_waiting();
  s.stats.kv_blocks_used = s.sched->kv_blocks_used();
}

// Hands the requests not yet admitted to the scheduler, first come first served: their images
// are encoded (vision tower, or the cache) and the prompt assembled. One request per step may
// encode, so running requests keep decoding between long image encodes.
void EngineCore::admit() {
  Engine::Impl& m = *engine_.impl_;
  State& s = *st_;
  std::vector<int64_t> to_admit;
  for (auto& [id, r] : s.reqs) {
    if (!r->admitted) to_admit.push_back(id);
  }
  std::sort(to_admit.begin(), to_admit.end());
  bool encoded = false;
  // On the GPU the images of the requests being admitted go through the tower together, up to a
  // budget of patches; a failed batch leaves them to the one-by-one path below, which reports the
  // error to the request it belongs to.
  std::vector<StagedImage*>& batch = s.batch_images;
  std::vector<double*>& batch_ms = s.batch_ms;
  batch.clear();
  batch_ms.clear();
  if (m.gpu_vision != nullptr) {
    constexpr int64_t kBatchPatches = 32768;
    int64_t patches = 0;
    for (int64_t id : to_admit) {
      Req& r = *s.reqs[id];
      for (StagedImage& img : r.images) {
        if (!img.encoded) img.encoded = s.vision_cache->get(img.key);
        if (img.encoded) continue;
        const PreprocessedImage& p = img.pixels;
        const int64_t n = p.grid_t * p.grid_h * p.grid_w;
        if (!batch.empty() && patches + n > kBatchPatches) break;
        batch.push_back(&img);
        batch_ms.push_back(&r.encode_ms);
        patches += n;
      }
    }
    if (!batch.empty() && encode_staged_images(*m.vision, batch, batch_ms.data()).ok()) {
      encoded = true;
    } else {
      batch.clear();
    }
  }
  for (int64_t id : to_admit) {
    Req& r = *s.reqs[id];
    Status st;
    if (!r.runs.empty()) {
      bool needs_encode = false;
      for (StagedImage& img : r.images) {
        if (!img.encoded) img.encoded = s.vision_cache->get(img.key);  // encoded meanwhile?
        if (!img.encoded) needs_encode = true;
      }
      if (needs_encode && encoded) break;  // next step
      for (size_t k = 0; k < r.images.size() && st.ok(); ++k) {
        StagedImage& img = r.images[k];
        const bool fresh = std::find(batch.begin(), batch.end(), &img) != batch.end();
        const bool hit = img.encoded != nullptr && !fresh;
        s.vision_cache->count(hit);
        if (hit) {
          ++r.images_cached;
          continue;
        }
        if (!fresh) {
          st = encode_staged_image(*m.vision, &img, &r.encode_ms)
                   .with_context("image " + std::to_string(k + 1));
        }
        if (st.ok()) s.vision_cache->put(img.key, img.encoded);
      }
      encoded = encoded || needs_encode;
      if (st.ok())
        st = assemble_multimodal(r.request.prompt_ids, r.runs, r.images, m.cfg, &r.prompt);
      r.images.clear();  // the prompt holds the features now
    } else {
      st = m.prepare(r.request.prompt_ids, {}, &r.prompt);
    }
    if (st.ok()) st = s.sched->add(id, r.prompt_len, r.prompt_len + r.max_new);
    if (!st.ok()) {
      CoreEvent ev;
      ev.error = st;
      finish(&r, ev);
      continue;
    }
    r.admitted = true;
    // Room for every token the request may reach: sampling appends without reallocating.
    const size_t total = static_cast<size_t>(r.prompt_len + r.max_new);
    for (auto* v : {&r.pos_t, &r.pos_h, &r.pos_w}) v->reserve(total);
    r.ids.reserve(total);
    r.feature_row.reserve(total);
    r.ids = r.prompt.ids;
    r.feature_row = r.prompt.feature_row;
    r.pos_t = r.prompt.rope.t;
    r.pos_h = r.prompt.rope.h;
    r.pos_w = r.prompt.rope.w;
    r.sampler->add_prompt(r.ids);
    r.sampler->reserve_generated(r.max_new);
    if (m.tokenizer) r.detok = std::make_unique<IncrementalDetokenizer>(*m.tokenizer, true);
    r.stops = std::make_unique<StopMatcher>(r.request.stop);
  }
}

void EngineCore::step() {
  State& s = *st_;
  const auto t0 = std::chrono::steady_clock::now();

  // 1. Take new requests and aborts (moved over under the lock: a local deque would allocate).
  std::vector<int64_t> aborts;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto& r : s.inbox) s.reqs[r->id] = std::move(r);
    s.inbox.clear();
    aborts.swap(s.aborts);
  }
  for (int64_t id : aborts) {
    auto it = s.reqs.find(id);
    if (it == s.reqs.end()) continue;
    if (it->second->admitted) s.sched->abort(id);
    s.reqs.erase(it);
    std::lock_guard<std::mutex> lock(s.mu);
    publish_stats_locked();
    if (--s.in_flight == 0) s.cv_idle.notify_all();
  }
  admit();

  // 2. Schedule this step.
  SchedulerOutput& out = s.sched_out;
  s.sched->schedule(&out);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stats.preemptions += static_cast<int64_t>(out.preempted.size());
    if (!out.items.empty()) ++s.stats.steps;
  }
  run_batch(out);
  {
    std::lock_guard<std::mutex> lock(s.mu);
    publish_stats_locked();
  }
  if (on_step_ && !out.items.empty()) {
    on_step_(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

void EngineCore::run_batch(const SchedulerOutput& out) {
  Engine::Impl& m = *engine_.impl_;
  State& s = *st_;
  const int64_t V = m.cfg.text_config.vocab_size;
  if (out.items.empty()) return;

  // 3. One forward pass over every scheduled chunk.
  std::vector<SeqChunk>& chunks = s.chunks;
  std::vector<VisionRows>& vision = s.vision;
  chunks.assign(out.items.size(), SeqChunk{});
  if (vision.size() < out.items.size()) vision.resize(out.items.size());
  if (s.samples.size() < out.items.size()) {
    s.samples.resize(out.items.size());
    s.penalties.resize(out.items.size());
  }
  for (size_t i = 0; i < out.items.size(); ++i) {
    const ScheduledItem& it = out.items[i];
    Req& r = *s.reqs[it.request_id];
    if (r.queue_ms < 0) r.queue_ms = ms_between(r.submitted, Clock::now()) - r.encode_ms;
    const auto& table = s.sched->block_table(it.request_id);
    SeqChunk& c = chunks[i];
    c.ids = r.ids.data() + it.first_token;
    c.n = it.num_tokens;
    c.first = it.first_token;
    c.pos =
        Positions3{r.pos_t.data() + c.first, r.pos_h.data() + c.first, r.pos_w.data() + c.first};
    c.block_table = table.data();
    c.num_table_blocks = static_cast<int64_t>(table.size());
    if (r.prompt.vision_tokens > 0 && c.first < static_cast<int64_t>(r.prompt.ids.size())) {
      vision[i].feature_row = r.feature_row.data() + c.first;
      vision[i].embeds = r.prompt.embeds.data();
      vision[i].deepstack.clear();
      for (const auto& d : r.prompt.deepstack) vision[i].deepstack.push_back(d.data());
      c.vision = &vision[i];
    }
    c.rows =
        c.first + c.n == static_cast<int64_t>(r.ids.size()) ? LogitRows::kLast : LogitRows::kNone;
    // On the GPU a logit row stays there unless logprobs want it: greedy takes the argmax, the
    // rest a draw made there with this request's settings.
    if (m.gpu != nullptr && c.rows == LogitRows::kLast && r.request.logprobs < 0 &&
        r.sampler->device_can_draw()) {
      c.argmax_only = r.sampler->plain_greedy();
      if (!c.argmax_only) {
        r.sampler->device_draw(&s.samples[i], &s.penalties[i]);
        c.sample = &s.samples[i];
      }
    }
  }
  const int64_t n_chunks = static_cast<int64_t>(chunks.size());
  // On the GPU the argmax of every logit row comes back too, and greedy rows stay there.
  Status st = m.gpu != nullptr
                  ? m.gpu->forward_batch(chunks.data(), n_chunks, s.logits.data(), s.argmax.data())
                  : m.decoder->forward_batch(chunks.data(), n_chunks, s.cache, s.logits.data());
  if (!st.ok()) {  // an engine bug, not user input: fail the requests of this step, keep running
    for (const auto& it : out.items) {
      auto f = s.reqs.find(it.request_id);
      if (f == s.reqs.end()) continue;
      CoreEvent ev;
      ev.error = st;
      finish(f->second.get(), ev);
    }
    return;
  }
  std::vector<std::pair<int64_t, int64_t>>& computed = s.computed;
  computed.clear();
  for (const auto& it : out.items) computed.emplace_back(it.request_id, it.num_tokens);
  s.sched->update(computed);

  // 4. Sample for every chunk that reached the end of its sequence.
  int64_t row = 0;
  for (size_t i = 0; i < out.items.size(); ++i) {
    if (chunks[i].rows == LogitRows::kNone) continue;
    Req& r = *s.reqs[out.items[i].request_id];
    float* logits = s.logits.data() + row * V;
    int32_t id = 0;
    if (chunks[i].argmax_only || chunks[i].sample != nullptr) {  // picked on the device
      id = s.argmax[row];
      r.sampler->record(id);
    } else {
      if (r.request.logprobs >= 0) std::copy(logits, logits + V, s.raw_row.begin());
      id = r.sampler->sample(logits);
    }
    ++row;
    r.ids.push_back(id);
    r.feature_row.push_back(-1);
    const int64_t p = static_cast<int64_t>(r.ids.size()) - 1 + r.prompt.rope.delta;
    r.pos_t.push_back(p);
    r.pos_h.push_back(p);
    r.pos_w.push_back(p);
    ++r.generated;
    s.sched->append_token(r.id);
    const bool is_stop =
        !r.request.ignore_eos &&
        (std::find(m.eos_ids.begin(), m.eos_ids.end(), id) != m.eos_ids.end() ||
         std::find(r.request.stop_token_ids.begin(), r.request.stop_token_ids.end(), id) !=
             r.request.stop_token_ids.end());
    CoreEvent ev;
    ev.request_id = r.id;
    ev.token_id = id;
    ev.stop_token = is_stop;
    ev.step = s.stats.steps;               // written only on this thread
    ev.top_logprobs.swap(s.top_logprobs);  // reuse the list's memory; handed back below
    if (r.request.logprobs >= 0) token_logprobs(s.raw_row.data(), V, id, r.request.logprobs, &ev);
    if (r.detok && !is_stop) ev.text = r.stops->push(r.detok->push(id));
    const bool stopped = is_stop || r.stops->stopped();
    const bool length = r.generated >= r.max_new;
    if (!stopped && !length) {
      r.on_event(ev);
      s.top_logprobs.swap(ev.top_logprobs);
      continue;
    }
    if (r.detok && !r.stops->stopped()) {
      ev.text += r.stops->push(r.detok->flush());
      ev.text += r.stops->flush();
    }
    ev.reason = stopped ? FinishReason::kStop : FinishReason::kLength;
    finish(&r, ev);  // takes a copy
    s.top_logprobs.swap(ev.top_logprobs);
  }
}

}  // namespace vlm

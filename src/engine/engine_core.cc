#include "engine/engine_core.h"

#include <algorithm>

#include "engine/engine_impl.h"
#include "engine/stop_matcher.h"

namespace vlm {

namespace {

// One request as the engine thread sees it.
struct Req {
  int64_t id = 0;
  GenerateRequest request;
  std::function<void(const CoreEvent&)> on_event;
  PreparedPrompt prompt;
  std::vector<int32_t> ids;          // prompt + generated
  std::vector<int32_t> feature_row;  // [ids.size()]: image feature row or -1
  std::vector<int64_t> pos_t, pos_h, pos_w;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<StopMatcher> stops;
  int64_t max_new = 0;
  int64_t generated = 0;
  bool admitted = false;
};

}  // namespace

struct EngineCore::State {
  std::unique_ptr<Scheduler> sched;
  KvCache cache;
  std::vector<float> logits;  // [max_num_seqs, vocab]

  mutable std::mutex mu;
  std::condition_variable cv;       // wakes the engine thread
  std::condition_variable cv_idle;  // wakes wait_idle()
  std::deque<std::unique_ptr<Req>> inbox;
  std::vector<int64_t> aborts;
  bool stop = false;
  int64_t next_id = 1;
  int64_t in_flight = 0;  // submitted and not yet finished / aborted
  Stats stats;

  std::unordered_map<int64_t, std::unique_ptr<Req>> reqs;  // engine thread only
};

EngineCore::EngineCore(Engine& engine, const BatchingOptions& opts, Scheduler sched)
    : engine_(engine), opts_(opts), st_(std::make_unique<State>()) {
  st_->sched = std::make_unique<Scheduler>(std::move(sched));
}

Result<std::unique_ptr<EngineCore>> EngineCore::create(Engine& engine, const BatchingOptions& o) {
  Engine::Impl& m = *engine.impl_;
  const Qwen3VLTextConfig& t = m.cfg.text_config;
  BatchingOptions opts = o;
  if (opts.max_batched_tokens > m.decoder->max_chunk()) {
    return invalid_argument("max_batched_tokens (" + std::to_string(opts.max_batched_tokens) +
                            ") exceeds the engine's prefill chunk (" +
                            std::to_string(m.decoder->max_chunk()) + ")");
  }
  if (opts.block_size <= 0) return invalid_argument("block_size must be positive");
  if (opts.num_blocks <= 0) {
    // Room for every sequence at full context, capped at 2 GiB of f32 K and V.
    const int64_t per_block = t.num_hidden_layers * opts.block_size * t.num_key_value_heads *
                              t.head_dim * 4 * 2;
    const int64_t want = opts.max_num_seqs * ((m.max_context + opts.block_size - 1) / opts.block_size);
    opts.num_blocks = static_cast<int32_t>(std::min<int64_t>(want, (int64_t{2} << 30) / per_block));
  }
  SchedulerConfig sc;
  sc.num_blocks = opts.num_blocks;
  sc.block_size = opts.block_size;
  sc.max_num_seqs = opts.max_num_seqs;
  sc.max_batched_tokens = opts.max_batched_tokens;
  sc.max_waiting = opts.max_waiting;
  VLM_ASSIGN_OR_RETURN(Scheduler sched, Scheduler::create(sc));
  std::unique_ptr<EngineCore> core(new EngineCore(engine, opts, std::move(sched)));
  core->st_->cache.allocate(t, opts.num_blocks, opts.block_size);
  core->st_->logits.resize(static_cast<size_t>(opts.max_num_seqs * t.vocab_size));
  core->st_->stats.kv_blocks_total = opts.num_blocks;
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
  if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  VLM_ASSIGN_OR_RETURN(ResolvedSampling rs, m.resolve_sampling(request.sampling));
  if (!request.stop.empty() && m.tokenizer == nullptr) {
    return invalid_argument("stop strings need the model's tokenizer");
  }
  auto r = std::make_unique<Req>();
  r->sampler = std::make_unique<Sampler>(m.cfg.text_config.vocab_size, rs);
  r->request = std::move(request);
  r->on_event = std::move(on_event);
  std::lock_guard<std::mutex> lock(st_->mu);
  if (static_cast<int64_t>(st_->inbox.size()) >= opts_.max_waiting) {
    return Status(StatusCode::kResourceExhausted, "the request queue is full");
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
  std::lock_guard<std::mutex> lock(st_->mu);
  return st_->stats;
}

void EngineCore::wait_idle() {
  std::unique_lock<std::mutex> lock(st_->mu);
  st_->cv_idle.wait(lock, [&] { return st_->in_flight == 0; });
}

void EngineCore::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(st_->mu);
      st_->cv.wait(lock, [&] {
        return st_->stop || !st_->inbox.empty() || !st_->aborts.empty() || !st_->reqs.empty();
      });
      if (st_->stop) return;
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
  ev.prompt_tokens = static_cast<int64_t>(r.prompt.ids.size());
  ev.completion_tokens = r.generated;
  if (r.admitted) s.sched->finish(r.id);
  r.on_event(ev);
  const int64_t id = r.id;
  s.reqs.erase(id);
  std::lock_guard<std::mutex> lock(s.mu);
  publish_stats_locked();
  if (--s.in_flight == 0) s.cv_idle.notify_all();
}

void EngineCore::publish_stats_locked() {
  State& s = *st_;
  s.stats.running = s.sched->num_running();
  s.stats.waiting = s.sched->num_waiting();
  s.stats.kv_blocks_used = s.sched->kv_blocks_used();
}

void EngineCore::step() {
  Engine::Impl& m = *engine_.impl_;
  State& s = *st_;

  // 1. Take new requests and aborts.
  std::deque<std::unique_ptr<Req>> incoming;
  std::vector<int64_t> aborts;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    incoming.swap(s.inbox);
    aborts.swap(s.aborts);
  }
  for (auto& r : incoming) s.reqs[r->id] = std::move(r);
  for (int64_t id : aborts) {
    auto it = s.reqs.find(id);
    if (it == s.reqs.end()) continue;
    if (it->second->admitted) s.sched->abort(id);
    s.reqs.erase(it);
    std::lock_guard<std::mutex> lock(s.mu);
    publish_stats_locked();
    if (--s.in_flight == 0) s.cv_idle.notify_all();
  }
  std::vector<int64_t> to_admit;
  for (auto& [id, r] : s.reqs) {
    if (!r->admitted) to_admit.push_back(id);
  }
  std::sort(to_admit.begin(), to_admit.end());  // FCFS by submission order
  for (int64_t id : to_admit) {
    Req& r = *s.reqs[id];
    // Images are encoded here, on the engine thread, when the request is admitted.
    Status st = m.prepare(r.request.prompt_ids, r.request.images, &r.prompt);
    const int64_t n = static_cast<int64_t>(r.prompt.ids.size());
    if (st.ok()) {
      r.max_new = r.request.max_new_tokens.value_or(
          std::min(m.gen.max_new_tokens.value_or(256), m.max_context - n));
      if (r.max_new < 1 || n + r.max_new > m.max_context) {
        st = out_of_range("prompt (" + std::to_string(n) + " tokens) + max_new_tokens (" +
                          std::to_string(r.max_new) + ") does not fit the context of " +
                          std::to_string(m.max_context) + " tokens");
      }
    }
    if (st.ok()) st = s.sched->add(id, n, n + r.max_new);
    if (!st.ok()) {
      CoreEvent ev;
      ev.error = st;
      finish(&r, ev);
      continue;
    }
    r.admitted = true;
    r.ids = r.prompt.ids;
    r.feature_row = r.prompt.feature_row;
    r.pos_t = r.prompt.rope.t;
    r.pos_h = r.prompt.rope.h;
    r.pos_w = r.prompt.rope.w;
    r.sampler->add_prompt(r.ids);
    if (m.tokenizer) r.detok = std::make_unique<IncrementalDetokenizer>(*m.tokenizer, true);
    r.stops = std::make_unique<StopMatcher>(r.request.stop);
  }

  // 2. Schedule this step.
  SchedulerOutput out = s.sched->schedule();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stats.preemptions += static_cast<int64_t>(out.preempted.size());
    if (!out.items.empty()) ++s.stats.steps;
  }
  run_batch(out);
  std::lock_guard<std::mutex> lock(s.mu);
  publish_stats_locked();
}

void EngineCore::run_batch(const SchedulerOutput& out) {
  Engine::Impl& m = *engine_.impl_;
  State& s = *st_;
  const int64_t V = m.cfg.text_config.vocab_size;
  if (out.items.empty()) return;

  // 3. One forward pass over every scheduled chunk.
  std::vector<SeqChunk> chunks(out.items.size());
  std::vector<VisionRows> vision(out.items.size());
  for (size_t i = 0; i < out.items.size(); ++i) {
    const ScheduledItem& it = out.items[i];
    Req& r = *s.reqs[it.request_id];
    const auto& table = s.sched->block_table(it.request_id);
    SeqChunk& c = chunks[i];
    c.ids = r.ids.data() + it.first_token;
    c.n = it.num_tokens;
    c.first = it.first_token;
    c.pos = Positions3{r.pos_t.data() + c.first, r.pos_h.data() + c.first, r.pos_w.data() + c.first};
    c.block_table = table.data();
    c.num_table_blocks = static_cast<int64_t>(table.size());
    if (r.prompt.vision_tokens > 0 && c.first < static_cast<int64_t>(r.prompt.ids.size())) {
      vision[i].feature_row = r.feature_row.data() + c.first;
      vision[i].embeds = r.prompt.embeds.data();
      for (const auto& d : r.prompt.deepstack) vision[i].deepstack.push_back(d.data());
      c.vision = &vision[i];
    }
    c.rows = c.first + c.n == static_cast<int64_t>(r.ids.size()) ? LogitRows::kLast : LogitRows::kNone;
  }
  Status st = m.decoder->forward_batch(chunks.data(), static_cast<int64_t>(chunks.size()), s.cache,
                                       s.logits.data());
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
  std::vector<std::pair<int64_t, int64_t>> computed;
  for (const auto& it : out.items) computed.emplace_back(it.request_id, it.num_tokens);
  s.sched->update(computed);

  // 4. Sample for every chunk that reached the end of its sequence.
  int64_t row = 0;
  for (size_t i = 0; i < out.items.size(); ++i) {
    if (chunks[i].rows == LogitRows::kNone) continue;
    Req& r = *s.reqs[out.items[i].request_id];
    const int32_t id = r.sampler->sample(s.logits.data() + (row++) * V);
    r.ids.push_back(id);
    r.feature_row.push_back(-1);
    const int64_t p = static_cast<int64_t>(r.ids.size()) - 1 + r.prompt.rope.delta;
    r.pos_t.push_back(p);
    r.pos_h.push_back(p);
    r.pos_w.push_back(p);
    ++r.generated;
    s.sched->append_token(r.id);
    const bool is_stop = !r.request.ignore_eos &&
                         (std::find(m.eos_ids.begin(), m.eos_ids.end(), id) != m.eos_ids.end() ||
                          std::find(r.request.stop_token_ids.begin(), r.request.stop_token_ids.end(),
                                    id) != r.request.stop_token_ids.end());
    CoreEvent ev;
    ev.request_id = r.id;
    ev.token_id = id;
    if (r.detok && !is_stop) ev.text = r.stops->push(r.detok->push(id));
    const bool stopped = is_stop || r.stops->stopped();
    const bool length = r.generated >= r.max_new;
    if (!stopped && !length) {
      r.on_event(ev);
      continue;
    }
    if (r.detok && !r.stops->stopped()) {
      ev.text += r.stops->push(r.detok->flush());
      ev.text += r.stops->flush();
    }
    ev.reason = stopped ? FinishReason::kStop : FinishReason::kLength;
    finish(&r, ev);
  }
}

}  // namespace vlm

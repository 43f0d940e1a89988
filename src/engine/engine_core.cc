#include "engine/engine_core.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/clock.h"
#include "engine/engine_impl.h"
#include "engine/kv_events.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/pixel_budget.h"
#include "engine/request_stream.h"
#include "engine/vision_cache.h"
#include "kv/block_hash.h"
#include "sched/scheduler.h"

namespace vlm {

namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// One request as the engine sees it: what submit() made of it on the caller's thread (image pad
// runs, staged images, the expanded length and the budget), the runner's state once admitted,
// and the stream its tokens go to.
struct Req {
  RunnerRequest run;
  std::vector<int32_t> prompt_ids;  // as submitted (single image pads), videos expanded
  std::vector<int32_t> stop_ids;    // eos ids and the request's stop ids (empty with ignore_eos)
  std::vector<PadRun> runs;         // after the videos' expansion: a run per temporal group
  std::vector<StagedImage> images;  // the images and videos, in prompt order
  int64_t prompt_len = 0;
  int64_t max_new_tokens = 0;
  int64_t generated = 0;
  // Set by the step that samples the last token (a stop token, or the budget reached): why the
  // request ends, and when that token was sampled.
  FinishReason ending = FinishReason::kNone;
  int64_t last_sampled_ns = 0;
  Clock::time_point submitted;
  double image_decode_ms = 0, video_decode_ms = 0, preprocess_ms = 0, encode_ms = 0;
  int64_t num_images = 0, images_cached = 0, videos = 0, videos_cached = 0, video_frames = 0;
  int64_t video_tokens = 0;
  bool admitted = false, forwarded = false;
  bool reads_prefix_cache = true;  // false for Engine::logits unless it asks
  std::shared_ptr<RequestStream::State> stream;
  std::vector<int32_t>* expanded_ids = nullptr;
};

// Appends a sampled token to its stream (the arrays were sized at submit: no allocation).
void append_token_locked(RequestStream::State& ss, const SampledToken& t, bool stop, int64_t step,
                         int64_t sampled_ns) {
  RawToken& raw = ss.tokens[ss.published];
  raw.token = t.token;
  raw.num_top = t.num_top;
  raw.logprob = t.logprob;
  raw.rank = t.rank;
  raw.stop_token = stop;
  raw.step = step;
  raw.sampled_ns = sampled_ns;
  for (int32_t j = 0; j < t.num_top; ++j) {
    ss.tops[ss.published * ss.top_k + j] = {t.top[j].first, t.top[j].second};
  }
  ++ss.published;
}

// The prefix-cache key of block k of `ids` (block size bs) after `parent` (null: the first): its
// token ids, and every image whose tokens it covers.
BlockHash block_hash(const BlockHasher& hasher, std::span<const int32_t> ids,
                     std::span<const ImageSpan> spans, int64_t k, int64_t bs,
                     const BlockHash* parent, std::vector<BlockExtraKey>* extras) {
  const int64_t begin = k * bs, end = begin + bs;
  extras->clear();
  for (const ImageSpan& s : spans) {
    if (s.begin < end && s.end > begin) {
      BlockExtraKey& x = extras->emplace_back();
      x.kind = BlockExtraKey::Kind::kImage;
      x.content = s.key.content;
      x.params = {s.key.min_pixels, s.key.max_pixels};
    }
  }
  return hasher.hash(parent, ids.subspan(static_cast<size_t>(begin), static_cast<size_t>(bs)),
                     *extras);
}

// Tells a stream its request ended — with its last token when `last` is set, so that the consumer
// sees the two together — and wakes its consumer.
void close_stream(RequestStream::State& ss, FinishReason reason, const Status& error,
                  const SampledToken* last, int64_t step, int64_t sampled_ns) {
  {
    std::lock_guard<std::mutex> lock(ss.mu);
    if (last != nullptr)
      append_token_locked(ss, *last, reason == FinishReason::kStop, step, sampled_ns);
    ss.finished = true;
    ss.reason = reason;
    ss.error = error;
  }
  ss.cv.notify_all();
  if (ss.notify) ss.notify();
}

}  // namespace

namespace {

// The KV cache's type from EngineOptions::kv_cache_dtype: auto is BF16 on the CPU for a BF16
// checkpoint (else f32) and the activation type on a device.
Result<DType> resolve_kv_dtype(const Engine::Impl& m) {
  const ops::Backend& be = m.decoder->backend();
  const bool cpu = be.device() == ops::Device::kCpu;
  DType t = DType::kF32;
  switch (m.opts.kv_cache_dtype) {
    case KvCacheDtype::kAuto:
      t = !cpu ? be.act_dtype()
               : (m.weights.embed_tokens.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32);
      break;
    case KvCacheDtype::kF32:
      t = DType::kF32;
      break;
    case KvCacheDtype::kBF16:
      t = DType::kBF16;
      break;
    case KvCacheDtype::kInt8:
      t = DType::kI8;
      break;
  }
  if (!be.supports_kv_dtype(t)) {
    return invalid_argument(std::string("--kv-cache-dtype ") +
                            kv_cache_dtype_name(m.opts.kv_cache_dtype) + " is not available on " +
                            (cpu ? "the CPU" : "this device") +
                            " (on cuda the KV cache is in the activation type: bf16, or f32 with "
                            "--gpu-dtype f32)");
  }
  return t;
}

}  // namespace

// What submitting threads and streams share with the engine thread: the inbox, the aborts, the
// counters. Streams hold it weakly (a cancel after the core is gone does nothing).
struct EngineCore::Shared {
  mutable std::mutex mu;
  std::condition_variable cv;       // wakes the engine thread
  std::condition_variable cv_idle;  // wakes wait_idle()
  std::deque<std::unique_ptr<Req>> inbox;
  std::vector<int64_t> aborts;
  std::vector<std::function<void()>> tasks;  // run_on_engine_thread()
  bool stop = false;
  int64_t next_id = 1;
  int64_t in_flight = 0;  // submitted and not yet finished / aborted
  Engine::CoreStats stats;
  std::atomic<int64_t> heartbeat_ns{0};  // steady_clock, set by the engine thread

  void abort(int64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    aborts.push_back(id);
    cv.notify_all();
  }
};

// The engine thread's own.
struct EngineCore::State {
  std::unique_ptr<Scheduler> sched;
  KvCache cache;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<VisionCache> vision_cache;
  std::unordered_map<int64_t, std::unique_ptr<Req>> reqs;
  std::function<RunnerRequest*(int64_t)> find;  // reqs → the runner's view
  // Per-step scratch, kept so that its memory is reused: steady-state decode steps allocate
  // nothing (tests/model/alloc_test.cc).
  SchedulerOutput sched_out;
  ModelRunnerOutput run_out;
  std::vector<std::pair<int64_t, int64_t>> computed;
  std::vector<int64_t> aborts;
  // The image encode in progress: one at a time, sliced over steps while requests run.
  struct Encoding {
    std::vector<int64_t> requests;  // per image: the request it belongs to
    std::vector<StagedImage*> images;
    std::vector<int64_t> patches;  // per image: its share of the time
    std::unique_ptr<VisionEncoder::Job> job;
  };
  std::unique_ptr<Encoding> encoding;
  // The step's time beside the decodes: a cost model from recent forward passes (moving
  // averages), and what this step's encode took.
  double forward_ms = 0;      // every forward pass
  double decode_ms = 0;       // passes with decodes only: what the streams' pace costs
  double extra_ms = 0;        // passes with prefill chunks: their time beyond decode_ms ...
  double extra_tokens = 0;    // ... and their prompt tokens, so a token costs the ratio
  double step_encode_ms = 0;  // this step's encode slices
  double side_ms = 0;         // this step's side budget (side_budget_ms(), once per step)
  BlockHasher hasher;         // prefix-cache keys, seeded at random per engine
  std::unique_ptr<KvEventPublisher> kv_events;  // null: no KV events
  std::vector<KvCacheEvent> kv_log;             // publish_kv_events()' scratch
  std::vector<KvWireEvent> kv_wire;
  std::vector<BlockExtraKey> extras;  // block_hash()'s scratch
  int64_t steps = 0;
};

EngineCore::EngineCore(Engine::Impl& engine, const BatchingOptions& opts)
    : m_(engine),
      opts_(opts),
      shared_(std::make_shared<Shared>()),
      st_(std::make_unique<State>()) {}

Result<std::unique_ptr<EngineCore>> EngineCore::create(
    Engine::Impl& m, const BatchingOptions& o, std::function<void(double)> on_step,
    std::function<void(int64_t, double)> on_encode) {
  const Qwen3VLTextConfig& t = m.cfg.text_config;
  BatchingOptions opts = o;
  if (opts.max_batched_tokens <= 0) opts.max_batched_tokens = m.max_chunk();
  if (opts.max_batched_tokens > m.max_chunk()) {
    return invalid_argument("max_batched_tokens (" + std::to_string(opts.max_batched_tokens) +
                            ") exceeds the engine's prefill chunk (" +
                            std::to_string(m.max_chunk()) + ")");
  }
  if (opts.block_size <= 0) return invalid_argument("block_size must be positive");
  if (opts.max_num_seqs <= 0) return invalid_argument("max_num_seqs must be positive");
  const int64_t blocks_per_seq = (m.max_context + opts.block_size - 1) / opts.block_size;
  std::unique_ptr<EngineCore> core(new EngineCore(m, opts));
  State& s = *core->st_;
  // The runner's device buffers (the logits of a step) first: the KV cache takes what is left.
  VLM_ASSIGN_OR_RETURN(s.runner,
                       ModelRunner::create(m, s.cache, opts.max_num_seqs, blocks_per_seq));
  ops::Backend& be = m.decoder->backend();
  VLM_ASSIGN_OR_RETURN(const DType kv_dtype, resolve_kv_dtype(m));
  const int64_t per_block = KvCache::block_bytes(t.num_hidden_layers, t.num_key_value_heads,
                                                 t.head_dim, opts.block_size, kv_dtype);
  if (opts.num_blocks <= 0 && be.device() != ops::Device::kCpu) {
    // Every sequence at full context, within the share of device memory the options allow
    // (vLLM's gpu_memory_utilization): the KV cache takes what the weights and scratch leave.
    int64_t free_b = 0, total = 0;
    VLM_RETURN_IF_ERROR(be.memory_info(&free_b, &total));
    const int64_t budget =
        static_cast<int64_t>(m.opts.gpu_memory_utilization * static_cast<double>(total)) -
        (total - free_b);
    const int64_t fit = std::max<int64_t>(budget, 0) / per_block - 1;  // one block is scratch
    opts.num_blocks = static_cast<int32_t>(std::min<int64_t>(
        {opts.max_num_seqs * blocks_per_seq, fit, std::numeric_limits<int32_t>::max()}));
    if (opts.num_blocks <= 0) {
      return unavailable("no device memory is left for the KV cache under the memory utilization " +
                         std::to_string(m.opts.gpu_memory_utilization));
    }
  }
  if (opts.num_blocks <= 0 && opts.kv_cache_memory > 0) {
    // A memory budget (the CPU's --kv-cache-memory): as many blocks as fit, one being scratch.
    const int64_t fit = opts.kv_cache_memory / per_block - 1;
    if (fit < 1) {
      return invalid_argument("kv_cache_memory of " + std::to_string(opts.kv_cache_memory) +
                              " bytes holds no KV block (one block of " +
                              std::to_string(opts.block_size) + " tokens takes " +
                              std::to_string(per_block) + " bytes, and one more is scratch)");
    }
    opts.num_blocks =
        static_cast<int32_t>(std::min<int64_t>(fit, std::numeric_limits<int32_t>::max() - 1));
  }
  if (opts.num_blocks <= 0) {
    // Room for every sequence at full context, capped at 4 GiB of K and V but never below one
    // sequence at full context (reserved, and resident only as blocks are first written).
    const int64_t want = opts.max_num_seqs * blocks_per_seq;
    const int64_t capped =
        std::max(blocks_per_seq, std::min<int64_t>(want, (int64_t{4} << 30) / per_block));
    opts.num_blocks = static_cast<int32_t>(
        std::clamp<int64_t>(capped, 1, std::numeric_limits<int32_t>::max() - 1));
  }
  SchedulerConfig sc;
  sc.num_blocks = opts.num_blocks;
  sc.block_size = opts.block_size;
  sc.max_num_seqs = opts.max_num_seqs;
  sc.max_batched_tokens = opts.max_batched_tokens;
  // submit() bounds the queue (429 there); preempted requests may take the scheduler's waiting
  // queue past it, which must not fail them.
  sc.max_waiting = opts.max_waiting + opts.max_num_seqs + 1;
  sc.prefix_caching = opts.prefix_caching;
  VLM_ASSIGN_OR_RETURN(Scheduler sched, Scheduler::create(sc));
  if (!opts.kv_events.endpoint.empty()) {
    if (!opts.prefix_caching) {
      return invalid_argument("KV events describe the prefix cache, which is off");
    }
    VLM_ASSIGN_OR_RETURN(s.kv_events, KvEventPublisher::start(opts.kv_events));
    sched.enable_kv_events();
  }
  core->opts_ = opts;
  core->on_step_ = std::move(on_step);
  core->on_encode_ = std::move(on_encode);
  core->pixel_budget_ = std::make_unique<PixelBudget>(opts.max_inflight_image_pixels);
  s.sched = std::make_unique<Scheduler>(std::move(sched));
  VLM_RETURN_IF_ERROR(
      m.decoder
          ->allocate_cache(&s.cache, opts.num_blocks, opts.block_size, blocks_per_seq, kv_dtype)
          .with_context("the KV cache (" + std::to_string(opts.num_blocks) + " blocks)"));
  s.run_out.sampled.reserve(static_cast<size_t>(opts.max_num_seqs));
  s.vision_cache = std::make_unique<VisionCache>(
      static_cast<size_t>(std::max<int64_t>(opts.vision_cache_mib, 0)) << 20);
  s.find = [&s](int64_t id) -> RunnerRequest* { return &s.reqs.at(id)->run; };
  s.extras.reserve(64);  // a decode step that fills a block keys it without allocating
  core->shared_->stats.kv_blocks_total = opts.num_blocks;
  core->shared_->stats.kv_block_size = opts.block_size;
  core->shared_->stats.kv_cache_bytes = (int64_t{opts.num_blocks} + 1) * per_block;
  core->shared_->stats.kv_cache_dtype = kv_dtype == DType::kI8     ? "int8"
                                        : kv_dtype == DType::kBF16 ? "bf16"
                                                                   : "f32";
  core->shared_->heartbeat_ns = steady_now_ns();
  core->thread_ = std::thread([c = core.get()] { c->loop(); });
  return core;
}

EngineCore::~EngineCore() {
  Shared& sh = *shared_;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.stop = true;
  }
  sh.cv.notify_all();
  if (thread_.joinable()) thread_.join();
  // The engine thread is gone; what it left is settled here. Tasks still queued run on this
  // thread (the pool is free now); every request not yet ended ends with an error, so that a
  // reader blocked in next() and wait_idle() return.
  std::vector<std::function<void()>> tasks;
  std::deque<std::unique_ptr<Req>> inbox;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    tasks.swap(sh.tasks);
    inbox.swap(sh.inbox);
  }
  for (auto& task : tasks) task();
  for (auto& r : inbox) st_->reqs[r->run.id] = std::move(r);
  const Status stopped = unavailable("the engine stopped before the request finished");
  for (auto& [id, r] : st_->reqs)
    close_stream(*r->stream, FinishReason::kNone, stopped, nullptr, 0, 0);
  st_->reqs.clear();
  std::lock_guard<std::mutex> lock(sh.mu);
  sh.in_flight = 0;
  sh.cv_idle.notify_all();
}

Result<std::unique_ptr<RequestStream>> EngineCore::submit(GenerateRequest request,
                                                          std::function<void()> notify,
                                                          PromptOutputs prompt) {
  Engine::Impl& m = m_;
  if (request.prompt_ids.empty()) return invalid_argument("the prompt is empty");
  VLM_RETURN_IF_ERROR(m.check_prompt_ids(request.prompt_ids));
  VLM_ASSIGN_OR_RETURN(ResolvedSampling rs, m.resolve_sampling(request.sampling));
  if (!request.stop.empty() && m.tokenizer == nullptr) {
    return invalid_argument("stop strings need the model's tokenizer");
  }
  if (request.logprobs > kMaxTopLogprobs) {
    return invalid_argument("at most " + std::to_string(kMaxTopLogprobs) +
                            " top logprobs per token");
  }
  auto r = std::make_unique<Req>();

  // Images and videos: read, decode and preprocess here, on the caller's thread (or find them
  // cached).
  VLM_ASSIGN_OR_RETURN(const bool multimodal,
                       m.is_multimodal(request.prompt_ids, request.images, request.videos));
  if (multimodal) {
    if (!request.videos.empty() && m.tokenizer == nullptr) {
      return invalid_argument("videos need the model's tokenizer (for their timestamps)");
    }
    VLM_ASSIGN_OR_RETURN(r->runs, find_pad_runs(request.prompt_ids, m.cfg, request.images.size(),
                                                request.videos.size()));
    r->images.resize(r->runs.size());
    // What the items may take of the context: all of it but the text (each is a single pad
    // until expanded) and the one token every request generates. Each image is priced from its
    // header before it is decoded, each video once its frames are sampled.
    int64_t room =
        m.max_context - 1 -
        (static_cast<int64_t>(request.prompt_ids.size()) - static_cast<int64_t>(r->runs.size()));
    size_t next_image = 0, next_video = 0;
    for (const PadRun& run : r->runs) {
      StagedImage& item = r->images[run.item];
      if (run.video) {
        ++next_video;
        VLM_RETURN_IF_ERROR(stage_video(request.videos[next_video - 1], m.video,
                                        st_->vision_cache.get(), nullptr, &item,
                                        std::max<int64_t>(room, 0), pixel_budget_.get())
                                .with_context("video " + std::to_string(next_video)));
        r->video_decode_ms += item.decode_ms;
        // Each group adds its timestamp text ("<12.3 seconds>": about 8 tokens) and its own
        // vision start and end (an estimate: the expanded prompt is checked whole below).
        room -= 10 * item.groups;
      } else {
        ++next_image;
        VLM_RETURN_IF_ERROR(stage_image(request.images[next_image - 1], m.preprocess,
                                        st_->vision_cache.get(), nullptr, &item,
                                        std::max<int64_t>(room, 0), pixel_budget_.get())
                                .with_context("image " + std::to_string(next_image)));
        r->image_decode_ms += item.decode_ms;
      }
      room -= item.tokens;
      r->preprocess_ms += item.preprocess_ms;
    }
    if (!request.videos.empty()) {
      VLM_RETURN_IF_ERROR(
          expand_video_runs(*m.tokenizer, r->images, m.cfg, &request.prompt_ids, &r->runs));
    }
  }
  r->prompt_len = r->runs.empty() ? static_cast<int64_t>(request.prompt_ids.size())
                                  : expanded_length(request.prompt_ids.size(), r->runs, r->images);
  VLM_ASSIGN_OR_RETURN(r->max_new_tokens,
                       m.generation_budget(r->prompt_len, request.max_new_tokens));
  // The scheduler samples at least one token per request.
  if (r->max_new_tokens < 1) return invalid_argument("max_tokens must be >= 1");
  VLM_RETURN_IF_ERROR(st_->sched->check_fits(r->prompt_len + r->max_new_tokens));

  r->run.sampler = std::make_unique<Sampler>(m.cfg.text_config.vocab_size, rs);
  if (request.max_thinking_tokens >= 0) {
    const int64_t V = m.cfg.text_config.vocab_size;
    if (request.think_close_id < 0 || request.think_close_id >= V) {
      return invalid_argument("max_thinking_tokens needs the model's </think> token");
    }
    r->run.sampler->set_thinking_budget(request.max_thinking_tokens, request.think_open_id,
                                        request.think_close_id, request.thinking_open_in_prompt);
  }
  if (request.structured.kind != StructuredOutput::Kind::kNone) {
    if (!m.structured) return invalid_argument("structured output needs the model's tokenizer");
    VLM_ASSIGN_OR_RETURN(auto grammar, m.structured->compile(request.structured));
    // The grammar ends where the model's end tokens (and the request's stop tokens) may come;
    // when the prompt opened a reasoning block, it starts after that block's end.
    std::vector<int32_t> ends = m.eos_ids;
    ends.insert(ends.end(), request.stop_token_ids.begin(), request.stop_token_ids.end());
    const int32_t after = request.thinking_open_in_prompt ? request.think_close_id : -1;
    r->run.sampler->set_grammar(
        std::make_unique<structured::GrammarMatcher>(std::move(grammar), std::move(ends), after));
  }
  r->run.logprobs = request.logprobs;
  if (prompt.logits != nullptr) {
    prompt.logits->assign(static_cast<size_t>(r->prompt_len * m.cfg.text_config.vocab_size), 0.f);
    r->run.prompt_logits = prompt.logits->data();
    r->reads_prefix_cache = prompt.read_prefix_cache;
  }
  r->expanded_ids = prompt.expanded_ids;
  if (!request.ignore_eos) {
    r->stop_ids = m.eos_ids;
    r->stop_ids.insert(r->stop_ids.end(), request.stop_token_ids.begin(),
                       request.stop_token_ids.end());
  }
  r->prompt_ids = std::move(request.prompt_ids);
  auto stream = std::make_shared<RequestStream::State>();
  stream->reserve(r->max_new_tokens, std::max(request.logprobs, 0));
  stream->notify = std::move(notify);
  stream->abort = [w = std::weak_ptr<Shared>(shared_)](int64_t id) {
    if (auto s = w.lock()) s->abort(id);
  };
  r->stream = stream;
  auto processor = std::make_unique<OutputProcessor>(m.tokenizer, request.stop, request.logprobs);

  Shared& sh = *shared_;
  std::lock_guard<std::mutex> lock(sh.mu);
  // Queued = submitted and not running: the inbox, plus what the engine thread holds but has
  // not scheduled yet.
  if (sh.in_flight - sh.stats.running >= opts_.max_waiting) {
    return Status(StatusCode::kResourceExhausted,
                  "the request queue is full (" + std::to_string(opts_.max_waiting) + " waiting)");
  }
  r->run.id = stream->id = sh.next_id++;
  r->submitted = Clock::now();  // queued from here: the image work above is not queueing
  sh.inbox.push_back(std::move(r));
  ++sh.in_flight;
  sh.cv.notify_all();
  return std::make_unique<RequestStream>(std::move(stream), std::move(processor));
}

Engine::CoreStats EngineCore::stats() const {
  Engine::CoreStats out;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    out = shared_->stats;
  }
  const VisionCache::Stats vc = st_->vision_cache->stats();
  out.vision_cache_hits = vc.hits;
  out.vision_cache_misses = vc.misses;
  out.vision_cache_entries = vc.entries;
  out.vision_cache_bytes = static_cast<int64_t>(vc.bytes);
  out.image_pixels_peak = pixel_budget_->peak();
  out.image_pixel_waits = pixel_budget_->waits();
  return out;
}

std::chrono::steady_clock::time_point EngineCore::last_heartbeat() const {
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(shared_->heartbeat_ns.load()));
}

void EngineCore::run_on_engine_thread(const std::function<void()>& fn) {
  std::mutex done_mu;
  std::condition_variable done_cv;
  bool done = false;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->tasks.push_back([&] {
      fn();
      std::lock_guard<std::mutex> done_lock(done_mu);
      done = true;
      done_cv.notify_all();
    });
  }
  shared_->cv.notify_all();
  std::unique_lock<std::mutex> lock(done_mu);
  done_cv.wait(lock, [&] { return done; });
}

void EngineCore::wait_idle() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv_idle.wait(lock, [&] { return shared_->in_flight == 0; });
}

void EngineCore::loop() {
  Shared& sh = *shared_;
  std::vector<std::function<void()>> tasks;
  for (;;) {
    sh.heartbeat_ns = steady_now_ns();
    {
      std::unique_lock<std::mutex> lock(sh.mu);
      auto has_work = [&] {
        return sh.stop || !sh.inbox.empty() || !sh.aborts.empty() || !sh.tasks.empty() ||
               !st_->reqs.empty();
      };
      // An idle engine still wakes every second, so that its heartbeat shows it is alive.
      if (!sh.cv.wait_for(lock, std::chrono::seconds(1), has_work)) continue;
      if (sh.stop) return;
      tasks.swap(sh.tasks);
    }
    for (auto& task : tasks) task();
    tasks.clear();
    {
      std::unique_lock<std::mutex> lock(sh.mu);
      // The batching window: an idle engine gives a first arrival's companions a moment.
      if (opts_.batch_wait_ms > 0 && st_->reqs.empty() && !sh.inbox.empty()) {
        sh.cv.wait_for(lock, std::chrono::milliseconds(opts_.batch_wait_ms), [&] {
          return sh.stop || static_cast<int64_t>(sh.inbox.size()) >= opts_.max_num_seqs;
        });
        if (sh.stop) return;
      }
    }
    step();
  }
}

// Ends request `req`: the stream learns why (a finish reason, or an error) — with its last token
// when `last` is set, so that the consumer sees the two together — and the engine forgets it (its
// blocks go back to the pool).
void EngineCore::end(void* req, FinishReason reason, const Status& error, const SampledToken* last,
                     int64_t step, int64_t sampled_ns) {
  State& s = *st_;
  Req& r = *static_cast<Req*>(req);
  const int64_t id = r.run.id;
  if (r.admitted) s.sched->finish(id);
  drop_encode_of(id);
  {
    // Published before the stream hears: a client that reads /metrics right after its reply
    // sees the request's blocks returned.
    std::lock_guard<std::mutex> lock(shared_->mu);
    publish_stats_locked();
  }
  close_stream(*r.stream, reason, error, last, step, sampled_ns);
  s.reqs.erase(id);
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (--shared_->in_flight == 0) shared_->cv_idle.notify_all();
}

void EngineCore::publish_stats_locked() {
  shared_->stats.running = st_->sched->num_running();
  shared_->stats.waiting = st_->sched->num_waiting();
  shared_->stats.kv_blocks_used = st_->sched->kv_blocks_used();
  const Scheduler::PrefixCacheStats pc = st_->sched->prefix_cache_stats();
  shared_->stats.prefix_cache_queries = pc.queries;
  shared_->stats.prefix_cache_hits = pc.hits;
  shared_->stats.prefix_cache_blocks = pc.cached_blocks;
  shared_->stats.prefix_cache_evictions = pc.evictions;
}

void EngineCore::drop_encode_of(int64_t id) {
  State& s = *st_;
  if (s.encoding && std::find(s.encoding->requests.begin(), s.encoding->requests.end(), id) !=
                        s.encoding->requests.end()) {
    s.encoding.reset();  // the job's carried activations go back with it
  }
}

void EngineCore::encode_images(const std::vector<int64_t>& to_admit) {
  Engine::Impl& m = m_;
  State& s = *st_;
  if (!s.encoding) {
    // The first request (in order) with an image to encode: its first such image. On a device
    // that patchifies, its resized images and those of the requests after it go through the tower
    // together, up to a budget of patches.
    constexpr int64_t kBatchPatches = 32768;
    const bool batch = m.vision->takes_rgb();
    auto enc = std::make_unique<State::Encoding>();
    int64_t patches = 0;
    bool full = false;
    for (int64_t id : to_admit) {
      for (StagedImage& img : s.reqs.at(id)->images) {
        if (!img.encoded) img.encoded = s.vision_cache->get(img.key);
        if (img.encoded) continue;
        const PreprocessedImage& p = img.pixels;
        const int64_t n = p.grid_t * p.grid_h * p.grid_w;
        const bool rgb = p.pixel_values.empty() && !p.resized_rgb.empty();
        if (!enc->images.empty() && (!batch || !rgb || patches + n > kBatchPatches)) {
          full = true;
          break;
        }
        enc->requests.push_back(id);
        enc->images.push_back(&img);
        enc->patches.push_back(n);
        patches += n;
      }
      if (full || (!batch && !enc->images.empty())) break;
    }
    if (enc->images.empty()) return;
    auto job = begin_encode(*m.vision, enc->images);
    if (!job.ok() && enc->images.size() > 1) {  // the first image alone says whose error it is
      enc->requests.resize(1);
      enc->images.resize(1);
      enc->patches.resize(1);
      job = begin_encode(*m.vision, enc->images);
    }
    if (!job.ok()) {
      Req& r = *s.reqs.at(enc->requests[0]);
      const StagedImage* first = enc->images[0];
      const auto k = std::count_if(static_cast<const StagedImage*>(r.images.data()), first,
                                   [&](const StagedImage& x) { return x.video == first->video; });
      end(&r, FinishReason::kNone,
          job.status().with_context((first->video ? "video " : "image ") + std::to_string(k + 1)));
      return;
    }
    enc->job = std::move(job).value();
    s.encoding = std::move(enc);
  }
  // This step's share: unsliced while no request runs (nothing waits for the encode), else the
  // side budget, which holds the prefills too: the encode gets what the pending prefills (older
  // requests: they go first) are not expected to take, and waits for the next step when that is
  // under a quarter of it.
  double budget_ms = 0;
  if (opts_.max_encoder_ms >= 0 && s.sched->num_running() > 0) {
    const double side = s.side_ms;
    budget_ms = side - std::min(side, prefill_token_ms() *
                                          static_cast<double>(s.sched->pending_prefill_tokens()));
    if (budget_ms < 0.25 * side) return;
  }
  State::Encoding& enc = *s.encoding;
  const auto t0 = Clock::now();
  const Result<int64_t> units = s.runner->encode(*m.vision, *enc.job, budget_ms);
  const double ms = ms_since(t0);
  s.step_encode_ms += ms;
  if (units.ok() && on_encode_) on_encode_(*units, ms / 1000);
  int64_t patches = 0;
  for (int64_t n : enc.patches) patches += n;
  for (size_t i = 0; i < enc.images.size(); ++i) {  // each request's share of the time
    s.reqs.at(enc.requests[i])->encode_ms +=
        ms * static_cast<double>(enc.patches[i]) / static_cast<double>(patches);
  }
  if (!units.ok()) {
    const std::vector<int64_t> failed = enc.requests;
    s.encoding.reset();
    for (int64_t id : failed) {
      if (auto it = s.reqs.find(id); it != s.reqs.end()) {
        end(it->second.get(), FinishReason::kNone, units.status());
      }
    }
    return;
  }
  if (!enc.job->done()) return;
  take_encoded(*enc.job, enc.images);
  for (StagedImage* img : enc.images) s.vision_cache->put(img->key, img->encoded);
  s.encoding.reset();
}

// Hands the requests not yet admitted to the scheduler, first come first served: their images
// are encoded (vision tower, or the cache) and the prompt assembled. One image encode runs at a
// time, sliced over steps while other requests run (encode_images); a request whose images are
// not all encoded yet waits, and the requests after it with it.
void EngineCore::admit() {
  Engine::Impl& m = m_;
  State& s = *st_;
  std::vector<int64_t> to_admit;
  for (auto& [id, r] : s.reqs) {
    if (!r->admitted) to_admit.push_back(id);
  }
  if (to_admit.empty()) return;
  std::sort(to_admit.begin(), to_admit.end());
  if (m.vision != nullptr) encode_images(to_admit);
  for (int64_t id : to_admit) {
    auto found = s.reqs.find(id);
    if (found == s.reqs.end()) continue;  // ended by its encode's error
    Req& r = *found->second;
    Status st;
    PreparedPrompt prompt;
    if (!r.runs.empty()) {
      bool ready = true;
      for (StagedImage& img : r.images) {
        if (!img.encoded) img.encoded = s.vision_cache->get(img.key);  // encoded meanwhile?
        ready = ready && img.encoded != nullptr;
      }
      if (!ready) break;  // its encode is not done: it waits, and the requests after it
      for (StagedImage& img : r.images) {
        const bool hit = !img.encoded_here;
        s.vision_cache->count(hit);
        if (img.video) {
          ++r.videos;
          r.videos_cached += hit;
          r.video_frames += img.frames;
          r.video_tokens += img.tokens;
        } else {
          ++r.num_images;
          r.images_cached += hit;
        }
      }
      st = assemble_multimodal(r.prompt_ids, r.runs, r.images, m.cfg, &prompt);
      r.images.clear();  // the prompt holds the features now
    } else {
      Engine::Impl::prepare_text(r.prompt_ids, &prompt);
    }
    std::vector<BlockHash> hashes;  // the prompt's full blocks, for the prefix cache
    if (st.ok() && opts_.prefix_caching) {
      const int64_t bs = opts_.block_size;
      const int64_t full = static_cast<int64_t>(prompt.ids.size()) / bs;
      hashes.reserve(static_cast<size_t>(full));
      for (int64_t k = 0; k < full; ++k) {
        hashes.push_back(block_hash(s.hasher, prompt.ids, prompt.image_spans, k, bs,
                                    k == 0 ? nullptr : &hashes[k - 1], &s.extras));
      }
    }
    if (st.ok()) {
      st =
          s.sched->add(id, r.prompt_len, r.max_new_tokens, std::move(hashes), r.reads_prefix_cache);
    }
    if (!st.ok()) {
      end(&r, FinishReason::kNone, st);
      continue;
    }
    r.admitted = true;
    if (r.expanded_ids != nullptr) *r.expanded_ids = prompt.ids;
    RequestStream::State& ss = *r.stream;
    {
      std::lock_guard<std::mutex> lock(ss.mu);
      RequestStats& t = ss.stats;
      t.prompt_tokens = r.prompt_len;
      t.vision_tokens = prompt.vision_tokens;
      t.images = r.num_images;
      t.images_cached = r.images_cached;
      t.videos = r.videos;
      t.videos_cached = r.videos_cached;
      t.video_frames = r.video_frames;
      t.video_tokens = r.video_tokens;
      t.image_decode_ms = r.image_decode_ms;
      t.video_decode_ms = r.video_decode_ms;
      t.preprocess_ms = r.preprocess_ms;
      t.encode_ms = r.encode_ms;
    }
    r.run.start(std::move(prompt), r.max_new_tokens);
    r.prompt_ids = {};  // the runner's ids hold the prompt now
  }
}

void EngineCore::step() {
  State& s = *st_;
  Shared& sh = *shared_;
  const auto t0 = Clock::now();

  // 1. Take new requests and aborts (moved over under the lock: a local deque would allocate).
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    for (auto& r : sh.inbox) s.reqs[r->run.id] = std::move(r);
    sh.inbox.clear();
    s.aborts.swap(sh.aborts);
  }
  for (int64_t id : s.aborts) {
    auto it = s.reqs.find(id);
    if (it == s.reqs.end()) continue;
    if (it->second->admitted) s.sched->abort(id);
    drop_encode_of(id);  // cancelled mid-encode: its carried activations go now
    s.reqs.erase(it);
    std::lock_guard<std::mutex> lock(sh.mu);
    publish_stats_locked();
    if (--sh.in_flight == 0) sh.cv_idle.notify_all();
  }
  s.aborts.clear();
  s.step_encode_ms = 0;
  s.side_ms = side_budget_ms();
  admit();

  // 2. Schedule this step: beside running decodes the prefill chunks get what the side budget has
  // left after the encode (at least kMinSideChunk tokens, so they always advance).
  int64_t prefill_limit = Scheduler::kNoPrefillLimit;
  if (opts_.max_encoder_ms >= 0 && prefill_token_ms() > 0) {
    const double left = std::max(0.0, s.side_ms - s.step_encode_ms);
    prefill_limit =
        std::max<int64_t>(kMinSideChunk, static_cast<int64_t>(left / prefill_token_ms()));
  }
  SchedulerOutput& out = s.sched_out;
  s.sched->schedule(&out, prefill_limit);
  publish_kv_events();
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    sh.stats.preemptions += static_cast<int64_t>(out.preempted.size());
    if (!out.items.empty()) sh.stats.steps = ++s.steps;
  }
  if (!out.items.empty()) {
    const auto now = Clock::now();  // after admission: its image encodes are behind us
    const int64_t now_ns = steady_now_ns();
    for (const ScheduledItem& it : out.items) {
      Req& r = *s.reqs.at(it.request_id);
      if (r.forwarded) continue;
      r.forwarded = true;
      std::lock_guard<std::mutex> lock(r.stream->mu);
      r.stream->stats.cached_tokens =
          std::max<int64_t>(0, s.sched->find(it.request_id)->num_cached_tokens);
      r.stream->stats.queue_ms = std::max(0.0, ms_between(r.submitted, now) - r.encode_ms);
      r.stream->first_forward_ns = now_ns;
    }

    // 3. The model: one forward pass, then a token for every chunk that reached its end, each
    // handed to its stream as soon as it is sampled (but a request's last token, which comes
    // with its end once the scheduler has freed its blocks).
    const int64_t step_index = s.steps;
    auto on_sampled = [&](const SampledToken& t) {
      Req& r = *s.reqs.at(t.request_id);
      ++r.generated;
      const int64_t sampled_ns = steady_now_ns();
      const bool stop =
          std::find(r.stop_ids.begin(), r.stop_ids.end(), t.token) != r.stop_ids.end();
      if (stop || r.generated >= r.max_new_tokens) {
        r.ending = stop ? FinishReason::kStop : FinishReason::kLength;
        r.last_sampled_ns = sampled_ns;
        return;
      }
      RequestStream::State& ss = *r.stream;
      {
        std::lock_guard<std::mutex> lock(ss.mu);
        append_token_locked(ss, t, false, step_index, sampled_ns);
      }
      ss.cv.notify_all();
      if (ss.notify) ss.notify();
    };
    const auto f0 = Clock::now();
    Status st = s.runner->execute(out, *s.sched, s.find, on_sampled, &s.run_out);
    const double forward_ms = ms_since(f0);
    observe_forward(out, forward_ms);
    if (!st.ok()) {  // an engine bug, not user input: fail the requests of this step, keep running
      // Blocks keyed for this step were never computed: forget every key.
      s.sched->reset_prefix_cache();
      publish_kv_events();
      for (const auto& it : out.items) {
        auto f = s.reqs.find(it.request_id);
        if (f != s.reqs.end()) end(f->second.get(), FinishReason::kNone, st);
      }
    } else {
      update(step_index);
    }
  }
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    publish_stats_locked();
  }
  if (on_step_ && !out.items.empty())
    on_step_(std::chrono::duration<double>(Clock::now() - t0).count());
}

// Moving averages (weight 0.2 on the newest pass). A prompt token's cost is a ratio of two
// averages, time over tokens, so that steps with a few prompt tokens (noisy alone) count by their
// size.
void EngineCore::observe_forward(const SchedulerOutput& out, double ms) {
  State& s = *st_;
  constexpr double kNew = 0.2;
  auto avg = [](double old, double now) { return old > 0 ? (1 - kNew) * old + kNew * now : now; };
  s.forward_ms = avg(s.forward_ms, ms);
  int64_t prompt_tokens = 0;  // chunks of more than one token: prefills (a decode is one)
  for (const ScheduledItem& it : out.items) {
    if (it.num_tokens > 1) prompt_tokens += it.num_tokens;
  }
  if (prompt_tokens == 0) {
    s.decode_ms = avg(s.decode_ms, ms);
  } else if (s.decode_ms > 0) {
    s.extra_ms = (1 - kNew) * s.extra_ms + kNew * std::max(0.0, ms - s.decode_ms);
    s.extra_tokens = (1 - kNew) * s.extra_tokens + kNew * static_cast<double>(prompt_tokens);
  }
}

double EngineCore::auto_side_budget_ms(double pass_ms, int64_t waiting) {
  const double passes =
      std::clamp(kSidePassesPerWaiting * static_cast<double>(waiting), 1.0, kMaxSidePasses);
  return std::max(1.0, passes * pass_ms);
}

double EngineCore::side_budget_ms() const {
  if (opts_.max_encoder_ms > 0) return opts_.max_encoder_ms;
  const State& s = *st_;
  int64_t waiting = s.sched->num_prefilling();
  for (const auto& [id, r] : s.reqs) waiting += r->admitted ? 0 : 1;
  return auto_side_budget_ms(s.decode_ms > 0 ? s.decode_ms : s.forward_ms, waiting);
}

double EngineCore::prefill_token_ms() const {
  const State& s = *st_;
  return s.extra_tokens > 0 ? s.extra_ms / s.extra_tokens : 0;
}

// The prefix cache's changes since the last call (blocks keyed by this step's schedule, evicted
// to make room, or all forgotten) as one batch of KV events, with the token ids and images of the
// blocks stored.
void EngineCore::publish_kv_events() {
  State& s = *st_;
  if (!s.kv_events) return;
  s.sched->take_kv_events(&s.kv_log);
  if (s.kv_log.empty()) return;
  const int64_t bs = opts_.block_size;
  s.kv_wire.clear();
  for (const KvCacheEvent& e : s.kv_log) {
    KvWireEvent w;
    w.kind = e.kind;
    for (const BlockHash& h : e.hashes) w.hashes.push_back(external_block_hash(h));
    if (e.kind == KvCacheEvent::Kind::kStored) {
      // The sequence is live: its blocks were keyed as this step scheduled it.
      auto it = s.reqs.find(e.seq);
      if (it == s.reqs.end()) continue;
      const RunnerRequest& run = it->second->run;
      if (e.parent) w.parent = external_block_hash(*e.parent);
      const int64_t begin = e.first_block * bs;
      const int64_t end = begin + static_cast<int64_t>(e.hashes.size()) * bs;
      w.token_ids.assign(run.ids.begin() + begin, run.ids.begin() + end);
      w.extra_keys.resize(e.hashes.size());
      for (const ImageSpan& span : run.prompt.image_spans) {
        if (span.end <= begin || span.begin >= end) continue;
        const std::string key = sha256_hex(span.key.content);
        for (int64_t k = std::max(begin, span.begin) / bs; k * bs < std::min(end, span.end); ++k) {
          w.extra_keys[static_cast<size_t>(k - begin / bs)].push_back(key);
        }
      }
    }
    s.kv_wire.push_back(std::move(w));
  }
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  s.kv_events->publish(encode_kv_event_batch(ts, s.kv_wire, static_cast<int32_t>(bs)));
}

// After the forward pass: the scheduler learns what was computed and sampled, and requests that
// hit a stop token or their budget end (their streams get the last token with the end).
void EngineCore::update(int64_t step_index) {
  State& s = *st_;
  const SchedulerOutput& out = s.sched_out;
  std::vector<std::pair<int64_t, int64_t>>& computed = s.computed;
  computed.clear();
  for (const auto& it : out.items) computed.emplace_back(it.request_id, it.num_tokens);
  s.sched->update(computed);
  const int64_t bs = opts_.block_size;
  for (const SampledToken& t : s.run_out.sampled) {
    s.sched->append_token(t.request_id);
    Req& r = *s.reqs.at(t.request_id);
    if (r.ending != FinishReason::kNone) {
      end(&r, r.ending, ok_status(), &t, step_index, r.last_sampled_ns);
      continue;
    }
    // A generated token that fills a block: its key, so that a preempted request's recompute and
    // the next turn of a chat find it.
    const int64_t n = static_cast<int64_t>(r.run.ids.size());
    const SchedRequest* q = s.sched->find(t.request_id);
    if (opts_.prefix_caching && n % bs == 0 && q != nullptr &&
        static_cast<int64_t>(q->block_hashes.size()) == n / bs - 1) {
      const BlockHash* parent = q->block_hashes.empty() ? nullptr : &q->block_hashes.back();
      s.sched->add_block_hash(
          t.request_id, block_hash(s.hasher, r.run.ids, r.run.prompt.image_spans, n / bs - 1, bs,
                                   parent, &s.extras));
    }
  }
}

}  // namespace vlm

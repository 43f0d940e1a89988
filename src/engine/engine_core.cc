// The engine core's step (schedule → execute → update) and its making; the thread boundary is
// engine_core_thread.cc.
#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>

#include "core/check.h"
#include "core/clock.h"
#include "engine/draft_proposer.h"
#include "engine/engine_core_state.h"
#include "engine/mtp_proposer.h"
#include "engine/pixel_budget.h"
#include "engine/vision_cache.h"
#include "kv/kv_cache_spec.h"
#include "vlm/log.h"

namespace vlm {

namespace {

// A hybrid model's prefix-cache snapshots: their interval and count (defaults filled in), or none
// (another model, or no prefix caching).
Status resolve_state_snapshots(bool hybrid, BatchingOptions* o) {
  if (!hybrid || !o->prefix_caching) {
    o->state_snapshot_interval = o->state_snapshots = 0;
    return ok_status();
  }
  // The default from a measurement (docs/benchmarks.md, 2026-12-05): multi-turn image chats of
  // 100-300 tokens find 55-59% of their prompts cached at 64 tokens, none at 256.
  if (o->state_snapshot_interval <= 0) {  // 64 tokens, or the block when that is longer
    o->state_snapshot_interval = (64 + o->block_size - 1) / o->block_size * o->block_size;
  }
  if (o->state_snapshots <= 0) o->state_snapshots = static_cast<int32_t>(o->max_num_seqs);
  if (o->state_snapshot_interval % o->block_size != 0) {
    return invalid_argument(
        "state_snapshot_interval (" + std::to_string(o->state_snapshot_interval) +
        ") must be a multiple of block_size (" + std::to_string(o->block_size) + ")");
  }
  return ok_status();
}

// Speculative decoding's proposer beside the cache, in the plan: a draft model's block or the
// MTP head's layer of it beside each of the target's blocks (plan->extra_block_bytes), and the
// MTP's spare blocks out of the memory first (*fixed).
Status plan_proposer_bytes(const CoreModel& m, const BatchingOptions& o, KvBlockPlan* plan,
                           int64_t* fixed) {
  *fixed = 0;
  if (o.spec.method == SpecMethod::kDraft) {
    plan->extra_block_bytes = DraftProposer::block_bytes(m.draft, o.block_size);
  }
  if (o.spec.method != SpecMethod::kMtp) return ok_status();
  const int64_t b = m.runner.decoder->mtp_cache_spec(o.block_size, m.kv_dtype).block_bytes();
  plan->extra_block_bytes = b;
  *fixed = o.max_num_seqs * MtpProposer::spare_blocks(o.spec.num_tokens, o.block_size) * b;
  if (plan->memory_bytes <= 0) return ok_status();
  if (*fixed >= plan->memory_bytes) {
    return invalid_argument("kv_cache_memory of " + std::to_string(plan->memory_bytes) +
                            " bytes does not hold the MTP head's spare blocks");
  }
  plan->memory_bytes -= *fixed;
  return ok_status();
}

// Speculative decoding's proposer (null: none), once the target's blocks are planned: a draft
// model's and the MTP head's have as many blocks as the target's in their own caches (the MTP's
// and its spare blocks).
Result<std::unique_ptr<Proposer>> spec_proposer(const CoreModel& m, const BatchingOptions& o,
                                                int64_t blocks_per_seq) {
  if (o.spec.method != SpecMethod::kDraft && o.spec.method != SpecMethod::kMtp) {
    return make_proposer(o.spec, m.runner.vocab_size);
  }
  if (o.spec.method == SpecMethod::kDraft) {
    VLM_ASSIGN_OR_RETURN(std::unique_ptr<DraftProposer> p,
                         DraftProposer::create(m.draft, o.spec, m.runner.vocab_size, o.num_blocks,
                                               o.block_size, blocks_per_seq, o.max_num_seqs));
    return std::unique_ptr<Proposer>(std::move(p));
  }
  TextDecoder& dec = *m.runner.decoder;
  VLM_ASSIGN_OR_RETURN(
      std::unique_ptr<MtpProposer> p,
      MtpProposer::create(dec, o.spec, dec.mtp_cache_spec(o.block_size, m.kv_dtype), o.num_blocks,
                          blocks_per_seq, o.max_num_seqs));
  return std::unique_ptr<Proposer>(std::move(p));
}

}  // namespace

EngineCore::EngineCore(CoreModel model, const BatchingOptions& opts)
    : model_(std::move(model)),
      opts_(opts),
      shared_(std::make_shared<Shared>()),
      st_(std::make_unique<State>()) {}

Result<std::unique_ptr<EngineCore>> EngineCore::create(
    CoreModel model, const BatchingOptions& o, std::function<void(double)> on_step,
    std::function<void(int64_t, double)> on_encode) {
  TextDecoder& dec = *model.runner.decoder;
  BatchingOptions opts = o;
  if (opts.max_batched_tokens <= 0) opts.max_batched_tokens = dec.max_chunk();
  if (opts.max_batched_tokens > dec.max_chunk()) {
    return invalid_argument("max_batched_tokens (" + std::to_string(opts.max_batched_tokens) +
                            ") exceeds the engine's prefill chunk (" +
                            std::to_string(dec.max_chunk()) + ")");
  }
  if (opts.block_size <= 0) return invalid_argument("block_size must be positive");
  if (opts.max_num_seqs <= 0) return invalid_argument("max_num_seqs must be positive");
  const int64_t max_context = model.input.max_context;
  const int64_t blocks_per_seq = (max_context + opts.block_size - 1) / opts.block_size;
  std::unique_ptr<EngineCore> core(new EngineCore(std::move(model), opts));
  State& s = *core->st_;
  const CoreModel& m = core->model_;
  const KvCacheSpec spec = dec.cache_spec(opts.block_size, m.kv_dtype);
  // A hybrid model's state slots, one per sequence that may run, and its prefix cache's state
  // snapshots come out of the same budget.
  const bool hybrid = spec.state_group() != nullptr;
  if (opts.spec.method != SpecMethod::kNone) VLM_RETURN_IF_ERROR(check_spec_tokens(opts.spec));
  const int64_t spec_tokens = opts.spec.method != SpecMethod::kNone ? opts.spec.num_tokens : 0;
  // A step's verify rows: each decode and its proposals, within the step's tokens.
  const int64_t verify_tokens =
      spec_tokens > 0 ? std::min(opts.max_num_seqs * (1 + spec_tokens), opts.max_batched_tokens)
                      : 0;
  if (spec_tokens > 0 && dec.backend().device() != ops::Device::kCpu) {
    return invalid_argument(
        "speculative decoding (--spec) runs on the CPU only: its verify passes are not yet proven "
        "on a GPU");
  }
  // The runner's device buffers (the logits of a step) first: the KV cache takes what is left.
  VLM_ASSIGN_OR_RETURN(s.runner, ModelRunner::create(m.runner, s.cache, opts.max_num_seqs,
                                                     blocks_per_seq, verify_tokens));
  const int64_t state_slots = hybrid ? opts.max_num_seqs : 0;
  // With proposals, each slot's K more: a verify chunk's state after each of its tokens but the
  // last, so that the state where its accepted tokens end replaces the slot's.
  const int64_t token_slots = hybrid ? opts.max_num_seqs * spec_tokens : 0;
  s.token_slot_base = hybrid && spec_tokens > 0 ? static_cast<int32_t>(state_slots) : -1;
  VLM_RETURN_IF_ERROR(resolve_state_snapshots(hybrid, &opts));
  // (And a hybrid draft model's states.)
  const int64_t state_bytes =
      (state_slots + token_slots + opts.state_snapshots) * spec.state_bytes_per_seq() +
      DraftProposer::state_bytes(m.draft, opts.max_num_seqs, opts.spec.num_tokens);
  KvBlockPlan plan;
  plan.num_blocks = opts.num_blocks;
  plan.max_num_seqs = opts.max_num_seqs;
  plan.blocks_per_seq = blocks_per_seq;
  plan.memory_bytes = opts.kv_cache_memory;
  int64_t proposer_fixed = 0;
  VLM_RETURN_IF_ERROR(plan_proposer_bytes(m, opts, &plan, &proposer_fixed));
  if (plan.memory_bytes > 0 && state_bytes > 0) {
    if (state_bytes >= plan.memory_bytes) {
      return invalid_argument(
          "kv_cache_memory of " + std::to_string(plan.memory_bytes) +
          " bytes does not hold the linear-attention states (" + std::to_string(state_slots) +
          " state slots and " + std::to_string(opts.state_snapshots) + " snapshots" +
          (spec_tokens > 0 ? ", and speculative decoding's" : "") + ": " +
          std::to_string(state_bytes) +
          " bytes) and K/V blocks beside them: raise it, or lower --state-snapshots or "
          "--max-num-seqs" +
          (spec_tokens > 0 ? " or --spec-tokens" : ""));
    }
    plan.memory_bytes -= state_bytes;
  }
  ops::Backend& be = dec.backend();
  if (be.device() != ops::Device::kCpu && opts.num_blocks <= 0) {
    int64_t free_b = 0, total = 0;
    VLM_RETURN_IF_ERROR(be.memory_info(&free_b, &total));
    plan.device_budget_bytes =
        static_cast<int64_t>(m.gpu_memory_utilization * static_cast<double>(total)) -
        (total - free_b);
    plan.device_memory_utilization = m.gpu_memory_utilization;
  }
  VLM_ASSIGN_OR_RETURN(opts.num_blocks, plan_kv_blocks(spec, plan));
  VLM_ASSIGN_OR_RETURN(s.proposer, spec_proposer(m, opts, blocks_per_seq));
  if (opts.spec.method == SpecMethod::kMtp) s.mtp = static_cast<MtpProposer*>(s.proposer.get());
  SchedulerConfig sc;
  sc.num_blocks = opts.num_blocks;
  sc.block_size = opts.block_size;
  sc.max_num_seqs = opts.max_num_seqs;
  sc.max_batched_tokens = opts.max_batched_tokens;
  // submit() bounds the queue (429 there); preempted requests may take the scheduler's waiting
  // queue past it, which must not fail them.
  sc.max_waiting = opts.max_waiting + opts.max_num_seqs + 1;
  sc.prefix_caching = opts.prefix_caching;
  sc.max_side_ms = opts.max_encoder_ms;
  // A hybrid model: a state slot per running sequence, and snapshots for its prefix hits.
  sc.num_state_slots = static_cast<int32_t>(state_slots);
  sc.snapshot_interval = opts.state_snapshot_interval;
  sc.num_snapshots = opts.state_snapshots;
  VLM_ASSIGN_OR_RETURN(Scheduler sched, Scheduler::create(sc));
  if (opts.on_kv_events) {
    if (!opts.prefix_caching) {
      return invalid_argument("KV events describe the prefix cache, which is off");
    }
    sched.enable_kv_events();
  }
  s.sched = std::make_unique<Scheduler>(std::move(sched));
  VLM_RETURN_IF_ERROR(
      dec.allocate_cache(&s.cache, spec, opts.num_blocks, blocks_per_seq, state_slots + token_slots,
                         opts.state_snapshots)
          .with_context("the KV cache (" + std::to_string(opts.num_blocks) + " blocks)"));
  core->opts_ = opts;
  core->on_step_ = std::move(on_step);
  core->on_encode_ = std::move(on_encode);
  core->pixel_budget_ = std::make_unique<PixelBudget>(opts.max_inflight_image_pixels);
  core->vision_cache_ = std::make_unique<VisionCache>(
      static_cast<size_t>(std::max<int64_t>(opts.vision_cache_mib, 0)) << 20);
  core->input_ =
      std::make_unique<InputProcessor>(m.input, core->vision_cache_.get(),
                                       core->pixel_budget_.get(), opts.num_blocks, opts.block_size);
  if (m.runner.vision != nullptr) {
    s.encodes = std::make_unique<ImageEncodes>(*m.runner.vision, *core->vision_cache_, *s.runner,
                                               core->on_encode_, m.draft.vision);
  }
  s.sampled.reserve(static_cast<size_t>(std::max(opts.max_num_seqs, verify_tokens)));
  // A step's state copies: at most one of each per scheduled request (a decode step that crosses
  // a snapshot point takes one without allocating).
  s.sched_out.restores.reserve(static_cast<size_t>(opts.max_num_seqs));
  s.sched_out.saves.reserve(static_cast<size_t>(opts.max_num_seqs));
  s.rows.reserve(static_cast<size_t>(opts.max_num_seqs));
  s.propose_jobs.reserve(static_cast<size_t>(opts.max_num_seqs));
  s.extras.reserve(64);  // a decode step that fills a block keys it without allocating
  Engine::CoreStats& stats = core->shared_->stats;
  stats.kv_blocks_total = opts.num_blocks;
  stats.kv_block_size = opts.block_size;
  stats.kv_cache_bytes =
      (int64_t{opts.num_blocks} + 1) * (spec.block_bytes() + plan.extra_block_bytes) +
      proposer_fixed;
  stats.prefix_caching = opts.prefix_caching;
  stats.spec_tokens = spec_tokens;
  stats.state_slots = state_slots;
  stats.state_slot_bytes = spec.state_bytes_per_seq();
  stats.state_memory_bytes = state_bytes;
  stats.state_snapshots = opts.state_snapshots;
  stats.state_snapshot_interval = opts.state_snapshot_interval;
  stats.kv_cache_dtype = m.kv_dtype == DType::kI8     ? KvCacheDtype::kInt8
                         : m.kv_dtype == DType::kBF16 ? KvCacheDtype::kBF16
                                                      : KvCacheDtype::kF32;
  core->shared_->heartbeat_ns = steady_now_ns();
  core->thread_ = std::thread([c = core.get()] { c->loop(); });
  return core;
}

void EngineCore::step() {
  State& s = *st_;
  const auto t0 = Clock::now();
  take_requests();
  schedule();
  const SchedulerOutput& out = s.sched_out;
  if (!out.items.empty()) {
    const auto f0 = Clock::now();
    const Status st = execute(out);
    s.sched->record_forward(out, ms_since(f0));
    if (st.ok()) {
      update();
    } else {
      fail_step(st);
    }
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    publish_stats_locked();
  }
  if (on_step_ && !out.items.empty()) on_step_(ms_since(t0) / 1000);
}

void EngineCore::take_requests() {
  State& s = *st_;
  Shared& sh = *shared_;
  {  // moved over under the lock: a local deque would allocate
    std::lock_guard<std::mutex> lock(sh.mu);
    for (auto& r : sh.inbox) s.reqs[r->id] = std::move(r);
    sh.inbox.clear();
    s.aborts.swap(sh.aborts);
  }
  for (int64_t id : s.aborts) {
    auto it = s.reqs.find(id);
    if (it == s.reqs.end()) continue;
    if (it->second->admitted) s.sched->abort(id);
    if (s.encodes) s.encodes->drop(id);  // cancelled mid-encode: its activations go now
    s.reqs.erase(it);
    std::lock_guard<std::mutex> lock(sh.mu);
    publish_stats_locked();
    if (--sh.in_flight == 0) sh.cv_idle.notify_all();
  }
  s.aborts.clear();
}

void EngineCore::schedule() {
  State& s = *st_;
  s.waiting.clear();
  for (auto& [id, r] : s.reqs) {
    if (!r->admitted) s.waiting.push_back(r.get());
  }
  std::sort(s.waiting.begin(), s.waiting.end(),
            [](const EngineRequest* a, const EngineRequest* b) { return a->id < b->id; });
  s.sched->begin_step(static_cast<int64_t>(s.waiting.size()));
  if (!s.waiting.empty()) {
    if (s.encodes) {
      s.encodes->run(s.waiting, *s.sched, [this, &s](EngineRequest& r, const Status& st) {
        std::replace(s.waiting.begin(), s.waiting.end(), &r, static_cast<EngineRequest*>(nullptr));
        end(r, FinishReason::kNone, st);  // frees r
      });
    }
    admit(s.waiting);
  }
  // Beside running decodes the prefill chunks get what the side budget has left after the
  // encode (Scheduler::schedule).
  SchedulerOutput& out = s.sched_out;
  s.sched->schedule(&out);
  publish_kv_events();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->stats.preemptions += static_cast<int64_t>(out.preempted.size());
    if (!out.items.empty()) shared_->stats.steps = ++s.steps;
  }
  if (out.items.empty()) return;
  const auto now = Clock::now();  // after admission: its image encodes are behind us
  const int64_t now_ns = steady_now_ns();
  for (const ScheduledItem& it : out.items) {
    EngineRequest& r = *s.reqs.at(it.request_id);
    if (r.forwarded) continue;
    r.forwarded = true;
    std::lock_guard<std::mutex> lock(r.stream->mu);
    r.stream->stats.cached_tokens =
        std::max<int64_t>(0, s.sched->find(it.request_id)->num_cached_tokens);
    r.stream->stats.queue_ms = std::max(0.0, ms_between(r.submitted, now) - r.encode_ms);
    r.stream->first_forward_ns = now_ns;
  }
}

void EngineCore::admit(std::span<EngineRequest* const> waiting) {
  State& s = *st_;
  const int64_t bs = opts_.block_size;
  for (EngineRequest* req : waiting) {
    if (req == nullptr) continue;  // ended by its encode's error
    EngineRequest& r = *req;
    if (!input_->ready(r)) break;  // its encode is not done: it waits, and the requests after it
    PreparedPrompt prompt;
    if (model_.draft.vision != nullptr) {  // the draft's features, before assemble takes the images
      gather_features(r.images, &EncodedImage::draft,
                      static_cast<size_t>(model_.draft.deepstack_taps), &r.draft_features.embeds,
                      &r.draft_features.deepstack);
    }
    Status st = input_->assemble(r, &prompt);
    std::vector<BlockHash> hashes;  // the prompt's full blocks, for the prefix cache
    if (st.ok() && opts_.prefix_caching) {
      const int64_t full = static_cast<int64_t>(prompt.ids.size()) / bs;
      hashes.reserve(static_cast<size_t>(full));
      for (int64_t k = 0; k < full; ++k) {
        hashes.push_back(prefix_block_hash(s.hasher, prompt.ids, prompt.image_spans, k, bs,
                                           k == 0 ? nullptr : &hashes[k - 1], &s.extras));
      }
    }
    if (st.ok()) {
      st = s.sched->add(r.id, r.prompt_len, r.max_new_tokens, std::move(hashes),
                        r.reads_prefix_cache);
    }
    if (r.draft_features.embeds.size() !=
        static_cast<size_t>(prompt.vision_tokens * model_.draft.hidden)) {
      r.draft_features = {};  // not a row per image token: the draft sees the pads instead
    }
    if (!st.ok()) {
      end(r, FinishReason::kNone, st);
      continue;
    }
    if (r.expanded_ids != nullptr) *r.expanded_ids = prompt.ids;
    {
      std::lock_guard<std::mutex> lock(r.stream->mu);
      RequestStats& t = r.stream->stats;
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
    r.start(std::move(prompt));
    r.prompt_ids = {};  // the sequence holds the prompt now
    if (s.proposer) {
      r.spec_cap = opts_.spec.num_tokens;
      r.drafts.resize(static_cast<size_t>(r.spec_cap));
    }
  }
}

Status EngineCore::execute(const SchedulerOutput& out) {
  State& s = *st_;
  s.rows.clear();
  for (const ScheduledItem& it : out.items) {
    EngineRequest& r = *s.reqs.at(it.request_id);
    r.step_tokens = r.step_accepted = 0;
    const bool verify = it.num_spec > 0;
    const int32_t slot = s.sched->state_slot(it.request_id);
    s.rows.push_back({it.request_id, it.first_token, it.num_tokens,
                      verify ? StepKind::kVerify : r.kind, &r.seq,
                      &s.sched->block_table(it.request_id), slot,
                      std::span<const int32_t>(r.drafts.data(), verify ? it.num_spec : 0),
                      verify && slot >= 0 ? token_slot(slot) : -1});
  }
  s.sampled.clear();
  // A prefix hit of a hybrid model resumes from its snapshot; the snapshots this step completes
  // are taken once it has run (the slots then hold their state at the chunk's end).
  ops::Backend& be = model_.runner.decoder->backend();
  for (const StateCopy& c : out.restores) {
    VLM_RETURN_IF_ERROR(s.cache.restore_state(be, c.snapshot, c.slot));
  }
  VLM_RETURN_IF_ERROR(s.runner->forward(s.rows));
  for (const StateCopy& c : out.saves) {
    VLM_RETURN_IF_ERROR(s.cache.save_state(be, c.slot, c.snapshot));
  }
  SampledToken t;
  while (s.runner->sample_next(&t)) {
    EngineRequest& r = *s.reqs.at(t.request_id);
    ++r.step_tokens;
    r.step_accepted += t.accepted ? 1 : 0;
    s.sampled.push_back(t);
    const int64_t sampled_ns = steady_now_ns();
    if (r.append_token(t, sampled_ns)) {  // the last: it goes with the end
      s.runner->end_verify_row();         // (and a verify row's tokens after it are not its)
      continue;
    }
    r.stream->publish(t, /*stop=*/false, s.steps, sampled_ns);
  }
  // A hybrid model's verify rows that did not keep every proposal: the state where the tokens
  // they computed end (the last one and those accepted) replaces the slot's, which ran past.
  for (const StepRow& row : s.rows) {
    if (row.token_state_slot < 0) continue;
    const int32_t computed = s.reqs.at(row.request_id)->step_tokens;
    if (computed < row.num_tokens) {
      VLM_RETURN_IF_ERROR(
          s.cache.copy_slot(be, row.token_state_slot + computed - 1, row.state_slot));
    }
  }
  // The MTP head's rows of the positions this step computed, while every request still holds
  // its blocks (a failure is the proposer's: no proposals next step).
  if (s.mtp != nullptr) {
    if (const Status st = s.mtp->observe(s.rows); !st.ok()) {
      log_printf(LogLevel::kWarn,
                 "the MTP head's pass failed (its rows of this step's positions are "
                 "missing, and the next step goes without proposals): %s",
                 st.message().c_str());
    }
  }
  return ok_status();
}

void EngineCore::update() {
  State& s = *st_;
  const SchedulerOutput& out = s.sched_out;
  s.computed.clear();
  for (const auto& it : out.items) {
    // A verify row computed its last token and the proposals accepted: as many as it sampled.
    const int64_t n = it.num_spec > 0 ? s.reqs.at(it.request_id)->step_tokens : it.num_tokens;
    s.computed.emplace_back(it.request_id, n);
  }
  for (const StepRow& row : s.rows) {  // prefill-only and pooling requests end with their prompt
    if (row.first_token + row.num_tokens != row.seq->prompt_len()) continue;
    if (row.kind == StepKind::kPrefillOnly) {
      end(*s.reqs.at(row.request_id), FinishReason::kLength, ok_status());
    } else if (row.kind == StepKind::kPool) {
      EngineRequest& r = *s.reqs.at(row.request_id);
      r.stream->keep_pooled(std::move(r.seq.pooled_hidden), std::move(r.seq.pooled_logits),
                            steady_now_ns());
      end(r, FinishReason::kStop, ok_status());
    }
  }
  if (s.proposer) record_spec(out);
  const int64_t bs = opts_.block_size;
  for (const SampledToken& t : s.sampled) {
    s.sched->append_token(t.request_id);
    EngineRequest& r = *s.reqs.at(t.request_id);
    const SchedRequest* q = s.sched->find(t.request_id);
    VLM_CHECK(q != nullptr, "a sampled token of a request the scheduler no longer runs");
    const int64_t n = q->num_tokens;  // the sequence up to t (a verify row appends several)
    if (r.ending != FinishReason::kNone && n == r.seq.len()) {
      // The blocks its accepted proposals filled stay cached (update() has not counted them), and
      // a hybrid model's state at a snapshot point among them.
      for (const StepRow& row : s.rows) {
        if (row.request_id != t.request_id || row.token_state_slot < 0) continue;
        if (const Status st = save_verify_snapshot(row); !st.ok()) {
          fail_step(st);
          return;
        }
      }
      for (const auto& [id, c] : s.computed) {
        if (id == t.request_id) s.sched->finish(id, c);
      }
      end(r, r.ending, ok_status(), &t, s.steps);
      continue;
    }
    // A generated token that fills a block: its key, so that a preempted request's recompute and
    // the next turn of a chat find it.
    if (opts_.prefix_caching && n % bs == 0 &&
        static_cast<int64_t>(q->block_hashes.size()) == n / bs - 1) {
      const BlockHash* parent = q->block_hashes.empty() ? nullptr : &q->block_hashes.back();
      s.sched->add_block_hash(
          t.request_id, prefix_block_hash(s.hasher, r.seq.ids, r.seq.prompt.image_spans, n / bs - 1,
                                          bs, parent, &s.extras));
    }
  }
  // After the appends: a verify row's accepted tokens are the request's now.
  s.sched->update(s.computed);
  for (const StepRow& row : s.rows) {
    if (row.token_state_slot >= 0 && s.reqs.count(row.request_id) > 0) {
      if (const Status st = save_verify_snapshot(row); !st.ok()) {
        fail_step(st);
        return;
      }
    }
  }
  if (s.proposer) propose();
}

// A hybrid model's verify row, once its request has every token of the step: a snapshot point
// among the tokens it computed takes the state there (the slot's for its last token, else that
// token's own).
Status EngineCore::save_verify_snapshot(const StepRow& row) {
  State& s = *st_;
  const int64_t computed = s.reqs.at(row.request_id)->step_tokens;
  int64_t end = 0;
  const int32_t snap = s.sched->verify_snapshot(row.request_id, row.first_token, computed, &end);
  if (snap < 0) return ok_status();
  const int64_t j = end - row.first_token;  // tokens of the row up to the point
  const int32_t from =
      j == computed ? row.state_slot : row.token_state_slot + static_cast<int32_t>(j - 1);
  return s.cache.save_state(model_.runner.decoder->backend(), from, snap);
}

// Speculative decoding's counters (vLLM's spec_decode family), and each verified request's cap:
// halved after a verify that accepted nothing (at 0 no proposals, until kSpecRetrySteps plain
// steps have passed), doubled after one that accepted every proposal of a full cap.
void EngineCore::record_spec(const SchedulerOutput& out) {
  State& s = *st_;
  const int32_t K = opts_.spec.num_tokens;
  std::lock_guard<std::mutex> lock(shared_->mu);
  Engine::CoreStats& st = shared_->stats;
  for (const ScheduledItem& it : out.items) {
    if (it.num_spec == 0) continue;
    EngineRequest& r = *s.reqs.at(it.request_id);
    const int32_t k = static_cast<int32_t>(it.num_spec);
    const int32_t a = r.step_accepted;
    ++st.spec_drafts;
    st.spec_draft_tokens += k;
    st.spec_accepted_tokens += a;
    for (int32_t j = 0; j < a; ++j) ++st.spec_accepted_per_pos[static_cast<size_t>(j)];
    if (!opts_.spec.adaptive) continue;
    if (a == 0) {
      r.spec_cap /= 2;
      if (r.spec_cap == 0) r.spec_wait = kSpecRetrySteps;
    } else if (a == k && k == r.spec_cap) {
      r.spec_cap = std::min(K, 2 * r.spec_cap);
    }
  }
}

// Proposals for the next step, for every request that sampled this step and goes on: at most its
// cap, and so that every proposal accepted plus the token after stays within its budget. All of
// them in one call (a draft model batches its passes).
void EngineCore::propose() {
  State& s = *st_;
  const int32_t K = opts_.spec.num_tokens;
  s.propose_jobs.clear();
  for (const StepRow& row : s.rows) {
    auto f = s.reqs.find(row.request_id);
    if (f == s.reqs.end() || row.kind == StepKind::kPrefillOnly || row.kind == StepKind::kPool) {
      continue;
    }
    EngineRequest& r = *f->second;
    if (r.step_tokens == 0 || r.ending != FinishReason::kNone) continue;  // a chunk, or done
    if (r.spec_cap == 0 && r.spec_wait-- <= 0) r.spec_cap = 1;            // waited: try again
    const int64_t room = r.max_new_tokens - r.generated - 1;
    const int32_t max_k = static_cast<int32_t>(std::min<int64_t>(std::min(r.spec_cap, K), room));
    if (max_k <= 0) {
      s.sched->set_spec_tokens(r.id, 0);
      continue;
    }
    ProposeJob j;
    j.in = {r.seq.ids,
            r.seq.feature_row,
            r.seq.prompt_len(),
            r.id,
            Positions3{r.seq.pos_t.data(), r.seq.pos_h.data(), r.seq.pos_w.data()},
            &r.draft_features,
            &s.sched->block_table(r.id)};
    j.max_k = max_k;
    j.out = r.drafts.data();
    s.propose_jobs.push_back(j);
  }
  if (s.propose_jobs.empty()) return;
  const Status st = s.proposer->propose_batch(s.propose_jobs);
  if (!st.ok()) {  // the proposer's fault, not the requests': they go on without proposals
    log_printf(LogLevel::kWarn, "speculative proposals failed, this step goes without: %s",
               st.message().c_str());
  }
  for (const ProposeJob& j : s.propose_jobs)
    s.sched->set_spec_tokens(j.in.request_id, st.ok() ? j.k : 0);
}

int32_t EngineCore::token_slot(int32_t slot) const {
  const State& s = *st_;
  if (s.token_slot_base < 0) return -1;
  return s.token_slot_base + slot * opts_.spec.num_tokens;
}

void EngineCore::fail_step(const Status& st) {
  State& s = *st_;
  // Blocks keyed for this step were never computed: forget every key.
  s.sched->reset_prefix_cache();
  publish_kv_events();
  for (const auto& it : s.sched_out.items) {
    auto f = s.reqs.find(it.request_id);
    if (f != s.reqs.end()) end(*f->second, FinishReason::kNone, st);
  }
}

// The prefix cache's changes since the last call (blocks keyed by this step's schedule, evicted
// to make room, or all forgotten), with the token ids and images of the blocks stored, to the
// callback (the server's publisher queues them for its own thread).
void EngineCore::publish_kv_events() {
  State& s = *st_;
  if (!opts_.on_kv_events) return;
  s.sched->take_kv_events(&s.kv_log);
  if (s.kv_log.empty()) return;
  KvEventBatch batch;
  batch.block_size = static_cast<int32_t>(opts_.block_size);
  kv_events_of(
      s.kv_log, opts_.block_size,
      [&](int64_t id) -> const Sequence* {
        auto it = s.reqs.find(id);
        return it == s.reqs.end() ? nullptr : &it->second->seq;
      },
      &batch.events);
  batch.ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  opts_.on_kv_events(std::move(batch));
}

void EngineCore::end(EngineRequest& r, FinishReason reason, const Status& error,
                     const SampledToken* last, int64_t step_index) {
  State& s = *st_;
  const int64_t id = r.id;
  if (r.admitted) s.sched->finish(id);
  if (s.encodes) s.encodes->drop(id);
  if (s.proposer) s.proposer->forget(id);
  {
    // Published before the stream hears: a client that reads /metrics right after its reply
    // sees the request's blocks returned.
    std::lock_guard<std::mutex> lock(shared_->mu);
    publish_stats_locked();
  }
  if (last != nullptr) {
    r.stream->close(reason, error, last, reason == FinishReason::kStop, step_index,
                    r.last_sampled_ns);
  } else {
    r.stream->close(reason, error);
  }
  s.reqs.erase(id);
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (--shared_->in_flight == 0) shared_->cv_idle.notify_all();
}

void EngineCore::publish_stats_locked() {
  Engine::CoreStats& st = shared_->stats;
  const Scheduler& sched = *st_->sched;
  st.running = sched.num_running();
  st.waiting = sched.num_waiting();
  st.kv_blocks_used = sched.kv_blocks_used();
  const Scheduler::PrefixCacheStats pc = sched.prefix_cache_stats();
  st.prefix_cache_queries = pc.queries;
  st.prefix_cache_hits = pc.hits;
  st.prefix_cache_blocks = pc.cached_blocks;
  st.prefix_cache_evictions = pc.evictions;
  st.state_snapshots_held = sched.snapshots_held();
  st.state_snapshot_evictions = sched.snapshot_evictions();
}

}  // namespace vlm

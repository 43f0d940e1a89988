#include "sched/scheduler.h"

#include <algorithm>
#include <string>

#include "core/check.h"

namespace vlm {

Result<Scheduler> Scheduler::create(const SchedulerConfig& c) {
  if (c.num_blocks <= 0) return invalid_argument("scheduler: num_blocks must be > 0");
  if (c.block_size <= 0) return invalid_argument("scheduler: block_size must be > 0");
  if (c.max_num_seqs <= 0) return invalid_argument("scheduler: max_num_seqs must be > 0");
  if (c.max_waiting <= 0) return invalid_argument("scheduler: max_waiting must be > 0");
  if (c.num_state_slots < 0) return invalid_argument("scheduler: num_state_slots must be >= 0");
  if (c.snapshot_interval < 0 || c.num_snapshots < 0) {
    return invalid_argument("scheduler: snapshot_interval and num_snapshots must be >= 0");
  }
  if (c.num_state_slots > 0 && c.prefix_caching &&
      (c.snapshot_interval <= 0 || c.num_snapshots <= 0 ||
       c.snapshot_interval % c.block_size != 0 || !c.chunked_prefill)) {
    return invalid_argument(
        "scheduler: prefix caching of per-sequence states needs snapshots: a snapshot_interval "
        "that is a multiple of block_size, num_snapshots > 0, and chunked prefill");
  }
  if (c.snapshot_interval > 0 && (c.num_state_slots <= 0 || !c.prefix_caching)) {
    return invalid_argument("scheduler: state snapshots need state slots and prefix caching");
  }
  // NOTE: as in vLLM's SchedulerConfig check, the budget must cover one decode token for every
  // running request, or a full running set could starve its own decodes.
  if (c.max_batched_tokens < c.max_num_seqs) {
    return invalid_argument("scheduler: max_batched_tokens (" +
                            std::to_string(c.max_batched_tokens) + ") must be >= max_num_seqs (" +
                            std::to_string(c.max_num_seqs) + ")");
  }
  return Scheduler(c);
}

Scheduler::Scheduler(const SchedulerConfig& config)
    : config_(config), budget_(config.max_side_ms), kv_(config.num_blocks, config.block_size) {
  for (int32_t i = config.num_state_slots - 1; i >= 0; --i) free_slots_.push_back(i);
  snap_hash_.resize(static_cast<size_t>(config.num_snapshots));
  snap_valid_.assign(static_cast<size_t>(config.num_snapshots), 0);
  snap_used_.assign(static_cast<size_t>(config.num_snapshots), 0);
}

int32_t Scheduler::find_snapshot(const BlockHash& hash) {
  for (size_t i = 0; i < snap_hash_.size(); ++i) {
    if (snap_valid_[i] != 0 && snap_hash_[i] == hash) {
      snap_used_[i] = ++snap_clock_;
      return static_cast<int32_t>(i);
    }
  }
  return -1;
}

int32_t Scheduler::take_snapshot(const BlockHash& hash) {
  size_t pick = 0;
  for (size_t i = 0; i < snap_hash_.size(); ++i) {
    if (snap_valid_[i] == 0) {
      pick = i;
      break;
    }
    if (snap_used_[i] < snap_used_[pick]) pick = i;
  }
  if (snap_valid_[pick] != 0) ++snapshot_evictions_;
  if (snap_valid_[pick] == 0) ++snapshots_held_;
  snap_hash_[pick] = hash;
  snap_valid_[pick] = 1;
  snap_used_[pick] = ++snap_clock_;
  return static_cast<int32_t>(pick);
}

void Scheduler::reset_prefix_cache() {
  kv_.reset_cache();
  std::fill(snap_valid_.begin(), snap_valid_.end(), 0);
  snapshots_held_ = 0;
}

int32_t Scheduler::hit_at_snapshot(SchedRequest& r, int32_t* snapshot) {
  const int64_t per = config_.snapshot_interval / config_.block_size;  // blocks per snapshot
  for (int64_t k = static_cast<int64_t>(hit_.size()) / per * per; k > 0; k -= per) {
    const int32_t s = find_snapshot(r.block_hashes[static_cast<size_t>(k - 1)]);
    if (s < 0) continue;
    hit_.resize(static_cast<size_t>(k));
    *snapshot = s;
    return static_cast<int32_t>(k);
  }
  hit_.clear();
  return 0;
}

// Past its prompt a request keeps one snapshot, its latest: a reply's earlier ones would only
// push other prompts' snapshots out (a follow-up turn that shares the whole reply resumes from the
// latest). A snapshot another request has hit or taken meanwhile is no longer its own to replace.
bool Scheduler::owns_reply_snapshot(const SchedRequest& r) const {
  if (r.reply_snapshot < 0) return false;
  const auto i = static_cast<size_t>(r.reply_snapshot);
  return snap_valid_[i] != 0 && snap_used_[i] == r.reply_snapshot_used;
}

void Scheduler::save_snapshots(const ScheduledItem& item, SchedulerOutput* out) {
  // A verify item's snapshot point depends on how many proposals are accepted: the engine asks
  // once the step has run (verify_snapshot).
  if (item.num_spec > 0) return;
  SchedRequest& r = requests_.at(item.request_id);
  const int64_t end = item.first_token + item.num_tokens;
  if (end % config_.snapshot_interval != 0) return;
  const int32_t s = snapshot_at(r, end);
  if (s >= 0) out->saves.push_back({r.state_slot, s});
}

int32_t Scheduler::verify_snapshot(int64_t id, int64_t first, int64_t computed, int64_t* end) {
  auto it = requests_.find(id);
  if (!snapshots() || it == requests_.end() || it->second.state_slot < 0) return -1;
  *end = (first + computed) / config_.snapshot_interval * config_.snapshot_interval;
  if (*end <= first) return -1;
  return snapshot_at(it->second, *end);
}

int32_t Scheduler::snapshot_at(SchedRequest& r, int64_t end) {
  const int64_t k = end / config_.block_size;  // full blocks at the chunk's end
  if (k > static_cast<int64_t>(r.block_hashes.size())) return -1;
  const bool own = owns_reply_snapshot(r);
  const BlockHash& hash = r.block_hashes[static_cast<size_t>(k - 1)];
  if (const int32_t found = find_snapshot(hash); found >= 0) {
    if (own && found == r.reply_snapshot) r.reply_snapshot_used = snap_used_[found];
    return -1;
  }
  const bool reply = end > r.num_prompt_tokens;
  int32_t s = -1;
  if (reply && own) {
    if (end <= r.reply_snapshot_end) return -1;  // recomputing behind its latest, which stays
    s = r.reply_snapshot;                        // replaced in place
    snap_hash_[static_cast<size_t>(s)] = hash;
    snap_used_[static_cast<size_t>(s)] = ++snap_clock_;
  } else {
    s = take_snapshot(hash);
  }
  if (reply) {
    r.reply_snapshot = s;
    r.reply_snapshot_end = end;
    r.reply_snapshot_used = snap_used_[static_cast<size_t>(s)];
  }
  return s;
}

void Scheduler::release_slot(SchedRequest& r) {
  if (r.state_slot < 0) return;
  free_slots_.push_back(r.state_slot);
  r.state_slot = -1;
}

int32_t Scheduler::state_slot(int64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.state_slot;
}

Status check_kv_fits(int64_t num_tokens, int32_t num_blocks, int32_t block_size) {
  // A request must fit the cache alone at its largest, or preemption could never make room for it.
  const int64_t need = (num_tokens + block_size - 1) / block_size;
  if (need > num_blocks) {
    return out_of_range(std::to_string(num_tokens) + " tokens need " + std::to_string(need) +
                        " KV blocks but the whole cache has " + std::to_string(num_blocks) +
                        " (of " + std::to_string(block_size) +
                        " tokens); shorten the prompt or max_tokens");
  }
  return ok_status();
}

Status Scheduler::add(int64_t id, int64_t num_prompt_tokens, int64_t max_new_tokens,
                      std::vector<BlockHash> block_hashes, bool reads_prefix_cache) {
  const std::string what = "request " + std::to_string(id);
  if (requests_.count(id) != 0) return invalid_argument(what + ": duplicate id");
  if (num_prompt_tokens < 1) return invalid_argument(what + ": empty prompt");
  if (max_new_tokens < 1) {
    return invalid_argument(what +
                            ": max_new_tokens must be >= 1 (a prefill always samples one token)");
  }
  VLM_RETURN_IF_ERROR(check_fits(num_prompt_tokens + max_new_tokens).with_context(what));
  if (num_waiting() >= config_.max_waiting) {
    return Status(StatusCode::kResourceExhausted,
                  what + ": waiting queue full (" + std::to_string(config_.max_waiting) + ")");
  }
  SchedRequest r;
  r.id = id;
  r.num_prompt_tokens = num_prompt_tokens;
  r.num_tokens = num_prompt_tokens;
  r.max_new_tokens = max_new_tokens;
  r.state = SchedRequest::State::kWaiting;
  r.arrival = next_arrival_++;
  if (config_.prefix_caching) {
    r.block_hashes = std::move(block_hashes);
    r.block_hashes.resize(std::min<size_t>(
        r.block_hashes.size(), static_cast<size_t>(num_prompt_tokens / config_.block_size)));
    // Room for every block it may fill: add_block_hash never reallocates in a decode step.
    r.block_hashes.reserve(static_cast<size_t>(r.num_tokens_limit() / config_.block_size));
    r.reads_prefix_cache = reads_prefix_cache;
  }
  requests_.emplace(id, std::move(r));
  waiting_.push_back(id);
  return ok_status();
}

void Scheduler::abort(int64_t id) { remove(id); }

void Scheduler::finish(int64_t id, int64_t computed) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  SchedRequest& r = it->second;
  if (config_.prefix_caching && computed > 0) {  // its last step's full blocks stay cached
    r.num_computed_tokens = std::min(r.num_tokens, r.num_computed_tokens + computed);
    kv_.cache_full_blocks(id, r.block_hashes, r.num_computed_tokens);
  }
  r.state = SchedRequest::State::kFinished;
  remove(id);
}

void Scheduler::remove(int64_t id) {
  auto r = requests_.find(id);
  if (r == requests_.end()) return;
  release_slot(r->second);
  requests_.erase(r);
  kv_.free(id);
  if (auto it = std::find(running_.begin(), running_.end(), id); it != running_.end()) {
    running_.erase(it);
  }
  if (auto it = std::find(waiting_.begin(), waiting_.end(), id); it != waiting_.end()) {
    waiting_.erase(it);
  }
}

void Scheduler::add_block_hash(int64_t id, const BlockHash& hash) {
  auto it = requests_.find(id);
  if (it == requests_.end() || !config_.prefix_caching) return;
  SchedRequest& r = it->second;
  VLM_CHECK(static_cast<int64_t>(r.block_hashes.size() + 1) * config_.block_size <= r.num_tokens,
            "add_block_hash before the request's tokens fill the block");
  r.block_hashes.push_back(hash);
}

Scheduler::PrefixCacheStats Scheduler::prefix_cache_stats() const {
  PrefixCacheStats st;
  st.queries = prefix_queries_;
  st.hits = prefix_hits_;
  st.cached_blocks = kv_.pool().num_cached();
  st.evictions = kv_.pool().evictions();
  return st;
}

void Scheduler::cache_blocks(const ScheduledItem& item) {
  const SchedRequest& r = requests_.at(item.request_id);
  kv_.cache_full_blocks(item.request_id, r.block_hashes, item.first_token + item.num_tokens);
}

const SchedRequest* Scheduler::find(int64_t id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : &it->second;
}

// NOTE: the order of the two policies is vLLM v1's (vllm/v1/core/sched/scheduler.py): running
// requests first, then waiting ones, and no admission in a step that had to preempt (memory is
// short; admitting would only feed the next preemption).
SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  schedule(&out, kNoPrefillLimit);
  return out;
}

void Scheduler::schedule(SchedulerOutput* out, int64_t prefill_limit) {
  VLM_CHECK(prefill_limit >= 1, "scheduler: a prefill limit must allow one token");
  out->items.clear();
  out->preempted.clear();
  out->restores.clear();
  out->saves.clear();
  out->total_tokens = 0;
  int64_t budget = config_.max_batched_tokens;
  int64_t prefill_budget = config_.max_batched_tokens;
  prefill_limited_ = false;
  if (config_.chunked_prefill) {
    bool decodes = false;
    for (int64_t id : running_) decodes = decodes || requests_.at(id).is_decoding();
    prefill_limited_ = decodes && prefill_limit < prefill_budget;
    if (prefill_limited_) prefill_budget = prefill_limit;
  }
  schedule_running(out, &budget, &prefill_budget);
  if (out->preempted.empty()) schedule_waiting(out, &budget, &prefill_budget);
  for (const ScheduledItem& item : out->items) {
    out->total_tokens += item.num_tokens;
    if (snapshots()) save_snapshots(item, out);
  }
}

int64_t Scheduler::limited(const SchedRequest& r, int64_t budget, int64_t prefill_budget) const {
  if (!prefill_limited_) return budget;
  // A limited chunk never leaves less than the limit behind (a hybrid model's may still end
  // earlier, at a snapshot point): the rest comes whole (at most twice the limit), since a short
  // chunk costs more per token than a long one.
  const int64_t want = r.num_remaining() < 2 * prefill_budget ? r.num_remaining() : prefill_budget;
  return std::min(budget, prefill_budget > 0 ? want : 0);
}

int64_t Scheduler::pending_prefill_tokens() const {
  int64_t n = 0;
  for (int64_t id : running_) {
    const SchedRequest& r = requests_.at(id);
    if (r.is_prefilling()) n += r.num_remaining();
  }
  for (int64_t id : waiting_) n += requests_.at(id).num_remaining();
  return n;
}

int64_t Scheduler::num_prefilling() const {
  int64_t n = static_cast<int64_t>(waiting_.size());
  for (int64_t id : running_) n += requests_.at(id).is_prefilling() ? 1 : 0;
  return n;
}

int64_t Scheduler::prefill_chunk(const SchedRequest& r, int64_t budget, bool alone) const {
  const int64_t need = r.num_remaining();
  if (snapshots() && need > 1) {
    // A hybrid model's chunk ends at the furthest snapshot point it reaches (where its state is
    // kept), or runs as it would when it reaches none (chunked prefill: create() checked).
    const int64_t every = config_.snapshot_interval, c = r.num_computed_tokens;
    const int64_t n = std::min(need, budget);
    const int64_t last = (c + n) / every * every;
    return last > c ? last - c : n;
  }
  if (need <= budget) return need;
  if (config_.chunked_prefill) return budget;  // the rest follows in later steps
  // NOTE: without chunking a prefill is all or nothing. One larger than the whole budget (a long
  // prompt, or a recompute after preemption that also covers generated tokens) could then never
  // run, so it runs alone, over budget, when nothing else is running; FCFS admission holds later
  // requests back meanwhile, so the running set drains and it cannot starve. vLLM instead rejects
  // max_model_len > max_num_batched_tokens at startup; we keep the engine usable instead.
  return alone ? need : 0;
}

// Policy 1: every running request gets the tokens it still needs. Decodes go first so that a
// long prefill chunk never delays tokens users are waiting on (Sarathi-Serve's stall-free
// batching; vLLM V0's chunked-prefill scheduler also takes decodes first). Within each group the
// oldest goes first, and KV shortage preempts the newest (vLLM v1).
void Scheduler::schedule_running(SchedulerOutput* out, int64_t* budget, int64_t* prefill_budget) {
  std::vector<int64_t>& order = order_;
  order.clear();
  for (int64_t id : running_) {
    if (requests_.at(id).is_decoding()) order.push_back(id);
  }
  for (int64_t id : running_) {
    if (requests_.at(id).is_prefilling()) order.push_back(id);
  }
  for (int64_t id : order) {
    SchedRequest& r = requests_.at(id);
    if (r.state != SchedRequest::State::kRunning) continue;  // preempted earlier in this step
    const bool alone = out->items.empty() && running_.size() == 1;
    const bool prefill = r.is_prefilling();
    const int64_t n =
        prefill_chunk(r, prefill ? limited(r, *budget, *prefill_budget) : *budget, alone);
    if (n <= 0) continue;
    if (!reserve_or_preempt(r, n, out, budget)) continue;
    out->items.push_back({id, r.num_computed_tokens, n});
    *budget -= n;
    if (prefill) *prefill_budget = std::max<int64_t>(0, *prefill_budget - n);
  }
  add_spec_tokens(out, budget);
  // Keyed once the running set is settled (a preemption above may withdraw a chunk scheduled
  // before it): the blocks this step fills are computed by it, so a request admitted below may
  // already read them (each layer stores the pass's K/V before any of its attention runs).
  if (config_.prefix_caching) {
    for (const ScheduledItem& item : out->items) cache_blocks(item);
  }
}

// After every running request has its tokens (so that proposals never take a block one of those
// needs, nor preempt anyone), the decodes' proposals in the decodes' order: as many as the budget
// left allows, when the blocks for all of those are free (which may evict cached ones, as any
// reservation does), else none.
void Scheduler::add_spec_tokens(SchedulerOutput* out, int64_t* budget) {
  for (ScheduledItem& item : out->items) {
    SchedRequest& r = requests_.at(item.request_id);
    if (item.num_tokens != 1 || r.num_spec_tokens == 0) continue;
    const int64_t spec = std::min(r.num_spec_tokens, *budget);
    r.num_spec_tokens = 0;  // this step's, used or not
    if (spec <= 0) continue;
    if (!kv_.reserve(r.id, r.num_computed_tokens + 1 + spec, r.num_tokens_limit()).ok()) continue;
    item.num_tokens += spec;
    item.num_spec = spec;
    *budget -= spec;
  }
}

bool Scheduler::reserve_or_preempt(SchedRequest& r, int64_t n, SchedulerOutput* out,
                                   int64_t* budget) {
  // Terminates: each failure removes one running request, and r itself is among them. A request
  // alone always fits (add() checked its blocks at its limit <= num_blocks), so preempting r
  // means older requests hold the blocks and were scheduled: the step is never empty.
  while (!kv_.reserve(r.id, r.num_computed_tokens + n, r.num_tokens_limit()).ok()) {
    VLM_CHECK(!running_.empty(), "scheduler: a running request is missing from the running set");
    const int64_t victim = running_.back();
    preempt(victim, out, budget);
    if (victim == r.id) return false;
  }
  return true;
}

// Recompute-style preemption (vLLM v1 `_preempt_request`): drop the KV, requeue at the FRONT so
// the request keeps its FCFS priority, and prefill everything (prompt + generated) again later.
void Scheduler::preempt(int64_t id, SchedulerOutput* out, int64_t* budget) {
  SchedRequest& v = requests_.at(id);
  kv_.free(id);
  release_slot(v);  // its state restarts from zero with its recompute
  v.num_computed_tokens = 0;
  v.num_spec_tokens = 0;
  v.state = SchedRequest::State::kPreempted;
  running_.erase(std::find(running_.begin(), running_.end(), id));
  waiting_.push_front(id);
  out->preempted.push_back(id);
  // A newer request may already have been given tokens this step (a decode, when an older
  // prefill needs the blocks): withdraw them and give its budget back.
  auto it = std::find_if(out->items.begin(), out->items.end(),
                         [id](const ScheduledItem& item) { return item.request_id == id; });
  if (it != out->items.end()) {
    *budget += it->num_tokens;
    out->items.erase(it);
  }
}

// Policy 2: admit waiting requests in FCFS order while a sequence slot, budget and free blocks for
// their first chunk remain. The head that does not fit stops admission: no overtaking, so a big
// request cannot be starved by a stream of small ones.
void Scheduler::schedule_waiting(SchedulerOutput* out, int64_t* budget, int64_t* prefill_budget) {
  while (!waiting_.empty() && num_running() < config_.max_num_seqs) {
    if (!admit(requests_.at(waiting_.front()), out, budget, prefill_budget)) break;
  }
}

// A waiting request holds no blocks (preemption freed them). With prefix caching it starts after
// the longest run of its blocks found cached — whole blocks, and never its last token, whose
// logits the step must compute (vLLM's rule) — wherever that falls, inside an image too.
bool Scheduler::admit(SchedRequest& r, SchedulerOutput* out, int64_t* budget,
                      int64_t* prefill_budget) {
  if (config_.num_state_slots > 0 && free_slots_.empty()) return false;  // no state slot free
  const bool lookup = config_.prefix_caching && r.reads_prefix_cache;
  int32_t hit = lookup ? kv_.cached_prefix(r.block_hashes, r.num_tokens - 1, &hit_) : 0;
  if (!lookup) hit_.clear();
  int32_t resume = -1;  // a hybrid model's: the snapshot its state resumes from
  const bool owned = owns_reply_snapshot(r);  // (preempted past its prompt)
  if (snapshots() && hit > 0) hit = hit_at_snapshot(r, &resume);
  if (owned && resume == r.reply_snapshot) {  // resuming from its own: still its own
    r.reply_snapshot_used = snap_used_[static_cast<size_t>(resume)];
  }
  r.num_computed_tokens = int64_t{hit} * config_.block_size;
  const int64_t n =
      prefill_chunk(r, limited(r, *budget, *prefill_budget), /*alone=*/running_.empty());
  if (n <= 0 || !kv_.can_reserve_prefix(hit_, r.num_computed_tokens + n)) {
    r.num_computed_tokens = 0;  // admission by free blocks: not this step
    return false;
  }
  VLM_CHECK(kv_.reserve_prefix(r.id, hit_, r.num_computed_tokens + n, r.num_tokens_limit()).ok(),
            "reserve after can_reserve");
  waiting_.pop_front();
  running_.push_back(r.id);
  r.state = SchedRequest::State::kRunning;
  if (config_.num_state_slots > 0) {
    r.state_slot = free_slots_.back();
    free_slots_.pop_back();
    if (resume >= 0) out->restores.push_back({r.state_slot, resume});
  }
  out->items.push_back({r.id, r.num_computed_tokens, n});
  *budget -= n;
  *prefill_budget = std::max<int64_t>(0, *prefill_budget - n);
  if (lookup) {
    prefix_queries_ += r.num_tokens;
    prefix_hits_ += r.num_computed_tokens;
  }
  if (r.num_cached_tokens < 0) r.num_cached_tokens = r.num_computed_tokens;
  if (config_.prefix_caching) cache_blocks(out->items.back());
  return true;
}

void Scheduler::update(const std::vector<std::pair<int64_t, int64_t>>& computed) {
  for (const auto& [id, n] : computed) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.state != SchedRequest::State::kRunning) continue;
    SchedRequest& r = it->second;
    VLM_CHECK(n >= 0 && r.num_computed_tokens + n <= r.num_tokens,
              "scheduler update: more tokens computed than the request has");
    VLM_CHECK(kv_.blocks_for(r.num_computed_tokens + n) <=
                  static_cast<int32_t>(kv_.block_table(id).size()),
              "scheduler update: tokens computed beyond the blocks scheduled for them");
    r.num_computed_tokens += n;
    kv_.trim(id, r.num_tokens);  // the blocks of rejected proposals go back
  }
}

void Scheduler::set_spec_tokens(int64_t id, int64_t k) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  SchedRequest& r = it->second;
  VLM_CHECK(k >= 0 && r.num_tokens + k <= r.num_tokens_limit(),
            "set_spec_tokens: proposals past the request's max_new_tokens");
  r.num_spec_tokens = k;
}

void Scheduler::append_token(int64_t id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;  // aborted meanwhile
  SchedRequest& r = it->second;
  VLM_CHECK(r.num_tokens < r.num_tokens_limit(),
            "append_token past max_new_tokens: call finish() instead");
  ++r.num_tokens;
}

}  // namespace vlm

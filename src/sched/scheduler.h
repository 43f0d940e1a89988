// The request scheduler for continuous batching (vLLM v1 style): each step
// hands every runnable request a token count within one token budget. Chunked prefill and
// preemption both follow from that rule; there is no prefill or decode "phase".
//
// Plain data in, plain data out (convention 9): no tensors, no threads. The engine thread owns a
// Scheduler and drives it once per step:
//   out = schedule();                 // who computes which tokens this step
//   ... run the model on `out` ...
//   append_token(id) / finish(id);    // a sampled token joined, or the request is done
//   update({{id, n}, ...});           // those tokens now have KV in the cache
//   set_spec_tokens(id, k);           // speculative decoding: proposals for the next step
// Not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "sched/request.h"
#include "sched/step_budget.h"
#include "vlm/status.h"

namespace vlm {

struct SchedulerConfig {
  int32_t num_blocks = 0;             // KV blocks in the cache
  int32_t block_size = 16;            // tokens per block
  int64_t max_num_seqs = 64;          // most requests in the running set
  int64_t max_batched_tokens = 2048;  // token budget of one step (must be >= max_num_seqs)
  bool chunked_prefill = true;        // split long prefills across steps
  int64_t max_waiting = 256;          // add() beyond this many queued requests: ResourceExhausted
  // Automatic prefix caching: full blocks are keyed by the hashes add() and add_block_hash()
  // pass, and admission starts a request after the longest run of them found cached.
  bool prefix_caching = false;
  // The side budget beside running decodes (StepBudget): > 0 fixed ms per step, 0 automatic,
  // < 0 none.
  double max_side_ms = -1;
  // A hybrid model's per-sequence state slots (> 0): each running request holds one, from
  // admission until it finishes, is aborted or is preempted; admission waits for a free one.
  int32_t num_state_slots = 0;
  // With state slots and prefix caching: the state is kept at multiples of snapshot_interval
  // tokens (a multiple of block_size) where a step's chunk ends, in one of num_snapshots
  // snapshots, keyed by the hash of the block that ends there (least recently used ones are
  // replaced; past its prompt a request keeps one, its latest); a prefill chunk ends at the
  // furthest such point it reaches, and admission resumes a request after the longest run of its
  // cached blocks that ends at a snapshot, whose state it copies into its slot first.
  int64_t snapshot_interval = 0;
  int32_t num_snapshots = 0;
};

// A state copy the engine makes around a step: a snapshot into a request's slot before the
// forward pass (a prefix hit resumes from it), or a slot into a snapshot after it.
struct StateCopy {
  int32_t slot = -1;
  int32_t snapshot = -1;
};

// Compute tokens [first_token, first_token + num_tokens) of `request_id` this step.
struct ScheduledItem {
  int64_t request_id = 0;
  int64_t first_token = 0;  // == the request's num_computed_tokens when scheduled
  int64_t num_tokens = 0;   // >= 1
  // Of those, proposed tokens a decode step verifies (speculative decoding): num_tokens is
  // 1 + num_spec.
  int64_t num_spec = 0;
};

struct SchedulerOutput {
  std::vector<ScheduledItem> items;  // decodes first, then prefill chunks (see schedule())
  std::vector<int64_t> preempted;    // ids preempted this step (blocks freed, back in the queue)
  int64_t total_tokens = 0;          // sum of items[i].num_tokens
  // State snapshots (SchedulerConfig::snapshot_interval): copied into slots before the forward
  // pass, and out of slots after it.
  std::vector<StateCopy> restores, saves;
};

// OutOfRange when a request that may reach num_tokens tokens could never run: it needs more
// blocks than a whole cache of `num_blocks` blocks of `block_size` tokens.
Status check_kv_fits(int64_t num_tokens, int32_t num_blocks, int32_t block_size);

class Scheduler {
 public:
  // Checks every field: a non-positive size or limit, or max_batched_tokens < max_num_seqs (each
  // running decode must fit one step's budget), is invalid_argument.
  static Result<Scheduler> create(const SchedulerConfig& config);

  // Queues a request that may sample max_new_tokens tokens. invalid_argument: duplicate id,
  // num_prompt_tokens < 1, or max_new_tokens < 1 (a prefill always samples one token).
  // OutOfRange: prompt + max_new_tokens need more blocks than the whole cache, so it could never
  // run. ResourceExhausted: the waiting queue holds max_waiting requests (the server answers 429).
  // With prefix caching, `block_hashes` are the prompt's full blocks' hashes (fewer, or none, is
  // fine: only what is given is looked up and keyed); `reads_prefix_cache` false computes every
  // token (the blocks are still keyed for others).
  Status add(int64_t id, int64_t num_prompt_tokens, int64_t max_new_tokens,
             std::vector<BlockHash> block_hashes = {}, bool reads_prefix_cache = true);
  // check_kv_fits() against this scheduler's cache.
  Status check_fits(int64_t num_tokens) const {
    return check_kv_fits(num_tokens, config_.num_blocks, config_.block_size);
  }
  // Cancels a request (client disconnect) in any state and frees its blocks now. Unknown: no-op.
  void abort(int64_t id);

  // One step. Never exceeds max_batched_tokens, with one documented exception: without chunked
  // prefill, a prefill larger than the whole budget runs alone when nothing else is running
  // (otherwise it could never run). Schedules something whenever any request has work.
  SchedulerOutput schedule();
  // The same into *out, reusing its vectors' memory: the engine keeps one SchedulerOutput so that
  // steady-state steps allocate nothing. `prefill_limit` (>= 1) caps the prompt tokens of all
  // prefill chunks together in a step that also holds decodes, so that a step's length follows a
  // time budget beside the streams (with chunked prefill only: an unchunked prefill is whole). A
  // limited chunk never leaves less than the limit of its prompt for later: a rest under twice
  // the limit goes whole (a hybrid model's chunk may end earlier, at a snapshot point).
  static constexpr int64_t kNoPrefillLimit = INT64_MAX;
  void schedule(SchedulerOutput* out, int64_t prefill_limit);
  // The same with the prefill limit the step budget gives (none without a side budget).
  void schedule(SchedulerOutput* out) { schedule(out, budget_.prefill_limit(kNoPrefillLimit)); }

  // The side budget (step_budget.h), driven once per step: begin_step() with the requests not yet
  // handed to add() (their images are being encoded), then the encode's share and what it took,
  // then schedule(), then what the forward pass took.
  void begin_step(int64_t not_added) { budget_.begin_step(num_prefilling() + not_added); }
  StepBudget::EncodeShare encode_share() const {
    return budget_.encode_share(num_running(), pending_prefill_tokens());
  }
  void record_encode(double ms) { budget_.add_encode_ms(ms); }
  void record_forward(const SchedulerOutput& out, double ms) { budget_.observe_forward(out, ms); }
  // Prompt tokens not yet computed: the running requests' prefills and the waiting requests'.
  int64_t pending_prefill_tokens() const;
  // Requests with prompt tokens not yet computed (running or waiting).
  int64_t num_prefilling() const;

  // After the step ran: num_computed_tokens += n for each (id, n). Ids no longer running (aborted
  // or preempted since) are skipped.
  void update(const std::vector<std::pair<int64_t, int64_t>>& computed);
  // A hybrid model's verify step of request `id` from token `first` has run and kept `computed`
  // tokens (their blocks keyed): the snapshot its state at the last snapshot point among them
  // (*end) goes to, or -1 when none is to be taken.
  int32_t verify_snapshot(int64_t id, int64_t first, int64_t computed, int64_t* end);
  // Speculative decoding: `k` tokens are proposed after the request's last one, for its next
  // decode step to verify (that step only: they are dropped once it is scheduled, whether they
  // fit or not). That step gives it 1 + k tokens once every running request has its
  // tokens: fewer proposals when the budget left is smaller, none when the blocks for them are
  // not free (proposals never take a block a running request needs, nor preempt). The engine
  // then appends the tokens accepted (and the one after) before update(). Unknown: no-op.
  void set_spec_tokens(int64_t id, int64_t k);
  // A sampled token joined the request (num_tokens += 1). The engine calls finish() instead once
  // num_tokens has reached num_prompt_tokens + max_new_tokens.
  void append_token(int64_t id);
  // Done (eos, stop string or length): frees its blocks and drops the request. `computed`: tokens
  // its last step computed that update() has not counted (a verify row's accepted proposals):
  // the full blocks they complete, with their hashes given, stay in the prefix cache. Unknown:
  // no-op.
  void finish(int64_t id, int64_t computed = 0);
  // The next full block's hash, once the request's tokens fill it (a generated token completed
  // it). Unknown: no-op.
  void add_block_hash(int64_t id, const BlockHash& hash);
  // Forgets every cached block's key and every snapshot (e.g. after a failed forward pass whose
  // blocks and snapshots were keyed but never computed).
  void reset_prefix_cache();
  // KV events: records every change to the prefix cache's set of keyed blocks from now on
  // (kv/block_pool.h); take_kv_events() hands over those recorded since its last call.
  void enable_kv_events() { kv_.enable_events(); }
  void take_kv_events(std::vector<KvCacheEvent>* out) { kv_.take_events(out); }

  // Prefix caching counters, in tokens: the tokens of every admitted request that looked the cache
  // up, and those found there. Cached blocks now, and blocks evicted so far.
  struct PrefixCacheStats {
    int64_t queries = 0, hits = 0;
    int32_t cached_blocks = 0;
    int64_t evictions = 0;
  };
  PrefixCacheStats prefix_cache_stats() const;

  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int32_t kv_blocks_used() const { return kv_.pool().num_used(); }
  int32_t kv_blocks_total() const { return kv_.pool().num_blocks(); }
  // nullptr once finished or aborted. Valid until the next add/abort/finish.
  const SchedRequest* find(int64_t id) const;
  // The request's KV blocks, in token order (empty when it holds none).
  const std::vector<int32_t>& block_table(int64_t id) const { return kv_.block_table(id); }
  // The request's state slot (-1 when it holds none).
  int32_t state_slot(int64_t id) const;
  int32_t state_slots_free() const { return static_cast<int32_t>(free_slots_.size()); }
  // State snapshots held now, and those replaced to make room so far.
  int32_t snapshots_held() const { return snapshots_held_; }
  int64_t snapshot_evictions() const { return snapshot_evictions_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  explicit Scheduler(const SchedulerConfig& config);

  // The policies schedule() runs, in order.
  void schedule_running(SchedulerOutput* out, int64_t* budget, int64_t* prefill_budget);
  void schedule_waiting(SchedulerOutput* out, int64_t* budget, int64_t* prefill_budget);

  // The budget a prefill chunk of r may take: the token budget, and beside decodes the prefill
  // limit left this step.
  int64_t limited(const SchedRequest& r, int64_t budget, int64_t prefill_budget) const;
  // Tokens to give a request that still needs `r.num_remaining()`, within `budget`.
  int64_t prefill_chunk(const SchedRequest& r, int64_t budget, bool alone) const;
  // Reserves blocks for r's first `n` uncomputed tokens, preempting the newest running request
  // until it fits. False when r itself had to be preempted.
  bool reserve_or_preempt(SchedRequest& r, int64_t n, SchedulerOutput* out, int64_t* budget);
  // Speculative decoding: the running decodes' proposals joined to their items (update() gives the
  // blocks of rejected ones back).
  void add_spec_tokens(SchedulerOutput* out, int64_t* budget);
  void preempt(int64_t id, SchedulerOutput* out, int64_t* budget);
  void remove(int64_t id);
  void release_slot(SchedRequest& r);
  // Snapshots: the one keyed by `hash` (-1: none), marked used; a slot for a new one.
  int32_t find_snapshot(const BlockHash& hash);
  int32_t take_snapshot(const BlockHash& hash);
  // Cuts the hit in hit_ back to the longest prefix of it that ends at a snapshot (*snapshot,
  // which r resumes from) and returns its blocks; none: 0, hit_ cleared.
  int32_t hit_at_snapshot(SchedRequest& r, int32_t* snapshot);
  // The snapshots `item` completes: a chunk ending at a snapshot point not yet kept.
  void save_snapshots(const ScheduledItem& item, SchedulerOutput* out);
  // The snapshot `r`'s state at `end` tokens goes to (its block keyed by then), or -1 when none
  // is to be taken there.
  int32_t snapshot_at(SchedRequest& r, int64_t end);
  bool owns_reply_snapshot(const SchedRequest& r) const;
  bool snapshots() const { return config_.snapshot_interval > 0; }
  // Admits the head of the waiting queue: its cached prefix, then its first chunk.
  bool admit(SchedRequest& r, SchedulerOutput* out, int64_t* budget, int64_t* prefill_budget);
  // Keys the blocks `item` fills this step.
  void cache_blocks(const ScheduledItem& item);

  SchedulerConfig config_;
  StepBudget budget_;
  bool prefill_limited_ = false;  // this step's prefill chunks follow its prefill limit
  KvCacheManager kv_;
  std::unordered_map<int64_t, SchedRequest> requests_;  // every live request, by id
  std::vector<int64_t> running_;                        // oldest admitted first
  std::deque<int64_t> waiting_;                         // FCFS; preempted requests at the front
  std::vector<int64_t> order_;       // schedule_running's scratch (kept: its memory is reused)
  std::vector<int32_t> hit_;         // admit's scratch: the cached blocks found
  std::vector<int32_t> free_slots_;  // state slots no request holds (the next at the back)
  // Snapshots [num_snapshots]: the key, whether it holds one, and when it was last used.
  std::vector<BlockHash> snap_hash_;
  std::vector<uint8_t> snap_valid_;
  std::vector<int64_t> snap_used_;
  int64_t snap_clock_ = 0, snapshot_evictions_ = 0;
  int32_t snapshots_held_ = 0;
  int64_t next_arrival_ = 0;
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
};

}  // namespace vlm

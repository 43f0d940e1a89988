#include "engine/draft_proposer.h"

#include <algorithm>
#include <string>

#include "kv/kv_cache_spec.h"

namespace vlm {

int64_t DraftProposer::block_bytes(const DraftModel& model, int32_t block_size) {
  if (model.decoder == nullptr) return 0;
  return model.decoder->cache_spec(block_size, model.kv_dtype).block_bytes();
}

int64_t DraftProposer::state_bytes(const DraftModel& model, int64_t max_num_seqs, int32_t k) {
  if (model.decoder == nullptr) return 0;
  const KvCacheSpec cs = model.decoder->cache_spec(16, model.kv_dtype);
  if (cs.state_group() == nullptr) return 0;
  return max_num_seqs * (1 + int64_t{k}) * cs.state_bytes_per_seq();
}

DraftProposer::DraftProposer(const DraftModel& model, int64_t target_vocab, int32_t num_blocks,
                             int32_t block_size)
    : m_(model), target_vocab_(target_vocab), kv_(num_blocks, block_size) {}

Result<std::unique_ptr<DraftProposer>> DraftProposer::create(
    const DraftModel& model, const SpecOptions& spec, int64_t target_vocab, int32_t num_blocks,
    int32_t block_size, int64_t max_blocks_per_seq, int64_t max_num_seqs) {
  VLM_RETURN_IF_ERROR(check_spec_tokens(spec));
  if (model.decoder == nullptr) return invalid_argument("--spec draft needs a draft model");
  if (max_num_seqs > model.decoder->max_chunk()) {
    return invalid_argument(
        "the draft model's pass (" + std::to_string(model.decoder->max_chunk()) +
        " tokens) is smaller than max_num_seqs (" + std::to_string(max_num_seqs) + ")");
  }
  std::unique_ptr<DraftProposer> p(new DraftProposer(model, target_vocab, num_blocks, block_size));
  const KvCacheSpec cs = model.decoder->cache_spec(block_size, model.kv_dtype);
  p->hybrid_ = cs.state_group() != nullptr;
  p->k_ = spec.num_tokens;
  p->token_limit_ = max_blocks_per_seq * block_size;
  const int64_t slots = p->hybrid_ ? max_num_seqs : 0;
  for (int64_t i = slots - 1; i >= 0; --i) p->free_slots_.push_back(static_cast<int32_t>(i));
  VLM_RETURN_IF_ERROR(
      model.decoder
          ->allocate_cache(&p->cache_, cs, num_blocks, max_blocks_per_seq, slots, slots * p->k_)
          .with_context("the draft model's KV cache (" + std::to_string(num_blocks) + " blocks)"));
  const auto n = static_cast<size_t>(max_num_seqs);
  p->chunks_.reserve(n);
  p->chunk_job_.reserve(n);
  p->vision_.resize(n);
  for (VisionRows& v : p->vision_) v.deepstack.reserve(static_cast<size_t>(model.deepstack_taps));
  p->fed_ids_.resize(n);
  p->fed_pos_.resize(n);
  p->done_.reserve(n);
  p->logits_.resize(n * static_cast<size_t>(model.vocab_size));
  p->entries_.reserve(n * 2);
  return p;
}

void DraftProposer::forget(int64_t id) {
  kv_.free(id);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  if (it->second.slot >= 0) free_slots_.push_back(it->second.slot);
  entries_.erase(it);
}

bool DraftProposer::evict_one() {
  auto victim = entries_.end();
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->second.used == calls_) continue;  // proposing in this call
    if (victim == entries_.end() || it->second.used < victim->second.used) victim = it;
  }
  if (victim == entries_.end()) return false;
  forget(victim->first);
  return true;
}

bool DraftProposer::take_slot(Entry& e) {
  if (e.slot >= 0) return true;
  if (free_slots_.empty() && !evict_one()) return false;
  e = Entry{.used = calls_};  // from the sequence's start, in a fresh state
  e.slot = free_slots_.back();
  free_slots_.pop_back();
  return true;
}

int32_t DraftProposer::propose(const ProposeInput& in, int32_t max_k, int32_t* out) {
  ProposeJob job{in, max_k, out, 0};
  if (!propose_batch(std::span<ProposeJob>(&job, 1)).ok()) return 0;
  return job.k;
}

Status DraftProposer::run_pass(std::span<ProposeJob> jobs) {
  if (chunks_.empty()) return ok_status();
  const ops::Buf logits{logits_.data(), ops::Device::kCpu, DType::kF32};
  VLM_RETURN_IF_ERROR(m_.decoder->forward_batch(
      chunks_.data(), static_cast<int64_t>(chunks_.size()), cache_, logits));
  const int64_t V = m_.vocab_size;
  size_t row = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c].rows != LogitRows::kLast) continue;
    const float* r = logits_.data() + row++ * static_cast<size_t>(V);
    const auto id = static_cast<int32_t>(std::max_element(r, r + V) - r);
    ProposeJob& j = jobs[static_cast<size_t>(chunk_job_[c])];
    if (id >= target_vocab_) {  // not an id of the target's: the proposals end before it
      done_[static_cast<size_t>(chunk_job_[c])] = 1;
      continue;
    }
    j.out[j.k++] = id;
    if (j.k == j.max_k) done_[static_cast<size_t>(chunk_job_[c])] = 1;
  }
  return ok_status();
}

Status DraftProposer::propose_batch(std::span<ProposeJob> jobs) {
  const Status st = propose_all(jobs);
  if (!st.ok()) {  // a pass failed part way: what the cache holds is known of no request
    for (auto& [id, e] : entries_) e = Entry{.slot = e.slot, .used = e.used};
    for (ProposeJob& j : jobs) j.k = 0;
  }
  return st;
}

Status DraftProposer::propose_all(std::span<ProposeJob> jobs) {
  const size_t n = jobs.size();
  done_.assign(n, 0);
  // 1. Each request's entry: the proposals fed last step that the target accepted are cached
  // already (never the sequence's last token, whose row gives the first proposal); blocks for
  // the sequence and the proposals fed this step.
  ++calls_;
  for (ProposeJob& j : jobs) entries_[j.in.request_id].used = calls_;  // (none evicted below)
  for (size_t i = 0; i < n; ++i) {
    ProposeJob& j = jobs[i];
    j.k = 0;
    const int64_t len = static_cast<int64_t>(j.in.ids.size());
    Entry& e = entries_.at(j.in.request_id);
    // Nothing new since its last call (the engine always appends first): from the start again,
    // since the last token's row is needed and a hybrid state cannot step back over it.
    if (e.computed >= len) e = Entry{.slot = e.slot, .used = e.used};
    int32_t matched = 0;
    for (; matched < e.num_fed && e.computed < len - 1; ++matched) {
      if (j.in.ids[static_cast<size_t>(e.computed)] != e.fed[static_cast<size_t>(matched)]) break;
      ++e.computed;
    }
    if (hybrid_ && e.slot >= 0 && matched < e.num_fed) {
      // Its state ran over proposals the target did not keep: back to the one before the first.
      VLM_RETURN_IF_ERROR(
          cache_.restore_state(m_.decoder->backend(), snapshot(e, matched), e.slot));
    }
    e.num_fed = 0;
    bool room = j.max_k >= 1 && len >= 1 && (!hybrid_ || take_slot(e));
    while (room && !kv_.reserve(j.in.request_id, len + j.max_k - 1, token_limit_).ok()) {
      room = evict_one();
    }
    if (!room) done_[i] = 1;  // no room in the draft's cache: no proposals this step
  }
  // 2. One catch-up pass of the draft's pass size at most: every request's tokens not yet in the
  // cache, the requests that decode (a few tokens each) before the prompts that start (which
  // take what is left, and go on next step where they stopped: no step waits for a whole prompt);
  // the chunk that reaches a sequence's end gives its first proposal, a request still behind
  // proposes nothing this step.
  const int64_t budget = m_.decoder->max_chunk();
  chunks_.clear();
  chunk_job_.clear();
  int64_t used = 0;
  for (const bool decoding : {true, false}) {
    for (size_t i = 0; i < n && used < budget; ++i) {
      if (done_[i]) continue;
      const ProposeInput& in = jobs[i].in;
      Entry& e = entries_[in.request_id];
      const int64_t len = static_cast<int64_t>(in.ids.size());
      if (e.computed >= len || (len - e.computed <= 1 + k_) != decoding) continue;
      const int64_t take = std::min(len - e.computed, budget - used);
      SeqChunk c;
      c.ids = in.ids.data() + e.computed;
      c.n = take;
      c.first = e.computed;
      c.pos = Positions3{in.pos.t + c.first, in.pos.h + c.first, in.pos.w + c.first};
      const std::vector<int32_t>& table = kv_.block_table(in.request_id);
      c.block_table = table.data();
      c.num_table_blocks = static_cast<int64_t>(table.size());
      c.rows = c.first + take == len ? LogitRows::kLast : LogitRows::kNone;
      c.state_slot = e.slot;
      if (in.features != nullptr && !in.features->embeds.empty() && c.first < in.prompt_len) {
        VisionRows& v = vision_[chunks_.size()];
        v.feature_row = in.feature_row.data() + c.first;
        v.embeds = in.features->embeds.data();
        v.deepstack.clear();
        for (const auto& d : in.features->deepstack) v.deepstack.push_back(d.data());
        c.vision = &v;
      }
      chunks_.push_back(c);
      chunk_job_.push_back(static_cast<int32_t>(i));
      e.computed += take;
      used += take;
    }
  }
  VLM_RETURN_IF_ERROR(run_pass(jobs));
  for (size_t i = 0; i < n; ++i) {  // still behind: no proposals this step
    if (entries_[jobs[i].in.request_id].computed < static_cast<int64_t>(jobs[i].in.ids.size())) {
      done_[i] = 1;
    }
  }
  // 3. One pass per further position: each request not done feeds its last proposal (after the
  // sequence, at the 1-D text positions that follow it).
  for (int32_t depth = 1;; ++depth) {
    chunks_.clear();
    chunk_job_.clear();
    for (size_t i = 0; i < n; ++i) {
      ProposeJob& j = jobs[i];
      if (done_[i] || j.k != depth) continue;
      Entry& e = entries_[j.in.request_id];
      const int64_t len = static_cast<int64_t>(j.in.ids.size());
      const size_t slot = chunks_.size();
      fed_ids_[slot] = j.out[depth - 1];
      fed_pos_[slot] = j.in.pos.t[len - 1] + depth;
      if (hybrid_) {  // its state before this proposal, to go back to if it is not kept
        VLM_RETURN_IF_ERROR(
            cache_.save_state(m_.decoder->backend(), e.slot, snapshot(e, e.num_fed)));
      }
      e.fed[static_cast<size_t>(e.num_fed++)] = j.out[depth - 1];
      SeqChunk c;
      c.state_slot = e.slot;
      c.ids = &fed_ids_[slot];
      c.n = 1;
      c.first = len + depth - 1;
      c.pos = Positions3{&fed_pos_[slot], &fed_pos_[slot], &fed_pos_[slot]};
      const std::vector<int32_t>& table = kv_.block_table(j.in.request_id);
      c.block_table = table.data();
      c.num_table_blocks = static_cast<int64_t>(table.size());
      c.rows = LogitRows::kLast;
      chunks_.push_back(c);
      chunk_job_.push_back(static_cast<int32_t>(i));
    }
    if (chunks_.empty()) break;
    VLM_RETURN_IF_ERROR(run_pass(jobs));
  }
  return ok_status();
}

}  // namespace vlm

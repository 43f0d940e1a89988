// Speculative decoding with a draft model (SpecMethod::kDraft; docs/architecture.md,
// "Speculative decoding"): a smaller model with the target's tokenizer proposes its greedy
// continuation. It keeps its own paged KV cache (as many blocks as the target's, out of the same
// budget) and, per request, how far the cache holds the request's real tokens. Each step's
// proposals are batched passes: first one pass that catches the requests up (the tokens the
// last verify accepted; a new request's prompt, with its images through the draft's own vision
// features, a pass's worth a step until it is in) and gives each its first proposal, then one
// pass of one row per request for each further position. The proposals it fed on a step stay in its
// cache: those the target accepted are not computed again (a hybrid draft keeps its state before
// each proposal it feeds, and goes back to the one where the accepted ones end). A proposal is
// deterministic given the sequence, so the verify's rejection rule keeps the output exact whatever
// the draft proposes.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/engine_core.h"
#include "engine/proposer.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"

namespace vlm {

class DraftProposer final : public Proposer {
 public:
  // `num_blocks` blocks of `block_size` tokens (tables of up to max_blocks_per_seq), for up to
  // max_num_seqs requests at a time proposing up to spec.num_tokens; proposals at or past
  // target_vocab are cut.
  static Result<std::unique_ptr<DraftProposer>> create(
      const DraftModel& model, const SpecOptions& spec, int64_t target_vocab, int32_t num_blocks,
      int32_t block_size, int64_t max_blocks_per_seq, int64_t max_num_seqs);

  int32_t propose(const ProposeInput& in, int32_t max_k, int32_t* out) override;
  Status propose_batch(std::span<ProposeJob> jobs) override;
  void forget(int64_t id) override;

  // Bytes of one of its KV blocks (the engine plans the target's blocks with these beside them),
  // and a hybrid draft's states for max_num_seqs requests proposing up to K (a slot each and a
  // snapshot per proposal it feeds; 0 for another model).
  static int64_t block_bytes(const DraftModel& model, int32_t block_size);
  static int64_t state_bytes(const DraftModel& model, int64_t max_num_seqs, int32_t k);

 private:
  DraftProposer(const DraftModel& model, int64_t target_vocab, int32_t num_blocks,
                int32_t block_size);
  // What the draft holds of one request: its cache holds the first `computed` tokens of the
  // sequence, and after them the `num_fed` proposals it fed itself last step.
  struct Entry {
    int64_t computed = 0;
    int32_t num_fed = 0;
    std::array<int32_t, SpecOptions::kMaxTokens> fed{};
    int32_t slot = -1;  // a hybrid draft's state slot (its snapshots: slot · K onward)
    uint64_t used = 0;  // the last call that proposed for it
  };
  // Frees what the request that proposed least recently, and not in this call, holds (its
  // blocks and state slot: a preempted request's, or one that has not asked for a while, which
  // starts over if it asks again); false when there is none.
  bool evict_one();
  // A hybrid draft: a state slot for `e`, evicting as above when none is free; false when every
  // slot serves this call.
  bool take_slot(Entry& e);
  // The snapshot holding `e`'s state before its fed proposal f.
  int32_t snapshot(const Entry& e, int32_t f) const { return e.slot * k_ + f; }
  // propose_batch() but for its error handling.
  Status propose_all(std::span<ProposeJob> jobs);
  // One batched pass over chunks_ (the logit rows to logits_), then each chunk's argmax into its
  // job's next proposal.
  Status run_pass(std::span<ProposeJob> jobs);

  DraftModel m_;
  int64_t target_vocab_;
  bool hybrid_ = false;
  int32_t k_ = 0;                    // SpecOptions::num_tokens
  int64_t token_limit_ = 0;          // the most tokens a table holds (reserved once)
  uint64_t calls_ = 0;               // propose_batch() calls so far
  std::vector<int32_t> free_slots_;  // a hybrid draft's
  KvCache cache_;
  KvCacheManager kv_;
  std::unordered_map<int64_t, Entry> entries_;
  // A pass's scratch: its chunks, the job each serves, image rows, the fed proposals' ids and
  // 1-D positions, the logit rows.
  std::vector<SeqChunk> chunks_;
  std::vector<int32_t> chunk_job_;
  std::vector<VisionRows> vision_;
  std::vector<int32_t> fed_ids_;
  std::vector<int64_t> fed_pos_;
  std::vector<float> logits_;
  std::vector<uint8_t> done_;  // per job: no further proposal
};

}  // namespace vlm

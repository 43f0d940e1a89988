// Speculative decoding with Qwen3.5's own MTP head (SpecMethod::kMtp; docs/architecture.md,
// "Speculative decoding"): the checkpoint's mtp.* layer reads the target's last hidden state at
// position p (after its final norm) and the token at p + 1, and predicts the token at p + 2.
// Its KV is one attention layer of its own, addressed by the target's block ids (so a prefix
// hit brings the MTP's rows along); the row at position p holds (hidden p, token p + 1).
//
// After every step (observe): one MTP pass over every position the step computed whose next
// token is now known (a prompt chunk's, a decode's, a verify row's accepted ones), reading the
// hidden states the target's pass kept; a row that reaches its sequence's end gives that
// request's first proposal. propose_batch() then chains K − 1 more, as vLLM does: each a pass of
// one row per request, fed the last proposal and the MTP's own output (after its final norm),
// at the next position. The chained rows' K/V go past the sequence, into the request's own
// blocks or a few spare blocks per request; the next step's pass writes the true rows there.
// A proposal depends only on what came before it (never on the draw that checks it), so the
// verify's rejection rule keeps the output exact whatever the head proposes: a stale row (see
// docs/architecture.md) makes proposals worse, never the output different.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/model_runner.h"
#include "engine/proposer.h"
#include "kv/kv_cache.h"
#include "kv/kv_cache_spec.h"

namespace vlm {

class MtpProposer final : public Proposer {
 public:
  // Over `dec` (which has_mtp()), whose target cache has `num_blocks` blocks and tables of up to
  // max_blocks_per_seq, for up to max_num_seqs requests proposing up to spec.num_tokens.
  static Result<std::unique_ptr<MtpProposer>> create(TextDecoder& dec, const SpecOptions& spec,
                                                     const KvCacheSpec& cache_spec,
                                                     int32_t num_blocks, int64_t max_blocks_per_seq,
                                                     int64_t max_num_seqs);
  // Spare blocks each request's chained rows may need past its table (K − 1 positions).
  static int64_t spare_blocks(int32_t k, int64_t block_size) {
    return (k - 1 + block_size - 1) / block_size;
  }

  // After a step's tokens were sampled and appended (its rows' sequences and block tables as
  // the step left them, before any request ends): the MTP rows of the positions it computed.
  // An error leaves no proposals for the next step.
  Status observe(std::span<const StepRow> rows);
  int32_t propose(const ProposeInput& in, int32_t max_k, int32_t* out) override;
  Status propose_batch(std::span<ProposeJob> jobs) override;
  void forget(int64_t id) override;

 private:
  MtpProposer(TextDecoder& dec, int32_t num_blocks, int64_t spare);
  // One MTP pass over chunks_ (chain: the hidden states are the last pass's outputs); each
  // logit row's argmax to ids_.
  Status run_pass(bool chain);

  // What observe() left for a request whose sequence (of `len` ids) it reached the end of: the
  // first proposal and its output row in the last pass.
  struct First {
    int64_t request_id = 0;
    int64_t len = 0;
    int32_t id = 0;
    int32_t out_row = 0;
  };
  TextDecoder& dec_;
  int32_t num_blocks_;
  int64_t spare_;
  KvCache cache_;
  std::vector<First> first_;  // (at most max_num_seqs: looked through, never allocated)
  // A pass's scratch: its chunks (and the request each serves), hidden rows, image rows (an
  // image placeholder's embedding is its feature row, as vLLM feeds it), chained ids and
  // positions, the logit rows and their argmax; per job its table (the target's, then its
  // spare blocks) and its last output row.
  std::vector<SeqChunk> chunks_;
  std::vector<int64_t> chunk_id_;
  std::vector<int32_t> hidden_rows_;
  std::vector<VisionRows> vision_;
  std::vector<int32_t> fed_ids_;
  std::vector<int64_t> fed_pos_;
  std::vector<float> logits_;
  std::vector<int32_t> ids_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<int32_t> out_row_;
};

}  // namespace vlm

// The model side of one engine step (vLLM's ModelRunner): the step's rows → one batch of chunks
// (token ids, 3-D positions, block tables, image rows) → TextDecoder::prepare / run on the
// engine's backend → sampling → SampledToken, plain data. Decided here, the same for every
// backend: where sampling runs (the host, or the device for greedy picks and the draws it can
// make), and whether a decode step runs as a recorded graph (padded to a bucket; recorded the
// second time its shape runs, then replayed). It sees the model through a narrow handle
// (RunnerModel) and the requests only as the rows it is given: it never finds a request, calls
// back, or changes a sequence (the engine core appends what it samples). Owns the step's
// scratch, so that steady-state steps allocate nothing.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "engine/multimodal.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
#include "vlm/engine.h"

namespace vlm {

// The model as the runner sees it: a narrow handle, never the engine.
struct RunnerModel {
  TextDecoder* decoder = nullptr;
  VisionEncoder* vision = nullptr;  // null without a vision tower
  int64_t vocab_size = 0;
  ops::Isa isa = ops::Isa::kGeneric;
  bool cuda_graphs = true;                        // decode steps as graphs where the backend can
  std::atomic<int64_t>* graph_replays = nullptr;  // counts decode steps replayed (may be null)
};

// One row of a step: compute tokens [first_token, first_token + num_tokens) of `seq` (which the
// runner reads; its sampler draws) over the request's KV blocks.
struct StepRow {
  int64_t request_id = 0;
  int64_t first_token = 0;
  int64_t num_tokens = 0;
  StepKind kind = StepKind::kGenerate;
  Sequence* seq = nullptr;
  const std::vector<int32_t>* block_table = nullptr;
  int32_t state_slot = -1;  // a hybrid model's state slot
  // kVerify: the proposed tokens (num_tokens - 1 of them), after the sequence's last token, and
  // a hybrid model's first slot for the state after each token (SeqChunk::token_state_slot).
  std::span<const int32_t> drafts;
  int32_t token_state_slot = -1;
};

class ModelRunner {
 public:
  // `cache`: the paged KV cache (block tables of up to max_blocks_per_seq entries);
  // `verify_tokens`: the most tokens the kVerify rows of a step hold together (0: none).
  static Result<std::unique_ptr<ModelRunner>> create(const RunnerModel& model, const KvCache& cache,
                                                     int64_t max_num_seqs,
                                                     int64_t max_blocks_per_seq,
                                                     int64_t verify_tokens = 0);

  // One forward pass over `rows` (which stay valid until the last sample_next()). An error is an
  // engine fault (the step's requests fail).
  Status forward(std::span<const StepRow> rows);
  // The pass's next sampled token, in row order: one for every kGenerate row that reached the
  // end of its sequence, and for a kVerify row one per proposal accepted and the one after
  // (kPrefillOnly rows' logits are copied to their requests on the way).
  // False when none is left. Pulled one at a time so that the caller hands each token to its
  // stream while the next row is sampled (the serial part of a step, when the pool's other
  // threads are idle).
  bool sample_next(SampledToken* out);
  // The token sample_next() gave last ended its request (a stop token): the rest of its kVerify
  // row is not sampled. No-op after any other row's token.
  void end_verify_row();

  // Runs units of an image encode for about `budget_ms` (at least one unit), sized so that each
  // takes about a quarter of it at the rate units of its kind have run so far (one row grain
  // until measured); with budget_ms <= 0, to its end, each stage whole. Returns the units run.
  Result<int64_t> encode(VisionEncoder::Job& job, double budget_ms);

 private:
  ModelRunner(const RunnerModel& model, const KvCache& cache, int64_t max_num_seqs,
              int64_t max_blocks_per_seq, int64_t verify_tokens);
  // A kVerify row's chunk: its last token and the proposals, at the text positions after it, in
  // the runner's scratch from `at`.
  void verify_chunk(const StepRow& row, size_t at, SeqChunk* c);
  // After the pass: each kPool row that reached its prompt's end keeps its hidden state and the
  // logits of its ids (Sequence::pooled_hidden, pooled_logits).
  Status keep_pooled(std::span<const StepRow> rows);
  // The next token of kVerify row i (its logit rows from next_logit_row_): moves on to the next
  // row once the token is not the proposal, or is the one after the last.
  void sample_verify(size_t i, SampledToken* out);
  // The pass on the backend: plainly, or as a graph of its shape (recorded the second time the
  // shape runs, replayed from then on).
  Status run_pass(const Pass& pass, const Padding& pad, ops::Buf logits);
  // The smallest graph bucket holding `rows` decode rows, or 0 when none does.
  int64_t bucket_for(int64_t rows) const;
  // On the device: the argmax of the pass's logit rows, the draws, and the rows the host
  // samples itself, to the host.
  Status pick_on_device(int64_t rows);

  RunnerModel model_;
  TextDecoder& dec_;
  ops::Backend& be_;
  const KvCache& cache_;
  int64_t max_blocks_per_seq_;
  bool device_sampling_ = false;
  bool graphs_ = false;
  std::span<const StepRow> rows_;  // the last forward pass's, and sample_next()'s place in it
  size_t next_row_ = 0, next_logit_row_ = 0, next_draw_ = 0;
  int64_t verify_at_ = 0;  // sample_next()'s place within a kVerify row
  // kVerify rows' chunks: ids and 1-D positions [verify_tokens].
  std::vector<int32_t> verify_ids_;
  std::vector<int64_t> verify_pos_;
  std::vector<SeqChunk> chunks_;
  std::vector<VisionRows> vision_;
  std::vector<uint8_t> on_device_;        // per chunk: its token is picked on the device
  std::vector<ops::SampleParams> draws_;  // the device's draws this step
  std::vector<ops::PenaltyEntry> penalties_, one_penalties_;
  // [rows, vocab]: the step's logit rows (on the host). Not zeroed when sized: rows are written
  // before they are read, and the room for max_num_seqs rows (from 4 MiB its own mapping:
  // Engine::load fixes malloc's mmap threshold there) stays unbacked until a step has that many.
  template <class T>
  struct NoInit : std::allocator<T> {
    template <class U>
    struct rebind {
      using other = NoInit<U>;
    };
    template <class U>
    void construct(U* p) noexcept {
      ::new (static_cast<void*>(p)) U;
    }
    template <class U, class... Args>
    void construct(U* p, Args&&... args) {
      ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
  };
  std::vector<float, NoInit<float>> logits_;
  ops::Buffer argmax_host_;         // [max_chunk] int32: each row's argmax (device sampling)
  ops::Buffer drawn_host_;          // [max_chunk] int32: the device's draws
  ops::PenaltyEntry no_penalty_{};  // what the device reads when no draw has a penalty
  std::vector<float> raw_row_;      // [vocab]: a row before the sampler's changes (logprobs)
  size_t normal_logit_rows_ = 0;
  Pass pass_;
  // The backend's buffers where it is not the host: logits [max_chunk, vocab], the picks.
  ops::Buffer logits_dev_, argmax_dev_, drawn_dev_, draws_dev_, penalties_dev_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<ops::Graph>> graphs_by_shape_;
  // encode(): nanoseconds per FLOP of each kind of encoder unit, as measured (0: not yet).
  std::array<double, VisionEncoder::Job::kKinds> encode_ns_per_flop_{};
  std::set<std::pair<int64_t, int64_t>> warmed_;
};

}  // namespace vlm

// The model side of one engine step (vLLM's ModelRunner): SchedulerOutput → one batch of chunks
// (token ids, 3-D positions, block tables, image rows) → TextDecoder::prepare / run on the
// engine's backend → sampling → ModelRunnerOutput, plain data. Decided here, the same for every
// backend: where sampling runs (the host, or the device for greedy picks and the draws it can
// make), and whether a decode step runs as a recorded graph (padded to a bucket; recorded the
// second time its shape runs, then replayed). So is everything the batch needs of a request's
// state, which the runner keeps up to date as tokens are sampled. Owns the step's scratch, so
// that steady-state steps allocate nothing.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "engine/multimodal.h"
#include "engine/sampler.h"
#include "model/text_decoder.h"
#include "model/vision_encoder.h"
#include "sched/scheduler.h"
#include "vlm/engine.h"

namespace vlm {

// What the runner keeps of a running request: its ids (prompt + sampled), each position's image
// feature row and 3-D position, the prepared prompt (image features), its sampler, and what the
// caller asked of the output.
struct RunnerRequest {
  int64_t id = 0;
  PreparedPrompt prompt;
  std::vector<int32_t> ids;
  std::vector<int32_t> feature_row;  // [ids.size()]: image feature row or -1
  std::vector<int64_t> pos_t, pos_h, pos_w;
  std::unique_ptr<Sampler> sampler;
  int32_t logprobs = -1;           // top alternatives per sampled token; -1: none
  float* prompt_logits = nullptr;  // Engine::logits: every prompt position's row [n, vocab]

  // Takes the prepared prompt over, with room for `max_new_tokens` more (sampling then appends
  // without reallocating).
  void start(PreparedPrompt p, int64_t max_new_tokens);
};

// One sampled token.
struct SampledToken {
  int64_t request_id = 0;
  int32_t token = 0;
  // With the request's logprobs >= 0: the token's log-probability and rank (1: the most likely),
  // and the most likely tokens.
  float logprob = 0;
  int64_t rank = 0;
  int32_t num_top = 0;
  std::array<std::pair<int32_t, float>, 20> top;
};

struct ModelRunnerOutput {
  std::vector<SampledToken> sampled;  // in schedule order: every chunk that reached its end
};

// Told of each token as soon as it is sampled, before the step's other rows are: the engine
// core hands it to its stream at once, so that the consumer's work overlaps the rest of the
// step's sampling (the serial part of a step, when the pool's other threads are idle) instead of
// the next forward pass. A non-owning reference to a callable, like RangeFn: never allocates.
class SampledFn {
 public:
  template <typename F>
  SampledFn(const F& f)  // NOLINT: implicit, so call sites pass lambdas directly
      : obj_(&f),
        call_([](const void* o, const SampledToken& t) { (*static_cast<const F*>(o))(t); }) {}
  void operator()(const SampledToken& t) const { call_(obj_, t); }

 private:
  const void* obj_;
  void (*call_)(const void*, const SampledToken&);
};

class ModelRunner {
 public:
  // `cache`: the paged KV cache (block tables of up to max_blocks_per_seq entries).
  static Result<std::unique_ptr<ModelRunner>> create(Engine::Impl& model, const KvCache& cache,
                                                     int64_t max_num_seqs,
                                                     int64_t max_blocks_per_seq);

  // Runs the step `sched` describes (block tables from `scheduler`) over the requests `find`
  // gives by id; each sampled token is appended to its request and passed to `on_sampled`. An
  // error is an engine fault (the step's requests fail).
  Status execute(const SchedulerOutput& sched, const Scheduler& scheduler,
                 const std::function<RunnerRequest*(int64_t)>& find, SampledFn on_sampled,
                 ModelRunnerOutput* out);

  // Runs units of an image encode for about `budget_ms` (at least one unit), sized so that each
  // takes about a quarter of it at the rate units of its kind have run so far (one row grain
  // until measured); with budget_ms <= 0, to its end, each stage whole. Returns the units run.
  Result<int64_t> encode(VisionEncoder& encoder, VisionEncoder::Job& job, double budget_ms);

 private:
  ModelRunner(Engine::Impl& model, const KvCache& cache, int64_t max_num_seqs,
              int64_t max_blocks_per_seq);
  // The pass on the backend: plainly, or as a graph of its shape (recorded the second time the
  // shape runs, replayed from then on).
  Status run_pass(const Pass& pass, const Padding& pad, ops::Buf logits);
  // The smallest graph bucket holding `rows` decode rows, or 0 when none does.
  int64_t bucket_for(int64_t rows) const;
  // On the device: the argmax of the pass's logit rows, the draws, and the rows the host
  // samples itself, to the host.
  Status pick_on_device(int64_t rows);

  Engine::Impl& m_;
  TextDecoder& dec_;
  ops::Backend& be_;
  const KvCache& cache_;
  int64_t max_blocks_per_seq_;
  bool device_sampling_ = false;
  bool graphs_ = false;
  std::vector<SeqChunk> chunks_;
  std::vector<VisionRows> vision_;
  std::vector<uint8_t> on_device_;        // per chunk: its token is picked on the device
  std::vector<ops::SampleParams> draws_;  // the device's draws this step
  std::vector<ops::PenaltyEntry> penalties_, one_penalties_;
  std::vector<float> logits_;       // [rows, vocab]: the step's logit rows (on the host)
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

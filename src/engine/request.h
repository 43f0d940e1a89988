// One request as the engine holds it, from the InputProcessor (caller's thread) to its end (the
// engine thread): one record, each field with one writer.
//   - input: the InputProcessor fills it at submit (prompt, staged media, budget, output asks);
//     admission reads it and releases what the prompt no longer needs.
//   - seq (Sequence): what the model runs. start() writes it at admission, append_token() each
//     sampled token after; the ModelRunner only reads it (its sampler draws).
//   - progress and stats: the engine core's, on its thread.
//   - stream: the mailbox the consumer's thread reads (RequestStreamState, under its lock).
// The scheduler keeps its own plain counts of the request (sched/request.h), by the same id.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "engine/multimodal.h"
#include "engine/proposer.h"
#include "engine/request_stream.h"
#include "engine/sampler.h"
#include "vlm/engine.h"

namespace vlm {

// What a row of a step computes (ModelRunner::forward). kGenerate samples a token where a chunk
// reaches the end of its sequence; kPrefillOnly writes every prompt position's logits to the
// request and samples nothing (Engine::logits); kPool (pooling: embeddings, a reranker's score)
// keeps the last prompt token's hidden state after the final norm and the logits of a few ids
// there, and samples nothing; kVerify is a decode row with proposed tokens (speculative
// decoding): logits at each, and the tokens accepted plus one.
enum class StepKind : uint8_t { kGenerate, kPrefillOnly, kPool, kVerify };

// The sequence the model runs: its ids (prompt, then sampled), each position's image feature row
// and 3-D position, the prepared prompt (image features), its sampler, and what the caller asked
// of the output.
struct Sequence {
  PreparedPrompt prompt;
  std::vector<int32_t> ids;
  std::vector<int32_t> feature_row;  // [ids.size()]: image feature row or -1
  std::vector<int64_t> pos_t, pos_h, pos_w;
  std::unique_ptr<Sampler> sampler;
  int32_t logprobs = -1;           // top alternatives per sampled token; -1: none
  float* prompt_logits = nullptr;  // kPrefillOnly: every prompt position's row [n, vocab]
  // kPool: the ids whose logits are kept, and what the pass at the prompt's end kept.
  std::vector<int32_t> pool_logit_ids;
  std::vector<float> pooled_hidden, pooled_logits;

  int64_t prompt_len() const { return static_cast<int64_t>(prompt.ids.size()); }
  int64_t len() const { return static_cast<int64_t>(ids.size()); }
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
  bool accepted = false;  // a kVerify row's token that is its proposal
};

struct EngineRequest {
  int64_t id = 0;

  // Input (the InputProcessor's).
  std::vector<int32_t> prompt_ids;  // as submitted (single image pads), videos expanded
  std::vector<int32_t> stop_ids;    // eos ids and the request's stop ids (empty with ignore_eos)
  std::vector<PadRun> runs;         // after the videos' expansion: a run per temporal group
  std::vector<StagedImage> images;  // the images and videos, in prompt order
  int64_t prompt_len = 0;           // expanded
  int64_t max_new_tokens = 0;
  StepKind kind = StepKind::kGenerate;  // kPrefillOnly: Engine::logits; kPool: pooling
  bool reads_prefix_cache = true;       // false for Engine::logits unless it asks
  std::vector<int32_t>* expanded_ids =
      nullptr;  // Engine::logits: the expanded prompt, at admission

  // Times and counts for the stream's stats.
  Clock::time_point submitted;
  double image_decode_ms = 0, video_decode_ms = 0, preprocess_ms = 0, encode_ms = 0;
  int64_t num_images = 0, images_cached = 0, videos = 0, videos_cached = 0, video_frames = 0;
  int64_t video_tokens = 0;

  Sequence seq;

  // Progress (the engine core's). Set by the step that samples the last token (a stop token, or
  // the budget reached): why the request ends, and when that token was sampled.
  int64_t generated = 0;
  FinishReason ending = FinishReason::kNone;
  int64_t last_sampled_ns = 0;
  bool admitted = false, forwarded = false;
  // Speculative decoding (the engine core's): the proposals the next step verifies (room for K
  // from admission), the most it may ask for (halved after a verify that accepted nothing,
  // doubled after one that accepted all), plain steps left before a cap of 0 tries 1 again, and
  // this step's tokens appended and proposals among them.
  std::vector<int32_t> drafts;
  int32_t spec_cap = 0, spec_wait = 0;
  DraftFeatures draft_features;  // a draft model's image features (its own vision tower's)
  int32_t step_tokens = 0, step_accepted = 0;

  std::shared_ptr<RequestStreamState> stream;

  // Admission: the sequence takes the prepared prompt over, with room for every token the budget
  // allows (sampling then appends without reallocating).
  void start(PreparedPrompt p);
  // A token sampled for this request (`sampled_ns`: when): the sequence grows by it, and
  // `ending` is set when it is a stop token or the last the budget allows. Returns whether it
  // ends the request.
  bool append_token(const SampledToken& t, int64_t sampled_ns);
};

}  // namespace vlm

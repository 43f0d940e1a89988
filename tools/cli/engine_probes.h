// The benchmark probes of `vlm bench` that time one part of a loaded engine alone — the vision
// tower on one image or video, decode attention, a structured output's grammar. They reach into
// the engine's internals (tools/cli/engine_probes.cc is the one tool source the layering check
// lets include them), so they are no part of the public API (include/vlm).
#pragma once

#include <cstdint>
#include <vector>

#include "vlm/engine.h"
#include "vlm/request.h"
#include "vlm/status.h"

namespace vlm_cli {

// Decodes, preprocesses and encodes one image through the vision tower, and reports the cost
// (the text decoder does not run). Runs on the engine thread between steps.
struct ImageTimings {
  int64_t vision_tokens = 0;
  int64_t resized_h = 0, resized_w = 0;
  double decode_ms = 0, preprocess_ms = 0, encode_ms = 0;
};
vlm::Result<ImageTimings> encode_image(vlm::Engine& engine, const vlm::ImageInput& image);

// The same for one video: its frames decoded (and resized as they come), preprocessed and encoded
// (all temporal groups in one encoder input).
struct VideoTimings : ImageTimings {
  int64_t frames = 0, groups = 0;
  int64_t decoded_frames = 0;  // frames the decoder produced (fewer where it seeks)
};
vlm::Result<VideoTimings> encode_video(vlm::Engine& engine, const vlm::VideoInput& video);

// Times decode attention alone, as a decode step of one sequence runs it (the thread pool,
// split-K over long contexts): one query per head against `context` cached positions in every
// layer, the K/V (random values) stored as `dtype`, a separate cache per layer so no layer finds
// another's in the CPU caches. Milliseconds per step (all layers), per rep. CPU only; runs on
// the engine thread between steps.
vlm::Result<std::vector<double>> time_decode_attention(vlm::Engine& engine, int64_t context,
                                                       vlm::KvCacheDtype dtype, int reps);

// Times a hybrid model's Gated DeltaNet token mixing alone (ops::gated_delta_net: conv1d, gates,
// delta rule) as a prefill of `tokens` tokens from a fresh sequence runs it, with the delta rule
// in chunks of `chunk` tokens (1: the recurrent form token by token): random inputs and small
// weights at the model's shapes, every linear layer with its own state. Milliseconds per pass
// over all linear layers, per rep. CPU only; runs on the engine thread between steps.
vlm::Result<std::vector<double>> time_delta_rule(vlm::Engine& engine, int64_t tokens, int64_t chunk,
                                                 int reps);

// Times a structured output's grammar as a server meets it: compiled from scratch `reps` times
// (ms each, against the vocabulary's token trie, built once and timed apart), then `sequences`
// sequences sharing the compiled grammar each draw uniformly among the allowed tokens (seeded)
// for up to `max_steps` steps or until the grammar is complete; every step's mask (applied to a
// logit row) plus the accept of the drawn token is timed in µs. The first sequence meets every
// state cold; later ones reuse the masks of states met before.
struct GrammarTimings {
  double token_trie_ms = 0;
  std::vector<double> compile_ms;
  std::vector<double> step_us;        // every step of every sequence
  std::vector<double> first_step_us;  // the first sequence's steps
  int64_t complete = 0;               // sequences that reached the grammar's end
  int64_t states = 0, mask_walks = 0, mask_hits = 0;
};
vlm::Result<GrammarTimings> time_grammar(const vlm::Engine& engine, const vlm::StructuredOutput& so,
                                         int reps, int sequences, int max_steps, uint64_t seed);

}  // namespace vlm_cli

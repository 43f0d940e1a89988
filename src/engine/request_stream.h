// The state one request's stream shares between the engine thread (which appends the tokens it
// samples, then the end) and the thread that consumes the stream (RequestStream, which turns
// them into RequestOutputs with the OutputProcessor). Every array is sized at submit for the
// request's whole budget, so appending on the engine thread never allocates.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "engine/engine_access.h"
#include "vlm/engine.h"

namespace vlm {

struct SampledToken;  // engine/request.h

// The most alternatives a token's logprobs may list (GenerateRequest::logprobs).
inline constexpr int32_t kMaxTopLogprobs = 20;

// One alternative of a token's logprobs.
struct TopEntry {
  int32_t id;
  float logprob;
};

// A sampled token as the engine saw it. Trivial (as TopEntry), so that their arrays are not
// zero-filled: pages become resident only as tokens are written.
struct RawToken {
  int32_t token;
  int32_t num_top;     // alternatives at tops[index * top_k ...]
  float logprob;       // log-softmax of the raw logits at `token` (with logprobs)
  int64_t rank;        // 1 + the ids more likely than `token` (with logprobs)
  bool stop_token;     // an eos or stop id: it ends the reply, it is not part of it
  int64_t step;        // the engine step that sampled it
  int64_t sampled_ns;  // when it was sampled (steady_clock)
};

struct RequestStream::State {
  int64_t id = 0;
  int32_t top_k = -1;  // GenerateRequest::logprobs

  std::mutex mu;  // guards everything below up to `notify`
  std::condition_variable cv;
  std::unique_ptr<RawToken[]> tokens;  // [capacity]
  std::unique_ptr<TopEntry[]> tops;    // [capacity * max(top_k, 0)]
  int64_t capacity = 0;
  int64_t published = 0;  // tokens the engine has appended
  bool finished = false;  // the engine ended the request (length, stop token or error)
  FinishReason reason = FinishReason::kNone;
  Status error;
  // The prompt side of the stats (token counts, images, queue / image times), set when the
  // request is admitted; the engine's first forward pass over it (steady_clock ns).
  RequestStats stats;
  int64_t first_forward_ns = 0;
  // A pooling request's result (RequestOutput::pooled_hidden, pooled_logits), set before close,
  // and when its last prompt token was computed (steady_clock ns; its prefill's end).
  std::vector<float> pooled_hidden, pooled_logits;
  int64_t pooled_ns = 0;

  std::atomic<bool> cancelled{false};
  std::function<void()> notify;        // called by the engine thread after appending
  std::function<void(int64_t)> abort;  // asks the engine to drop request `id`

  // The engine thread: appends a sampled token (the arrays were sized at submit: no allocation)
  // and wakes the consumer.
  void publish(const SampledToken& t, bool stop, int64_t step, int64_t sampled_ns);
  // The engine thread: the request ended — with its last token when `last` is set, so that the
  // consumer sees the two together — and the consumer wakes.
  void close(FinishReason reason, const Status& error, const SampledToken* last = nullptr,
             bool stop = false, int64_t step = 0, int64_t sampled_ns = 0);

  // The engine thread, before close(): a pooling request's result.
  void keep_pooled(std::vector<float> hidden, std::vector<float> logits, int64_t at_ns) {
    std::lock_guard<std::mutex> lock(mu);
    pooled_hidden = std::move(hidden);
    pooled_logits = std::move(logits);
    pooled_ns = at_ns;
  }

  // publish() with the lock held.
  void append_locked(const SampledToken& t, bool stop, int64_t step, int64_t sampled_ns);
  // At submit: room for `n` tokens of `k` alternatives each (default-initialised, so not
  // written until used).
  void reserve(int64_t n, int32_t k) {
    capacity = n;
    top_k = k;
    tokens.reset(new RawToken[static_cast<size_t>(n)]);
    if (k > 0) tops.reset(new TopEntry[static_cast<size_t>(n * k)]);
  }
};

}  // namespace vlm

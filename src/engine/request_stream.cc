#include "engine/request_stream.h"

#include "engine/output_processor.h"
#include "engine/request.h"

namespace vlm {

namespace {

double ms_between_ns(int64_t from, int64_t to) {
  return from > 0 && to > from ? (to - from) / 1e6 : 0.0;
}

}  // namespace

void RequestStream::State::append_locked(const SampledToken& t, bool stop, int64_t step,
                                         int64_t sampled_ns) {
  RawToken& raw = tokens[published];
  raw.token = t.token;
  raw.num_top = t.num_top;
  raw.logprob = t.logprob;
  raw.rank = t.rank;
  raw.stop_token = stop;
  raw.step = step;
  raw.sampled_ns = sampled_ns;
  for (int32_t j = 0; j < t.num_top; ++j) {
    tops[published * top_k + j] = {t.top[j].first, t.top[j].second};
  }
  ++published;
}

void RequestStream::State::publish(const SampledToken& t, bool stop, int64_t step,
                                   int64_t sampled_ns) {
  {
    std::lock_guard<std::mutex> lock(mu);
    append_locked(t, stop, step, sampled_ns);
  }
  cv.notify_all();
  if (notify) notify();
}

void RequestStream::State::close(FinishReason why, const Status& err, const SampledToken* last,
                                 bool stop, int64_t step, int64_t sampled_ns) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (last != nullptr) append_locked(*last, stop, step, sampled_ns);
    finished = true;
    reason = why;
    error = err;
  }
  cv.notify_all();
  if (notify) notify();
}

std::unique_ptr<RequestStream> EngineAccess::make_stream(
    std::shared_ptr<StreamState> state, std::unique_ptr<OutputProcessor> processor) {
  return std::unique_ptr<RequestStream>(new RequestStream(std::move(state), std::move(processor)));
}

RequestStream::RequestStream(std::shared_ptr<State> state,
                             std::unique_ptr<OutputProcessor> processor)
    : state_(std::move(state)), proc_(std::move(processor)) {}

RequestStream::~RequestStream() {
  if (!done_) cancel();
}

int64_t RequestStream::id() const { return state_->id; }
int64_t RequestStream::max_new_tokens() const { return state_->capacity; }

bool RequestStream::next(RequestOutput* out) { return take(out, true); }
bool RequestStream::try_next(RequestOutput* out) { return take(out, false); }

void RequestStream::cancel() {
  State& s = *state_;
  if (s.cancelled.exchange(true)) return;
  if (s.abort) s.abort(s.id);
  std::lock_guard<std::mutex> lock(s.mu);
  s.cv.notify_all();  // a next() waiting on another thread returns
}

bool RequestStream::take(RequestOutput* out, bool wait) {
  State& s = *state_;
  if (done_) return false;
  RawToken tok{};
  TopEntry tops[kMaxTopLogprobs];
  bool have_token = false, ended = false;
  FinishReason reason = FinishReason::kNone;
  Status error;
  RequestStats stats;
  int64_t first_forward_ns = 0;
  std::vector<float> pooled_hidden, pooled_logits;
  int64_t pooled_ns = 0;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    auto ready = [&] { return consumed_ < s.published || s.finished || s.cancelled.load(); };
    if (wait) {
      s.cv.wait(lock, ready);
    } else if (!ready()) {
      return false;
    }
    if (s.cancelled.load()) {
      done_ = true;
      return false;
    }
    if (consumed_ < s.published) {
      tok = s.tokens[consumed_];
      for (int32_t j = 0; j < tok.num_top; ++j) tops[j] = s.tops[consumed_ * s.top_k + j];
      ++consumed_;
      have_token = true;
    }
    // The end comes with the last token when the engine has already finished.
    ended = s.finished && consumed_ == s.published;
    reason = s.reason;
    error = s.error;
    stats = s.stats;
    first_forward_ns = s.first_forward_ns;
    if (ended) {
      pooled_hidden = std::move(s.pooled_hidden);
      pooled_logits = std::move(s.pooled_logits);
      pooled_ns = s.pooled_ns;
    }
  }
  *out = RequestOutput{};
  out->pooled_hidden = std::move(pooled_hidden);
  out->pooled_logits = std::move(pooled_logits);
  if (have_token) proc_->on_token(tok, tops, out);
  if (have_token && proc_->stopped()) {
    // A stop string: the reply ends here; the engine may have sampled a little further, which
    // is dropped with the request.
    cancel();
    ended = true;
    reason = FinishReason::kStop;
    error = ok_status();
  }
  stats.completion_tokens = proc_->tokens();
  stats.prefill_ms =
      ms_between_ns(first_forward_ns, pooled_ns > 0 ? pooled_ns : proc_->first_sampled_ns());
  stats.decode_ms = ms_between_ns(proc_->first_sampled_ns(), proc_->last_sampled_ns());
  out->stats = stats;
  if (ended) {
    if (error.ok()) proc_->finish(out);
    out->finished = true;
    out->finish_reason = error.ok() ? reason : FinishReason::kNone;
    out->error = error;
    done_ = true;
  }
  return true;
}

}  // namespace vlm

#include "engine/output_processor.h"

namespace vlm {

OutputProcessor::OutputProcessor(std::shared_ptr<const Tokenizer> tokenizer,
                                 const std::vector<std::string>& stop, int32_t top_k)
    : tok_(std::move(tokenizer)), stops_(stop), top_k_(top_k) {
  if (tok_ != nullptr) detok_ = std::make_unique<IncrementalDetokenizer>(*tok_, true);
}

void OutputProcessor::on_token(const RawToken& t, const TopEntry* tops, RequestOutput* out) {
  out->token_id = t.token;
  out->step = t.step;
  out->sampled_ns = t.sampled_ns;
  if (stops_.stopped()) return;  // the reply has ended: a late token counts for nothing
  ++tokens_;
  if (first_sampled_ns_ == 0) first_sampled_ns_ = t.sampled_ns;
  last_sampled_ns_ = t.sampled_ns;
  if (top_k_ >= 0 && !t.stop_token) {
    // The entry's bytes are what the token adds to the text: nothing for a special token (the
    // reply skips them).
    TokenLogprob e;
    e.token_id = t.token;
    if (tok_ != nullptr && !tok_->is_special(t.token)) e.token = tok_->token_bytes(t.token);
    e.logprob = t.logprob;
    e.rank = t.rank;
    for (int32_t j = 0; j < t.num_top; ++j) {
      e.top_logprobs.push_back(
          TopLogprob{tok_ != nullptr ? tok_->token_bytes(tops[j].id) : std::string(),
                     tops[j].logprob, tops[j].id});
    }
    pending_.push_back(std::move(e));
  }
  if (detok_ != nullptr && !t.stop_token) {
    out->text = stops_.push(detok_->push(t.token));
    text_bytes_ += out->text.size();
  }
  release_logprobs(stops_.stopped(), out);
}

void OutputProcessor::finish(RequestOutput* out) {
  if (detok_ != nullptr && !stops_.stopped()) {
    std::string tail = stops_.push(detok_->flush());
    tail += stops_.flush();
    text_bytes_ += tail.size();
    out->text += tail;
  }
  release_logprobs(true, out);
}

// Moves the pending entries the text has reached into out->logprobs. At the end the text is
// final: an entry it covers only in part (a token the stop string begins inside) keeps the bytes
// that are in the text, and the rest are dropped.
void OutputProcessor::release_logprobs(bool final, RequestOutput* out) {
  while (!pending_.empty()) {
    TokenLogprob& e = pending_.front();
    if (listed_bytes_ + e.token.size() > text_bytes_) {
      if (!final || listed_bytes_ >= text_bytes_) break;
      e.token.resize(text_bytes_ - listed_bytes_);
    }
    listed_bytes_ += e.token.size();
    out->logprobs.push_back(std::move(e));
    pending_.pop_front();
  }
  if (final) pending_.clear();
}

}  // namespace vlm

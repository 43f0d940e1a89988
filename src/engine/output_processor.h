// The caller's side of a request: turns the tokens the engine sampled into what a client reads —
// text (incremental detokenizing, stop strings with held-back text), logprob entries whose bytes
// add up to that text, and the finish reason. Runs on the thread that consumes the stream
// (RequestStream), never on the engine thread; the server and the C++ API share it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "engine/request_stream.h"
#include "engine/stop_matcher.h"
#include "vlm/request.h"
#include "vlm/tokenizer.h"

namespace vlm {

class OutputProcessor {
 public:
  // `tokenizer` may be null (no text: token ids only); held, so a stream may outlive its Engine.
  // top_k: GenerateRequest::logprobs.
  OutputProcessor(std::shared_ptr<const Tokenizer> tokenizer, const std::vector<std::string>& stop,
                  int32_t top_k);

  // One sampled token (`tops`: its alternatives): its text and the logprob entries that text
  // reaches go into *out (token_id, text, logprobs). After a stop string matched, stopped() is
  // true and the text ends before it.
  void on_token(const RawToken& t, const TopEntry* tops, RequestOutput* out);
  // The end of the reply: the text held back is released (unless a stop string matched), and
  // the logprob entries are settled so that their bytes add up to the whole text.
  void finish(RequestOutput* out);

  bool stopped() const { return stops_.stopped(); }
  int64_t tokens() const { return tokens_; }  // tokens seen (a stop token included)
  int64_t last_sampled_ns() const { return last_sampled_ns_; }
  int64_t first_sampled_ns() const { return first_sampled_ns_; }

 private:
  void release_logprobs(bool final, RequestOutput* out);

  std::shared_ptr<const Tokenizer> tok_;
  std::unique_ptr<IncrementalDetokenizer> detok_;
  StopMatcher stops_;
  int32_t top_k_;
  size_t text_bytes_ = 0;             // bytes of text emitted so far
  size_t listed_bytes_ = 0;           // bytes of text the emitted logprob entries cover
  std::deque<TokenLogprob> pending_;  // entries the text has not reached yet
  int64_t tokens_ = 0;
  int64_t first_sampled_ns_ = 0, last_sampled_ns_ = 0;
};

}  // namespace vlm

#include "engine/request.h"

#include <algorithm>

namespace vlm {

void EngineRequest::start(PreparedPrompt p) {
  Sequence& s = seq;
  s.prompt = std::move(p);
  const size_t total = s.prompt.ids.size() + static_cast<size_t>(max_new_tokens);
  for (auto* v : {&s.pos_t, &s.pos_h, &s.pos_w}) v->reserve(total);
  s.ids.reserve(total);
  s.feature_row.reserve(total);
  s.ids = s.prompt.ids;
  s.feature_row = s.prompt.feature_row;
  s.pos_t = s.prompt.rope.t;
  s.pos_h = s.prompt.rope.h;
  s.pos_w = s.prompt.rope.w;
  s.sampler->add_prompt(s.ids);
  s.sampler->reserve_generated(max_new_tokens);
  admitted = true;
}

bool EngineRequest::append_token(const SampledToken& t, int64_t sampled_ns) {
  Sequence& s = seq;
  s.ids.push_back(t.token);
  s.feature_row.push_back(-1);
  const int64_t p = s.len() - 1 + s.prompt.rope.delta;  // text after the prompt: 1-D positions
  s.pos_t.push_back(p);
  s.pos_h.push_back(p);
  s.pos_w.push_back(p);
  ++generated;
  const bool stop = std::find(stop_ids.begin(), stop_ids.end(), t.token) != stop_ids.end();
  if (stop || generated >= max_new_tokens) {
    ending = stop ? FinishReason::kStop : FinishReason::kLength;
    last_sampled_ns = sampled_ns;
    return true;
  }
  return false;
}

}  // namespace vlm

#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

namespace vlm {

Sampler::Sampler(int64_t vocab_size, const ResolvedSampling& params)
    : vocab_(vocab_size),
      p_(params),
      rng_(params.seed),
      seen_(vocab_size, 0),
      counts_(vocab_size, 0),
      idx_(vocab_size),
      probs_(vocab_size),
      kth_heap_(static_cast<size_t>(std::clamp<int64_t>(params.top_k, 1, vocab_size))) {
  seen_list_.reserve(1024);
  out_list_.reserve(1024);
}

void Sampler::add_prompt(std::span<const int32_t> ids) {
  for (int32_t id : ids) {
    if (id >= 0 && id < vocab_ && !seen_[id]) {
      seen_[id] = 1;
      seen_list_.push_back(id);
    }
  }
}

void Sampler::reserve_generated(int64_t max_new) {
  const int64_t n = std::min(std::max<int64_t>(max_new, 0), vocab_);
  const int64_t seen = static_cast<int64_t>(seen_list_.size());
  seen_list_.reserve(static_cast<size_t>(std::min(vocab_, seen + n)));
  out_list_.reserve(static_cast<size_t>(n));
}

void Sampler::apply_penalties(float* logits) const {
  for (const auto& [id, bias] : p_.logit_bias) logits[id] += bias;
  if (p_.repetition_penalty != 1.0) {
    const float rp = static_cast<float>(p_.repetition_penalty);
    for (int32_t id : seen_list_) logits[id] = logits[id] < 0 ? logits[id] * rp : logits[id] / rp;
  }
  if (p_.presence_penalty != 0.0 || p_.frequency_penalty != 0.0) {
    for (int32_t id : out_list_) {
      logits[id] -= static_cast<float>(p_.presence_penalty + p_.frequency_penalty * counts_[id]);
    }
  }
}

void Sampler::set_thinking_budget(int64_t budget, int32_t open_id, int32_t close_id,
                                  bool open_in_prompt) {
  think_budget_ = budget;
  think_open_ = open_id;
  think_close_ = close_id;
  thinking_ = open_in_prompt;
}

bool Sampler::budget_spent() const {
  return think_budget_ >= 0 && thinking_ && thought_ >= think_budget_;
}

int32_t Sampler::sample(float* logits) {
  if (budget_spent()) {
    record(think_close_);  // the budget is spent: the reasoning ends here
    return think_close_;
  }
  apply_penalties(logits);
  if (grammar_) grammar_->apply(logits);
  int32_t chosen = 0;
  if (p_.greedy) {
    chosen = static_cast<int32_t>(std::max_element(logits, logits + vocab_) - logits);
  } else {
    double total = 0;
    const int64_t n = candidates(logits, &total);
    std::uniform_real_distribution<double> u(0.0, total);
    chosen = pick(n, u(rng_), -1);
  }
  record(chosen);
  return chosen;
}

// NOTE: the rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023) for a proposal
// that puts all its mass on `draft`: accept it with probability min(1, p(draft) / 1) = p(draft),
// else draw from max(0, p - q) normalised, which is p without the draft. Every id x then comes out
// with probability p(x), p being the distribution sample() draws from.
int32_t Sampler::sample_speculative(float* logits, int32_t draft, bool* accepted) {
  int32_t chosen = 0;
  if (budget_spent()) {
    chosen = think_close_;
  } else {
    apply_penalties(logits);
    if (grammar_) grammar_->apply(logits);
    if (p_.greedy) {
      chosen = static_cast<int32_t>(std::max_element(logits, logits + vocab_) - logits);
    } else {
      double total = 0;
      const int64_t n = candidates(logits, &total);
      int64_t at = -1;  // the draft among the candidates (absent: probability 0)
      for (int64_t i = 0; i < n && at < 0; ++i) at = idx_[i] == draft ? i : -1;
      const double p_draft = at >= 0 ? probs_[at] : 0.0;
      const double rest = total - p_draft;
      if (std::uniform_real_distribution<double>(0.0, total)(rng_) < p_draft || rest <= 0) {
        chosen = draft;
      } else {
        chosen = pick(n, std::uniform_real_distribution<double>(0.0, rest)(rng_), at);
      }
    }
  }
  *accepted = chosen == draft;
  record(chosen);
  return chosen;
}

int64_t Sampler::candidates(const float* logits, double* total_out) {
  const float inv_t = static_cast<float>(1.0 / p_.temperature);
  int64_t n = vocab_;
  if (grammar_) {
    // Only the tokens the grammar allows are candidates: a top-k over the rest would keep
    // every -inf logit (the k-th largest being -inf) and sort the whole vocabulary, and a
    // rounding in the draw could land on one of them.
    const float ninf = -std::numeric_limits<float>::infinity();
    n = 0;
    int32_t* idx = idx_.data();
    for (int64_t i = 0; i < vocab_; ++i) {  // branch-free: most rows keep most tokens
      idx[n] = static_cast<int32_t>(i);
      n += logits[i] != ninf;
    }
    if (n == 0) {  // the matcher never leaves nothing; if it did, no read out of bounds
      idx[0] = static_cast<int32_t>(std::max_element(logits, logits + vocab_) - logits);
      n = 1;
    }
  } else {
    std::iota(idx_.begin(), idx_.end(), 0);
  }
  auto by_logit_desc = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (p_.top_k > 0 && p_.top_k < n) {
    // The k-th largest logit in one pass over the candidates, with a min-heap of the k largest
    // so far (most logits lose a single comparison against its top): the value a selection
    // of the k-th element would give, in a fraction of its time over a full vocabulary.
    const size_t k = static_cast<size_t>(p_.top_k);
    float* heap = kth_heap_.data();
    size_t h = 0;
    const std::greater<float> min_heap;
    for (int64_t j = 0; j < n; ++j) {
      const float v = logits[idx_[static_cast<size_t>(j)]];
      if (h < k) {
        heap[h++] = v;
        std::push_heap(heap, heap + h, min_heap);
      } else if (v > heap[0]) {
        std::pop_heap(heap, heap + k, min_heap);
        heap[k - 1] = v;
        std::push_heap(heap, heap + k, min_heap);
      }
    }
    // transformers keeps every token whose logit ties the k-th one.
    const float kth = heap[0];
    n = std::partition(idx_.begin(), idx_.begin() + n,
                       [&](int32_t i) { return logits[i] >= kth; }) -
        idx_.begin();
  }
  std::sort(idx_.begin(), idx_.begin() + n, by_logit_desc);
  // Softmax over the candidates (temperature applied to logits, as TemperatureLogitsWarper).
  const float mx = logits[idx_[0]] * inv_t;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += (probs_[i] = std::exp(logits[idx_[i]] * inv_t - mx));
  for (int64_t i = 0; i < n; ++i) probs_[i] = static_cast<float>(probs_[i] / sum);
  if (p_.top_p < 1.0) {
    // Keep the smallest prefix whose mass reaches top_p (at least one token).
    double cum = 0;
    int64_t keep = n;
    for (int64_t i = 0; i < n; ++i) {
      cum += probs_[i];
      if (cum >= p_.top_p) {
        keep = i + 1;
        break;
      }
    }
    n = keep;
  }
  if (p_.min_p > 0.0) {
    const float thr = static_cast<float>(p_.min_p) * probs_[0];
    int64_t keep = 1;
    while (keep < n && probs_[keep] >= thr) ++keep;
    n = keep;
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += probs_[i];
  *total_out = total;
  return n;
}

int32_t Sampler::pick(int64_t n, double r, int64_t skip) const {
  int32_t chosen = idx_[n - 1 == skip && n > 1 ? n - 2 : n - 1];
  for (int64_t i = 0; i < n; ++i) {
    if (i == skip) continue;
    r -= probs_[i];
    if (r < 0) {
      chosen = idx_[i];
      break;
    }
  }
  return chosen;
}

void Sampler::device_draw(ops::SampleParams* out, std::vector<ops::PenaltyEntry>* penalties) {
  *out = ops::SampleParams{};
  if (p_.greedy) {
    out->top_k = 1;
  } else {
    out->top_k = static_cast<int32_t>(p_.top_k);
    out->inv_temperature = static_cast<float>(1.0 / p_.temperature);
    out->top_p = static_cast<float>(p_.top_p);
    out->min_p = static_cast<float>(p_.min_p);
    out->u = static_cast<float>(std::uniform_real_distribution<double>(0.0, 1.0)(rng_));
  }
  penalties->clear();
  const bool rep = p_.repetition_penalty != 1.0;
  const bool sub = p_.presence_penalty != 0.0 || p_.frequency_penalty != 0.0;
  if (rep || sub) {
    for (int32_t id : seen_list_) {  // the generated ids are among the seen ones
      const int32_t n = counts_[id];
      if (!rep && n == 0) continue;
      penalties->push_back({id, static_cast<float>(p_.repetition_penalty),
                            n > 0 && sub
                                ? static_cast<float>(p_.presence_penalty + p_.frequency_penalty * n)
                                : 0.f});
    }
  }
  out->penalty_begin = 0;
  out->penalty_end = static_cast<int32_t>(penalties->size());
}

void Sampler::logprobs(const float* row, int64_t V, int32_t chosen, int32_t k, ops::Isa isa,
                       float* logprob, int64_t* rank, std::pair<int32_t, float>* top,
                       int32_t* num_top) {
  const float at = row[chosen];
  int64_t above = 0;
  const float lse = ops::logsumexp(row, V, at, &above, isa);
  *logprob = at - lse;
  *rank = above + 1;
  *num_top = 0;
  if (k <= 0) return;
  auto better = [](const std::pair<int32_t, float>& a, const std::pair<int32_t, float>& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  };
  // A min-heap (under `better`) of the k best so far, in top[0, n); once full, a value below the
  // worst kept is skipped by one comparison.
  int32_t n = 0;
  for (int64_t i = 0; i < V; ++i) {
    if (n == k && row[i] < top[0].second) continue;
    if (row[i] != row[i]) continue;  // a NaN logit (a broken model) is never a top alternative
    const std::pair<int32_t, float> c{static_cast<int32_t>(i), row[i]};
    if (n < k) {
      top[n++] = c;
      std::push_heap(top, top + n, better);
    } else if (better(c, top[0])) {
      std::pop_heap(top, top + n, better);
      top[n - 1] = c;
      std::push_heap(top, top + n, better);
    }
  }
  std::sort_heap(top, top + n, better);
  for (int32_t j = 0; j < n; ++j) top[j].second -= lse;
  *num_top = n;
}

void Sampler::record(int32_t id) {
  // The matcher accepts every token sample() drew, and the thinking budget's forced close
  // (which starts its grammar); anything else it refuses and keeps its state.
  if (grammar_) grammar_->accept(id);
  if (think_budget_ >= 0) {
    if (!started_ && !thinking_ && id == think_open_) {
      thinking_ = true;
    } else if (thinking_) {
      if (id == think_close_) {
        thinking_ = false;
      } else {
        ++thought_;
      }
    }
    started_ = true;
  }
  if (counts_[id]++ == 0) out_list_.push_back(id);
  if (!seen_[id]) {
    seen_[id] = 1;
    seen_list_.push_back(id);
  }
}

}  // namespace vlm

#include "engine/model_runner.h"

#include <algorithm>

#include "engine/engine_impl.h"

namespace vlm {

void RunnerRequest::start(PreparedPrompt p, int64_t max_new_tokens) {
  prompt = std::move(p);
  const size_t total = prompt.ids.size() + static_cast<size_t>(max_new_tokens);
  for (auto* v : {&pos_t, &pos_h, &pos_w}) v->reserve(total);
  ids.reserve(total);
  feature_row.reserve(total);
  ids = prompt.ids;
  feature_row = prompt.feature_row;
  pos_t = prompt.rope.t;
  pos_h = prompt.rope.h;
  pos_w = prompt.rope.w;
  sampler->add_prompt(ids);
  sampler->reserve_generated(max_new_tokens);
}

ModelRunner::ModelRunner(Engine::Impl& model, KvCache* cache, int64_t max_num_seqs)
    : m_(model), cache_(cache) {
  const int64_t V = m_.cfg.text_config.vocab_size;
  normal_logit_rows_ = static_cast<size_t>(max_num_seqs);
  logits_.resize(normal_logit_rows_ * static_cast<size_t>(V));
  argmax_.resize(normal_logit_rows_);
  raw_row_.resize(static_cast<size_t>(V));
}

Status ModelRunner::execute(const SchedulerOutput& sched, const Scheduler& scheduler,
                            const std::function<RunnerRequest*(int64_t)>& find,
                            SampledFn on_sampled, ModelRunnerOutput* out) {
  const int64_t V = m_.cfg.text_config.vocab_size;
  out->sampled.clear();
  if (sched.items.empty()) return ok_status();

  // 1. The batch: one chunk per scheduled item.
  const size_t n = sched.items.size();
  chunks_.assign(n, SeqChunk{});
  if (vision_.size() < n) vision_.resize(n);
  if (samples_.size() < n) {
    samples_.resize(n);
    penalties_.resize(n);
  }
  size_t rows = 0;  // logit rows the forward pass returns
  for (size_t i = 0; i < n; ++i) {
    const ScheduledItem& it = sched.items[i];
    RunnerRequest& r = *find(it.request_id);
    const auto& table = scheduler.block_table(it.request_id);
    SeqChunk& c = chunks_[i];
    c.ids = r.ids.data() + it.first_token;
    c.n = it.num_tokens;
    c.first = it.first_token;
    c.pos = Positions3{r.pos_t.data() + c.first, r.pos_h.data() + c.first, r.pos_w.data() + c.first};
    c.block_table = table.data();
    c.num_table_blocks = static_cast<int64_t>(table.size());
    if (r.prompt.vision_tokens > 0 && c.first < static_cast<int64_t>(r.prompt.ids.size())) {
      vision_[i].feature_row = r.feature_row.data() + c.first;
      vision_[i].embeds = r.prompt.embeds.data();
      vision_[i].deepstack.clear();
      for (const auto& d : r.prompt.deepstack) vision_[i].deepstack.push_back(d.data());
      c.vision = &vision_[i];
    }
    const bool reaches_end = c.first + c.n == static_cast<int64_t>(r.ids.size());
    const bool in_prompt = c.first < static_cast<int64_t>(r.prompt.ids.size());
    c.rows = r.prompt_logits != nullptr && in_prompt ? LogitRows::kAll
             : reaches_end                          ? LogitRows::kLast
                                                    : LogitRows::kNone;
    rows += c.rows == LogitRows::kAll ? static_cast<size_t>(c.n) : c.rows == LogitRows::kLast ? 1 : 0;
    // On the GPU a logit row stays there unless the host needs it (logprobs, a logit bias):
    // greedy takes the argmax, the rest a draw made there with this request's settings.
    if (m_.gpu != nullptr && c.rows == LogitRows::kLast && r.logprobs < 0 &&
        r.sampler->device_can_draw()) {
      c.argmax_only = r.sampler->plain_greedy();
      if (!c.argmax_only) {
        r.sampler->device_draw(&samples_[i], &penalties_[i]);
        c.sample = &samples_[i];
      }
    }
  }
  // Every position's row (Engine::logits) needs more room than a step of last rows: grown for
  // that step, given back after it.
  if (rows > normal_logit_rows_) {
    logits_.resize(rows * static_cast<size_t>(V));
    argmax_.resize(rows);
  }

  // 2. One forward pass over every chunk; on the GPU the argmax of every logit row comes back
  // too, and greedy rows stay there.
  const int64_t n_chunks = static_cast<int64_t>(n);
  VLM_RETURN_IF_ERROR(m_.gpu != nullptr
                          ? m_.gpu->forward_batch(chunks_.data(), n_chunks, logits_.data(), argmax_.data())
                          : m_.decoder->forward_batch(chunks_.data(), n_chunks, *cache_, logits_.data()));

  // 3. A token for every chunk that reached the end of its sequence.
  size_t row = 0;
  for (size_t i = 0; i < n; ++i) {
    const SeqChunk& c = chunks_[i];
    if (c.rows == LogitRows::kNone) continue;
    RunnerRequest& r = *find(sched.items[i].request_id);
    size_t last = row;  // the row sampled from
    if (c.rows == LogitRows::kAll) {
      std::copy_n(logits_.data() + row * V, c.n * V, r.prompt_logits + c.first * V);
      last = row + static_cast<size_t>(c.n) - 1;
      row += static_cast<size_t>(c.n);
      if (c.first + c.n != static_cast<int64_t>(r.ids.size())) continue;  // the prompt goes on
    } else {
      ++row;
    }
    float* logits = logits_.data() + last * V;
    SampledToken& s = out->sampled.emplace_back();
    s.request_id = r.id;
    if (c.argmax_only || c.sample != nullptr) {  // picked on the device
      s.token = argmax_[last];
      r.sampler->record(s.token);
    } else {
      if (r.logprobs >= 0) std::copy(logits, logits + V, raw_row_.begin());
      s.token = r.sampler->sample(logits);
    }
    if (r.logprobs >= 0) {
      Sampler::logprobs(raw_row_.data(), V, s.token, r.logprobs, m_.isa, &s.logprob, &s.rank,
                        s.top.data(), &s.num_top);
    }
    r.ids.push_back(s.token);
    r.feature_row.push_back(-1);
    const int64_t p = static_cast<int64_t>(r.ids.size()) - 1 + r.prompt.rope.delta;
    r.pos_t.push_back(p);
    r.pos_h.push_back(p);
    r.pos_w.push_back(p);
    on_sampled(s);
  }
  if (rows > normal_logit_rows_) {
    logits_.resize(normal_logit_rows_ * static_cast<size_t>(V));
    logits_.shrink_to_fit();
  }
  return ok_status();
}

}  // namespace vlm

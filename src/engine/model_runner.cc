#include "engine/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "core/check.h"
#include "vlm/log.h"

namespace vlm {

namespace {

// Decode steps of these many rows (or fewer, padded up) run as graphs.
constexpr int64_t kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256};

}  // namespace

ModelRunner::ModelRunner(const RunnerModel& model, const KvCache& cache, int64_t max_num_seqs,
                         int64_t max_blocks_per_seq, int64_t verify_tokens)
    : model_(model),
      dec_(*model.decoder),
      be_(model.decoder->backend()),
      cache_(cache),
      max_blocks_per_seq_(max_blocks_per_seq) {
  const int64_t V = model_.vocab_size;
  // A step's logit rows: one per sequence, or with proposals one per token it verifies.
  normal_logit_rows_ = static_cast<size_t>(std::max(max_num_seqs, verify_tokens));
  verify_ids_.resize(static_cast<size_t>(verify_tokens));
  verify_pos_.resize(static_cast<size_t>(verify_tokens));
  logits_.resize(normal_logit_rows_ * static_cast<size_t>(V));
  raw_row_.resize(static_cast<size_t>(V));
  device_sampling_ = be_.has_device_sampling();
  graphs_ = be_.supports_graphs() && model_.cuda_graphs;
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::create(const RunnerModel& model,
                                                         const KvCache& cache, int64_t max_num_seqs,
                                                         int64_t max_blocks_per_seq,
                                                         int64_t verify_tokens) {
  if (model.decoder == nullptr) return invalid_argument("the model runner needs a text decoder");
  std::unique_ptr<ModelRunner> r(
      new ModelRunner(model, cache, max_num_seqs, max_blocks_per_seq, verify_tokens));
  const int64_t C = r->dec_.max_chunk(), V = model.vocab_size;
  // Pinned where the device copies them back (their copies then overlap the host's work).
  VLM_ASSIGN_OR_RETURN(r->argmax_host_, r->be_.alloc_host(static_cast<size_t>(C) * 4));
  VLM_ASSIGN_OR_RETURN(r->drawn_host_, r->be_.alloc_host(static_cast<size_t>(C) * 4));
  if (r->be_.device() != ops::Device::kCpu) {  // the logits live on the device
    VLM_ASSIGN_OR_RETURN(r->logits_dev_, r->be_.alloc(C * V, DType::kF32));
  }
  if (r->device_sampling_) {
    VLM_ASSIGN_OR_RETURN(r->argmax_dev_, r->be_.alloc(C, DType::kI32));
    VLM_ASSIGN_OR_RETURN(r->drawn_dev_, r->be_.alloc(C, DType::kI32));
  }
  return r;
}

int64_t ModelRunner::bucket_for(int64_t rows) const {
  for (int64_t b : kBuckets) {
    if (b >= rows && b <= dec_.max_chunk()) return b;
  }
  return 0;
}

Status ModelRunner::run_pass(const Pass& pass, const Padding& pad, ops::Buf logits) {
  if (pad.rows == 0) return dec_.run(pass, cache_, logits);
  const std::pair<int64_t, int64_t> shape{pad.rows, pad.table_width};
  auto graph = graphs_by_shape_.find(shape);
  if (graph == graphs_by_shape_.end() && warmed_.count(shape) > 0) {
    // The second time this shape runs (the first let every kernel and the products pick their
    // algorithms outside a recording): record it.
    std::unique_ptr<ops::Graph> recorded;
    Status st = be_.begin_capture();
    if (st.ok()) {
      const Status work = dec_.run(pass, cache_, logits);
      st = be_.end_capture(&recorded);
      if (st.ok()) st = work;
    }
    if (st.ok()) {
      graph = graphs_by_shape_.emplace(shape, std::move(recorded)).first;
    } else {  // keep serving without graphs
      log_printf(LogLevel::kWarn, "graph capture failed, decoding without graphs: %s",
                 st.message().c_str());
      graphs_ = false;
      return dec_.run(pass, cache_, logits);
    }
  }
  if (graph != graphs_by_shape_.end()) {
    VLM_RETURN_IF_ERROR(graph->second->launch());
    if (model_.graph_replays) model_.graph_replays->fetch_add(1, std::memory_order_relaxed);
    return ok_status();
  }
  warmed_.insert(shape);
  return dec_.run(pass, cache_, logits);
}

Status ModelRunner::pick_on_device(int64_t rows) {
  const int64_t V = model_.vocab_size;
  const ops::Buf logits = logits_dev_.buf();
  // Every logit row's argmax (the greedy picks), then the draws (which penalise their rows in
  // place), then the rows the host samples itself.
  VLM_RETURN_IF_ERROR(be_.argmax_rows(logits, rows, V, argmax_dev_.buf()));
  if (!draws_.empty()) {
    const void* pen =
        penalties_.empty() ? static_cast<const void*>(&no_penalty_) : penalties_.data();
    VLM_ASSIGN_OR_RETURN(ops::Buf params,
                         be_.stage(draws_.data(), draws_.size() * sizeof(ops::SampleParams),
                                   DType::kU8, &draws_dev_));
    VLM_ASSIGN_OR_RETURN(
        ops::Buf penalties,
        be_.stage(pen, std::max<size_t>(penalties_.size(), 1) * sizeof(ops::PenaltyEntry),
                  DType::kU8, &penalties_dev_));
    VLM_RETURN_IF_ERROR(be_.sample_rows(logits, V, params, static_cast<int64_t>(draws_.size()),
                                        penalties, drawn_dev_.buf()));
    VLM_RETURN_IF_ERROR(
        be_.to_host(drawn_host_.as<int32_t>(), drawn_dev_.buf(), draws_.size() * 4));
  }
  VLM_RETURN_IF_ERROR(
      be_.to_host(argmax_host_.as<int32_t>(), argmax_dev_.buf(), static_cast<size_t>(rows) * 4));
  return ok_status();
}

Status ModelRunner::forward(std::span<const StepRow> rows) {
  const int64_t V = model_.vocab_size;
  rows_ = rows;
  next_row_ = next_logit_row_ = next_draw_ = 0;
  verify_at_ = 0;
  if (rows.empty()) return ok_status();

  // 1. The batch: one chunk per row.
  const size_t n = rows.size();
  chunks_.assign(n, SeqChunk{});
  on_device_.assign(n, 0);
  draws_.clear();
  penalties_.clear();
  if (vision_.size() < n) vision_.resize(n);
  size_t logit_rows_n = 0;  // logit rows the forward pass returns
  bool decode = graphs_;
  int64_t widest = 1;
  size_t verify_at = 0;  // the verify rows' scratch used so far
  for (size_t i = 0; i < n; ++i) {
    const StepRow& it = rows[i];
    const Sequence& r = *it.seq;
    const std::vector<int32_t>& table = *it.block_table;
    SeqChunk& c = chunks_[i];
    c.ids = r.ids.data() + it.first_token;
    c.n = it.num_tokens;
    c.first = it.first_token;
    c.pos =
        Positions3{r.pos_t.data() + c.first, r.pos_h.data() + c.first, r.pos_w.data() + c.first};
    c.block_table = table.data();
    c.num_table_blocks = static_cast<int64_t>(table.size());
    c.state_slot = it.state_slot;
    c.token_state_slot = it.token_state_slot;
    if (it.kind == StepKind::kVerify) {
      verify_chunk(it, verify_at, &c);
      verify_at += static_cast<size_t>(c.n);
    } else if (r.prompt.vision_tokens > 0 && c.first < r.prompt_len()) {
      vision_[i].feature_row = r.feature_row.data() + c.first;
      vision_[i].embeds = r.prompt.embeds.data();
      vision_[i].deepstack.clear();
      for (const auto& d : r.prompt.deepstack) vision_[i].deepstack.push_back(d.data());
      c.vision = &vision_[i];
    }
    const bool reaches_end = c.first + c.n == r.len();
    const bool all_rows = it.kind == StepKind::kPrefillOnly || it.kind == StepKind::kVerify;
    c.rows = all_rows ? LogitRows::kAll : reaches_end ? LogitRows::kLast : LogitRows::kNone;
    // On a device a logit row stays there unless the host needs it (logprobs, a logit bias):
    // greedy takes the argmax, the rest a draw made there with this request's settings.
    if (device_sampling_ && it.kind == StepKind::kGenerate && c.rows == LogitRows::kLast &&
        r.logprobs < 0 && r.sampler->device_can_draw()) {
      on_device_[i] = 1;
      if (!r.sampler->plain_greedy()) {
        ops::SampleParams sp;
        r.sampler->device_draw(&sp, &one_penalties_);
        sp.row = static_cast<int32_t>(logit_rows_n);
        sp.penalty_begin = static_cast<int32_t>(penalties_.size());
        penalties_.insert(penalties_.end(), one_penalties_.begin(), one_penalties_.end());
        sp.penalty_end = static_cast<int32_t>(penalties_.size());
        draws_.push_back(sp);
      }
    }
    logit_rows_n += static_cast<size_t>(logit_rows(c));
    decode = decode && c.n == 1 && c.vision == nullptr && c.rows == LogitRows::kLast &&
             it.kind == StepKind::kGenerate;
    widest = std::max(widest, c.num_table_blocks);
  }
  // Every position's row (prefill-only rows) needs more room than a step of last rows: grown for
  // that step, given back once it is sampled.
  if (logit_rows_n > normal_logit_rows_) logits_.resize(logit_rows_n * static_cast<size_t>(V));

  // 2. One forward pass over every chunk: a decode step that fits a bucket as a graph, its rows
  // padded to the bucket and its block tables to the next power of two (at least 16) of the
  // longest, so that a graph serves a range of context lengths.
  Padding pad;
  if (decode) {
    pad.rows = bucket_for(static_cast<int64_t>(n));
    int64_t width = 16;
    while (width < widest) width *= 2;
    pad.table_width = std::max(widest, std::min(width, max_blocks_per_seq_));
    if (pad.rows == 0) pad = Padding{};
  }
  VLM_RETURN_IF_ERROR(dec_.prepare(chunks_.data(), static_cast<int64_t>(n), cache_, pad, &pass_));
  const bool host_logits = be_.device() == ops::Device::kCpu;
  const ops::Buf logits =
      host_logits ? ops::Buf{logits_.data(), ops::Device::kCpu, DType::kF32} : logits_dev_.buf();
  Status st = run_pass(pass_, pad, logits);
  if (st.ok() && !host_logits) {
    if (device_sampling_) st = pick_on_device(static_cast<int64_t>(logit_rows_n));
    for (size_t i = 0, row = 0; i < n && st.ok(); ++i) {  // the rows the host samples, to the host
      const int64_t k = logit_rows(chunks_[i]);
      if (k > 0 && !on_device_[i]) {
        st = be_.to_host(logits_.data() + row * V, logits.at(static_cast<int64_t>(row) * V),
                         static_cast<size_t>(k * V) * 4);
      }
      row += static_cast<size_t>(k);
    }
  }
  // Also after an error: the next prepare() rewrites the staging the copies read from.
  Status synced = be_.synchronize();
  if (st.ok() && synced.ok()) synced = keep_pooled(rows);
  if (!st.ok() || !synced.ok()) rows_ = {};  // nothing to sample
  VLM_RETURN_IF_ERROR(st);
  return synced;
}

Status ModelRunner::keep_pooled(std::span<const StepRow> rows) {
  const int64_t V = model_.vocab_size;
  int64_t row = 0;  // the chunk's first logit row
  for (size_t i = 0; i < rows.size(); ++i) {
    const SeqChunk& c = chunks_[i];
    if (rows[i].kind == StepKind::kPool && c.rows == LogitRows::kLast) {
      Sequence& r = *rows[i].seq;
      r.pooled_hidden.resize(static_cast<size_t>(dec_.hidden_size()));
      VLM_RETURN_IF_ERROR(dec_.normed_rows_to_host(row, 1, r.pooled_hidden.data()));
      r.pooled_logits.clear();
      for (const int32_t id : r.pool_logit_ids) r.pooled_logits.push_back(logits_[row * V + id]);
    }
    row += logit_rows(c);
  }
  return ok_status();
}

void ModelRunner::verify_chunk(const StepRow& row, size_t at, SeqChunk* c) {
  const Sequence& r = *row.seq;
  VLM_CHECK(row.first_token + 1 == r.len() &&
                static_cast<int64_t>(row.drafts.size()) + 1 == row.num_tokens &&
                at + static_cast<size_t>(row.num_tokens) <= verify_ids_.size(),
            "a verify row is the sequence's last token and its proposals, within the scratch");
  int32_t* ids = verify_ids_.data() + at;
  int64_t* pos = verify_pos_.data() + at;
  ids[0] = r.ids.back();
  std::copy(row.drafts.begin(), row.drafts.end(), ids + 1);
  // Past the prompt every position is 1-D text (EngineRequest::append_token).
  for (int64_t j = 0; j < row.num_tokens; ++j) pos[j] = r.pos_t.back() + j;
  c->ids = ids;
  c->pos = Positions3{pos, pos, pos};
}

void ModelRunner::sample_verify(size_t i, SampledToken* out) {
  const int64_t V = model_.vocab_size;
  const StepRow& row = rows_[i];
  Sequence& r = *row.seq;
  const int64_t j = verify_at_;
  float* logits_row = logits_.data() + (next_logit_row_ + static_cast<size_t>(j)) * V;
  if (r.logprobs >= 0) std::copy(logits_row, logits_row + V, raw_row_.begin());
  bool accepted = false;
  const int64_t k = static_cast<int64_t>(row.drafts.size());
  out->token = j < k ? r.sampler->sample_speculative(logits_row, row.drafts[j], &accepted)
                     : r.sampler->sample(logits_row);
  out->accepted = accepted;
  if (accepted) {
    ++verify_at_;
  } else {  // the first token that is not the proposal, or the one after the last: the row ends
    next_logit_row_ += static_cast<size_t>(k + 1);
    ++next_row_;
    verify_at_ = 0;
  }
}

void ModelRunner::end_verify_row() {
  if (verify_at_ == 0) return;  // no verify row in progress
  next_logit_row_ += rows_[next_row_].drafts.size() + 1;
  ++next_row_;
  verify_at_ = 0;
}

bool ModelRunner::sample_next(SampledToken* out) {
  const int64_t V = model_.vocab_size;
  // 3. A token for every generate row that reached the end of its sequence, and the accepted
  // ones of every verify row.
  while (next_row_ < rows_.size()) {
    const size_t i = next_row_;
    const SeqChunk& c = chunks_[i];
    Sequence& r = *rows_[i].seq;
    const bool verify = rows_[i].kind == StepKind::kVerify;  // sample_verify moves on by itself
    if (!verify) {
      ++next_row_;
      if (c.rows == LogitRows::kNone) continue;
      if (rows_[i].kind == StepKind::kPool) {  // kept by forward(): no token
        next_logit_row_ += 1;
        continue;
      }
      if (c.rows == LogitRows::kAll) {  // prefill-only: the prompt's rows, no token
        std::copy_n(logits_.data() + next_logit_row_ * V, c.n * V, r.prompt_logits + c.first * V);
        next_logit_row_ += static_cast<size_t>(c.n);
        continue;
      }
    }
    SampledToken& s = *out;
    s.request_id = rows_[i].request_id;
    s.accepted = false;
    s.num_top = 0;
    s.logprob = 0;
    s.rank = 0;
    if (verify) {
      sample_verify(i, out);
    } else {
      const size_t last = next_logit_row_++;  // the row sampled from
      float* logits_row = logits_.data() + last * V;
      if (on_device_[i]) {  // picked on the device: its argmax, or its draw
        s.token = r.sampler->plain_greedy() ? argmax_host_.as<int32_t>()[last]
                                            : drawn_host_.as<int32_t>()[next_draw_++];
        r.sampler->record(s.token);
      } else {
        if (r.logprobs >= 0) std::copy(logits_row, logits_row + V, raw_row_.begin());
        s.token = r.sampler->sample(logits_row);
      }
    }
    if (r.logprobs >= 0) {
      Sampler::logprobs(raw_row_.data(), V, s.token, r.logprobs, model_.isa, &s.logprob, &s.rank,
                        s.top.data(), &s.num_top);
    }
    return true;
  }
  if (logits_.size() > normal_logit_rows_ * static_cast<size_t>(V)) {  // the step's extra room
    logits_.resize(normal_logit_rows_ * static_cast<size_t>(V));
    logits_.shrink_to_fit();
  }
  rows_ = {};
  return false;
}

Result<int64_t> ModelRunner::encode(VisionEncoder::Job& job, double budget_ms) {
  if (model_.vision == nullptr) return invalid_argument("this model has no vision tower");
  VisionEncoder& encoder = *model_.vision;
  int64_t units = 0;
  if (budget_ms <= 0) {
    for (; !job.done(); ++units) VLM_RETURN_IF_ERROR(encoder.advance(&job, 0));
    return units;
  }
  using Clock = std::chrono::steady_clock;
  const auto ns_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::nano>(Clock::now() - t).count();
  };
  const double budget_ns = budget_ms * 1e6;
  const auto t0 = Clock::now();
  const bool device = be_.device() != ops::Device::kCpu;  // time a unit once it has run
  while (!job.done()) {
    double& rate = encode_ns_per_flop_[static_cast<size_t>(job.stage_kind())];
    int64_t rows = 1;  // one grain until this kind of unit has been timed
    if (rate > 0) {
      const double per_row =
          encoder.next_unit_flops(job, 1) / static_cast<double>(encoder.next_unit_rows(job, 1));
      rows = std::max<int64_t>(1, static_cast<int64_t>(budget_ns / 4 / (rate * per_row)));
    }
    const double flops = encoder.next_unit_flops(job, rows);
    if (units > 0 && ns_since(t0) + rate * flops > budget_ns) break;
    const auto u0 = Clock::now();
    VLM_RETURN_IF_ERROR(encoder.advance(&job, rows));
    if (device) VLM_RETURN_IF_ERROR(be_.synchronize());
    const double measured = ns_since(u0) / std::max(flops, 1.0);
    rate = rate > 0 ? 0.7 * rate + 0.3 * measured : measured;
    ++units;
  }
  return units;
}

}  // namespace vlm

#include "engine/mtp_proposer.h"

#include <algorithm>
#include <string>

namespace vlm {

MtpProposer::MtpProposer(TextDecoder& dec, int32_t num_blocks, int64_t spare)
    : dec_(dec), num_blocks_(num_blocks), spare_(spare) {}

Result<std::unique_ptr<MtpProposer>> MtpProposer::create(TextDecoder& dec, const SpecOptions& spec,
                                                         const KvCacheSpec& cache_spec,
                                                         int32_t num_blocks,
                                                         int64_t max_blocks_per_seq,
                                                         int64_t max_num_seqs) {
  VLM_RETURN_IF_ERROR(check_spec_tokens(spec));
  if (!dec.has_mtp()) return invalid_argument("--spec mtp needs the model's MTP head");
  if (max_num_seqs > dec.max_chunk()) {
    return invalid_argument("the MTP head's pass (" + std::to_string(dec.max_chunk()) +
                            " tokens) is smaller than max_num_seqs (" +
                            std::to_string(max_num_seqs) + ")");
  }
  const int64_t spare = spare_blocks(spec.num_tokens, cache_spec.block_size);
  std::unique_ptr<MtpProposer> p(new MtpProposer(dec, num_blocks, spare));
  VLM_RETURN_IF_ERROR(
      dec.allocate_mtp_cache(&p->cache_, cache_spec, num_blocks + max_num_seqs * spare,
                             max_blocks_per_seq + spare)
          .with_context("the MTP head's KV cache (" + std::to_string(num_blocks) + " blocks and " +
                        std::to_string(max_num_seqs * spare) + " spare)"));
  const auto n = static_cast<size_t>(max_num_seqs);
  p->chunks_.reserve(n);
  p->chunk_id_.reserve(n);
  p->hidden_rows_.resize(static_cast<size_t>(dec.max_chunk()));
  p->fed_ids_.resize(n);
  p->fed_pos_.resize(n);
  p->logits_.resize(n * static_cast<size_t>(dec.vocab_size()));
  p->ids_.resize(n);
  p->vision_.resize(n);
  p->tables_.resize(n);
  for (auto& t : p->tables_) t.reserve(static_cast<size_t>(max_blocks_per_seq + spare));
  p->out_row_.resize(n);
  p->first_.reserve(n);
  return p;
}

Status MtpProposer::run_pass(bool chain) {
  Pass pass;
  VLM_RETURN_IF_ERROR(
      dec_.prepare(chunks_.data(), static_cast<int64_t>(chunks_.size()), cache_, Padding{}, &pass));
  const ops::Buf logits{logits_.data(), ops::Device::kCpu, DType::kF32};
  VLM_RETURN_IF_ERROR(dec_.run_mtp(pass, cache_, chain, logits));
  VLM_RETURN_IF_ERROR(dec_.backend().synchronize());
  const auto V = static_cast<size_t>(dec_.vocab_size());
  for (int64_t r = 0; r < pass.n_sel; ++r) {
    const float* row = logits_.data() + static_cast<size_t>(r) * V;
    ids_[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
  }
  return ok_status();
}

Status MtpProposer::observe(std::span<const StepRow> rows) {
  first_.clear();
  chunks_.clear();
  chunk_id_.clear();
  int64_t off = 0, used = 0;  // the row's first hidden state; MTP rows so far
  for (const StepRow& row : rows) {
    const Sequence& q = *row.seq;
    const int64_t f = row.first_token;
    // Positions whose next token is known: a verify row's accepted ones, the end of a prompt
    // chunk once the next chunk's first token or the sampled token follows it.
    const int64_t m = std::min(row.num_tokens, q.len() - 1 - f);
    if (m > 0) {
      SeqChunk c;
      c.ids = q.ids.data() + f + 1;
      c.n = m;
      c.first = f;
      c.pos = Positions3{q.pos_t.data() + f, q.pos_h.data() + f, q.pos_w.data() + f};
      c.block_table = row.block_table->data();
      c.num_table_blocks = static_cast<int64_t>(row.block_table->size());
      for (int64_t i = 0; i < m; ++i) {
        hidden_rows_[static_cast<size_t>(used + i)] = static_cast<int32_t>(off + i);
      }
      c.hidden_rows = hidden_rows_.data() + used;
      if (q.prompt.vision_tokens > 0 && f + 1 < q.prompt_len()) {  // next tokens' image rows
        VisionRows& v = vision_[chunks_.size()];
        v.feature_row = q.feature_row.data() + f + 1;
        v.embeds = q.prompt.embeds.data();
        c.vision = &v;
      }
      const bool first =
          f + m == q.len() - 1 && row.kind != StepKind::kPrefillOnly && row.kind != StepKind::kPool;
      c.rows = first ? LogitRows::kLast : LogitRows::kNone;
      chunks_.push_back(c);
      chunk_id_.push_back(first ? row.request_id : -1);
      used += m;
    }
    off += row.num_tokens;
  }
  if (chunks_.empty()) return ok_status();
  VLM_RETURN_IF_ERROR(run_pass(false));
  int32_t r = 0;
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunk_id_[c] < 0) continue;
    const int64_t len = chunks_[c].first + chunks_[c].n + 1;
    first_.push_back(First{chunk_id_[c], len, ids_[static_cast<size_t>(r)], r});
    ++r;
  }
  return ok_status();
}

void MtpProposer::forget(int64_t id) {
  std::erase_if(first_, [&](const First& f) { return f.request_id == id; });
}

int32_t MtpProposer::propose(const ProposeInput& in, int32_t max_k, int32_t* out) {
  ProposeJob job{in, max_k, out, 0};
  if (!propose_batch(std::span<ProposeJob>(&job, 1)).ok()) return 0;
  return job.k;
}

Status MtpProposer::propose_batch(std::span<ProposeJob> jobs) {
  // The first proposals observe() made (for the sequences as they are now), and each chaining
  // request's table: the target's, then its spare blocks.
  bool chain = false;
  for (size_t i = 0; i < jobs.size(); ++i) {
    ProposeJob& j = jobs[i];
    j.k = 0;
    auto it = std::find_if(first_.begin(), first_.end(),
                           [&](const First& f) { return f.request_id == j.in.request_id; });
    if (j.max_k < 1 || it == first_.end() || it->len != static_cast<int64_t>(j.in.ids.size())) {
      continue;
    }
    j.out[j.k++] = it->id;
    out_row_[i] = it->out_row;
    if (j.max_k == 1 || j.in.block_table == nullptr) continue;
    chain = true;
    std::vector<int32_t>& t = tables_[i];
    t.assign(j.in.block_table->begin(), j.in.block_table->end());
    for (int64_t s = 0; s < spare_; ++s) {
      t.push_back(static_cast<int32_t>(num_blocks_ + static_cast<int64_t>(i) * spare_ + s));
    }
  }
  first_.clear();  // used: the next step's come from its own pass
  // One pass per further position: the last proposal and the MTP's output for it, at the
  // position after (the row's K/V past the sequence, where the next step's pass rewrites it).
  for (int32_t depth = 1; chain; ++depth) {
    chunks_.clear();
    chunk_id_.clear();
    for (size_t i = 0; i < jobs.size(); ++i) {
      ProposeJob& j = jobs[i];
      if (j.k != depth || j.k >= j.max_k || j.in.block_table == nullptr) continue;
      const int64_t len = static_cast<int64_t>(j.in.ids.size());
      const size_t slot = chunks_.size();
      fed_ids_[slot] = j.out[depth - 1];
      fed_pos_[slot] = j.in.pos.t[len - 1] + depth - 1;
      hidden_rows_[slot] = out_row_[i];
      SeqChunk c;
      c.ids = &fed_ids_[slot];
      c.n = 1;
      c.first = len - 2 + depth;
      c.pos = Positions3{&fed_pos_[slot], &fed_pos_[slot], &fed_pos_[slot]};
      c.block_table = tables_[i].data();
      c.num_table_blocks = static_cast<int64_t>(tables_[i].size());
      c.hidden_rows = &hidden_rows_[slot];
      c.rows = LogitRows::kLast;
      chunks_.push_back(c);
      chunk_id_.push_back(static_cast<int64_t>(i));
    }
    if (chunks_.empty()) break;
    VLM_RETURN_IF_ERROR(run_pass(true));
    for (size_t c = 0; c < chunks_.size(); ++c) {
      ProposeJob& j = jobs[static_cast<size_t>(chunk_id_[c])];
      j.out[j.k++] = ids_[c];
      out_row_[static_cast<size_t>(chunk_id_[c])] = static_cast<int32_t>(c);
    }
  }
  return ok_status();
}

}  // namespace vlm

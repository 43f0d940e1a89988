// The public benchmark helpers (vlm/bench.h): memory bandwidth and batched decode.
#include "vlm/bench.h"

#include <algorithm>
#include <mutex>

#include "core/clock.h"
#include "core/membw.h"
#include "core/thread_pool.h"
#include "engine/engine_core.h"

namespace vlm {

namespace {

struct TokenMark {
  int64_t step = 0;  // CoreEvent::step
  Clock::time_point at;
};

// What the engine thread reports for one round, read by the caller after wait_idle().
struct RoundLog {
  std::mutex mu;
  std::vector<std::vector<TokenMark>> marks;  // [request][token]
  Status error;
};

Result<BatchedDecodeRound> run_round(EngineCore& core, const Engine& engine,
                                     const BatchedDecodeOptions& o, int64_t gen_tokens) {
  RoundLog log;
  log.marks.resize(static_cast<size_t>(o.batch));
  for (auto& m : log.marks) m.reserve(static_cast<size_t>(gen_tokens + 1));
  std::vector<GenerateRequest> reqs(static_cast<size_t>(o.batch));
  for (int i = 0; i < o.batch; ++i) {
    GenerateRequest& r = reqs[static_cast<size_t>(i)];
    r.prompt_ids = synthetic_prompt_ids(o.prompt_tokens, engine.vocab_size(), i);
    r.max_new_tokens = gen_tokens + 1;
    r.ignore_eos = true;
    r.sampling.do_sample = false;
  }
  const auto start = Clock::now();
  for (int i = 0; i < o.batch; ++i) {
    auto id = core.submit(std::move(reqs[static_cast<size_t>(i)]), [&log, i](const CoreEvent& ev) {
      const auto now = Clock::now();
      std::lock_guard<std::mutex> lock(log.mu);
      if (ev.token_id >= 0) log.marks[static_cast<size_t>(i)].push_back({ev.step, now});
      if (ev.finished && !ev.error.ok() && log.error.ok()) log.error = ev.error;
    });
    if (!id.ok()) {
      core.wait_idle();  // the requests already queued finish before `log` goes away
      return id.status().with_context("request " + std::to_string(i + 1));
    }
  }
  core.wait_idle();
  std::lock_guard<std::mutex> lock(log.mu);
  if (!log.error.ok()) return log.error;
  int64_t open_step = 0;
  for (size_t i = 0; i < log.marks.size(); ++i) {
    const auto& m = log.marks[i];
    if (static_cast<int64_t>(m.size()) != gen_tokens + 1) {
      return internal_error("request " + std::to_string(i + 1) + " produced " +
                            std::to_string(m.size()) + " tokens, not " +
                            std::to_string(gen_tokens + 1));
    }
    open_step = std::max(open_step, m.front().step);
  }
  Clock::time_point open = start, close = start;
  BatchedDecodeRound round;
  for (const auto& m : log.marks) {
    for (const TokenMark& t : m) {
      if (t.step <= open_step) open = std::max(open, t.at);
      if (t.step > open_step) ++round.tokens;
      close = std::max(close, t.at);
    }
  }
  round.first_tokens_ms = ms_between(start, open);
  round.decode_ms = ms_between(open, close);
  return round;
}

}  // namespace

std::vector<int32_t> synthetic_prompt_ids(int64_t n, int64_t vocab, int64_t salt) {
  const int64_t span = std::max<int64_t>(1, std::min<int64_t>(vocab, 150000) - 35);
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(3 + (i * 7919 + salt * 104729 + 13) % span);
  }
  return ids;
}

int64_t last_level_cache_bytes() { return l3_cache_bytes(); }

int64_t default_membw_bytes() {
  const int64_t l3 = l3_cache_bytes();
  return l3 > 0 ? std::max<int64_t>(4 * l3, int64_t{256} << 20) : int64_t{2} << 30;
}

Result<MemoryBandwidth> measure_memory_bandwidth(const MemoryBandwidthOptions& o) {
  ThreadPool pool(o.n_threads);
  const int64_t bytes = o.bytes > 0 ? o.bytes : default_membw_bytes();
  VLM_ASSIGN_OR_RETURN(MembwSamples s, measure_membw(bytes, o.reps, pool));
  MemoryBandwidth out;
  out.bytes = s.bytes;
  out.n_threads = pool.n_threads();
  out.read_gb_s = std::move(s.read_gb_s);
  out.copy_gb_s = std::move(s.copy_gb_s);
  return out;
}

Result<std::vector<BatchedDecodeRound>> bench_batched_decode(Engine& engine,
                                                             const BatchedDecodeOptions& o) {
  if (o.batch < 1 || o.prompt_tokens < 1 || o.gen_tokens < 1 || o.reps < 1) {
    return invalid_argument("batched decode needs batch, prompt tokens, generated tokens and "
                            "repetitions >= 1");
  }
  BatchingOptions bo;
  bo.block_size = 16;
  // Every sequence's whole length, plus a block: the round never preempts.
  const int64_t per_seq = (o.prompt_tokens + o.gen_tokens + 1 + bo.block_size - 1) / bo.block_size;
  bo.num_blocks = static_cast<int32_t>(o.batch * (per_seq + 1));
  bo.max_num_seqs = o.batch;
  bo.max_batched_tokens = o.max_batched_tokens;
  bo.max_waiting = o.batch;
  bo.vision_cache_mib = 0;
  // The idle engine starts once all `batch` requests are queued (they are queued in well under a
  // millisecond; should one be late, the round is still measured right, from the window).
  bo.batch_wait_ms = 1000;
  VLM_ASSIGN_OR_RETURN(std::unique_ptr<EngineCore> core, EngineCore::create(engine, bo));
  if (o.warmup) VLM_RETURN_IF_ERROR(run_round(*core, engine, o, 1).status());
  std::vector<BatchedDecodeRound> rounds;
  for (int r = 0; r < o.reps; ++r) {
    VLM_ASSIGN_OR_RETURN(BatchedDecodeRound round, run_round(*core, engine, o, o.gen_tokens));
    rounds.push_back(round);
  }
  return rounds;
}

}  // namespace vlm

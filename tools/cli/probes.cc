#include "probes.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>

namespace vlm_cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kLine = 64;    // bytes per cache line (one read-loop iteration)
constexpr int64_t kPage = 4096;  // allocation granule; slices are whole pages

// Two u64 lanes: a 16-byte vector add on every ISA the build targets (SSE2 is x86-64's
// baseline, NEON AArch64's), so the read loop reaches the memory roof without a per-ISA build.
typedef uint64_t U64x2 __attribute__((vector_size(16)));

// Sum of the 64-bit words of `n` lines from `p`; four accumulators so the adds never wait on
// each other (the loads, not the adds, must be the bottleneck).
uint64_t sum_lines(const uint8_t* p, int64_t n) {
  U64x2 a = {0, 0}, b = a, c = a, d = a;
  for (int64_t i = 0; i < n; ++i, p += kLine) {
    U64x2 x0, x1, x2, x3;
    std::memcpy(&x0, p, 16);
    std::memcpy(&x1, p + 16, 16);
    std::memcpy(&x2, p + 32, 16);
    std::memcpy(&x3, p + 48, 16);
    a += x0;
    b += x1;
    c += x2;
    d += x3;
  }
  const U64x2 s = (a + b) + (c + d);
  return s[0] + s[1];
}

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs fn(first_line, end_line, thread) on `threads` threads, each over one contiguous run of
// whole pages.
template <typename F>
void on_slices(int64_t lines, int threads, const F& fn) {
  const int64_t pages = lines * kLine / kPage;
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    const int64_t b = pages * t / threads * (kPage / kLine);
    const int64_t e = pages * (t + 1) / threads * (kPage / kLine);
    pool.emplace_back([&fn, b, e, t] { fn(b, e, t); });
  }
  for (auto& th : pool) th.join();
}

}  // namespace

int64_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

std::vector<int32_t> synthetic_prompt_ids(int64_t n, int64_t vocab, int64_t salt) {
  const int64_t span = std::max<int64_t>(1, std::min<int64_t>(vocab, 150000) - 35);
  std::vector<int32_t> ids(static_cast<size_t>(std::max<int64_t>(n, 0)));
  for (int64_t i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(3 + (i * 7919 + salt * 104729 + 13) % span);
  }
  return ids;
}

int64_t last_level_cache_bytes() {
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string s;
  if (!(f >> s) || s.empty()) return 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (v <= 0) return 0;
  switch (*end) {  // sysfs writes "266240K"; accept the other suffixes too
    case '\0':
      return v;
    case 'K':
      return v << 10;
    case 'M':
      return v << 20;
    case 'G':
      return v << 30;
    default:
      return 0;
  }
}

int64_t default_membw_bytes() {
  const int64_t l3 = last_level_cache_bytes();
  return l3 > 0 ? std::max<int64_t>(4 * l3, int64_t{256} << 20) : int64_t{2} << 30;
}

vlm::Result<MemoryBandwidth> measure_memory_bandwidth(const MemoryBandwidthOptions& o) {
  const int64_t bytes = o.bytes > 0 ? o.bytes : default_membw_bytes();
  if (o.reps < 1) return vlm::invalid_argument("the bandwidth probe needs at least one pass");
  const int threads =
      o.n_threads > 0 ? o.n_threads : std::max(1u, std::thread::hardware_concurrency());
  const int64_t size = (bytes + kPage - 1) / kPage * kPage;
  const int64_t lines = size / kLine;
  Buffer src(static_cast<uint8_t*>(std::aligned_alloc(kPage, static_cast<size_t>(size))));
  Buffer dst(static_cast<uint8_t*>(std::aligned_alloc(kPage, static_cast<size_t>(size))));
  if (src == nullptr || dst == nullptr) {
    return vlm::unavailable("cannot allocate 2 × " + std::to_string(size >> 20) +
                            " MiB for the bandwidth probe (use a smaller size)");
  }
  uint8_t* s = src.get();
  uint8_t* d = dst.get();
  // First touch (the page faults) before any timed pass, slice by slice as the passes take them.
  on_slices(lines, threads, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) std::memset(s + i * kLine, static_cast<int>(i & 0xff), kLine);
    std::memset(d + b * kLine, 0, static_cast<size_t>((e - b) * kLine));
  });

  std::vector<uint64_t> partial(static_cast<size_t>(threads), 0);
  auto read_pass = [&] {
    on_slices(lines, threads, [&](int64_t b, int64_t e, int t) {
      partial[static_cast<size_t>(t)] += sum_lines(s + b * kLine, e - b);
    });
  };
  auto copy_pass = [&] {
    on_slices(lines, threads, [&](int64_t b, int64_t e, int) {
      std::memcpy(d + b * kLine, s + b * kLine, static_cast<size_t>((e - b) * kLine));
    });
  };

  MemoryBandwidth out;
  out.bytes = size;
  out.n_threads = threads;
  read_pass();  // untimed: page tables, TLBs and the threads warm
  copy_pass();
  for (int r = 0; r < o.reps; ++r) {
    auto t0 = Clock::now();
    read_pass();
    out.read_gb_s.push_back(static_cast<double>(size) / seconds_since(t0) / 1e9);
    t0 = Clock::now();
    copy_pass();
    out.copy_gb_s.push_back(2.0 * static_cast<double>(size) / seconds_since(t0) / 1e9);
  }
  for (uint64_t p : partial) out.checksum += p;
  // Read back one copied byte so the copies are observable too.
  out.checksum += d[size / 2];
  return out;
}

namespace {

struct TokenMark {
  int64_t step = 0;
  int64_t sampled_ns = 0;
};

vlm::Result<BatchedDecodeRound> run_round(vlm::Engine& engine, const BatchedDecodeOptions& o,
                                          int64_t gen_tokens) {
  std::vector<std::unique_ptr<vlm::RequestStream>> streams;
  const int64_t start_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  for (int i = 0; i < o.batch; ++i) {
    vlm::GenerateRequest r;
    r.prompt_ids = o.prompt_ids.empty()
                       ? synthetic_prompt_ids(o.prompt_tokens, engine.vocab_size(), i)
                       : o.prompt_ids;
    r.max_new_tokens = gen_tokens + 1;
    r.ignore_eos = true;
    r.sampling.do_sample = false;
    auto s = engine.submit(std::move(r));
    if (!s.ok()) return s.status().with_context("request " + std::to_string(i + 1));
    streams.push_back(std::move(s).value());
  }
  std::vector<std::vector<TokenMark>> marks(streams.size());
  for (size_t i = 0; i < streams.size(); ++i) {
    vlm::RequestOutput out;
    while (streams[i]->next(&out)) {
      if (!out.error.ok()) return out.error;
      if (out.token_id >= 0) marks[i].push_back({out.step, out.sampled_ns});
    }
  }
  int64_t open_step = 0;
  for (size_t i = 0; i < marks.size(); ++i) {
    if (static_cast<int64_t>(marks[i].size()) != gen_tokens + 1) {
      return vlm::internal_error("request " + std::to_string(i + 1) + " produced " +
                                 std::to_string(marks[i].size()) + " tokens, not " +
                                 std::to_string(gen_tokens + 1));
    }
    open_step = std::max(open_step, marks[i].front().step);
  }
  int64_t open = start_ns, close = start_ns;
  BatchedDecodeRound round;
  std::map<int64_t, int64_t> step_end;  // each step in the window: its last token's time
  for (const auto& m : marks) {
    for (const TokenMark& t : m) {
      if (t.step <= open_step) open = std::max(open, t.sampled_ns);
      if (t.step > open_step) {
        ++round.tokens;
        int64_t& end = step_end[t.step];
        end = std::max(end, t.sampled_ns);
      }
      close = std::max(close, t.sampled_ns);
    }
  }
  round.steps = static_cast<int64_t>(step_end.size());
  for (const auto& m : marks) {  // a verify step gives a request several tokens
    int64_t last = open_step;
    for (const TokenMark& t : m) {
      if (t.step > last) ++round.request_steps;
      last = std::max(last, t.step);
    }
  }
  int64_t before = open;
  for (const auto& [step, end] : step_end) {
    round.step_ms.push_back(static_cast<double>(end - before) / 1e6);
    before = end;
  }
  round.first_tokens_ms = (open - start_ns) / 1e6;
  round.decode_ms = (close - open) / 1e6;
  return round;
}

}  // namespace

vlm::Result<std::vector<BatchedDecodeRound>> bench_batched_decode(vlm::Engine& engine,
                                                                  const BatchedDecodeOptions& o) {
  if (o.batch < 1 || o.prompt_tokens < 1 || o.gen_tokens < 1 || o.reps < 1) {
    return vlm::invalid_argument(
        "batched decode needs batch, prompt tokens, generated tokens and "
        "repetitions >= 1");
  }
  if (o.warmup) VLM_RETURN_IF_ERROR(run_round(engine, o, 1).status());
  std::vector<BatchedDecodeRound> rounds;
  for (int r = 0; r < o.reps; ++r) {
    VLM_ASSIGN_OR_RETURN(BatchedDecodeRound round, run_round(engine, o, o.gen_tokens));
    rounds.push_back(round);
  }
  return rounds;
}

}  // namespace vlm_cli

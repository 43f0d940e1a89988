#include "core/membw.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

namespace vlm {

namespace {

constexpr int64_t kLine = 64;             // bytes per cache line (one read-loop iteration)
constexpr int64_t kPage = 4096;           // allocation granule
constexpr int64_t kGrain = kPage / kLine;  // lines per parallel_for grain: slices are whole pages

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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int64_t l3_cache_bytes() {
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string s;
  if (!(f >> s) || s.empty()) return 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (v <= 0) return 0;
  switch (*end) {  // sysfs writes "266240K"; accept the other suffixes too
    case '\0': return v;
    case 'K': return v << 10;
    case 'M': return v << 20;
    case 'G': return v << 30;
    default: return 0;
  }
}

Result<MembwSamples> measure_membw(int64_t bytes, int reps, ThreadPool& pool) {
  if (bytes <= 0) return invalid_argument("the bandwidth probe needs a positive buffer size");
  if (reps < 1) return invalid_argument("the bandwidth probe needs at least one pass");
  const int64_t size = (bytes + kPage - 1) / kPage * kPage;
  const int64_t lines = size / kLine;
  Buffer src(static_cast<uint8_t*>(std::aligned_alloc(kPage, static_cast<size_t>(size))));
  Buffer dst(static_cast<uint8_t*>(std::aligned_alloc(kPage, static_cast<size_t>(size))));
  if (src == nullptr || dst == nullptr) {
    return Status(StatusCode::kUnavailable,
                  "cannot allocate 2 × " + std::to_string(size >> 20) +
                      " MiB for the bandwidth probe (use a smaller size)");
  }
  uint8_t* s = src.get();
  uint8_t* d = dst.get();
  // First touch (the page faults) before any timed pass.
  pool.parallel_for(lines, kGrain, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) std::memset(s + i * kLine, static_cast<int>(i & 0xff), kLine);
    std::memset(d + b * kLine, 0, static_cast<size_t>((e - b) * kLine));
  });

  std::vector<uint64_t> partial(static_cast<size_t>(pool.n_threads()), 0);
  auto read_pass = [&] {
    pool.parallel_for(lines, kGrain, [&](int64_t b, int64_t e, int t) {
      partial[static_cast<size_t>(t)] += sum_lines(s + b * kLine, e - b);
    });
  };
  auto copy_pass = [&] {
    pool.parallel_for(lines, kGrain, [&](int64_t b, int64_t e, int) {
      std::memcpy(d + b * kLine, s + b * kLine, static_cast<size_t>((e - b) * kLine));
    });
  };

  MembwSamples out;
  out.bytes = size;
  read_pass();  // untimed: page tables, TLBs and the threads warm
  copy_pass();
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    read_pass();
    out.read_gb_s.push_back(static_cast<double>(size) / seconds_since(t0) / 1e9);
    t0 = std::chrono::steady_clock::now();
    copy_pass();
    out.copy_gb_s.push_back(2.0 * static_cast<double>(size) / seconds_since(t0) / 1e9);
  }
  for (uint64_t p : partial) out.checksum += p;
  // Read back one copied byte so the copies are observable too.
  out.checksum += d[size / 2];
  return out;
}

}  // namespace vlm

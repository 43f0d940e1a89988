#include "ops/autotune.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/half.h"
#include "vlm/progress.h"

namespace vlm::ops {
namespace {

// What the cache is keyed by: the CPU's model name, the ISA levels it runs, AMX, and this build
// (the compile time of this file: a rebuild of the kernels measures again).
std::string cpu_key() {
  std::string model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) model = line.substr(colon + 2);
      break;
    }
  }
  std::string isas;
  for (Isa i : runnable_isas()) isas += std::string(isa_name(i)) + " ";
  return model + " | " + isas + (bf16_gemm_available(Bf16Gemm::kDotBf16) ? "dpbf16 " : "") +
         (amx_available() ? "amx " : "") + "| " + __DATE__ + " " + __TIME__;
}

// One line per result: "<key> | <shape> | <chosen> | <name>=<gflops> ...".
std::string cache_line(const std::string& key, const KernelChoice& c) {
  std::ostringstream o;
  o << key << " | " << c.shape << " | " << c.chosen << " |";
  for (const KernelCandidate& k : c.candidates) o << " " << k.name << "=" << k.gflops;
  return o.str();
}

bool parse_line(const std::string& line, const std::string& prefix, KernelChoice* c) {
  if (line.rfind(prefix, 0) != 0) return false;
  std::istringstream rest(line.substr(prefix.size()));
  std::string chosen, bar;
  if (!(rest >> chosen >> bar) || bar != "|") return false;
  c->chosen = chosen;
  c->candidates.clear();
  for (std::string item; rest >> item;) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return false;
    c->candidates.push_back({item.substr(0, eq), std::atof(item.c_str() + eq + 1)});
  }
  return !c->candidates.empty();
}

// Runs of run() per second: a warm-up, then repeats until about 0.1 s has passed and at least
// min_runs were timed (at most max_runs).
template <class F>
double runs_per_second(F&& run, int min_runs, int max_runs) {
  run();
  const auto t0 = std::chrono::steady_clock::now();
  int runs = 0;
  double s = 0;
  do {
    run();
    ++runs;
    s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while ((s < 0.1 || runs < min_runs) && runs < max_runs);
  return runs / s;
}

// Rounds of measurement: every candidate once per round, in turn, and its best round kept. One
// round measured in a row let a slow start choose a kernel 1.6x slower than the one passed over
// (on a 2-vCPU VM, f32 measured 129 GFLOP/s against 165 for dpbf16 at one load and 221 against
// 140 at the next).
constexpr int kRounds = 3;

// GFLOP/s of one GEMM candidate.
double measure(Bf16Gemm g, const std::vector<float>& x, const TensorView& w, int64_t M, int64_t K,
               std::vector<float>& y, ThreadPool& pool, Isa isa) {
  const TensorView* ws[] = {&w};
  float* ys[] = {y.data()};
  const double rate =
      runs_per_second([&] { matmul_multi(x.data(), M, K, ws, ys, pool, isa, 0, g); }, 1, 1000);
  return 2.0 * static_cast<double>(M) * static_cast<double>(K) * static_cast<double>(w.dim(0)) *
         rate / 1e9;
}

}  // namespace

std::string kernel_cache_dir() {
  if (const char* d = std::getenv("VLM_CACHE_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d != nullptr && *d != '\0') {
    return std::string(d) + "/vlm";
  }
  if (const char* d = std::getenv("HOME"); d != nullptr && *d != '\0') {
    return std::string(d) + "/.cache/vlm";
  }
  return "";
}

namespace {

// The cached result for c.shape, if any (c filled in, cached set); else the cache's other lines in
// *lines, for store() to keep.
bool lookup(const std::string& cache_dir, KernelChoice* c, std::vector<std::string>* lines) {
  if (cache_dir.empty()) return false;
  const std::string prefix = cpu_key() + " | " + c->shape + " | ";
  std::ifstream in(cache_dir + "/cpu-kernels.txt");
  for (std::string line; std::getline(in, line);) {
    if (parse_line(line, prefix, c)) {
      c->cached = true;
      return true;
    }
    lines->push_back(line);
  }
  return false;
}

// The cache's lines plus c's, written to a temporary file renamed over the cache (atomic); a
// cache that cannot be written is left as it was.
void store(const std::string& cache_dir, const std::vector<std::string>& lines,
           const KernelChoice& c) {
  if (cache_dir.empty()) return;
  const std::string file = cache_dir + "/cpu-kernels.txt";
  std::error_code ec;
  std::filesystem::create_directories(cache_dir, ec);
  const std::string tmp = file + ".tmp." + std::to_string(::getpid()) + "." +
                          std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  bool written = false;
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (const std::string& line : lines) out << line << "\n";
    out << cache_line(cpu_key(), c) << "\n";
    out.flush();
    written = out.good();
  }
  if (written) std::filesystem::rename(tmp, file, ec);
  if (!written || ec) std::filesystem::remove(tmp, ec);  // the old cache stays as it was
}

// The fastest of the exact candidates (exact[i] for candidate i; the first is one); a candidate
// that is not exact must beat that by `margin` (×).
void pick(KernelChoice* c, const std::vector<bool>& exact, double margin) {
  double best = 0;
  for (size_t i = 0; i < c->candidates.size(); ++i) {
    if (exact[i] && c->candidates[i].gflops > best) {
      best = c->candidates[i].gflops;
      c->chosen = c->candidates[i].name;
    }
  }
  best *= margin;
  for (size_t i = 0; i < c->candidates.size(); ++i) {
    if (!exact[i] && c->candidates[i].gflops > best) {
      best = c->candidates[i].gflops;
      c->chosen = c->candidates[i].name;
    }
  }
}

}  // namespace

Result<KernelChoice> choose_bf16_gemm(ThreadPool& pool, Isa isa, int64_t M, int64_t K, int64_t N,
                                      const std::string& cache_dir, const std::string& family) {
  if (M <= 0 || K <= 0 || N <= 0) return invalid_argument("choose_bf16_gemm: an empty shape");
  KernelChoice c;
  c.family = family;
  c.shape = family + " M=" + std::to_string(M) + " K=" + std::to_string(K) +
            " N=" + std::to_string(N) + " threads=" + std::to_string(pool.n_threads()) +
            " isa=" + isa_name(isa);
  std::vector<std::string> lines;
  if (lookup(cache_dir, &c, &lines)) return c;
  // Random data of the product's shape: the weights as BF16, x as f32.
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(M * K)), y(static_cast<size_t>(M * N));
  std::vector<uint16_t> wb(static_cast<size_t>(N * K));
  for (float& v : x) v = d(rng);
  for (uint16_t& v : wb) v = f32_to_bf16(d(rng));
  TensorView w;
  w.dtype = DType::kBF16;
  w.shape = {N, K};
  w.data = wb.data();
  std::vector<Bf16Gemm> gemms = {Bf16Gemm::kWidenF32};
  const TensorView* ws[] = {&w};
  for (Bf16Gemm g : {Bf16Gemm::kDotBf16, Bf16Gemm::kAmx}) {
    if (bf16_gemm_runs(g, M, K, ws)) gemms.push_back(g);
  }
  for (Bf16Gemm g : gemms) c.candidates.push_back({bf16_gemm_name(g), 0});
  ProgressStep step("measuring the " + family + " kernels",
                    kRounds * static_cast<int64_t>(gemms.size()), "runs");
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < gemms.size(); ++i) {
      c.candidates[i].gflops =
          std::max(c.candidates[i].gflops, measure(gemms[i], x, w, M, K, y, pool, isa));
      step.advance();
    }
  }
  step.finish();
  std::vector<bool> exact(c.candidates.size(), false);
  exact[0] = true;        // f32; the BF16 candidates round x
  pick(&c, exact, 1.05);  // exactness is worth 5%
  store(cache_dir, lines, c);
  return c;
}

Result<KernelChoice> choose_decode_kernel(ThreadPool& pool, Isa isa, DecodeFamily f,
                                          std::span<const TensorView* const> weights,
                                          bool exact_only, const std::string& cache_dir) {
  if (weights.empty()) return invalid_argument("choose_decode_kernel: no weights");
  // A prefix of the weights large enough to come from memory (or all of them): 512 MiB is 4× the
  // largest L3 one core reads from today (AMD's stacked-cache CCDs: 96–128 MiB).
  constexpr int64_t target = int64_t{512} << 20;
  for (const TensorView* w : weights) {
    if (!decode_family_takes(f, w->dtype) || w->rank() != 2) {
      return invalid_argument(std::string("choose_decode_kernel: ") + decode_family_name(f) +
                              " takes 2-D weights of its types, not a " +
                              std::to_string(w->rank()) + "-D " + dtype_name(w->dtype) + " one");
    }
  }
  std::vector<const TensorView*> sweep;
  int64_t bytes = 0, max_k = 0, max_n = 0;
  std::vector<std::string> shapes;  // distinct, in order
  for (const TensorView* w : weights) {
    if (bytes >= target) break;
    sweep.push_back(w);
    bytes += static_cast<int64_t>(w->nbytes() + w->quant_nbytes());
    max_k = std::max(max_k, w->dim(1));
    max_n = std::max(max_n, w->dim(0));
    const std::string s = std::to_string(w->dim(0)) + "x" + std::to_string(w->dim(1));
    if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
  }
  std::string shape_list;
  for (const std::string& s : shapes) shape_list += (shape_list.empty() ? "" : ",") + s;
  KernelChoice c;
  c.family = decode_family_name(f);
  c.shape = c.family + " weights=" + std::to_string(sweep.size()) +
            " bytes=" + std::to_string(bytes) + " shapes=" + shape_list +
            (exact_only ? " exact" : "") + " threads=" + std::to_string(pool.n_threads()) +
            " isa=" + isa_name(isa);
  std::vector<std::string> lines;
  if (lookup(cache_dir, &c, &lines)) return c;
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(max_k)), y(static_cast<size_t>(max_n));
  for (float& v : x) v = d(rng);
  const auto cands = decode_candidates(f);
  std::vector<bool> exact;
  std::vector<int> index;  // the candidates that run here
  for (int i = 0; i < static_cast<int>(cands.size()); ++i) {
    if (!decode_candidate_runs(f, i, isa) || (exact_only && !cands[i].exact)) continue;
    index.push_back(i);
    c.candidates.push_back({cands[i].name, 0});
    exact.push_back(cands[i].exact);
  }
  ProgressStep step("measuring the " + c.family + " kernels",
                    kRounds * static_cast<int64_t>(index.size()), "runs");
  for (int round = 0; round < kRounds; ++round) {
    for (size_t j = 0; j < index.size(); ++j) {
      DecodeKernels k;
      k.of(f) = index[j];
      const double sweeps = runs_per_second(
          [&] {
            for (const TensorView* w : sweep) {
              const TensorView* ws[] = {w};
              float* ys[] = {y.data()};
              matmul_multi(x.data(), 1, w->dim(1), ws, ys, pool, isa, 0, Bf16Gemm::kWidenF32, k);
            }
          },
          2, 10000);
      c.candidates[j].gflops =
          std::max(c.candidates[j].gflops, static_cast<double>(bytes) * sweeps / 1e9);
      step.advance();
    }
  }
  step.finish();
  pick(&c, exact, 1.05);
  store(cache_dir, lines, c);
  return c;
}

std::string describe(const KernelChoice& c) {
  std::string s = c.family + ":";
  char buf[96];
  const bool decode = c.family.find("_decode") != std::string::npos;
  for (size_t i = 0; i < c.candidates.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s %s %.1f %s", i == 0 ? "" : ",", c.candidates[i].name.c_str(),
                  c.candidates[i].gflops, decode ? "GB/s" : "GFLOP/s");
    s += buf;
  }
  return s + " -> " + c.chosen + " (" + (c.cached ? "cached; " : "measured; ") +
         c.shape.substr(c.shape.find(' ') + 1) + ")";
}

}  // namespace vlm::ops

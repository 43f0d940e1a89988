// open_prequant_store: a pre-quantized checkpoint's tensors turned into the layouts the loaders
// read (model/prequant.h says which and why).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <regex>

#include "core/half.h"
#include "model/prequant.h"

namespace vlm {
namespace {

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int b = 0; b < 256; ++b) a[static_cast<size_t>(b)] = e4m3_to_f32(static_cast<uint8_t>(b));
    return a;
  }();
  return t;
}

float float_at(const TensorView& v, int64_t i) {
  switch (v.dtype) {
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(v.data)[i]);
    default:
      return static_cast<const float*>(v.data)[i];
  }
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The companions of a quantized module's weight, by suffix (compressed-tensors, Qwen FP8; GPTQ
// and AWQ).
constexpr const char* kCompanions[] = {".weight_scale", ".weight_scale_inv", ".weight_zero_point",
                                       ".weight_shape", ".weight_g_idx",     ".weight_packed",
                                       ".qweight",      ".qzeros",           ".scales",
                                       ".g_idx"};

enum class Strategy { kTensor, kChannel, kGroup, kBlock };

Strategy strategy_of(const PrequantScheme& s) {
  if (s.strategy == "channel") return Strategy::kChannel;
  if (s.strategy == "group") return Strategy::kGroup;
  if (s.strategy == "block") return Strategy::kBlock;
  return Strategy::kTensor;
}

// How a module's integers are stored: compressed-tensors' rows ([N, K] int8, or packed along K
// in [N, K · bits / 32] words); GPTQ's columns (qweight [K · bits / 32, N], packed along K;
// scales [G, N]; qzeros [G, N · bits / 32], packed along N); AWQ's GEMM (qweight [K, N / 8],
// packed along N in the order kAwqNibble undoes; scales [G, N]; qzeros [G, N / 8] as qweight).
enum class Packing { kRows, kGptq, kAwq };

// AWQ's GEMM packing: column 8c + j of a word's 8 is the nibble at 4 · kAwqNibble[j].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// One quantized linear: its scheme and tensors.
struct Module {
  std::string name;  // the module's: "model.language_model.layers.0.self_attn.q_proj"
  const PrequantScheme* s = nullptr;
  Strategy strategy = Strategy::kTensor;
  Packing packing = Packing::kRows;
  TensorView w;            // weight (I8, F8_E4M3), weight_packed or qweight (I32)
  TensorView scale, zero;  // zero.data null: symmetric
  TensorView g_idx;  // each column's group ([K] I32: g_idx, weight_g_idx), data null: k / group
  uint32_t zero_add = 0;  // GPTQ v1: added to each qzeros word (the zero points stored minus one)
  // With activation-ordered groups in a fast layout: column j of the converted weight is column
  // perm[j] of the stored one (its groups contiguous); empty: the stored order.
  std::vector<int32_t> perm;
  bool uneven_groups = false;  // activation-ordered groups not all of the group size: f32 only
  int64_t N = 0, K = 0;
  std::string where;  // "<file>: tensor '<name>'"

  int64_t scale_cols() const { return scale.rank() == 2 ? scale.dim(1) : 1; }
  int offset() const { return 1 << (s->bits - 1); }
  // The scale group of column k.
  int64_t group(int64_t k) const {
    if (g_idx.data != nullptr) return static_cast<const int32_t*>(g_idx.data)[k];
    return strategy == Strategy::kGroup ? k / s->group_size : 0;
  }
  // The scale entry that (n, k) uses.
  int64_t scale_index(int64_t n, int64_t k) const {
    if (packing != Packing::kRows) return group(k) * N + n;  // [G, N]
    switch (strategy) {
      case Strategy::kTensor:
        return 0;
      case Strategy::kChannel:
        return n;
      case Strategy::kGroup:
        return n * scale_cols() + group(k);
      case Strategy::kBlock:
        break;
    }
    return (n / s->block_rows) * scale_cols() + k / s->block_cols;
  }
  float scale_at(int64_t n, int64_t k) const { return float_at(scale, scale_index(n, k)); }
  // The zero point of (n, k) (0 when symmetric) in row_ints' signed terms: the packed formats'
  // unsigned one (GPTQ v1's plus one) − 2^(bits − 1); compressed-tensors' I8 ones as stored.
  int zero_at(int64_t n, int64_t k) const {
    return zero.data == nullptr ? 0 : zero_of(n, group(k));
  }
  // Row n's zero point of group g (zero.data not null).
  int zero_of(int64_t n, int64_t g) const {
    const int64_t cols = zero.rank() == 2 ? zero.dim(1) : 1;
    const auto* words = static_cast<const uint32_t*>(zero.data);
    if (packing == Packing::kGptq) {
      const int per = static_cast<int>(32 / s->bits);
      const uint32_t word = words[g * cols + n / per] + zero_add;
      return static_cast<int>((word >> (s->bits * (n % per))) & ((1u << s->bits) - 1)) - offset();
    }
    if (packing == Packing::kAwq) {
      const uint32_t word = words[g * cols + n / 8];
      return static_cast<int>((word >> (4 * kAwqNibble[n % 8])) & 15u) - 8;
    }
    if (zero.dtype == DType::kI8) return static_cast<const int8_t*>(zero.data)[n * cols + g];
    const uint32_t word = words[(n / 8) * cols + g];
    return static_cast<int>((word >> (4 * (n % 8))) & 15u) - 8;
  }
  // The integer weights of row n, signed (packed: stored − 2^(bits − 1)).
  void row_ints(int64_t n, int8_t* q) const {
    const auto* words = static_cast<const uint32_t*>(w.data);
    const uint32_t mask = (1u << s->bits) - 1;
    if (packing == Packing::kGptq) {  // column n, K / per words down
      const int per = static_cast<int>(32 / s->bits);
      for (int64_t k = 0; k < K; ++k) {
        const uint32_t v = (words[(k / per) * N + n] >> (s->bits * (k % per))) & mask;
        q[k] = static_cast<int8_t>(static_cast<int>(v) - offset());
      }
      return;
    }
    if (packing == Packing::kAwq) {
      const int64_t cols = w.dim(1), shift = 4 * kAwqNibble[n % 8];
      for (int64_t k = 0; k < K; ++k) {
        q[k] = static_cast<int8_t>(static_cast<int>((words[k * cols + n / 8] >> shift) & 15u) - 8);
      }
      return;
    }
    if (s->format != "pack-quantized") {
      std::memcpy(q, static_cast<const int8_t*>(w.data) + n * K, static_cast<size_t>(K));
      return;
    }
    const int per = static_cast<int>(32 / s->bits);
    words += n * w.dim(1);
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t v = (words[k / per] >> (s->bits * (k % per))) & mask;
      q[k] = static_cast<int8_t>(static_cast<int>(v) - offset());
    }
  }
  // Row n's integers in the converted order (perm applied), tmp as scratch.
  void row_ints_ordered(int64_t n, int8_t* q, std::vector<int8_t>& tmp) const {
    if (perm.empty()) return row_ints(n, q);
    tmp.resize(static_cast<size_t>(K));
    row_ints(n, tmp.data());
    for (int64_t j = 0; j < K; ++j) q[j] = tmp[static_cast<size_t>(perm[static_cast<size_t>(j)])];
  }
  // The stored column of converted column j.
  int64_t column(int64_t j) const { return perm.empty() ? j : perm[static_cast<size_t>(j)]; }
  // Row n's values as the format defines them, in f32.
  void row_f32(int64_t n, float* out, std::vector<int8_t>& tmp) const {
    if (s->is_float) {
      const auto* b = static_cast<const uint8_t*>(w.data) + n * K;
      const auto& t = e4m3_table();
      for (int64_t k = 0; k < K; ++k) out[k] = t[b[k]] * scale_at(n, k);
      return;
    }
    tmp.resize(static_cast<size_t>(K));
    row_ints(n, tmp.data());
    for (int64_t k = 0; k < K; ++k) {
      out[k] = static_cast<float>(tmp[static_cast<size_t>(k)] - zero_at(n, k)) * scale_at(n, k);
    }
  }
};

// A fast-layout target.
enum class Target { kF32, kI4, kI8, kQ8_0 };

const char* target_name(Target t) {
  switch (t) {
    case Target::kI4:
      return "INT4";
    case Target::kI8:
      return "INT8";
    case Target::kQ8_0:
      return "Q8_0";
    case Target::kF32:
      break;
  }
  return "f32";
}

// Whether the text decoder multiplies `module` as a linear weight (not the vision tower's, a
// router's or the embedding's).
bool decoder_linear(const std::string& module) {
  return module.find("visual.") == std::string::npos && !ends_with(module, "mlp.gate") &&
         !ends_with(module, "shared_expert_gate") && !ends_with(module, "embed_tokens");
}

// The kI4 group for a 4-bit module: its group when 32, 64 or 128, else the largest of those that
// divides both its scale group (K for channel / tensor scales) and K; 0 when none does.
int64_t int4_group(const Module& m) {
  const int64_t g = m.strategy == Strategy::kGroup ? m.s->group_size : m.K;
  for (int64_t G : {int64_t{128}, int64_t{64}, int64_t{32}}) {
    if (g % G == 0 && m.K % G == 0) return G;
  }
  return 0;
}

Target fast_target(const Module& m) {
  if (!decoder_linear(m.name) || m.uneven_groups) return Target::kF32;
  if (m.s->is_float) {  // one scale per 32 values
    const bool fits = m.K % 32 == 0 &&
                      (m.strategy != Strategy::kBlock || m.s->block_cols % 32 == 0) &&
                      (m.strategy != Strategy::kGroup || m.s->group_size % 32 == 0);
    return fits ? Target::kQ8_0 : Target::kF32;
  }
  if (m.s->bits == 8) {  // symmetric: one scale per row (INT8) or per 32 values (Q8_0)
    if (m.zero.data != nullptr) return Target::kF32;
    if (m.strategy != Strategy::kGroup) return Target::kI8;
    return m.K % 32 == 0 && m.s->group_size % 32 == 0 ? Target::kQ8_0 : Target::kF32;
  }
  return int4_group(m) != 0 ? Target::kI4 : Target::kF32;
}

// What the conversion owns: the source (its mappings hold the tensors passed through) and the
// converted bytes.
struct Owned {
  explicit Owned(WeightStore s) : source(std::move(s)) {}
  WeightStore source;
  std::vector<std::vector<uint8_t>> buffers;
  uint8_t* add(size_t bytes) { return buffers.emplace_back(bytes).data(); }
};

struct Counts {
  std::atomic<int64_t> rounded_scales{0};  // INT4 / integer Q8_0 scales not exactly an f16
  std::atomic<int64_t> coarse_d{0};        // Q8_0 scales below f16's normal range
  std::atomic<int64_t> nan{0};             // NaN weights (FP8)
  std::atomic<int64_t> out_of_range{0};    // integers outside their bits' range
  int64_t zero8 = 0;                       // 8-bit decoder linears with zero points, as f32
  int64_t uneven = 0;                      // activation-ordered groups of uneven size, as f32
};

// A converted module's [N, K] matrix of `dtype` at `data`.
TensorView matrix_view(DType dtype, const Module& m, const void* data) {
  TensorView v;
  v.dtype = dtype;
  v.shape = {m.N, m.K};
  v.data = data;
  return v;
}

// The converted weight's column order, when it is not the stored one (TensorView::in_perm).
void attach_perm(const Module& m, Owned& o, TensorView* t) {
  if (m.perm.empty()) return;
  auto* p = reinterpret_cast<int32_t*>(o.add(m.perm.size() * 4));
  std::memcpy(p, m.perm.data(), m.perm.size() * 4);
  t->in_perm = p;
}

void rows(ThreadPool* pool, int64_t N, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr) return fn(0, N);
  pool->parallel_for(N, 8, [&](int64_t r0, int64_t r1, int) { fn(r0, r1); });
}

TensorView to_f32(const Module& m, Owned& o, ThreadPool* pool, Counts& c) {
  auto* out = reinterpret_cast<float*>(o.add(static_cast<size_t>(m.N * m.K) * 4));
  rows(pool, m.N, [&](int64_t r0, int64_t r1) {
    std::vector<int8_t> tmp;
    const int lo = -(1 << (m.s->bits - 1)), hi = (1 << (m.s->bits - 1)) - 1;
    int64_t nan = 0, outside = 0;
    for (int64_t n = r0; n < r1; ++n) {
      float* row = out + n * m.K;
      m.row_f32(n, row, tmp);
      for (int64_t k = 0; k < m.K; ++k) nan += std::isnan(row[k]);
      if (m.s->is_float) continue;  // (row_f32 left row n's integers in tmp)
      for (int8_t q : tmp) outside += q < lo || q > hi;
    }
    c.nan += nan;
    c.out_of_range += outside;
  });
  return matrix_view(DType::kF32, m, out);
}

TensorView to_i4(const Module& m, Owned& o, ThreadPool* pool, Counts& c) {
  const int64_t G = int4_group(m), groups = m.K / G;
  uint8_t* q = o.add(static_cast<size_t>(m.N * m.K / 2));
  auto* scale = reinterpret_cast<uint16_t*>(o.add(static_cast<size_t>(m.N * groups) * 2));
  auto* zero = m.zero.data != nullptr
                   ? reinterpret_cast<int8_t*>(o.add(static_cast<size_t>(m.N * groups)))
                   : nullptr;
  rows(pool, m.N, [&](int64_t r0, int64_t r1) {
    std::vector<int8_t> v(static_cast<size_t>(m.K)), tmp;
    int64_t rounded = 0, outside = 0;
    for (int64_t n = r0; n < r1; ++n) {
      m.row_ints_ordered(n, v.data(), tmp);
      for (int64_t k = 0; k < m.K; ++k) {
        outside += v[static_cast<size_t>(k)] < -8 || v[static_cast<size_t>(k)] > 7;
      }
      uint8_t* row = q + n * m.K / 2;
      for (int64_t b = 0; b < m.K / 32; ++b) {
        for (int j = 0; j < 16; ++j) {
          const auto lo = static_cast<uint8_t>(v[static_cast<size_t>(32 * b + j)] & 15);
          const auto hi = static_cast<uint8_t>(v[static_cast<size_t>(32 * b + 16 + j)] & 15);
          row[16 * b + j] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
      for (int64_t g = 0; g < groups; ++g) {
        const float s = m.scale_at(n, m.column(g * G));
        const uint16_t h = f32_to_f16(s);
        rounded += f16_to_f32(h) != s;
        scale[n * groups + g] = h;
        if (zero != nullptr) {
          zero[n * groups + g] = static_cast<int8_t>(m.zero_at(n, m.column(g * G)));
        }
      }
    }
    c.rounded_scales += rounded;
    c.out_of_range += outside;
  });
  TensorView t = matrix_view(DType::kI4, m, q);
  t.int4.scale = scale;
  t.int4.zero = zero;
  t.int4.group = G;
  attach_perm(m, o, &t);
  return t;
}

// Symmetric 8-bit integers with groups of a multiple of 32 → Q8_0: d the group's scale (rounded
// to f16 when it is not one), q as stored.
TensorView ints_to_q8_0(const Module& m, Owned& o, ThreadPool* pool, Counts& c) {
  const int64_t blocks = m.K / 32;
  uint8_t* out = o.add(static_cast<size_t>(m.N * blocks) * 34);
  rows(pool, m.N, [&](int64_t r0, int64_t r1) {
    std::vector<int8_t> v(static_cast<size_t>(m.K)), tmp;
    int64_t rounded = 0;
    for (int64_t n = r0; n < r1; ++n) {
      m.row_ints_ordered(n, v.data(), tmp);
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* blk = out + (n * blocks + b) * 34;
        const float s = m.scale_at(n, m.column(32 * b));
        const uint16_t h = f32_to_f16(s);
        rounded += f16_to_f32(h) != s;
        std::memcpy(blk, &h, 2);
        std::memcpy(blk + 2, v.data() + 32 * b, 32);
      }
    }
    c.rounded_scales += rounded;
  });
  TensorView t = matrix_view(DType::kQ8_0, m, out);
  attach_perm(m, o, &t);
  return t;
}

TensorView to_i8(const Module& m, Owned& o, ThreadPool* pool) {
  auto* q = reinterpret_cast<int8_t*>(o.add(static_cast<size_t>(m.N * m.K)));
  auto* scale = reinterpret_cast<float*>(o.add(static_cast<size_t>(m.N) * 4));
  rows(pool, m.N, [&](int64_t r0, int64_t r1) {
    for (int64_t n = r0; n < r1; ++n) {
      m.row_ints(n, q + n * m.K);
      scale[n] = m.scale_at(n, 0);
    }
  });
  TensorView t = matrix_view(DType::kI8, m, q);
  t.scale = scale;
  return t;
}

// FP8 → Q8_0 blocks of 32: d = s · 2^(E − 6) for the block's largest exponent E (in f16), q the
// nearest integer to w / d.
TensorView to_q8_0(const Module& m, Owned& o, ThreadPool* pool, Counts& c) {
  const int64_t blocks = m.K / 32;
  uint8_t* out = o.add(static_cast<size_t>(m.N * blocks) * 34);
  const auto& t = e4m3_table();
  rows(pool, m.N, [&](int64_t r0, int64_t r1) {
    int64_t nan = 0, coarse = 0;
    for (int64_t n = r0; n < r1; ++n) {
      const auto* src = static_cast<const uint8_t*>(m.w.data) + n * m.K;
      for (int64_t b = 0; b < blocks; ++b) {
        uint8_t* blk = out + (n * blocks + b) * 34;
        const float s = m.scale_at(n, 32 * b);
        float amax = 0;
        for (int j = 0; j < 32; ++j) {
          const float f = t[src[32 * b + j]];
          nan += std::isnan(f);
          amax = std::max(amax, std::isnan(f) ? 0.0f : std::fabs(f));
        }
        int e = 0;
        std::frexp(amax, &e);  // amax = m · 2^e, m in [0.5, 1): the largest exponent is e − 1
        const float want = std::ldexp(s, e - 7);
        const uint16_t dh = amax > 0 ? f32_to_f16(want) : 0;
        const float d = f16_to_f32(dh);
        coarse += amax > 0 && std::fabs(want) < 0x1p-14f;  // subnormal in f16: fewer bits, or 0
        std::memcpy(blk, &dh, 2);
        for (int j = 0; j < 32; ++j) {
          const float x = d != 0 ? t[src[32 * b + j]] * s / d : 0.0f;
          blk[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(
              std::isnan(x) ? 0.0f : std::clamp(std::nearbyint(x), -127.0f, 127.0f)));
        }
      }
    }
    c.nan += nan;
    c.coarse_d += coarse;
  });
  return matrix_view(DType::kQ8_0, m, out);
}

// Python's re.match (a match from the start of `name`), each pattern compiled once.
class Patterns {
 public:
  bool match(const std::string& pattern, const std::string& name) {
    auto it = compiled_.find(pattern);
    if (it == compiled_.end()) it = compiled_.emplace(pattern, std::regex(pattern)).first;
    std::smatch mr;
    return std::regex_search(name, mr, it->second, std::regex_constants::match_continuous);
  }

 private:
  std::map<std::string, std::regex> compiled_;
};

bool ignored(const PrequantConfig& c, const std::string& module, Patterns& re, std::string* entry) {
  for (const std::string& e : c.ignore) {
    // (Qwen's FP8 and AutoAWQ's modules_to_not_convert match by substring.)
    const bool substring = c.method == PrequantMethod::kFp8 || c.method == PrequantMethod::kAwq;
    const bool hit = substring                ? module.find(e) != std::string::npos
                     : e.rfind("re:", 0) == 0 ? re.match(e.substr(3), module)
                                              : module == e;
    if (hit) {
      *entry = e;
      return true;
    }
  }
  return false;
}

// GPTQ's `dynamic` rule for a module, as GPTQModel picks it: a "-:" one whose pattern matches from
// the name's start, else the first such of the others in the file's order; null: none. (config.json
// is read into an object whose keys are sorted, so that order is gone: two overrides that both
// match and disagree are refused instead. A "-:" rule wins over a matching override either way,
// as GPTQModel orders the "-:" ones first; the module's tensors then say it is quantized, and the
// load is refused naming the rule.)
Result<const PrequantRule*> gptq_rule(const PrequantConfig& c, const std::string& module,
                                      const std::string& where, Patterns& re) {
  const PrequantRule* found = nullptr;
  for (const PrequantRule& r : c.rules) {
    if (!re.match(r.pattern, module)) continue;
    if (r.skip) return &r;
    const PrequantScheme &a = c.groups[r.scheme], &b = c.groups[found ? found->scheme : r.scheme];
    if (a.bits != b.bits || a.strategy != b.strategy || a.group_size != b.group_size ||
        a.symmetric != b.symmetric || a.desc_act != b.desc_act) {
      return invalid_argument(where + ": the dynamic rules " + found->pattern + " and " +
                              r.pattern + " both match " + module + " and disagree");
    }
    if (found == nullptr) found = &r;
  }
  return found;
}

// The config group of a module, as compressed-tensors chooses it: a group whose re: target
// matches the name before one that targets every Linear; two of the same rank that both match
// are refused (which one applies would be a guess).
Result<const PrequantScheme*> scheme_for(const PrequantConfig& c, const std::string& module,
                                         const std::string& where, Patterns& re) {
  if (c.method == PrequantMethod::kGptq || c.method == PrequantMethod::kAwq) {
    VLM_ASSIGN_OR_RETURN(const PrequantRule* r, gptq_rule(c, module, where, re));
    if (r != nullptr && r->skip) {
      return invalid_argument(where + ": module " + module +
                              " is quantized, but the dynamic rule -:" + r->pattern +
                              " leaves it unquantized");
    }
    return &c.groups[r != nullptr ? r->scheme : 0];
  }
  std::vector<const PrequantScheme*> by_name, by_class;  // the groups of each rank that match
  for (const PrequantScheme& s : c.groups) {
    for (const std::string& t : s.targets) {
      const bool regex = t.rfind("re:", 0) == 0;
      if (regex && !re.match(t.substr(3), module)) continue;
      auto& rank = regex ? by_name : by_class;
      if (std::find(rank.begin(), rank.end(), &s) == rank.end()) rank.push_back(&s);
    }
  }
  const auto& chosen = by_name.empty() ? by_class : by_name;
  if (chosen.empty()) {
    return invalid_argument(where + ": quantized, but no config group targets " + module);
  }
  if (chosen.size() > 1) return invalid_argument(where + ": two config groups target " + module);
  return chosen[0];
}

// Every scale finite, and small enough that Q8_0's f16 d = s · 2^(E − 6) (E ≤ 8: e4m3's largest
// is 448) stays finite.
Status finite_scales(const Module& m, const std::string& what) {
  for (int64_t i = 0; i < m.scale.numel(); ++i) {
    const float v = float_at(m.scale, i);
    if (!std::isfinite(v) || std::fabs(v) > 8192.0f) {
      return invalid_argument(what + ": scale " + std::to_string(i) + " is " + std::to_string(v));
    }
  }
  return ok_status();
}

// The expected shape of a module's scale ([1] or [] for a tensor scale).
Status check_scale(const Module& m) {
  const PrequantScheme& s = *m.s;
  const std::string what = m.where + " scale " + shape_to_string(m.scale.shape);
  if (m.scale.dtype != DType::kF32 && m.scale.dtype != DType::kBF16 &&
      m.scale.dtype != DType::kF16) {
    return invalid_argument(what + ": expected F32, BF16 or F16 scales, got " +
                            dtype_name(m.scale.dtype));
  }
  std::vector<int64_t> want;
  if (s.strategy == "tensor") {
    if (m.scale.numel() == 1) return finite_scales(m, what);
    want = {1};
  } else if (s.strategy == "channel") {
    if (m.scale.numel() == m.N && m.scale.dim(0) == m.N) return finite_scales(m, what);
    want = {m.N, 1};
  } else if (s.strategy == "group") {
    want = {m.N, ceil_div(m.K, s.group_size)};
  } else {
    want = {ceil_div(m.N, s.block_rows), ceil_div(m.K, s.block_cols)};
  }
  if (m.scale.shape != want) {
    return invalid_argument(what + ": expected " + shape_to_string(want) + " for " + s.strategy +
                            " scales of a [" + std::to_string(m.N) + ", " + std::to_string(m.K) +
                            "] weight");
  }
  return finite_scales(m, what);
}

Status check_zero(const Module& m) {
  if (m.s->symmetric) {
    if (m.zero.data != nullptr) {
      return invalid_argument(m.where + ": has zero points, but its scheme is symmetric");
    }
    return ok_status();
  }
  if (m.zero.data == nullptr) {
    return invalid_argument(m.where + ": no weight_zero_point, but its scheme is asymmetric");
  }
  const int64_t cols = m.scale_cols();
  const std::vector<int64_t> want = m.zero.dtype == DType::kI32
                                        ? std::vector<int64_t>{ceil_div(m.N, 8), cols}
                                        : std::vector<int64_t>{m.N, cols};
  if ((m.zero.dtype != DType::kI32 && m.zero.dtype != DType::kI8) || m.zero.shape != want) {
    return invalid_argument(m.where + ": weight_zero_point " + dtype_name(m.zero.dtype) + " " +
                            shape_to_string(m.zero.shape) + ", expected I32 (packed) " +
                            shape_to_string({ceil_div(m.N, 8), cols}) + " or I8 " +
                            shape_to_string({m.N, cols}));
  }
  return ok_status();
}

// The [N, K] the module's tensors say, checked against its format.
Status read_shape(const WeightStore& st, const std::string& base, Module* m) {
  const PrequantScheme& s = *m->s;
  if (s.format == "pack-quantized") {
    VLM_ASSIGN_OR_RETURN(TensorView shp, st.get(base + ".weight_shape"));
    if ((shp.dtype != DType::kI32 && shp.dtype != DType::kI64) || shp.numel() != 2) {
      return invalid_argument(m->where + ": weight_shape must be 2 integers");
    }
    for (int i = 0; i < 2; ++i) {
      const int64_t d = shp.dtype == DType::kI32 ? static_cast<const int32_t*>(shp.data)[i]
                                                 : static_cast<const int64_t*>(shp.data)[i];
      (i == 0 ? m->N : m->K) = d;
    }
    const std::vector<int64_t> want = {m->N, ceil_div(m->K * s.bits, 32)};
    if (m->w.dtype != DType::kI32 || m->w.shape != want || m->N <= 0 || m->K <= 0) {
      return invalid_argument(m->where + ": " + dtype_name(m->w.dtype) + " " +
                              shape_to_string(m->w.shape) + ", expected I32 " +
                              shape_to_string(want) + " for weight_shape [" + std::to_string(m->N) +
                              ", " + std::to_string(m->K) + "]");
    }
    return ok_status();
  }
  const DType want = s.is_float ? DType::kF8E4M3 : DType::kI8;
  if (m->w.dtype != want || m->w.rank() != 2) {
    return invalid_argument(m->where + ": " + dtype_name(m->w.dtype) + " " +
                            shape_to_string(m->w.shape) + ", expected a 2-D " + dtype_name(want) +
                            " weight for " + s.format);
  }
  m->N = m->w.dim(0);
  m->K = m->w.dim(1);
  return ok_status();
}

// A GPTQ / AWQ tensor of `base`, of dtype `dt` and shape `want`.
Result<TensorView> packed_tensor(const WeightStore& st, const Module& m, const std::string& base,
                                 const char* suffix, std::initializer_list<DType> dts,
                                 const std::vector<int64_t>& want) {
  if (!st.has(base + suffix)) return invalid_argument(m.where + ": no " + base + suffix);
  VLM_ASSIGN_OR_RETURN(TensorView t, st.get(base + suffix));
  if (std::find(dts.begin(), dts.end(), t.dtype) == dts.end() || t.shape != want) {
    std::string types;
    for (DType d : dts) types.append(types.empty() ? "" : " or ").append(dtype_name(d));
    return invalid_argument(st.file_of(base + suffix) + ": tensor '" + base + suffix + "' " +
                            dtype_name(t.dtype) + " " + shape_to_string(t.shape) + ", expected " +
                            types + " " + shape_to_string(want) + " for a [" + std::to_string(m.N) +
                            ", " + std::to_string(m.K) + "] " + std::to_string(m.s->bits) +
                            "-bit weight");
  }
  return t;
}

// m's g_idx checked against its G groups, and when they are not k / group (activation order) the
// column order that makes them contiguous (Module::perm; Module::uneven_groups when no order
// does); a g_idx that is k / group dropped (no lookups).
Status read_g_idx(int64_t G, Module* m) {
  const auto* g = static_cast<const int32_t*>(m->g_idx.data);
  bool trivial = true;
  for (int64_t k = 0; k < m->K; ++k) {
    if (g[k] < 0 || g[k] >= G) {
      return invalid_argument(m->where + ": g_idx[" + std::to_string(k) +
                              "] = " + std::to_string(g[k]) + " is not one of its " +
                              std::to_string(G) + " groups");
    }
    trivial = trivial && g[k] == (m->strategy == Strategy::kGroup ? k / m->s->group_size : 0);
  }
  if (trivial) {
    m->g_idx = TensorView{};
    return ok_status();
  }
  m->perm.resize(static_cast<size_t>(m->K));
  for (int64_t k = 0; k < m->K; ++k) m->perm[static_cast<size_t>(k)] = static_cast<int32_t>(k);
  std::stable_sort(m->perm.begin(), m->perm.end(),
                   [&](int32_t a, int32_t b) { return g[a] < g[b]; });
  for (int64_t j = 0; j < m->K && !m->uneven_groups; ++j) {
    m->uneven_groups = g[m->perm[static_cast<size_t>(j)]] != j / m->s->group_size;
  }
  return ok_status();
}

// A GPTQ or AWQ module (`name`: its qweight), checked: shapes, groups, zero points (dropped when
// every one is 2^(bits − 1), so that the symmetric kernels run).
Status read_packed(const WeightStore& st, const PrequantConfig& c, const std::string& name,
                   const std::string& base, Module* m) {
  const bool gptq = c.method == PrequantMethod::kGptq;
  m->packing = gptq ? Packing::kGptq : Packing::kAwq;
  VLM_ASSIGN_OR_RETURN(m->w, st.get(name));
  const int64_t per = 32 / m->s->bits;
  if (m->w.dtype != DType::kI32 || m->w.rank() != 2 || m->w.dim(0) == 0 || m->w.dim(1) == 0) {
    return invalid_argument(m->where + ": " + dtype_name(m->w.dtype) + " " +
                            shape_to_string(m->w.shape) + ", expected 2-D I32 packed weights");
  }
  m->K = gptq ? m->w.dim(0) * per : m->w.dim(0);
  m->N = gptq ? m->w.dim(1) : m->w.dim(1) * per;
  if (m->N % per != 0) {  // (qzeros packs whole words of N)
    return invalid_argument(m->where + ": " + shape_to_string(m->w.shape) + " has " +
                            std::to_string(m->N) + " outputs, not a multiple of the " +
                            std::to_string(per) + " a zero point word packs");
  }
  const int64_t G = m->strategy == Strategy::kGroup ? ceil_div(m->K, m->s->group_size) : 1;
  VLM_ASSIGN_OR_RETURN(
      m->scale,
      packed_tensor(st, *m, base, ".scales", {DType::kF16, DType::kBF16, DType::kF32}, {G, m->N}));
  VLM_RETURN_IF_ERROR(finite_scales(*m, m->where + " scales"));
  VLM_ASSIGN_OR_RETURN(m->zero,
                       packed_tensor(st, *m, base, ".qzeros", {DType::kI32}, {G, m->N / per}));
  if (c.gptq_v1) m->zero_add = m->s->bits == 4 ? 0x11111111u : 0x01010101u;
  if (st.has(base + ".g_idx")) {
    if (!gptq) return invalid_argument(m->where + ": g_idx in an AWQ checkpoint");
    VLM_ASSIGN_OR_RETURN(m->g_idx, packed_tensor(st, *m, base, ".g_idx", {DType::kI32}, {m->K}));
    VLM_RETURN_IF_ERROR(read_g_idx(G, m));
  } else if (gptq && m->s->desc_act) {
    return invalid_argument(m->where + ": desc_act, but no " + base + ".g_idx");
  }
  bool all_offset = true;
  for (int64_t g = 0; g < G && all_offset; ++g) {
    for (int64_t n = 0; n < m->N && all_offset; ++n) all_offset = m->zero_of(n, g) == 0;
  }
  if (all_offset) m->zero = TensorView{};
  return ok_status();
}

// The quantized module whose weight is `name` (".weight", ".weight_packed" or ".qweight"), checked.
Result<Module> read_module(const WeightStore& st, const PrequantConfig& c, const std::string& name,
                           const std::string& base, Patterns& re) {
  Module m;
  m.name = base;
  m.where = st.file_of(name) + ": tensor '" + name + "'";
  std::string entry;
  if (ignored(c, base, re, &entry)) {
    return invalid_argument(m.where + ": module " + base + " is quantized, but the ignore list's " +
                            entry + " names it");
  }
  VLM_ASSIGN_OR_RETURN(m.s, scheme_for(c, base, m.where, re));
  m.strategy = strategy_of(*m.s);
  if (c.method == PrequantMethod::kGptq || c.method == PrequantMethod::kAwq) {
    VLM_RETURN_IF_ERROR(read_packed(st, c, name, base, &m));
    return m;
  }
  VLM_ASSIGN_OR_RETURN(m.w, st.get(name));
  if ((m.w.dtype == DType::kI32) != (m.s->format == "pack-quantized")) {
    return invalid_argument(m.where + ": " + dtype_name(m.w.dtype) + " weights do not match its " +
                            "config group's format " + m.s->format);
  }
  VLM_RETURN_IF_ERROR(read_shape(st, base, &m));
  const std::string sname =
      base + (c.method == PrequantMethod::kFp8 ? ".weight_scale_inv" : ".weight_scale");
  if (!st.has(sname)) return invalid_argument(m.where + ": no " + sname);
  VLM_ASSIGN_OR_RETURN(m.scale, st.get(sname));
  VLM_RETURN_IF_ERROR(check_scale(m));
  if (st.has(base + ".weight_zero_point")) {
    VLM_ASSIGN_OR_RETURN(m.zero, st.get(base + ".weight_zero_point"));
  }
  VLM_RETURN_IF_ERROR(check_zero(m));
  if (st.has(base + ".weight_g_idx")) {  // actorder group: column k's group weight_g_idx[k]
    if (m.strategy != Strategy::kGroup || m.s->is_float) {
      return invalid_argument(m.where + ": weight_g_idx, but its scheme is not integer groups");
    }
    VLM_ASSIGN_OR_RETURN(m.g_idx,
                         packed_tensor(st, m, base, ".weight_g_idx", {DType::kI32}, {m.K}));
    VLM_RETURN_IF_ERROR(read_g_idx(m.scale_cols(), &m));
  } else if (m.s->desc_act) {
    return invalid_argument(m.where + ": actorder group, but no " + base + ".weight_g_idx");
  }
  return m;
}

// The module a quantized weight tensor belongs to ("" when `name` is none).
std::string quantized_base(const WeightStore& st, const std::string& name) {
  if (ends_with(name, ".weight_packed")) return name.substr(0, name.size() - 14);
  if (ends_with(name, ".qweight")) return name.substr(0, name.size() - 8);
  if (!ends_with(name, ".weight")) return "";
  auto v = st.get(name);
  if (!v.ok() || (v->dtype != DType::kF8E4M3 && v->dtype != DType::kI8)) return "";
  return name.substr(0, name.size() - 7);
}

}  // namespace

Result<PrequantStore> open_prequant_store(WeightStore source, const PrequantConfig& cfg,
                                          PrequantLayout layout, ThreadPool* pool) {
  auto owned = std::make_shared<Owned>(std::move(source));
  const WeightStore& st = owned->source;
  std::map<std::string, TensorView> views;
  std::map<std::string, std::string> origin;
  std::map<std::string, bool> consumed;  // companions of the modules converted
  std::map<Target, int64_t> made;
  Counts counts;
  Patterns re;
  PrequantStore out{WeightStore::from_views("", {}, {}, nullptr), {}, 0};
  const std::vector<std::string> names = st.names();
  for (const std::string& name : names) {
    const std::string base = quantized_base(st, name);
    if (base.empty()) continue;
    if (views.count(base + ".weight") != 0 ||
        ((ends_with(name, "_packed") || ends_with(name, ".qweight")) && st.has(base + ".weight"))) {
      return invalid_argument(st.file_of(name) + ": tensor '" + name + "' and '" + base +
                              ".weight' both hold module " + base + "'s weight");
    }
    VLM_ASSIGN_OR_RETURN(Module m, read_module(st, cfg, name, base, re));
    const Target t = layout == PrequantLayout::kExact ? Target::kF32 : fast_target(m);
    if (t == Target::kF32) m.perm.clear();  // (f32 keeps the stored order)
    if (t == Target::kF32 && layout == PrequantLayout::kFast && decoder_linear(m.name)) {
      counts.uneven += m.uneven_groups;
      counts.zero8 += !m.uneven_groups && !m.s->is_float && m.s->bits == 8;
    }
    TensorView v;
    switch (t) {
      case Target::kI4:
        v = to_i4(m, *owned, pool, counts);
        break;
      case Target::kI8:
        v = to_i8(m, *owned, pool);
        break;
      case Target::kQ8_0:
        v = m.s->is_float ? to_q8_0(m, *owned, pool, counts)
                          : ints_to_q8_0(m, *owned, pool, counts);
        break;
      case Target::kF32:
        v = to_f32(m, *owned, pool, counts);
        break;
    }
    if (counts.nan.load() != 0) return invalid_argument(m.where + ": NaN weights");
    if (counts.out_of_range.load() != 0) {
      return invalid_argument(m.where + ": integers outside the range of " +
                              std::to_string(m.s->bits) + " bits");
    }
    made[t]++;
    views[base + ".weight"] = v;
    origin[base + ".weight"] = st.file_of(name);
    for (const char* c : kCompanions) consumed[base + c] = true;
    consumed[name] = true;
    st.release_pages(m.w);
    st.release_pages(m.scale);
  }
  for (const std::string& name : names) {
    if (consumed.count(name) != 0) continue;
    for (const char* c : kCompanions) {
      if (ends_with(name, c)) {
        return invalid_argument(st.file_of(name) + ": tensor '" + name +
                                "' has no quantized weight beside it");
      }
    }
    VLM_ASSIGN_OR_RETURN(views[name], st.get(name));
    origin[name] = st.file_of(name);
  }
  std::string summary = cfg.describe() + ":";
  out.quantized_modules = 0;
  for (const auto& [t, n] : made) {
    // (Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on the chained operator+.)
    summary.append(" ").append(std::to_string(n)).append(" matrices as ").append(target_name(t));
    summary += ",";
    out.quantized_modules += static_cast<uint64_t>(n);
  }
  summary.pop_back();
  if (layout == PrequantLayout::kFast && made.count(Target::kF32) != 0) {
    summary += " (f32: the vision tower's, a router's or a shape the fast layouts do not hold)";
  }
  out.notes.push_back(summary);
  if (counts.coarse_d.load() != 0) {
    out.notes.push_back(std::to_string(counts.coarse_d.load()) +
                        " Q8_0 blocks have a scale below f16's normal range (fewer bits, or 0)");
  }
  if (counts.zero8 != 0) {
    out.notes.push_back(std::to_string(counts.zero8) +
                        " 8-bit matrices with zero points are f32 (4 bytes a weight): neither "
                        "INT8 nor Q8_0 has zero points");
  }
  if (counts.uneven != 0) {
    out.notes.push_back(std::to_string(counts.uneven) +
                        " matrices are f32 (4 bytes a weight): their activation-ordered groups "
                        "are not all group_size columns");
  }
  if (counts.rounded_scales.load() != 0) {
    out.notes.push_back(std::to_string(counts.rounded_scales.load()) +
                        " INT4 / Q8_0 scales are not exactly an f16 and were rounded to one");
  }
  std::vector<const MappedFile*> maps;
  for (const SafetensorsFile& f : st.files()) maps.push_back(&f.mapping());
  out.store = WeightStore::from_views(st.dir(), std::move(views), std::move(origin),
                                      std::shared_ptr<const void>(owned), std::move(maps));
  return out;
}

}  // namespace vlm

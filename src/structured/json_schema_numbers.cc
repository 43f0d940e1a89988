// The JSON Schema compiler's numbers: integers in a range (exactly their canonical spellings)
// and decimals in a range (a subset that never leaves it), for json_schema.cc.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "structured/json_schema_compiler.h"

namespace vlm::structured::json_schema_internal {
namespace {

int num_digits(uint64_t x) {
  int n = 1;
  while (x >= 10) {
    x /= 10;
    ++n;
  }
  return n;
}

uint64_t pow10(int n) {
  uint64_t p = 1;
  for (int i = 0; i < n; ++i) p *= 10;
  return p;
}

Dec max_dec() { return Dec{kIntCap, std::string(kFracDigits, '9')}; }

// x >= 0 as a Dec: its shortest round-trip decimal (which reads back as exactly x), rounded to
// kFracDigits fraction digits up (toward +inf) or down. Integer parts beyond kIntCap saturate
// at kIntCap + 1, which is past every produced number.
Dec to_dec(double x, bool up) {
  if (x == 0) x = 0;  // -0 prints as "-0"
  char buf[1100];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed);
  const std::string s(buf, r.ptr);
  const size_t dot = s.find('.');
  const std::string ip = s.substr(0, dot);
  const std::string fp = dot == std::string::npos ? "" : s.substr(dot + 1);
  Dec d;
  if (ip.size() > 15) {
    d.k = kIntCap + 1;
    return d;
  }
  d.k = std::stoll(ip);
  for (size_t i = 0; i < fp.size() && i < static_cast<size_t>(kFracDigits); ++i) d.f[i] = fp[i];
  const bool rest = fp.size() > static_cast<size_t>(kFracDigits) &&
                    fp.find_first_not_of('0', kFracDigits) != std::string::npos;
  if (up && rest) {
    int i = kFracDigits - 1;
    while (i >= 0 && d.f[static_cast<size_t>(i)] == '9') d.f[static_cast<size_t>(i--)] = '0';
    if (i >= 0) {
      ++d.f[static_cast<size_t>(i)];
    } else {
      ++d.k;
    }
  }
  return d;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Integers: exactly the canonical spellings (no leading zeros, no "-0") of a range.

// Digit strings of one length n >= 1 from a to b (a <= b): the same-length strings compare as
// their numbers do, so this is a walk down the common prefix, splitting where a and b differ.
std::vector<Sequence> Compiler::fixed_range(std::string_view a, std::string_view b) {
  const size_t n = a.size();
  if (n == 1) return {{range(a[0], b[0])}};
  if (a[0] == b[0]) {
    Sequence s{g_->byte(static_cast<uint8_t>(a[0]))};
    append_alts(&s, fixed_range(a.substr(1), b.substr(1)), "digits");
    return {s};
  }
  std::vector<Sequence> out;
  const bool low_zero = a.find_first_not_of('0', 1) == std::string_view::npos;
  const bool high_nine = b.find_first_not_of('9', 1) == std::string_view::npos;
  const char start = low_zero ? a[0] : static_cast<char>(a[0] + 1);
  const char end = high_nine ? b[0] : static_cast<char>(b[0] - 1);
  if (!low_zero) {
    Sequence s{g_->byte(static_cast<uint8_t>(a[0]))};
    append_alts(&s, fixed_range(a.substr(1), std::string(n - 1, '9')), "digits");
    out.push_back(std::move(s));
  }
  if (start <= end) {
    Sequence s{range(start, end)};
    for (size_t i = 1; i < n; ++i) s.push_back(digit());
    out.push_back(std::move(s));
  }
  if (!high_nine) {
    Sequence s{g_->byte(static_cast<uint8_t>(b[0]))};
    append_alts(&s, fixed_range(std::string(n - 1, '0'), b.substr(1)), "digits");
    out.push_back(std::move(s));
  }
  return out;
}

// The canonical spellings of lo..hi (0 <= lo <= hi < 10^19): one part per digit count, where the
// digit counts whose every number is in range share one [1-9][0-9]{m,n}.
std::vector<Sequence> Compiler::uint_range(uint64_t lo, uint64_t hi) {
  std::vector<Sequence> out;
  if (lo == 0) {
    out.push_back(g_->literal("0"));
    if (hi == 0) return out;
    lo = 1;
  }
  int full_from = 0, full_to = -1;  // a run of full digit counts not yet written
  auto flush = [&] {
    if (full_to < full_from) return;
    Sequence s{range('1', '9')};
    if (full_to > 1) s.push_back(g_->repeat({digit()}, full_from - 1, full_to - 1));
    out.push_back(std::move(s));
    full_to = -1;
  };
  for (int d = num_digits(lo); d <= num_digits(hi); ++d) {
    const uint64_t first = pow10(d - 1), last = pow10(d) - 1;
    const uint64_t a = std::max(lo, first), b = std::min(hi, last);
    if (a == first && b == last) {
      if (full_to < full_from) full_from = d;
      full_to = d;
      continue;
    }
    flush();
    for (Sequence& s : fixed_range(std::to_string(a), std::to_string(b))) out.push_back(s);
  }
  flush();
  return out;
}

// lo..hi, |lo|, |hi| <= kBoundCap.
std::vector<Sequence> Compiler::int_range(int64_t lo, int64_t hi) {
  std::vector<Sequence> out;
  if (lo < 0) {
    Sequence s = g_->literal("-");
    append_alts(&s, uint_range(static_cast<uint64_t>(hi < 0 ? -hi : 1), static_cast<uint64_t>(-lo)),
                "digits");
    out.push_back(std::move(s));
  }
  if (hi >= 0) {
    for (Sequence& s :
         uint_range(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi))) {
      out.push_back(std::move(s));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Numbers with bounds: decimals in a range.

Element Compiler::free_frac(int i) {
  auto it = free_frac_.find(i);
  if (it != free_frac_.end()) return it->second;
  const Element e = g_->repeat({digit()}, i == 0 ? 1 : 0, kFracDigits - i);
  free_frac_.emplace(i, e);
  return e;
}

// Fraction digits f (1..kFracDigits of them) whose value, f padded with zeros to kFracDigits
// digits, is in [x, y] (x <= y, kFracDigits digits each). At position i the written digits are
// still equal to x's (tight_lo) and/or y's (tight_hi) prefix; a digit strictly inside frees
// that side.
Element Compiler::frac_digits(const std::string& x, const std::string& y) {
  std::map<int, int32_t> memo;
  std::function<Element(int, bool, bool)> build = [&](int i, bool tl, bool th) -> Element {
    if (!tl && !th) return free_frac(i);
    const int key = i * 4 + (tl ? 2 : 0) + (th ? 1 : 0);
    if (auto it = memo.find(key); it != memo.end()) return Grammar::ref(it->second);
    std::vector<Sequence> alts;
    // Ending here pads with zeros: below y always, at least x only if x's rest is zeros.
    if (i >= 1 && (!tl || x.find_first_not_of('0', static_cast<size_t>(i)) == std::string::npos)) {
      alts.push_back({});
    }
    if (i < kFracDigits) {
      const auto ui = static_cast<size_t>(i);
      const char lo = tl ? x[ui] : '0', hi = th ? y[ui] : '9';
      ByteSet classes[4];
      for (char c = lo; c <= hi; ++c) {
        classes[(tl && c == x[ui] ? 2 : 0) + (th && c == y[ui] ? 1 : 0)].add(
            static_cast<uint8_t>(c));
      }
      for (int cls = 0; cls < 4; ++cls) {
        if (classes[cls].empty()) continue;
        alts.push_back({g_->bytes(classes[cls]), build(i + 1, (cls & 2) != 0, (cls & 1) != 0)});
      }
    }
    const int32_t r = g_->rule("frac", std::move(alts));
    memo.emplace(key, r);
    return Grammar::ref(r);
  };
  return build(0, true, true);
}

// An optional fraction: nothing (the value 0, so only when x is zeros) or "." and digits.
Element Compiler::frac_opt(const std::string& x, const std::string& y) {
  const std::string zeros(kFracDigits, '0'), nines(kFracDigits, '9');
  if (x == zeros && y == nines) return frac_any_opt();
  std::vector<Sequence> alts;
  if (x == zeros) alts.push_back({});
  alts.push_back(cat({g_->literal("."), {frac_digits(x, y)}}));
  return g_->group(std::move(alts), "frac");
}

// Decimals "K" or "K.f" (K canonical, f 1..kFracDigits digits) with a <= value <= b.
std::vector<Sequence> Compiler::dec_range(const Dec& a, const Dec& b) {
  const std::string zeros(kFracDigits, '0'), nines(kFracDigits, '9');
  std::vector<Sequence> out;
  if (a.k == b.k) {
    out.push_back(cat({g_->literal(std::to_string(a.k)), {frac_opt(a.f, b.f)}}));
    return out;
  }
  const bool low_full = a.f == zeros, high_full = b.f == nines;
  const int64_t k1 = low_full ? a.k : a.k + 1, k2 = high_full ? b.k : b.k - 1;
  if (!low_full) out.push_back(cat({g_->literal(std::to_string(a.k)), {frac_opt(a.f, nines)}}));
  if (k1 <= k2) {
    Sequence s;
    append_alts(&s, uint_range(static_cast<uint64_t>(k1), static_cast<uint64_t>(k2)), "int");
    s.push_back(frac_any_opt());
    out.push_back(std::move(s));
  }
  if (!high_full) out.push_back(cat({g_->literal(std::to_string(b.k)), {frac_opt(zeros, b.f)}}));
  return out;
}

Result<Element> Compiler::compile_integer(const Json& s, const std::string& ptr) {
  if (auto it = s.find("multipleOf"); it != s.end()) {
    if (!it->is_number() || it->get<double>() != 1.0) {
      return error_at("'multipleOf' is not supported (except 1 for integers)",
                      child(ptr, "multipleOf"));
    }
  }
  // Each bound as an inclusive integer: a float bound rounds inward, an exclusive one moves one
  // step in; all are clamped to ±(kBoundCap + 1) (beyond that the range is empty or capped).
  std::optional<int64_t> lo, hi;
  auto bound = [&](const char* kw, bool lower, bool exclusive) -> Status {
    const Json& v = s[kw];
    if (!v.is_number()) {
      return error_at(std::string("'") + kw + "' must be a number", child(ptr, kw));
    }
    constexpr int64_t kBig = kBoundCap + 1;
    int64_t x;
    if (v.is_number_unsigned()) {
      x = static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), kBig));
    } else if (v.is_number_integer()) {
      x = std::clamp<int64_t>(v.get<int64_t>(), -kBig, kBig);
    } else {
      double d = v.get<double>();
      d = lower ? (exclusive ? std::floor(d) + 1 : std::ceil(d))
                : (exclusive ? std::ceil(d) - 1 : std::floor(d));
      x = static_cast<int64_t>(std::clamp(d, -1e18, 1e18));
      exclusive = false;
    }
    if (exclusive) x += lower ? 1 : -1;
    if (lower) {
      lo = lo ? std::max(*lo, x) : x;
    } else {
      hi = hi ? std::min(*hi, x) : x;
    }
    return ok_status();
  };
  // Draft 4 spells exclusivity as a boolean next to minimum/maximum.
  auto draft4 = [&](const char* kw) {
    auto it = s.find(kw);
    return it != s.end() && it->is_boolean() && it->get<bool>();
  };
  if (s.contains("minimum")) {
    VLM_RETURN_IF_ERROR(bound("minimum", true, draft4("exclusiveMinimum")));
  }
  if (s.contains("maximum")) {
    VLM_RETURN_IF_ERROR(bound("maximum", false, draft4("exclusiveMaximum")));
  }
  if (s.contains("exclusiveMinimum") && !s["exclusiveMinimum"].is_boolean()) {
    VLM_RETURN_IF_ERROR(bound("exclusiveMinimum", true, true));
  }
  if (s.contains("exclusiveMaximum") && !s["exclusiveMaximum"].is_boolean()) {
    VLM_RETURN_IF_ERROR(bound("exclusiveMaximum", false, true));
  }
  if (!lo && !hi) return any_integer();
  if (lo) lo = std::max(*lo, -kBoundCap);
  if (hi) hi = std::min(*hi, kBoundCap);
  if ((lo && *lo > kBoundCap) || (hi && *hi < -kBoundCap)) {
    return error_at("no integer satisfies the bounds", ptr);
  }
  // An open side stops at 15 digits, or at the other bound's digit count when that is longer.
  auto all_nines = [](int64_t x) {  // 10^digits(|x|) - 1
    return static_cast<int64_t>(pow10(num_digits(static_cast<uint64_t>(x < 0 ? -x : x))) - 1);
  };
  if (!hi) hi = *lo <= kIntCap ? kIntCap : all_nines(*lo);
  if (!lo) lo = *hi >= -kIntCap ? -kIntCap : -all_nines(*hi);
  if (*lo > *hi) return error_at("no integer satisfies the bounds", ptr);
  return alt(int_range(*lo, *hi), "integer");
}

// Numbers with bounds. A number "K.f" written here is a decimal d (K at most 15 digits, f at
// most kFracDigits); a JSON reader takes the double nearest d, and that rounding is monotone
// (d >= e implies double(d) >= double(e)). So the bounds first become inclusive doubles
// lo <= v <= hi (an exclusive bound x becomes the next double past x), and then every decimal d
// with spell(lo) <= d <= spell(hi) reads back inside, where spell(x) is the shortest decimal
// that reads back as exactly x. The grammar produces exactly the decimals with
// ceil15(spell(lo)) <= d <= floor15(spell(hi)), the rounding to kFracDigits fraction digits
// being inward, for each sign: non-negative ones as "K" or "K.f", negative ones as "-" and a
// magnitude in the mirrored range [-hi, -lo] (never "-0"). No exponents.
Result<Element> Compiler::compile_number(const Json& s, const std::string& ptr) {
  if (s.contains("multipleOf")) {
    return error_at("'multipleOf' is not supported (except 1 for integers)",
                    child(ptr, "multipleOf"));
  }
  std::optional<double> lo, hi;
  auto value = [&](const char* kw) -> Result<double> {
    const Json& v = s[kw];
    if (!v.is_number()) {
      return error_at(std::string("'") + kw + "' must be a number", child(ptr, kw));
    }
    // Integers past ±2^53 are outside every produced number anyway; clamped there they stay
    // exact as doubles.
    constexpr double k53 = 9007199254740992.0;
    return std::clamp(v.get<double>(), -k53, k53);
  };
  auto draft4 = [&](const char* kw) {
    auto it = s.find(kw);
    return it != s.end() && it->is_boolean() && it->get<bool>();
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  if (s.contains("minimum")) {
    VLM_ASSIGN_OR_RETURN(double x, value("minimum"));
    if (draft4("exclusiveMinimum")) x = std::nextafter(x, kInf);
    lo = x;
  }
  if (s.contains("exclusiveMinimum") && !s["exclusiveMinimum"].is_boolean()) {
    VLM_ASSIGN_OR_RETURN(const double x, value("exclusiveMinimum"));
    lo = std::max(lo.value_or(-kInf), std::nextafter(x, kInf));
  }
  if (s.contains("maximum")) {
    VLM_ASSIGN_OR_RETURN(double x, value("maximum"));
    if (draft4("exclusiveMaximum")) x = std::nextafter(x, -kInf);
    hi = x;
  }
  if (s.contains("exclusiveMaximum") && !s["exclusiveMaximum"].is_boolean()) {
    VLM_ASSIGN_OR_RETURN(const double x, value("exclusiveMaximum"));
    hi = std::min(hi.value_or(kInf), std::nextafter(x, -kInf));
  }
  if (!lo && !hi) return any_number();
  std::vector<Sequence> alts;
  const Dec cap = max_dec();
  if (!hi || *hi >= 0) {  // non-negative values
    const Dec a = !lo || *lo <= 0 ? Dec{} : to_dec(*lo, /*up=*/true);
    const Dec b = hi ? std::min(to_dec(*hi, /*up=*/false), cap) : cap;
    if (a <= b) {
      for (Sequence& q : dec_range(a, b)) alts.push_back(std::move(q));
    }
  }
  if (!lo || *lo < 0) {  // negative values, as magnitudes
    Dec tiny;
    tiny.f.back() = '1';
    const Dec a = !hi || *hi >= 0 ? tiny : std::max(to_dec(-*hi, /*up=*/true), tiny);
    const Dec b = lo ? std::min(to_dec(-*lo, /*up=*/false), cap) : cap;
    if (a <= b) {
      Sequence q = g_->literal("-");
      append_alts(&q, dec_range(a, b), "magnitude");
      alts.push_back(std::move(q));
    }
  }
  if (alts.empty()) return error_at("no number satisfies the bounds", ptr);
  return g_->group(std::move(alts), "number");
}

}  // namespace vlm::structured::json_schema_internal

#include "structured/grammar.h"

#include <algorithm>
#include <cstdio>

#include "structured/pda.h"
#include "structured/utf8.h"

namespace vlm::structured {

int32_t Grammar::new_rule(std::string name) {
  rules_.push_back(Rule{std::move(name), {}});
  return static_cast<int32_t>(rules_.size() - 1);
}

void Grammar::add_alternative(int32_t rule, Sequence seq) {
  elements_ += static_cast<int64_t>(seq.size()) + 1;
  rules_[static_cast<size_t>(rule)].alternatives.push_back(std::move(seq));
}

int32_t Grammar::rule(std::string name, std::vector<Sequence> alternatives) {
  const int32_t r = new_rule(std::move(name));
  for (auto& a : alternatives) add_alternative(r, std::move(a));
  return r;
}

Element Grammar::bytes(const ByteSet& s) {
  auto [it, inserted] = set_ids_.try_emplace(s, static_cast<int32_t>(sets_.size()));
  if (inserted) sets_.push_back(s);
  return {Element::Kind::kBytes, it->second};
}

Sequence Grammar::literal(std::string_view text) {
  Sequence s;
  s.reserve(text.size());
  for (char c : text) s.push_back(byte(static_cast<uint8_t>(c)));
  return s;
}

Element Grammar::group(std::vector<Sequence> alternatives, std::string name) {
  return ref(rule(std::move(name), std::move(alternatives)));
}

Element Grammar::optional(Sequence s) { return group({std::move(s), {}}, "opt"); }

Element Grammar::star(Sequence s) {
  const int32_t r = new_rule("star");
  s.push_back(ref(r));
  add_alternative(r, std::move(s));
  add_alternative(r, {});
  return ref(r);
}

Element Grammar::plus(Sequence s) {
  Sequence seq = s;
  seq.push_back(star(std::move(s)));
  return group({std::move(seq)}, "plus");
}

Element Grammar::repeat(Sequence s, int64_t min, int64_t max) {
  // The optional tail first: tail_k ::= s tail_{k-1} | ε, k = max - min.
  Sequence out;
  if (max < 0) {
    out.push_back(star(s));
  } else if (max > min) {
    int32_t prev = -1;
    for (int64_t k = 0; k < max - min; ++k) {
      const int32_t r = new_rule("rep");
      Sequence seq = s;
      if (prev >= 0) seq.push_back(ref(prev));
      add_alternative(r, std::move(seq));
      add_alternative(r, {});
      prev = r;
      if (num_elements() > kMaxGrammarElements) break;  // finalize() refuses it
    }
    out.push_back(ref(prev));
  }
  Sequence seq;
  for (int64_t i = 0;
       i < min && num_elements() + static_cast<int64_t>(seq.size()) <= kMaxGrammarElements; ++i) {
    seq.insert(seq.end(), s.begin(), s.end());
  }
  seq.insert(seq.end(), out.begin(), out.end());
  return group({std::move(seq)}, "repeat");
}

namespace {

// Splits [lo, hi] (one encoded length) into ranges whose encodings are products of byte ranges
// (Russ Cox's construction, as in RE2 and Rust's regex-syntax).
void utf8_split(uint32_t lo, uint32_t hi,
                std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  const int n = utf8_length(lo);
  if (n != utf8_length(hi)) {
    const uint32_t edge = n == 1 ? 0x7F : n == 2 ? 0x7FF : 0xFFFF;
    utf8_split(lo, edge, out);
    utf8_split(edge + 1, hi, out);
    return;
  }
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_split(lo, lo | m, out);
        utf8_split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_split(lo, (hi & ~m) - 1, out);
        utf8_split(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(lo, &a);
  append_utf8(hi, &b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) {
    seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  }
  out->push_back(std::move(seq));
}

}  // namespace

Element Grammar::code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  // Normalise: clip, drop surrogates, sort and merge.
  std::vector<std::pair<uint32_t, uint32_t>> rs;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) std::swap(lo, hi);
    hi = std::min<uint32_t>(hi, 0x10FFFF);
    if (lo > hi) continue;
    if (lo < 0xD800) rs.emplace_back(lo, std::min<uint32_t>(hi, 0xD7FF));
    if (hi > 0xDFFF) rs.emplace_back(std::max<uint32_t>(lo, 0xE000), hi);
  }
  std::sort(rs.begin(), rs.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto r : rs) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [lo, hi] : merged) utf8_split(lo, hi, &seqs);
  // One-byte ranges share one set; longer sequences each become an alternative.
  ByteSet ascii;
  std::vector<Sequence> alts;
  for (const auto& s : seqs) {
    if (s.size() == 1) {
      ascii.add_range(s[0].first, s[0].second);
      continue;
    }
    Sequence seq;
    for (auto [a, b] : s) seq.push_back(bytes(ByteSet::range(a, b)));
    alts.push_back(std::move(seq));
  }
  if (!ascii.empty()) alts.insert(alts.begin(), Sequence{bytes(ascii)});
  // No code point at all: an empty byte set, which no byte matches (finalize() prunes it).
  if (alts.empty()) alts.push_back(Sequence{bytes(ByteSet{})});
  return group(std::move(alts), "chars");
}

Status Grammar::finalize() {
  if (root_ < 0 || root_ >= static_cast<int32_t>(rules_.size())) {
    return invalid_argument("the grammar has no root rule");
  }
  if (elements_ > kMaxGrammarElements) {
    return invalid_argument("the grammar is too large (" + std::to_string(elements_) +
                            " elements; at most " + std::to_string(kMaxGrammarElements) + ")");
  }
  const size_t n = rules_.size();
  // Where each rule is referenced: (rule, alternative) pairs, for the worklists below (each
  // fixed point is linear in the grammar's size, whatever the order of the rules).
  std::vector<std::vector<std::pair<int32_t, int32_t>>> used_in(n);
  auto index_uses = [&] {
    for (auto& u : used_in) u.clear();
    for (size_t r = 0; r < n; ++r) {
      const auto& alts = rules_[r].alternatives;
      for (size_t a = 0; a < alts.size(); ++a) {
        for (const Element& e : alts[a]) {
          if (e.kind == Element::Kind::kRule) {
            used_in[static_cast<size_t>(e.id)].emplace_back(static_cast<int32_t>(r),
                                                            static_cast<int32_t>(a));
          }
        }
      }
    }
  };
  index_uses();
  // A fixed point over the rules: `base_ok(alt)` says whether an alternative can hold at all
  // (its non-rule elements decide), `waiting` counts its rule elements not yet marked; a rule is
  // marked once one of its alternatives has all its rule elements marked.
  auto fixed_point = [&](auto base_ok) {
    std::vector<char> marked(n, 0);
    std::vector<std::vector<int32_t>> waiting(n);  // per rule, per alternative: unmarked refs
    std::vector<int32_t> queue;
    auto mark = [&](size_t r) {
      if (!marked[r]) {
        marked[r] = 1;
        queue.push_back(static_cast<int32_t>(r));
      }
    };
    for (size_t r = 0; r < n; ++r) {
      const auto& alts = rules_[r].alternatives;
      waiting[r].assign(alts.size(), 0);
      for (size_t a = 0; a < alts.size(); ++a) {
        if (!base_ok(alts[a])) {
          waiting[r][a] = -1;  // never holds
          continue;
        }
        for (const Element& e : alts[a]) waiting[r][a] += e.kind == Element::Kind::kRule;
        if (waiting[r][a] == 0) mark(r);
      }
    }
    while (!queue.empty()) {
      const int32_t s = queue.back();
      queue.pop_back();
      for (auto [r, a] : used_in[static_cast<size_t>(s)]) {
        int32_t& w = waiting[static_cast<size_t>(r)][static_cast<size_t>(a)];
        if (w > 0 && --w == 0) mark(static_cast<size_t>(r));
      }
    }
    return marked;
  };
  // Productive rules derive some finite byte string: no empty byte set in the alternative.
  const std::vector<char> productive = fixed_point([&](const Sequence& alt) {
    return std::none_of(alt.begin(), alt.end(), [&](const Element& e) {
      return e.kind == Element::Kind::kBytes && sets_[static_cast<size_t>(e.id)].empty();
    });
  });
  if (!productive[static_cast<size_t>(root_)]) {
    return invalid_argument("the grammar matches no text at all (rule '" +
                            rules_[static_cast<size_t>(root_)].name + "')");
  }
  // Drop the alternatives that can never complete, so that no path leads to a dead end.
  auto elem_ok = [&](const Element& e) {
    return e.kind == Element::Kind::kBytes ? !sets_[static_cast<size_t>(e.id)].empty()
                                           : productive[static_cast<size_t>(e.id)] != 0;
  };
  for (Rule& r : rules_) {
    auto dead = [&](const Sequence& alt) { return !std::all_of(alt.begin(), alt.end(), elem_ok); };
    r.alternatives.erase(std::remove_if(r.alternatives.begin(), r.alternatives.end(), dead),
                         r.alternatives.end());
  }
  index_uses();  // alternatives were renumbered
  // Nullable rules (derive the empty string: an alternative of nullable rules only), then left
  // recursion: a rule reaching itself through references preceded only by nullable elements.
  const std::vector<char> nullable = fixed_point([](const Sequence& alt) {
    return std::all_of(alt.begin(), alt.end(),
                       [](const Element& e) { return e.kind == Element::Kind::kRule; });
  });
  std::vector<std::vector<int32_t>> left(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r].alternatives) {
      for (const Element& e : alt) {
        if (e.kind != Element::Kind::kRule) break;
        left[r].push_back(e.id);
        if (!nullable[static_cast<size_t>(e.id)]) break;
      }
    }
  }
  // Depth-first search for a cycle, with an explicit stack (chains of rules can be long).
  std::vector<char> color(n, 0);                 // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;  // (rule, next edge)
  for (size_t start = 0; start < n; ++start) {
    if (color[start] != 0) continue;
    color[start] = 1;
    path.emplace_back(static_cast<int32_t>(start), 0);
    while (!path.empty()) {
      auto& [r, next] = path.back();
      const auto& edges = left[static_cast<size_t>(r)];
      if (next == edges.size()) {
        color[static_cast<size_t>(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t s = edges[next++];
      if (color[static_cast<size_t>(s)] == 1) {
        return invalid_argument("the grammar is left-recursive at rule '" +
                                rules_[static_cast<size_t>(s)].name + "'");
      }
      if (color[static_cast<size_t>(s)] == 0) {
        color[static_cast<size_t>(s)] = 1;
        path.emplace_back(s, 0);
      }
    }
  }
  return ok_status();
}

namespace {

std::string set_text(const ByteSet& s) {
  std::string out = "[";
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    if (!s.has(static_cast<uint8_t>(b))) continue;
    int e = b;
    while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
    auto put = [&](int c) {
      if (c >= 0x21 && c < 0x7F && c != '\\' && c != ']' && c != '-' && c != '^') {
        out += static_cast<char>(c);
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02X", c);
        out += buf;
      }
    };
    put(b);
    if (e > b) {
      out += '-';
      put(e);
    }
    b = e;
  }
  return out + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < rules_.size(); ++r) {
    out += rules_[r].name + "_" + std::to_string(r) + " ::=";
    for (size_t a = 0; a < rules_[r].alternatives.size(); ++a) {
      if (a > 0) out += " |";
      if (rules_[r].alternatives[a].empty()) out += " \"\"";
      for (const Element& e : rules_[r].alternatives[a]) {
        out += ' ';
        if (e.kind == Element::Kind::kBytes) {
          out += set_text(sets_[static_cast<size_t>(e.id)]);
        } else {
          out += rules_[static_cast<size_t>(e.id)].name + "_" + std::to_string(e.id);
        }
      }
    }
    out += '\n';
  }
  return out;
}

bool matches(const Grammar& g, std::string_view text) {
  Pda pda(g);
  StackSet s = pda.initial();
  for (char c : text) {
    s = pda.advance(s, static_cast<uint8_t>(c));
    if (s.empty()) return false;
  }
  return pda.accepting(s);
}

bool matches_prefix(const Grammar& g, std::string_view text) {
  Pda pda(g);
  StackSet s = pda.initial();
  for (char c : text) {
    s = pda.advance(s, static_cast<uint8_t>(c));
    if (s.empty()) return false;
  }
  return true;
}

}  // namespace vlm::structured

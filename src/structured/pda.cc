#include "structured/pda.h"

#include <algorithm>

namespace vlm::structured {

Pda::Pda(const Grammar& g) : root_(g.root()) {
  for (int32_t i = 0; i < g.num_byte_sets(); ++i) sets_.push_back(g.byte_set(i));
  alt_starts_.resize(g.rules().size());
  for (size_t r = 0; r < g.rules().size(); ++r) {
    for (const Sequence& alt : g.rules()[r].alternatives) {
      alt_starts_[r].push_back(static_cast<int32_t>(elems_.size()));
      for (const Element& e : alt) {
        elems_.push_back(e.kind == Element::Kind::kBytes ? e.id * 2 : e.id * 2 + 1);
      }
      elems_.push_back(kEnd);
    }
  }
}

void Pda::expand(Stack st, StackSet* out) const {
  for (;;) {
    if (st.empty()) {
      out->push_back(std::move(st));
      return;
    }
    const int32_t p = st.back();
    const int32_t code = elems_[static_cast<size_t>(p)];
    if (code == kEnd) {  // the alternative is done: return to the frame below
      st.pop_back();
      continue;
    }
    if ((code & 1) == 0) {
      out->push_back(std::move(st));
      return;
    }
    // A rule: the frame continues after it (dropped when nothing follows, so right recursion
    // keeps the stack flat), and each alternative is pushed on top.
    st.pop_back();
    if (elems_[static_cast<size_t>(p) + 1] != kEnd) st.push_back(p + 1);
    if (st.size() >= kMaxStackDepth) return;
    const auto& alts = alt_starts_[static_cast<size_t>(code >> 1)];
    for (size_t i = 0; i < alts.size(); ++i) {
      Stack next = i + 1 < alts.size() ? st : std::move(st);
      next.push_back(alts[i]);
      expand(std::move(next), out);
    }
    return;
  }
}

static void normalize(StackSet* s) {
  std::sort(s->begin(), s->end());
  s->erase(std::unique(s->begin(), s->end()), s->end());
  if (s->size() > kMaxStacks) s->resize(kMaxStacks);
}

StackSet Pda::initial() const {
  StackSet out;
  for (int32_t a : alt_starts_[static_cast<size_t>(root_)]) expand(Stack{a}, &out);
  normalize(&out);
  return out;
}

StackSet Pda::advance(const StackSet& s, uint8_t b) const {
  StackSet out;
  for (const Stack& st : s) {
    if (st.empty() || !top_set(st).has(b)) continue;
    Stack next = st;
    next.back() += 1;
    expand(std::move(next), &out);
  }
  normalize(&out);
  return out;
}

ByteSet Pda::next_bytes(const StackSet& s) const {
  ByteSet out;
  for (const Stack& st : s) {
    if (!st.empty()) out.add(top_set(st));
  }
  return out;
}

}  // namespace vlm::structured

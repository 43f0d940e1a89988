#include "structured/pda.h"

#include <algorithm>
#include <set>

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
  // Depth-first over the alternatives with an explicit list of pending stacks (a chain of rules
  // each starting with the next could be long).
  // Configurations already met in this expansion are not followed again: alternatives that
  // consume nothing ((|)(|)...) would otherwise multiply the paths to the same stacks.
  std::set<Stack> seen;
  std::vector<Stack> pending;
  pending.push_back(std::move(st));
  while (!pending.empty()) {
    Stack cur = std::move(pending.back());
    pending.pop_back();
    for (;;) {
      if (!seen.insert(cur).second) break;
      if (cur.empty()) {
        out->push_back(std::move(cur));
        break;
      }
      const int32_t p = cur.back();
      const int32_t code = elems_[static_cast<size_t>(p)];
      if (code == kEnd) {  // the alternative is done: return to the frame below
        cur.pop_back();
        continue;
      }
      if ((code & 1) == 0) {
        out->push_back(std::move(cur));
        break;
      }
      // A rule: the frame continues after it (dropped when nothing follows, so right recursion
      // keeps the stack flat), and each alternative is pushed on top.
      cur.pop_back();
      if (elems_[static_cast<size_t>(p) + 1] != kEnd) cur.push_back(p + 1);
      if (cur.size() >= kMaxStackDepth) break;
      const auto& alts = alt_starts_[static_cast<size_t>(code >> 1)];
      if (alts.empty()) break;
      for (size_t k = alts.size() - 1; k > 0; --k) {  // the first alternative is followed now
        Stack next = cur;
        next.push_back(alts[k]);
        pending.push_back(std::move(next));
      }
      cur.push_back(alts[0]);
    }
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

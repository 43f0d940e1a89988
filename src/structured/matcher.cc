#include "structured/matcher.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/clock.h"

namespace vlm::structured {

namespace {

// A grammar's cache (transition rows and masks) is dropped and rebuilt when it outgrows this;
// masks alone are evicted oldest first past kMaskBudget.
constexpr int64_t kCacheBudget = int64_t{64} << 20;
constexpr int64_t kMaskBudget = int64_t{48} << 20;

}  // namespace

TokenVocab::TokenVocab(const std::vector<std::string>& bytes, int64_t vocab_size)
    : vocab_(std::max<int64_t>(vocab_size, static_cast<int64_t>(bytes.size()))), bytes_(bytes) {
  bytes_.resize(static_cast<size_t>(vocab_));
  byte_token_.fill(-1);
  for (size_t i = 0; i < bytes_.size(); ++i) {
    const std::string& b = bytes_[i];
    if (b.size() == 1 && byte_token_[static_cast<uint8_t>(b[0])] < 0) {
      byte_token_[static_cast<uint8_t>(b[0])] = static_cast<int32_t>(i);
    }
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    if (!bytes_[i].empty()) ids.push_back(static_cast<int32_t>(i));
  }
  // Sorted by bytes (std::string compares as unsigned char), equal strings by id: a token's
  // node is then created, or revisited, in increasing node order, so each node's tokens are one
  // run of tokens_.
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const int c = bytes_[static_cast<size_t>(a)].compare(bytes_[static_cast<size_t>(b)]);
    return c < 0 || (c == 0 && a < b);
  });
  nodes_.emplace_back();         // the root
  std::vector<int32_t> open{0};  // the path of open nodes: open[d] is the node at depth d
  std::string prev;
  for (int32_t id : ids) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t lcp = 0;
    while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
    // Close the nodes below the common prefix.
    while (open.size() > lcp + 1) {
      nodes_[static_cast<size_t>(open.back())].end = static_cast<int32_t>(nodes_.size());
      open.pop_back();
    }
    for (size_t d = lcp; d < s.size(); ++d) {
      open.push_back(static_cast<int32_t>(nodes_.size()));
      Node nd;
      nd.byte = static_cast<uint8_t>(s[d]);
      nd.depth = static_cast<uint16_t>(std::min<size_t>(d + 1, 65535));
      nodes_.push_back(nd);
    }
    // This token ends at the deepest open node (tokens of equal bytes are adjacent in ids).
    Node& at = nodes_[static_cast<size_t>(open.back())];
    if (at.ntok == 0) at.tok = static_cast<int32_t>(tokens_.size());
    if (at.ntok < 255) {  // more ids with the very same bytes than that are not listed
      tokens_.push_back(id);
      ++at.ntok;
    }
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(s.size()));
    prev = s;
  }
  while (!open.empty()) {
    nodes_[static_cast<size_t>(open.back())].end = static_cast<int32_t>(nodes_.size());
    open.pop_back();
  }
  if (tokens_.empty()) tokens_.push_back(0);  // a node without tokens reads tokens_[0]
}

CompiledGrammar::CompiledGrammar(const Grammar& g, std::shared_ptr<const TokenVocab> vocab,
                                 double walk_budget_ms)
    : vocab_(std::move(vocab)),
      walk_budget_ms_(walk_budget_ms),
      pda_(g),
      initial_(pda_.initial()) {}

CompiledGrammar::Stats CompiledGrammar::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats s;
  s.states = static_cast<int64_t>(states_.size());
  s.masks = static_cast<int64_t>(masked_.size());
  s.mask_walks = walks_;
  s.mask_hits = hits_;
  s.mask_fallbacks = fallbacks_;
  return s;
}

int32_t CompiledGrammar::intern(StackSet stacks) {
  std::string key;
  for (const Stack& st : stacks) {
    const uint32_t n = static_cast<uint32_t>(st.size());
    key.append(reinterpret_cast<const char*>(&n), sizeof n);
    key.append(reinterpret_cast<const char*>(st.data()), st.size() * sizeof(int32_t));
  }
  auto [it, inserted] = ids_.try_emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (!inserted) return it->second;
  State s;
  s.accepting = pda_.accepting(stacks);
  // What the state holds besides its transition row: its stacks and its key.
  state_bytes_ += static_cast<int64_t>(sizeof(State) + it->first.size() + 64);
  for (const Stack& st : stacks) {
    state_bytes_ += static_cast<int64_t>(sizeof(Stack) + st.size() * sizeof(int32_t));
  }
  s.stacks = std::move(stacks);
  states_.push_back(std::move(s));
  trans_.resize(trans_.size() + 256, -2);
  return it->second;
}

int32_t CompiledGrammar::step(int32_t state, uint8_t b) {
  const size_t at = static_cast<size_t>(state) * 256 + b;
  if (trans_[at] == -2) fill_row(state);
  return trans_[at];
}

void CompiledGrammar::fill_row(int32_t state) {
  // Bytes accepted by the same stacks lead to the same state (a stack's successor does not
  // depend on which byte of its set it took): one advance per class of bytes, not per byte.
  const StackSet stacks = states_[static_cast<size_t>(state)].stacks;  // intern() may grow states_
  std::vector<std::pair<std::vector<uint64_t>, int32_t>> classes;      // signature → state
  std::vector<uint64_t> sig((stacks.size() + 63) / 64);
  for (int b = 0; b < 256; ++b) {
    std::fill(sig.begin(), sig.end(), 0);
    bool any = false;
    for (size_t k = 0; k < stacks.size(); ++k) {
      if (!stacks[k].empty() && pda_.top_set(stacks[k]).has(static_cast<uint8_t>(b))) {
        sig[k >> 6] |= uint64_t{1} << (k & 63);
        any = true;
      }
    }
    int32_t t = -1;
    if (any) {
      auto it = std::find_if(classes.begin(), classes.end(),
                             [&](const auto& c) { return c.first == sig; });
      if (it != classes.end()) {
        t = it->second;
      } else {
        StackSet next = pda_.advance(stacks, static_cast<uint8_t>(b));
        t = next.empty() ? -1 : intern(std::move(next));
        classes.emplace_back(sig, t);
      }
    }
    trans_[static_cast<size_t>(state) * 256 + static_cast<size_t>(b)] = t;
  }
}

CompiledGrammar::MaskPtr CompiledGrammar::walk(int32_t state) {
  const TokenVocab& v = *vocab_;
  auto mask = std::make_shared<std::vector<uint64_t>>(static_cast<size_t>(v.words()), 0);
  uint64_t* m = mask->data();
  path_.assign(static_cast<size_t>(v.max_depth_) + 1, 0);
  const Clock::time_point t0 = Clock::now();  // only new transitions take long: timed there
  bool budget_spent = false;
  int32_t* path = path_.data();
  path[0] = state;
  const TokenVocab::Node* nodes = v.nodes_.data();
  const int32_t* tokens = v.tokens_.data();
  const int32_t n = static_cast<int32_t>(v.nodes_.size());
  const int32_t* trans = trans_.data();
  for (int32_t i = 1; i < n;) {
    const TokenVocab::Node& nd = nodes[i];
    const int32_t parent = path[nd.depth - 1];
    int32_t t = trans[static_cast<size_t>(parent) * 256 + nd.byte];
    if (t == -2) {
      t = step(parent, nd.byte);
      trans = trans_.data();  // step() may have grown the table
      // A walk that has run past its budget gives up: the mask becomes the one-byte tokens of
      // the bytes allowed next (a subset of the allowed tokens, never empty where the
      // vocabulary has a token for every byte), so that a grammar whose automaton keeps making
      // new, large states costs bounded time per step instead of stalling every request on the
      // engine thread. Ordinary grammars walk in about a millisecond (docs/benchmarks.md).
      if (!budget_spent && ms_since(t0) > walk_budget_ms_) {
        // Too many states: the one-byte tokens of the allowed bytes, if there are any.
        std::vector<uint64_t> one(static_cast<size_t>(v.words()), 0);
        bool any = false;
        for (int b = 0; b < 256; ++b) {
          const int32_t id = v.byte_token_[static_cast<size_t>(b)];
          if (id >= 0 && step(state, static_cast<uint8_t>(b)) >= 0) {
            one[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (id & 63);
            any = true;
          }
        }
        if (any) {
          ++fallbacks_;
          *mask = std::move(one);
          return mask;
        }
        budget_spent = true;  // no such tokens: finish the walk, however long
      }
    }
    if (t < 0) {  // the byte leaves the grammar: so does every token below this node
      i = nd.end;
      continue;
    }
    path[nd.depth] = t;
    // Half the nodes end a token: the first one is marked without a branch (a node with none
    // ORs a zero), the rare others in a loop.
    const int32_t id = tokens[nd.tok];
    m[id >> 6] |= static_cast<uint64_t>(nd.ntok != 0) << (id & 63);
    for (int32_t k = 1; k < nd.ntok; ++k) {
      const int32_t more = tokens[nd.tok + k];
      m[more >> 6] |= uint64_t{1} << (more & 63);
    }
    ++i;
  }
  return mask;
}

void CompiledGrammar::maybe_reset() {
  const int64_t bytes =
      static_cast<int64_t>(trans_.size() * sizeof(int32_t)) + mask_bytes_ + state_bytes_;
  if (bytes <= kCacheBudget) return;
  state_bytes_ = 0;
  states_.clear();
  trans_.clear();
  ids_.clear();
  masked_.clear();
  mask_bytes_ = 0;
  ++epoch_;
}

CompiledGrammar::MaskPtr CompiledGrammar::mask(int32_t state) {
  State& s = states_[static_cast<size_t>(state)];
  if (s.mask) {
    ++hits_;
    return s.mask;
  }
  ++walks_;
  MaskPtr m = walk(state);
  states_[static_cast<size_t>(state)].mask = m;  // walk() may have grown states_
  masked_.push_back(state);
  mask_bytes_ += vocab_->words() * 8;
  while (mask_bytes_ > kMaskBudget && masked_.size() > 1) {
    states_[static_cast<size_t>(masked_.front())].mask.reset();
    masked_.pop_front();
    mask_bytes_ -= vocab_->words() * 8;
  }
  return m;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<CompiledGrammar> grammar,
                               std::vector<int32_t> end_ids, int32_t activate_after)
    : g_(std::move(grammar)),
      end_ids_(std::move(end_ids)),
      saved_(end_ids_.size()),
      activate_after_(activate_after) {
  stacks_ = g_->initial_;
  std::lock_guard<std::mutex> lock(g_->mu_);
  epoch_ = g_->epoch_;
  state_ = g_->intern(stacks_);
}

void GrammarMatcher::sync() {
  g_->maybe_reset();
  if (epoch_ != g_->epoch_) {
    epoch_ = g_->epoch_;
    state_ = g_->intern(stacks_);
  }
}

bool GrammarMatcher::complete() const {
  if (ended_) return true;
  if (!active()) return false;
  std::lock_guard<std::mutex> lock(g_->mu_);
  return epoch_ == g_->epoch_ ? g_->states_[static_cast<size_t>(state_)].accepting
                              : g_->pda_.accepting(stacks_);
}

CompiledGrammar::MaskPtr GrammarMatcher::mask_now(bool* done) {
  CompiledGrammar::MaskPtr m;
  {
    std::lock_guard<std::mutex> lock(g_->mu_);
    sync();
    m = g_->mask(state_);
  }
  // A state with nothing allowed is a dead end (only nesting past kMaxStackDepth makes one):
  // the reply ends here rather than leave the sampler with nothing to draw.
  if (!*done && std::all_of(m->begin(), m->end(), [](uint64_t x) { return x == 0; })) {
    *done = dead_end_ = true;
  }
  return m;
}

void GrammarMatcher::fill(uint64_t* words) {
  const int64_t W = g_->vocab().words();
  const int64_t V = g_->vocab().vocab_size();
  bool done = complete();
  if (ended_) {
    std::fill(words, words + W, 0);
  } else if (!active()) {
    std::fill(words, words + W, ~uint64_t{0});
    if (V % 64) words[W - 1] = (uint64_t{1} << (V % 64)) - 1;
  } else {
    std::memcpy(words, mask_now(&done)->data(), static_cast<size_t>(W) * 8);
  }
  for (int32_t id : end_ids_) {
    if (id < 0 || id >= V) continue;
    if (done) {
      words[id >> 6] |= uint64_t{1} << (id & 63);
    } else {
      words[id >> 6] &= ~(uint64_t{1} << (id & 63));
    }
  }
}

void GrammarMatcher::apply(float* logits) {
  const int64_t V = g_->vocab().vocab_size();
  const float ninf = -std::numeric_limits<float>::infinity();
  bool done = complete();
  // End tokens: kept exactly when the output is complete, whatever the mask says.
  const size_t ne = end_ids_.size();
  for (size_t k = 0; k < ne; ++k) {
    const int32_t id = end_ids_[k];
    saved_[k] = id >= 0 && id < V ? logits[id] : 0.f;
  }
  if (ended_) {
    std::fill(logits, logits + V, ninf);
  } else if (active()) {
    const CompiledGrammar::MaskPtr m = mask_now(&done);
    const uint64_t* w = m->data();
    const int64_t W = g_->vocab().words();
    for (int64_t i = 0; i < W; ++i) {
      const int64_t base = i * 64;
      const int64_t len = std::min<int64_t>(64, V - base);
      uint64_t off = ~w[i];
      if (len < 64) off &= (uint64_t{1} << len) - 1;
      if (off == 0) continue;
      if (len == 64 && off == ~uint64_t{0}) {
        std::fill(logits + base, logits + base + 64, ninf);
        continue;
      }
      while (off) {
        logits[base + __builtin_ctzll(off)] = ninf;
        off &= off - 1;
      }
    }
  }
  for (size_t k = 0; k < ne; ++k) {
    const int32_t id = end_ids_[k];
    if (id >= 0 && id < V) logits[id] = done ? saved_[k] : ninf;
  }
}

bool GrammarMatcher::accept(int32_t id) {
  if (ended_) return false;
  const bool is_end = std::find(end_ids_.begin(), end_ids_.end(), id) != end_ids_.end();
  if (!active()) {
    if (is_end) return false;
    if (id == activate_after_) activate_after_ = -1;
    return true;
  }
  if (is_end) {
    if (!complete() && !dead_end_) return false;
    ended_ = true;
    return true;
  }
  if (id < 0 || id >= g_->vocab().vocab_size()) return false;
  const std::string& bytes = g_->vocab().bytes(id);
  if (bytes.empty()) return false;
  std::lock_guard<std::mutex> lock(g_->mu_);
  sync();
  int32_t s = state_;
  for (char c : bytes) {
    s = g_->step(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  state_ = s;
  stacks_ = g_->states_[static_cast<size_t>(s)].stacks;
  return true;
}

}  // namespace vlm::structured

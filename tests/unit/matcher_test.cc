// The token matcher against a plain simulation: every mask equals "the token's bytes keep the
// output a prefix of the language", end tokens are allowed exactly when the output is complete,
// and random walks through the masks never meet a state with nothing allowed.
#include "structured/matcher.h"

#include <gtest/gtest.h>

#include <random>

#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "vlm/tokenizer.h"

namespace vlm::structured {
namespace {

// A small vocabulary: every single byte, some multi-byte strings (including ones that cross
// grammar boundaries), an unused id and two end tokens at the end.
std::vector<std::string> small_vocab() {
  std::vector<std::string> v;
  for (int b = 0; b < 256; ++b) v.push_back(std::string(1, static_cast<char>(b)));
  for (const char* s : {"ab",  "abc", "ba",       "aab",      "bb",    "cc",   "a,",    ",a",
                        "\":", "{\"", "\"}",      "12",       "345",   "true", "false", "null",
                        "}}",  "]]",  "\xC3\xA9", "\xE2\x82", "\"a\"", " \"",  ", \""}) {
    v.push_back(s);
  }
  v.push_back("");  // unused
  v.push_back("");  // end (special: no bytes)
  v.push_back("");
  return v;
}

Grammar ab_grammar() {
  // root ::= ("a" | "b")* "c" | "ab" ","
  Grammar g;
  Sequence s{g.star({g.group({g.literal("a"), g.literal("b")})})};
  s.push_back(g.byte('c'));
  g.set_root(g.rule("root", {s, g.literal("ab,")}));
  EXPECT_TRUE(g.finalize().ok());
  return g;
}

void check_walks(const Grammar& g, const std::vector<std::string>& bytes, int walks,
                 uint64_t seed) {
  const int64_t V = static_cast<int64_t>(bytes.size());
  const std::vector<int32_t> ends{static_cast<int32_t>(V - 2), static_cast<int32_t>(V - 1)};
  auto vocab = std::make_shared<TokenVocab>(bytes, V);
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->words()));
  for (int w = 0; w < walks; ++w) {
    GrammarMatcher m(cg, ends);
    std::string out;
    for (int step = 0; step < 200; ++step) {
      m.fill(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < V; ++id) {
        const bool bit = (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
        bool want;
        if (id >= V - 2) {
          want = matches(g, out);
        } else {
          want = !bytes[static_cast<size_t>(id)].empty() &&
                 matches_prefix(g, out + bytes[static_cast<size_t>(id)]);
        }
        ASSERT_EQ(bit, want) << "token " << id << " after '" << out << "'";
        if (bit) allowed.push_back(id);
      }
      ASSERT_FALSE(allowed.empty()) << "dead end after '" << out << "'";
      // Prefer continuing (end with probability 1/8 when allowed), so walks get long.
      int32_t pick = allowed[rng() % allowed.size()];
      if (pick >= V - 2 && allowed.size() > 2 && rng() % 8 != 0) {
        while (pick >= V - 2) pick = allowed[rng() % allowed.size()];
      }
      ASSERT_TRUE(m.accept(pick));
      if (pick >= V - 2) {
        EXPECT_TRUE(m.terminated());
        EXPECT_TRUE(matches(g, out));
        break;
      }
      out += bytes[static_cast<size_t>(pick)];
    }
  }
}

TEST(MatcherTest, TrieHoldsEveryTokenOnce) {
  const auto bytes = small_vocab();
  TokenVocab v(bytes, static_cast<int64_t>(bytes.size()) + 5);  // padding ids past the tokenizer
  EXPECT_EQ(v.vocab_size(), static_cast<int64_t>(bytes.size()) + 5);
  EXPECT_GT(v.num_nodes(), 256);
}

TEST(MatcherTest, MasksEqualThePlainSimulation) { check_walks(ab_grammar(), small_vocab(), 40, 1); }

TEST(MatcherTest, RefusesWhatTheMaskForbids) {
  const auto bytes = small_vocab();
  const int32_t V = static_cast<int32_t>(bytes.size());
  auto vocab = std::make_shared<TokenVocab>(bytes, V);
  auto cg = std::make_shared<CompiledGrammar>(ab_grammar(), vocab);
  GrammarMatcher m(cg, {V - 1});
  EXPECT_FALSE(m.accept(V - 1));  // not complete yet
  EXPECT_FALSE(m.accept('x'));
  EXPECT_TRUE(m.accept(256));  // "ab"
  EXPECT_FALSE(m.complete());
  EXPECT_TRUE(m.accept(','));
  EXPECT_TRUE(m.complete());
  std::vector<float> logits(static_cast<size_t>(V), 1.f);
  m.apply(logits.data());
  for (int32_t id = 0; id < V; ++id) {
    EXPECT_EQ(std::isinf(logits[static_cast<size_t>(id)]), id != V - 1) << id;
  }
  EXPECT_TRUE(m.accept(V - 1));
  EXPECT_TRUE(m.terminated());
}

TEST(MatcherTest, WaitsForTheEndOfReasoning) {
  const auto bytes = small_vocab();
  const int32_t V = static_cast<int32_t>(bytes.size());
  auto vocab = std::make_shared<TokenVocab>(bytes, V);
  auto cg = std::make_shared<CompiledGrammar>(ab_grammar(), vocab);
  const int32_t close = V - 3;  // stands for </think>
  GrammarMatcher m(cg, {V - 1}, close);
  std::vector<float> logits(static_cast<size_t>(V), 1.f);
  m.apply(logits.data());
  EXPECT_FALSE(std::isinf(logits['x']));                        // anything while reasoning
  EXPECT_TRUE(std::isinf(logits[static_cast<size_t>(V - 1)]));  // but not the end
  EXPECT_TRUE(m.accept('x'));
  EXPECT_TRUE(m.accept(close));
  EXPECT_TRUE(m.active());
  EXPECT_FALSE(m.accept('x'));
  EXPECT_TRUE(m.accept('c'));
  EXPECT_TRUE(m.complete());
}

}  // namespace
}  // namespace vlm::structured

namespace vlm::structured {
namespace {

// The real Qwen3 vocabulary (151,643 byte-level tokens and the added ones; the special ones
// have no grammar text) against JSON grammars: on random walks through the masks, every mask
// agrees with the plain simulation on a sample of tokens, and never leaves nothing allowed.
class QwenVocabTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto tok = Tokenizer::load(std::string(VLM_TESTDATA_DIR) + "/tokenizer/tokenizer.json");
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    const int32_t n = (*tok)->vocab_size();
    bytes_ = new std::vector<std::string>(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
      if (!(*tok)->is_special(id)) (*bytes_)[static_cast<size_t>(id)] = (*tok)->token_bytes(id);
    }
    eos_ = (*tok)->token_to_id("<|im_end|>").value_or(-1);
  }
  static void TearDownTestSuite() { delete bytes_; }

  void walk(const Grammar& g, int sequences, int max_steps) {
    constexpr int64_t kVocab = 151936;  // the model's rows, past the tokenizer's ids
    auto vocab = std::make_shared<TokenVocab>(*bytes_, kVocab);
    auto cg = std::make_shared<CompiledGrammar>(g, vocab);
    std::mt19937_64 rng(3);
    std::vector<uint64_t> mask(static_cast<size_t>(vocab->words()));
    for (int s = 0; s < sequences; ++s) {
      GrammarMatcher m(cg, {eos_});
      std::string out;
      for (int step = 0; step < max_steps && !m.terminated(); ++step) {
        m.fill(mask.data());
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < kVocab; ++id) {
          if ((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1) allowed.push_back(id);
        }
        ASSERT_FALSE(allowed.empty()) << "dead end after '" << out << "'";
        // The mask against the simulation, on 64 random tokens and every allowed one sampled.
        for (int k = 0; k < 64; ++k) {
          const int32_t id = static_cast<int32_t>(rng() % bytes_->size());
          const bool bit = (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1;
          const std::string& b = (*bytes_)[static_cast<size_t>(id)];
          const bool want = id == eos_ ? matches(g, out) : !b.empty() && matches_prefix(g, out + b);
          ASSERT_EQ(bit, want) << "token " << id << " after '" << out << "'";
        }
        const int32_t pick = allowed[rng() % allowed.size()];
        ASSERT_TRUE(m.accept(pick));
        if (pick != eos_) out += (*bytes_)[static_cast<size_t>(pick)];
      }
      if (m.terminated()) EXPECT_TRUE(matches(g, out)) << out;
    }
  }

  static std::vector<std::string>* bytes_;
  static int32_t eos_;
};
std::vector<std::string>* QwenVocabTest::bytes_ = nullptr;
int32_t QwenVocabTest::eos_ = -1;

TEST_F(QwenVocabTest, JsonObject) { walk(json_object_grammar(), 4, 60); }

TEST_F(QwenVocabTest, BoundedSchemaEnds) {
  auto g = compile_json_schema(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "age": {"type": "integer", "minimum": 0, "maximum": 130},
      "tags": {"type": "array", "items": {"enum": ["a", "b\"c", "é"]}, "maxItems": 3},
      "when": {"type": "string", "format": "date"}},
      "required": ["name", "age", "when"]})");
  ASSERT_TRUE(g.ok()) << g.status().message();
  walk(*g, 6, 300);
}

}  // namespace
}  // namespace vlm::structured

namespace vlm::structured {
namespace {

// A grammar whose automaton has exponentially many states (the 16th byte from the end is an
// 'a': every history is a different state) against a vocabulary of every a/b string up to 15
// bytes: a walk past its time budget (here none at all, so the test does not depend on speed)
// allows the one-byte tokens of the allowed bytes, which keeps the output in the language at a
// bounded cost per step.
TEST(MatcherTest, ExplosiveGrammarFallsBackToOneByteTokens) {
  Grammar g;
  ByteSet ab;
  ab.add('a');
  ab.add('b');
  Sequence s{g.star({g.bytes(ab)})};
  s.push_back(g.byte('a'));
  s.push_back(g.repeat({g.bytes(ab)}, 15, 15));
  g.set_root(g.rule("root", {s}));
  ASSERT_TRUE(g.finalize().ok());
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (int len = 2; len <= 15; ++len) {
    for (int bits = 0; bits < (1 << len); ++bits) {
      std::string t;
      for (int k = 0; k < len; ++k) t += (bits >> k) & 1 ? 'a' : 'b';
      bytes.push_back(t);
    }
  }
  const int32_t end = static_cast<int32_t>(bytes.size());
  bytes.push_back("");
  auto vocab = std::make_shared<TokenVocab>(bytes, static_cast<int64_t>(bytes.size()));
  auto cg = std::make_shared<CompiledGrammar>(g, vocab, /*walk_budget_ms=*/0.0);
  GrammarMatcher m(cg, {end});
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->words()));
  m.fill(mask.data());
  auto allowed = [&](int32_t id) { return (mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1; };
  EXPECT_EQ(cg->stats().mask_fallbacks, 1);
  EXPECT_TRUE(allowed('a'));
  EXPECT_TRUE(allowed('b'));
  EXPECT_FALSE(allowed(256));  // "bb": allowed by the grammar, left out by the fallback
  EXPECT_FALSE(allowed(end));
  // The output goes on, one byte at a time, and ends in the language.
  std::string out;
  for (int i = 0; i < 20; ++i) {
    const char c = i == 4 ? 'a' : 'b';
    ASSERT_TRUE(m.accept(static_cast<uint8_t>(c)));
    out += c;
  }
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(matches(g, out));
}

}  // namespace
}  // namespace vlm::structured

namespace vlm::structured {
namespace {

// Nesting deeper than the automaton follows (a_k ::= "x" a_{k+1} "y" for 500 rules) leaves a
// state with no way on: the matcher then allows the end tokens, so the reply stops instead of
// leaving the sampler nothing to draw.
TEST(MatcherTest, DeadEndPastTheDepthLimitEndsTheReply) {
  Grammar g;
  std::vector<int32_t> ids;
  for (int i = 0; i < 500; ++i) ids.push_back(g.new_rule("a"));
  for (int i = 0; i + 1 < 500; ++i) {
    Sequence s = g.literal("x");
    s.push_back(Grammar::ref(ids[static_cast<size_t>(i) + 1]));
    s.push_back(g.byte('y'));
    g.add_alternative(ids[static_cast<size_t>(i)], s);
  }
  g.add_alternative(ids.back(), g.literal("z"));
  g.set_root(ids.front());
  ASSERT_TRUE(g.finalize().ok());
  const auto bytes = small_vocab();
  const int32_t V = static_cast<int32_t>(bytes.size());
  auto vocab = std::make_shared<TokenVocab>(bytes, V);
  auto cg = std::make_shared<CompiledGrammar>(g, vocab);
  GrammarMatcher m(cg, {V - 1});
  std::vector<uint64_t> mask(static_cast<size_t>(vocab->words()));
  int xs = 0;
  for (; xs < 600; ++xs) {
    m.fill(mask.data());
    if (!((mask['x' >> 6] >> ('x' & 63)) & 1)) break;
    ASSERT_TRUE(m.accept('x'));
  }
  EXPECT_LT(xs, 500);
  // Nothing but the end is allowed, and it is taken.
  for (int32_t id = 0; id < V; ++id) {
    EXPECT_EQ((mask[static_cast<size_t>(id) >> 6] >> (id & 63)) & 1, id == V - 1 ? 1u : 0u) << id;
  }
  std::vector<float> logits(static_cast<size_t>(V), 0.f);
  m.apply(logits.data());
  EXPECT_FALSE(std::isinf(logits[static_cast<size_t>(V - 1)]));
  EXPECT_TRUE(m.accept(V - 1));
  EXPECT_TRUE(m.terminated());
}

}  // namespace
}  // namespace vlm::structured

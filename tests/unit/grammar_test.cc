// Grammars over bytes: the builder's combinators, UTF-8 code-point sets, finalize()'s checks and
// the pushdown automaton that runs them.
#include "structured/grammar.h"

#include <gtest/gtest.h>

#include "structured/pda.h"

namespace vlm::structured {
namespace {

TEST(GrammarTest, LiteralAlternativesAndRepetition) {
  Grammar g;
  // root ::= "a" ("bc" | "d")* "e"{2,3}
  Sequence body = g.literal("a");
  body.push_back(g.star({g.group({g.literal("bc"), g.literal("d")})}));
  body.push_back(g.repeat(g.literal("e"), 2, 3));
  g.set_root(g.rule("root", {body}));
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_TRUE(matches(g, "aee"));
  EXPECT_TRUE(matches(g, "abcdbceee"));
  EXPECT_FALSE(matches(g, "ae"));
  EXPECT_FALSE(matches(g, "aeeee"));
  EXPECT_FALSE(matches(g, "abee"));
  EXPECT_TRUE(matches_prefix(g, "ab"));
  EXPECT_FALSE(matches_prefix(g, "ax"));
}

TEST(GrammarTest, CodePointsAreExactlyTheirUtf8) {
  Grammar g;
  // Every scalar value except '"' (and the surrogates, which are never scalar values).
  g.set_root(g.rule("root", {{g.code_points({{0, 0x21}, {0x23, 0x10FFFF}})}}));
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_TRUE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "\""));
  EXPECT_TRUE(matches(g, "\xC3\xA9"));           // é
  EXPECT_TRUE(matches(g, "\xE2\x82\xAC"));       // €
  EXPECT_TRUE(matches(g, "\xF0\x9F\x98\x80"));   // 😀
  EXPECT_TRUE(matches(g, "\xF4\x8F\xBF\xBF"));   // U+10FFFF
  EXPECT_FALSE(matches(g, "\xED\xA0\x80"));      // a surrogate
  EXPECT_FALSE(matches(g, "\xC0\xAF"));          // overlong
  EXPECT_FALSE(matches(g, "\xE0\x80\xAF"));      // overlong
  EXPECT_FALSE(matches(g, "\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(matches(g, "\x80"));
  // Every code point of the BMP and a sample above it, against a direct encoding.
  for (uint32_t c = 0; c <= 0x10FFFF; c += (c < 0x10000 ? 1 : 97)) {
    std::string s;
    if (c < 0x80) {
      s += static_cast<char>(c);
    } else if (c < 0x800) {
      s += static_cast<char>(0xC0 | (c >> 6));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
      s += static_cast<char>(0xE0 | (c >> 12));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    } else {
      s += static_cast<char>(0xF0 | (c >> 18));
      s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
      s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
      s += static_cast<char>(0x80 | (c & 0x3F));
    }
    const bool want = c != 0x22 && !(c >= 0xD800 && c <= 0xDFFF);
    ASSERT_EQ(matches(g, s), want) << std::hex << c;
  }
}

TEST(GrammarTest, FinalizeRefusesWhatCannotRun) {
  {
    Grammar g;
    EXPECT_FALSE(g.finalize().ok());  // no root
  }
  {
    Grammar g;  // root ::= root "a" | "b": left recursion
    const int32_t r = g.new_rule("list");
    Sequence s{Grammar::ref(r)};
    s.push_back(g.byte('a'));
    g.add_alternative(r, s);
    g.add_alternative(r, g.literal("b"));
    g.set_root(r);
    const Status st = g.finalize();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("left-recursive at rule 'list'"), std::string::npos);
  }
  {
    Grammar g;  // root ::= loop; loop ::= "a" loop: no finite text
    const int32_t r = g.new_rule("loop");
    Sequence s = g.literal("a");
    s.push_back(Grammar::ref(r));
    g.add_alternative(r, s);
    g.set_root(g.rule("root", {{Grammar::ref(r)}}));
    EXPECT_FALSE(g.finalize().ok());
  }
  {
    Grammar g;  // a dead alternative is dropped, the rest runs
    const int32_t dead = g.new_rule("dead");
    Sequence s = g.literal("x");
    s.push_back(Grammar::ref(dead));
    g.add_alternative(dead, s);
    Sequence a = g.literal("a");
    a.push_back(Grammar::ref(dead));
    g.set_root(g.rule("root", {a, g.literal("b")}));
    ASSERT_TRUE(g.finalize().ok());
    EXPECT_FALSE(matches_prefix(g, "a"));  // no path into the dead rule
    EXPECT_TRUE(matches(g, "b"));
  }
}

TEST(GrammarTest, RightRecursionKeepsStacksFlat) {
  Grammar g;
  g.set_root(g.rule("root", {{g.star(g.literal("ab"))}}));
  ASSERT_TRUE(g.finalize().ok());
  Pda pda(g);
  StackSet s = pda.initial();
  for (int i = 0; i < 2000; ++i) {
    s = pda.advance(s, 'a');
    s = pda.advance(s, 'b');
    ASSERT_FALSE(s.empty());
    for (const Stack& st : s) ASSERT_LE(st.size(), 2u);
  }
  EXPECT_TRUE(pda.accepting(s));
}

TEST(GrammarTest, LongChainsOfRulesNeitherRecurseNorTakeQuadraticTime) {
  // r0 ::= r1; r1 ::= r2; ...; r_{n-1} ::= "a": finalize() and the automaton walk the chain with
  // their own stacks and linear worklists, at any length within the element limit.
  Grammar g;
  constexpr int kRules = 200000;
  std::vector<int32_t> ids;
  for (int i = 0; i < kRules; ++i) ids.push_back(g.new_rule("r"));
  for (int i = 0; i + 1 < kRules; ++i) {
    g.add_alternative(ids[static_cast<size_t>(i)], {Grammar::ref(ids[static_cast<size_t>(i) + 1])});
  }
  g.add_alternative(ids.back(), g.literal("a"));
  g.set_root(ids.front());
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_TRUE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "b"));
}

}  // namespace
}  // namespace vlm::structured

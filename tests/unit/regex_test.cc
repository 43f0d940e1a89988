// The regular-expression and GBNF front ends: each piece of syntax against texts it must and must
// not match, the JSON-string spelling mode, every refusal, and a randomized comparison with
// std::regex.
#include "structured/regex.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "structured/gbnf.h"

namespace vlm::structured {
namespace {

// Compiles `pattern` and checks each text in `yes` matches and each in `no` does not.
void expect_language(const std::string& pattern, const std::vector<std::string>& yes,
                     const std::vector<std::string>& no) {
  SCOPED_TRACE("pattern: " + pattern);
  Result<Grammar> g = compile_regex(pattern);
  ASSERT_TRUE(g.ok()) << g.status().message();
  for (const std::string& s : yes) EXPECT_TRUE(matches(*g, s)) << "should match: " << s;
  for (const std::string& s : no) EXPECT_FALSE(matches(*g, s)) << "should not match: " << s;
}

// Checks that `pattern` is refused with a message holding `what` and its offset.
void expect_regex_error(const std::string& pattern, const std::string& what, size_t offset) {
  SCOPED_TRACE("pattern: " + pattern);
  Result<Grammar> g = compile_regex(pattern);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  const std::string& m = g.status().message();
  EXPECT_NE(m.find(what), std::string::npos) << m;
  EXPECT_NE(m.find("(offset " + std::to_string(offset) + ")"), std::string::npos) << m;
  EXPECT_EQ(m.rfind("regex: ", 0), 0u) << m;
}

// A string's content as JSON spells it (Python's json.dumps with ensure_ascii=False).
std::string json_spelling(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out;
}

// root ::= '"' pattern-in-JSON-spelling '"'
Result<Grammar> json_string_grammar(const std::string& pattern) {
  Grammar g;
  Sequence s = g.literal("\"");
  VLM_ASSIGN_OR_RETURN(const Element e, add_regex(&g, pattern, true));
  s.push_back(e);
  s.push_back(g.byte('"'));
  g.set_root(g.rule("root", {s}));
  VLM_RETURN_IF_ERROR(g.finalize());
  return g;
}

TEST(RegexTest, Literals) {
  expect_language("abc", {"abc"}, {"", "ab", "abcd", "abd", "ABC"});
  expect_language("h\xC3\xA9llo\xF0\x9F\x98\x80", {"h\xC3\xA9llo\xF0\x9F\x98\x80"},
                  {"hello", "h\xC3\xA9llo"});
  expect_language("", {""}, {"a"});
  // A '{', '}' or ']' that starts no quantifier or class is literal text.
  expect_language("a{", {"a{"}, {"a"});
  expect_language("a{x}", {"a{x}"}, {"a"});
  expect_language("a{1,2", {"a{1,2"}, {"a"});
  expect_language("{}]", {"{}]"}, {""});
}

TEST(RegexTest, Dot) {
  expect_language("a.c",
                  {"abc", "a c", "a\tc", "a.c",
                   "a\xC3\xA9"
                   "c",
                   "a\xE2\x82\xAC"
                   "c",
                   "a\xF0\x9F\x98\x80"
                   "c"},
                  {"ac", "a\nc", "a\rc",
                   "a\xE2\x80\xA8"
                   "c",
                   "abbc"});
  expect_language(".", {"\xF0\x9F\x98\x80"}, {"\n", "\xF0\x9F\x98", "\x80"});
}

TEST(RegexTest, CharacterClasses) {
  expect_language("[abc]+", {"a", "cab"}, {"", "d", "abd"});
  expect_language("[a-z0-9_]+", {"abc_09"}, {"A", "-"});
  // Greek small letters α (U+03B1) to ω (U+03C9).
  expect_language("[\xCE\xB1-\xCF\x89]+", {"\xCE\xB1\xCE\xB2\xCE\xB3", "\xCF\x89"},
                  {"abc", "\xCE\x91", "\xCF\x8A"});
  expect_language("[^a-z]", {"A", "\n", "\xC3\xA9", "\xF0\x9F\x98\x80"}, {"a", "z", "AB"});
  expect_language("[^\xC3\xA9]", {"e", "\xC3\xA8"}, {"\xC3\xA9"});
  expect_language("[-a]+", {"-a-"}, {"b"});
  expect_language("[a-]+", {"-a-"}, {"b"});
  expect_language("[\\]\\[\\-]+", {"[]-"}, {"a"});
  expect_language("[[]", {"["}, {"]"});
  expect_language("[\\d.]+", {"3.14"}, {"a"});
  expect_language("[^\\d\\s]", {"a", "-"}, {"1", " ", "\n", "\xC2\xA0"});
  expect_language("[\\x41-\\x43\\u00e9]", {"A", "C", "\xC3\xA9"}, {"D"});
  expect_language("[\\b]", {"\b"}, {"b"});
  expect_language("[.*+?(){}|^$]+", {".*+?(){}|^$"}, {"a"});
}

TEST(RegexTest, ClassEscapes) {
  expect_language("\\d+", {"0123456789"}, {"a", "\xD9\xA3"});
  expect_language("\\w+", {"aZ_9"}, {"-", "\xC3\xA9"});
  // \D and \W are ASCII only: Python's \d and \w also hold non-ASCII digits and letters (é, the
  // Arabic-Indic three U+0663, U+4307), which Python's \D and \W then leave out.
  expect_language("\\D", {"a", "\n", "\x7F"}, {"5", "\xC3\xA9", "\xD9\xA3", "\xE4\x8C\x87"});
  expect_language("\\W", {"-", " ", "\x7F"}, {"a", "_", "7", "\xC3\xA9", "\xE4\x8C\x87"});
  expect_language("\\s+", {" \t\n\r\f\v"}, {"a"});
  // \S leaves out every character either dialect counts as whitespace, so that its output
  // is never whitespace to either.
  expect_language("\\S", {"a", "\xC3\xA9"}, {" ", "\n", "\xC2\xA0", "\xE3\x80\x80"});
  expect_language("[^\\S]", {" ", "\t", "\n"}, {"a", "\x1C", "\xC2\xA0", "\xE3\x80\x80"});
}

TEST(RegexTest, NegatedUnicodeClassesAreAscii) {
  // Whatever these match, Python's re matches too: a class or negation whose non-ASCII part
  // depends on Unicode's digits or letters keeps to ASCII.
  expect_language("[^\\d]", {"a", "-"}, {"7", "\xD9\xA3", "\xC3\xA9"});
  expect_language("[^\\w]", {"-", " "}, {"a", "_", "\xC3\xA9", "\xE4\x8C\x87"});
  expect_language("[^\\D]", {"0", "9"}, {"a", "\xD9\xA3"});
  expect_language("[^\\W]", {"a", "_", "0"}, {"-", "\xC3\xA9"});
  expect_language("[^\\dx\xC3\xA9]", {"a"}, {"x", "1", "\xC3\xA9", "\xC3\xA8"});
  expect_language("[\\D\xC3\xA9]", {"a", "\xC3\xA9"}, {"1", "\xC3\xA8"});
  // No character outside ASCII at all, over every 2-byte UTF-8 character and a sample of longer
  // ones (CJK, Arabic-Indic and mathematical digits, letters, symbols).
  std::vector<std::string> non_ascii;
  for (uint32_t c = 0x80; c < 0x800; ++c) {
    non_ascii.push_back(
        std::string{static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))});
  }
  for (const char* c : {"\xE4\x8C\x87", "\xE2\x85\xAB", "\xE2\x82\xAC", "\xEF\xBC\x91",
                        "\xF0\x9D\x9F\x99", "\xF0\x9F\x98\x80"}) {
    non_ascii.push_back(c);
  }
  for (const char* p : {"\\D", "\\W", "[^\\d]", "[^\\w]", "[^\\d\\s]", "[^a\\W]"}) {
    SCOPED_TRACE(std::string("pattern: ") + p);
    Result<Grammar> g = compile_regex(p);
    ASSERT_TRUE(g.ok()) << g.status().message();
    for (const std::string& c : non_ascii) ASSERT_FALSE(matches(*g, c)) << c;
  }
}

TEST(RegexTest, CharacterEscapes) {
  expect_language("\\n\\t\\r\\f\\v", {"\n\t\r\f\v"}, {"ntrfv"});
  expect_language(std::string("\\0", 2), {std::string(1, '\0')}, {"0"});
  expect_language("\\012", {"\n"}, {});
  expect_language("\\x41\\u00e9\\u{1F600}", {"A\xC3\xA9\xF0\x9F\x98\x80"}, {});
  expect_language("\\uD83D\\uDE00", {"\xF0\x9F\x98\x80"}, {});  // a UTF-16 surrogate pair
  expect_language("\\cJ", {"\n"}, {"cJ"});
  expect_language("\\.\\*\\\\\\/\\-\\[\\]\\(\\)\\{\\}\\|\\?\\+\\^\\$", {".*\\/-[](){}|?+^$"}, {});
}

TEST(RegexTest, GroupsAndAlternation) {
  expect_language("(ab)+", {"ab", "abab"}, {"", "aba"});
  expect_language("(?:ab|cd)*e", {"e", "abcde"}, {"abc", "ace"});
  expect_language("(?P<x>a)b", {"ab"}, {"a"});
  expect_language("(?<year>\\d{4})-(?<m>\\d{2})", {"2024-01"}, {"24-01"});
  expect_language("a|bc|", {"", "a", "bc"}, {"b", "abc"});
  expect_language("(a|b)(c|d)", {"ac", "bd"}, {"ab", "a"});
  expect_language("()", {""}, {"a"});
  expect_language("a(?#a comment)b", {"ab"}, {"a b"});
  expect_language("a(|b|)c", {"ac", "abc"}, {"abbc"});
  expect_language("(a?|b?)+", {"", "ab", "bba"}, {"c"});
}

TEST(RegexTest, EmptyBranchesAreMergedAway) {
  // `(|)` is the empty string and `(a|)` an optional a: a row of such groups adds no ways to
  // match nothing, so the grammar stays small and each state has few parse stacks.
  std::string p = "x";
  for (int i = 0; i < 24; ++i) p += "(|)";
  p += "y";
  Result<Grammar> g = compile_regex(p);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(matches(*g, "xy"));
  EXPECT_FALSE(matches(*g, "x"));
  EXPECT_LT(g->rules().size(), 4u) << g->to_string();
  std::string q = "x";
  for (int i = 0; i < 24; ++i) q += "(a|)";
  Result<Grammar> h = compile_regex(q);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_TRUE(matches(*h, "x"));
  EXPECT_TRUE(matches(*h, "x" + std::string(24, 'a')));
  EXPECT_FALSE(matches(*h, "x" + std::string(25, 'a')));
  for (const Rule& r : h->rules()) {
    int empty = 0;
    for (const Sequence& alt : r.alternatives) empty += alt.empty();
    EXPECT_LE(empty, 1) << r.name;
  }
}

TEST(RegexTest, Quantifiers) {
  expect_language("a*", {"", "aaaa"}, {"b"});
  expect_language("a+", {"a", "aaa"}, {""});
  expect_language("ab?", {"a", "ab"}, {"abb"});
  expect_language("a{3}", {"aaa"}, {"aa", "aaaa"});
  expect_language("a{2,}", {"aa", "aaaaaaa"}, {"a"});
  expect_language("a{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"});
  expect_language("a{0}b", {"b"}, {"ab"});
  expect_language("a{0,0}", {""}, {"a"});
  expect_language("(ab){1,2}c", {"abc", "ababc"}, {"c", "abababc"});
  // Lazy forms: the same language.
  expect_language("a*?b", {"b", "aab"}, {"a"});
  expect_language("a+?", {"a", "aa"}, {""});
  expect_language("a??", {"", "a"}, {"aa"});
  expect_language("a{2,3}?", {"aa", "aaa"}, {"a", "aaaa"});
  // The largest counts allowed.
  expect_language("a{10000}", {std::string(10000, 'a')}, {std::string(9999, 'a')});
  expect_language("(b{0,3}){0,3}", {"", "bbbbbbbbb"}, {"bbbbbbbbbb", "c"});
}

TEST(RegexTest, RepeatingWhatMayBeEmpty) {
  // A repeated body that can match nothing must not make the grammar loop or recurse left.
  expect_language("(a*)*", {"", "a", "aaa"}, {"b"});
  expect_language("(a*)+", {"", "aaa"}, {"b"});
  expect_language("(a?b?)*c", {"c", "abababc", "bbac"}, {"", "abd"});
  expect_language("(|a)+", {"", "aa"}, {"b"});
  expect_language("(a*){2,5}b", {"b", "aaaaaab"}, {"ba"});
  expect_language("(a*|b)*", {"", "abba"}, {"c"});
  expect_language("()*x", {"x"}, {""});
  expect_language("(?:(?:a|)(?:b|))*", {"", "ab", "ba", "bbb"}, {"c"});
  expect_language("((a*)(b*)){3}", {"", "ab", "aabbab", "ababa"}, {"c", "abababa"});
}

TEST(RegexTest, Anchors) {
  expect_language("^abc$", {"abc"}, {"ab"});
  expect_language("^(a|b)+$", {"ab"}, {""});
  expect_language("(^a|^b)c$", {"ac", "bc"}, {"c"});
  expect_language("^a|^b", {"a", "b"}, {"ab"});
  expect_language("(a$|b$)", {"a", "b"}, {"ab"});
  expect_language("^$", {""}, {"a"});
  expect_regex_error("a^b", "'^' is only supported at the start", 1);
  expect_regex_error("a$b", "'$' is only supported at the end", 1);
  expect_regex_error("(a$|b)c", "'$'", 2);
  expect_regex_error("(^a)*", "'^'", 1);
  expect_regex_error("^*", "nothing to repeat", 1);
}

TEST(RegexTest, Refusals) {
  expect_regex_error("ab(?=c)", "lookahead is not supported", 2);
  expect_regex_error("(?!c)", "negative lookahead is not supported", 0);
  expect_regex_error("x(?<=a)b", "lookbehind is not supported", 1);
  expect_regex_error("(?<!a)b", "negative lookbehind is not supported", 0);
  expect_regex_error("(a)\\1", "backreference is not supported", 3);
  expect_regex_error("(?P<n>a)(?P=n)", "backreference is not supported", 8);
  expect_regex_error("(?<n>a)\\k<n>", "backreference is not supported", 7);
  expect_regex_error("a\\bc", "word boundary \\b is not supported", 1);
  expect_regex_error("\\Ba", "word boundary \\B is not supported", 0);
  expect_regex_error("(?i)abc", "inline flag is not supported", 0);
  expect_regex_error("a(?i:b)", "inline flag is not supported", 1);
  expect_regex_error("(?>a)", "atomic group is not supported", 0);
  expect_regex_error("a*+", "possessive quantifier is not supported", 2);
  expect_regex_error("\\p{L}", "Unicode property escape is not supported", 0);
  expect_regex_error("\\N{DASH}", "named character escape is not supported", 0);
  expect_regex_error("[\\1]", "octal escape in a class is not supported", 1);
  expect_regex_error("a{10001}", "repetition count above 10000 is not supported", 1);
  expect_regex_error("a{2,10001}", "repetition count above 10000", 1);
  expect_regex_error("\\uD800", "lone surrogate is not supported", 0);
  expect_regex_error(std::string(101, '(') + std::string(101, ')'), "nesting deeper", 100);
}

TEST(RegexTest, SyntaxErrors) {
  expect_regex_error("a**", "multiple repeat", 2);
  expect_regex_error("a{2}{3}", "multiple repeat", 4);
  expect_regex_error("a*??", "multiple repeat", 3);
  expect_regex_error("*a", "nothing to repeat", 0);
  expect_regex_error("a|+", "nothing to repeat", 2);
  expect_regex_error("({2})", "nothing to repeat", 1);
  expect_regex_error("a{3,2}", "bad repetition range {3,2}", 1);
  expect_regex_error("a{,3}", "write {0,n}", 1);
  expect_regex_error("(ab", "missing ')'", 0);
  expect_regex_error("a(b(c)", "missing ')'", 1);
  expect_regex_error("ab)", "unbalanced ')'", 2);
  expect_regex_error("[ab", "unterminated character class", 0);
  expect_regex_error("x[]a]", "write \\]", 2);
  expect_regex_error("[^]", "write \\]", 2);
  expect_regex_error("[z-a]", "bad character range z-a", 1);
  expect_regex_error("[\\d-z]", "bad character range", 1);
  expect_regex_error("a\\q", "unknown escape \\q", 1);
  // Python's \A, \Z and \U are ECMAScript's letters: no reading both share.
  expect_regex_error("\\Aab", "unknown escape \\A", 0);
  expect_regex_error("ab\\Z", "unknown escape \\Z", 2);
  expect_regex_error("\\U0001F600", "unknown escape \\U", 0);
  expect_regex_error("\\x4g", "bad escape \\x4", 0);
  expect_regex_error("\\u{110000}", "bad escape", 0);
  expect_regex_error("abc\\", "trailing backslash", 3);
  expect_regex_error("a\xFF", "invalid UTF-8", 1);
  expect_regex_error("(?<1>a)", "bad group name", 3);
  expect_regex_error("(?Q)", "unknown group syntax", 0);
  expect_regex_error("(?x)a b", "inline flag", 0);
  expect_regex_error("(?", "unknown group syntax", 0);
}

TEST(RegexTest, SizeLimits) {
  // Each bounded repetition unrolls into rules; enough of them pass kMaxGrammarElements.
  std::string big;
  for (int i = 0; i < 40; ++i) big += "(a{0,10000})";
  Result<Grammar> g = compile_regex(big);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("grammar elements"), std::string::npos)
      << g.status().message();
  // A long literal is one element per byte, with no recursion in the compiler.
  const std::string text(100000, 'x');
  expect_language(text, {text}, {text.substr(1)});
}

TEST(RegexTest, EmptyLanguageIsReported) {
  // A class with no characters at all leaves the pattern with no text.
  Result<Grammar> g = compile_regex("[^\\x00-\\u{10FFFF}]");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("regex: "), std::string::npos);
  // Inside an alternation it is just a dead branch.
  expect_language("a|[^\\x00-\\u{10FFFF}]", {"a"}, {""});
}

TEST(RegexTest, JsonStringSpelling) {
  {
    // The pattern a"b\c: its one string, spelled a\"b\\c in JSON.
    Result<Grammar> g = json_string_grammar("a\"b\\\\c");
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_TRUE(matches(*g, "\"a\\\"b\\\\c\""));
    EXPECT_FALSE(matches(*g, "\"a\"b\\c\""));
    EXPECT_FALSE(matches(*g, "\"a\\\"b\\c\""));
  }
  {
    // Every ASCII character, each in its one JSON spelling.
    Result<Grammar> g = json_string_grammar("[\\x00-\\x7f]");
    ASSERT_TRUE(g.ok()) << g.status().message();
    for (int c = 0; c < 128; ++c) {
      const std::string s(1, static_cast<char>(c));
      EXPECT_TRUE(matches(*g, "\"" + json_spelling(s) + "\"")) << c;
      if (c < 0x20 || c == '"' || c == '\\') {
        EXPECT_FALSE(matches(*g, "\"" + s + "\"")) << c;
      }
    }
    EXPECT_FALSE(matches(*g, "\"\\u001F\""));  // one canonical spelling: lower-case hex
    EXPECT_FALSE(matches(*g, "\"\\u000a\""));  // \n has its short form
    EXPECT_FALSE(matches(*g, "\"\\/\""));
  }
  {
    Result<Grammar> g = json_string_grammar(".+");
    ASSERT_TRUE(g.ok()) << g.status().message();
    EXPECT_TRUE(matches(*g, "\"a\\tb\\\"\xF0\x9F\x98\x80\""));
    EXPECT_FALSE(matches(*g, "\"a\\nb\""));  // '.' is no newline
    EXPECT_FALSE(matches(*g, "\"a\nb\""));
  }
  // For a sample of strings, the JSON spelling is in the JSON-string language exactly when the
  // string itself is in the plain language.
  const std::vector<std::string> patterns = {"(\\w|\\s|[\"\\\\/]|[\\x00-\\x1f])*", "[^a-z]{0,4}",
                                             "(a\"|\\\\b|\\n)+", ".{1,3}",
                                             "[\\t-\\r]*[\\x01-\\x1e]?"};
  const std::vector<std::string> alphabet = {"a",    "b",    "Z",        "_",           " ",
                                             "\"",   "\\",   "/",        "\n",          "\t",
                                             "\x01", "\x1f", "\xC3\xA9", "\xE2\x82\xAC"};
  std::mt19937 rng(7);
  for (const std::string& p : patterns) {
    SCOPED_TRACE("pattern: " + p);
    Result<Grammar> plain = compile_regex(p);
    Result<Grammar> json = json_string_grammar(p);
    ASSERT_TRUE(plain.ok() && json.ok());
    int in = 0;
    for (int i = 0; i < 300; ++i) {
      std::string s;
      const int len = static_cast<int>(rng() % 5);
      for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
      const bool want = matches(*plain, s);
      in += want;
      EXPECT_EQ(matches(*json, "\"" + json_spelling(s) + "\""), want) << json_spelling(s);
    }
    EXPECT_GT(in, 0);
  }
}

TEST(RegexTest, AddRegexEmbedsWithoutFinalizing) {
  Grammar g;
  Sequence s = g.literal("id=");
  Result<Element> e = add_regex(&g, "[0-9]{2}", false);
  ASSERT_TRUE(e.ok());
  s.push_back(*e);
  g.set_root(g.rule("root", {s}));
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_TRUE(matches(g, "id=42"));
  EXPECT_FALSE(matches(g, "id=4"));
  EXPECT_FALSE(add_regex(&g, "(?=x)", false).ok());
}

TEST(RegexTest, AgreesWithStdRegex) {
  // Patterns both dialects read alike, on random strings over a small alphabet.
  const std::vector<std::string> patterns = {
      "(a|b)*c",          "a{2,3}b?",       "[a-c]+[^ab]*",   "(ab|a)(c|bcd)?d*",
      "x?(y|z{1,2})*",    "\\d+(\\.\\d*)?", "(a*)*b",         "(a|)+c",
      "[\\w-]{0,3}\\s?",  "a.c|.b",         "(?:[^\\s]\\S)*", "(a?b?){2,3}",
      "([ab]{1,2}|c)+d?", "\\W\\D?",        "((a|b)(c|))*",   "[^a-c0-9]+"};
  std::mt19937 rng(1234);
  for (const std::string& p : patterns) {
    SCOPED_TRACE("pattern: " + p);
    // The pattern's own letters and digits, and a few characters outside every class.
    std::string alphabet = "x.-_ \n\r09";
    for (char c : p) {
      if (std::isalnum(static_cast<unsigned char>(c)) && alphabet.find(c) == std::string::npos) {
        alphabet += c;
      }
    }
    Result<Grammar> g = compile_regex(p);
    ASSERT_TRUE(g.ok()) << g.status().message();
    const std::regex re(p, std::regex::ECMAScript);
    int in = 0;
    for (int i = 0; i < 600; ++i) {
      std::string s;
      const int len = static_cast<int>(rng() % 7);
      for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
      const bool want = std::regex_match(s, re);
      in += want;
      ASSERT_EQ(matches(*g, s), want) << "text: '" << s << "'";
    }
    EXPECT_GT(in, 0);
  }
}

// GBNF.

Grammar gbnf_ok(const std::string& text) {
  Result<Grammar> g = parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) {
    Grammar empty;  // matches nothing, so the checks after fail instead of crashing
    empty.set_root(empty.rule("root", {{empty.bytes(ByteSet{})}, {}}));
    EXPECT_TRUE(empty.finalize().ok());
    return empty;
  }
  return std::move(g).value();
}

void expect_gbnf_error(const std::string& text, const std::string& what) {
  SCOPED_TRACE("grammar: " + text);
  Result<Grammar> g = parse_gbnf(text);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find(what), std::string::npos) << g.status().message();
}

TEST(GbnfTest, JsonGrammar) {
  const Grammar g = gbnf_ok(R"gbnf(
root   ::= value
value  ::= object | array | string | number | ("true" | "false" | "null")

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}"

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]"

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\""

number ::= "-"? ([0-9] | [1-9] [0-9]{1,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws ::= | " " | "\n"
)gbnf");
  for (const char* yes : {"true", "null", "-12.5e+3", "\"a\\n\\u00e9\xC3\xA9\"", "[]",
                          "[1,2,\n\"x\"]", "{\"a\": [true], \"b\":{}}"}) {
    EXPECT_TRUE(matches(g, yes)) << yes;
  }
  for (const char* no : {"tru", "01", "\"a\nb\"", "\"\\x\"", "[1,]", "{\"a\" 1}", "{a:1}"}) {
    EXPECT_FALSE(matches(g, no)) << no;
  }
  EXPECT_TRUE(matches_prefix(g, "{\"a\": [tr"));
}

TEST(GbnfTest, Arithmetic) {
  const Grammar g = gbnf_ok(
      "root   ::= expr\n"
      "expr   ::= term ((\"+\" | \"-\") term)*\n"
      "term   ::= factor ((\"*\" | \"/\") factor)*\n"
      "factor ::= number | \"(\" expr \")\" | \"-\" factor\n"
      "number ::= [0-9]+\n");
  for (const char* yes : {"1", "1+2*(3-4)", "-(1)", "((2))/--3"}) EXPECT_TRUE(matches(g, yes));
  for (const char* no : {"", "1+", "(1", "1)", "a"}) EXPECT_FALSE(matches(g, no)) << no;
}

TEST(GbnfTest, CommentsAndMultiLineRules) {
  const Grammar g = gbnf_ok(
      "# greetings\n"
      "root ::= greeting # a trailing comment\n"
      "  \" \" name  # the rule goes on: this line starts no new rule\n"
      "\n"
      "greeting ::= \"hello\"\n"
      "  | \"hi\"   # alternatives on lines of their own\n"
      "name ::= [A-Z] [a-z]*");
  EXPECT_TRUE(matches(g, "hello Ann"));
  EXPECT_TRUE(matches(g, "hi Bo"));
  EXPECT_FALSE(matches(g, "hello"));
  EXPECT_FALSE(matches(g, "hey Ann"));
  EXPECT_FALSE(matches(g, "hi ann"));
}

TEST(GbnfTest, LiteralsAndClasses) {
  const Grammar lit = gbnf_ok(R"(root ::= "a\tb\n\"\\\x41\u00e9\U0001F600\[\]" "" "")");
  EXPECT_TRUE(matches(lit, "a\tb\n\"\\A\xC3\xA9\xF0\x9F\x98\x80[]"));
  EXPECT_FALSE(matches(lit, "a\\tb"));

  const Grammar neg = gbnf_ok(R"(root ::= [^a-z\n]+)");
  EXPECT_TRUE(matches(neg, "ABC"));
  EXPECT_TRUE(matches(neg, "\xC3\xA9\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(neg, "a"));
  EXPECT_FALSE(matches(neg, "\n"));

  const Grammar cls = gbnf_ok(R"(root ::= [a-c\]\-]+ [\u03b1-\u03c9] [-x])");
  EXPECT_TRUE(matches(cls, "ab]-c\xCE\xB2-"));
  EXPECT_TRUE(matches(cls, "a\xCE\xB1x"));
  EXPECT_FALSE(matches(cls, "d\xCE\xB1x"));

  const Grammar any = gbnf_ok("root ::= . .");
  EXPECT_TRUE(matches(any, "\n\xF0\x9F\x98\x80"));
  EXPECT_FALSE(matches(any, "a"));
}

TEST(GbnfTest, Repetition) {
  const Grammar g = gbnf_ok(R"(root ::= "ab"{2,3} "c"{2} "d"{1,} ( "e" "f" ){ 0 , 1 } x?
x ::= "x")");
  EXPECT_TRUE(matches(g, "ababccd"));
  EXPECT_TRUE(matches(g, "abababccdddefx"));
  EXPECT_FALSE(matches(g, "abccd"));
  EXPECT_FALSE(matches(g, "ababababccd"));
  EXPECT_FALSE(matches(g, "ababcd"));
  EXPECT_FALSE(matches(g, "ababcc"));
  EXPECT_FALSE(matches(g, "ababccdee"));
}

TEST(GbnfTest, RepeatingWhatMayBeEmpty) {
  // The repetition takes the body's non-empty form, so these are not left-recursive.
  const Grammar star = gbnf_ok(R"(root ::= ("a"?)* "b")");
  for (const char* yes : {"b", "ab", "aaab"}) EXPECT_TRUE(matches(star, yes)) << yes;
  for (const char* no : {"", "a", "ba"}) EXPECT_FALSE(matches(star, no)) << no;
  const Grammar plus = gbnf_ok(R"(root ::= ("a" | "")+)");
  for (const char* yes : {"", "a", "aaa"}) EXPECT_TRUE(matches(plus, yes)) << yes;
  EXPECT_FALSE(matches(plus, "b"));
  const Grammar at_least = gbnf_ok(R"(root ::= x{2,} "." 
x ::= "a"? "b"?)");
  for (const char* yes : {".", "a.", "abba."}) EXPECT_TRUE(matches(at_least, yes)) << yes;
  EXPECT_FALSE(matches(at_least, "c."));
  // Through rules, defined before or after their use, and nested repetitions.
  const Grammar words = gbnf_ok(R"(root ::= item* "."
item ::= ws word
ws   ::= " "*
word ::= [a-z]*)");
  for (const char* yes : {".", "ab.", " ab  cd.", "   ."}) EXPECT_TRUE(matches(words, yes)) << yes;
  for (const char* no : {"", "A.", "ab"}) EXPECT_FALSE(matches(words, no)) << no;
  const Grammar nested = gbnf_ok(R"(root ::= (a b)+ "!"
a ::= "x"?
b ::= ("y" | a)*)");
  for (const char* yes : {"!", "x!", "yxyy!", "xxx!"}) EXPECT_TRUE(matches(nested, yes)) << yes;
  EXPECT_FALSE(matches(nested, "z!"));
  // Each agrees with the same regular expression on random texts.
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {R"(root ::= ("a"? "b"?)* "c")", "(a?b?)*c"},
      {R"(root ::= ("a"* | "b"){2,} "c"?)", "(a*|b){2,}c?"},
      {R"(root ::= (("a" | "")("b" | ""))+)", "((a|)(b|))+"},
      {"root ::= (x \"c\")* x\nx ::= (\"a\"? \"b\")*", "((a?b)*c)*(a?b)*"}};
  std::mt19937 rng(99);
  for (const auto& [gbnf, pattern] : pairs) {
    SCOPED_TRACE("grammar: " + gbnf);
    const Grammar g = gbnf_ok(gbnf);
    Result<Grammar> re = compile_regex(pattern);
    ASSERT_TRUE(re.ok()) << re.status().message();
    for (int i = 0; i < 300; ++i) {
      std::string s;
      const int len = static_cast<int>(rng() % 7);
      for (int k = 0; k < len; ++k) s += "abcd"[rng() % 4];
      ASSERT_EQ(matches(g, s), matches(*re, s)) << "text: '" << s << "'";
    }
  }
}

TEST(GbnfTest, EmptyAlternativesAreKeptOnce) {
  std::string text = "root ::= \"x\"";
  for (int i = 0; i < 24; ++i) text += " (\"\" | \"\")";
  text += " \"y\"";
  const Grammar g = gbnf_ok(text);
  EXPECT_TRUE(matches(g, "xy"));
  EXPECT_FALSE(matches(g, "x"));
  for (const Rule& r : g.rules()) EXPECT_LE(r.alternatives.size(), 1u) << r.name;
}

TEST(GbnfTest, Errors) {
  expect_gbnf_error("root ::= foo\n", "undefined rule 'foo' (line 1, column 10)");
  expect_gbnf_error("root ::= \"a\"\n\nexpr ::= x y\n", "undefined rule 'x' (line 3, column 10)");
  expect_gbnf_error("expr ::= \"a\"\n", "no 'root' rule");
  expect_gbnf_error("root ::= root \"a\" | \"b\"\n", "left-recursive");
  expect_gbnf_error("root ::= (\"a\"? root)* \"b\"", "left-recursive");
  expect_gbnf_error("root ::= \"a\n", "unterminated string literal (line 1, column 10)");
  expect_gbnf_error("root ::= \"\\q\"", "unknown escape '\\q' (line 1, column 11)");
  expect_gbnf_error("root ::= \"\\x4\"", "expected 2 hex digits");
  expect_gbnf_error("root ::= \"\\uD800\"", "not a Unicode scalar value");
  expect_gbnf_error("root ::= [a-", "unterminated character class");
  expect_gbnf_error("root ::= [z-a]", "character range in the wrong order");
  expect_gbnf_error("root ::= (\"a\"", "missing ')'");
  expect_gbnf_error("root ::= \"a\")", "unbalanced ')' (line 1, column 13)");
  expect_gbnf_error("root ::= * \"a\"", "nothing before '*'");
  expect_gbnf_error("root ::= \"a\"{3,2}", "wrong order");
  expect_gbnf_error("root ::= \"a\"{,2}", "expected a number after '{'");
  expect_gbnf_error("root ::= \"a\"{10001}", "above 10000");
  expect_gbnf_error("root = \"a\"", "expected '::=' after 'root' (line 1, column 6)");
  expect_gbnf_error("root ::= \"a\"\nroot ::= \"b\"", "rule 'root' is defined twice (line 2");
  expect_gbnf_error("root ::= \"\xC3\xA9\" @", "unexpected '@' (line 1, column 14)");
  expect_gbnf_error("root ::= [^\\x00-\\U0010FFFF]", "matches no text");
}

}  // namespace
}  // namespace vlm::structured

// JSON Schema → grammar: every supported keyword against texts that must and must not match, the
// subsets chosen on purpose (whitespace, digit caps, property order), and the refusals, which
// name the keyword and its place.
#include "structured/json_schema.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "structured/pda.h"

namespace vlm::structured {
namespace {

Grammar compile(const std::string& schema) {
  auto g = compile_json_schema(schema);
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status().message();
  if (!g.ok()) return Grammar();
  return std::move(g).value();
}

// The error message of a schema that must be refused.
std::string error_of(const std::string& schema) {
  auto g = compile_json_schema(schema);
  EXPECT_FALSE(g.ok()) << schema;
  if (g.ok()) return "";
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  return g.status().message();
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A random text of the grammar: a walk over the automaton that stops, when it may, with some
// probability. Empty when it ran too long.
std::string sample(const Grammar& g, std::mt19937* rng, size_t limit = 4000) {
  Pda pda(g);
  StackSet s = pda.initial();
  std::string out;
  while (out.size() < limit) {
    if (pda.accepting(s) && (*rng)() % 4 == 0) return out;
    const ByteSet next = pda.next_bytes(s);
    std::vector<uint8_t> options;
    for (int b = 0; b < 256; ++b) {
      if (next.has(static_cast<uint8_t>(b))) options.push_back(static_cast<uint8_t>(b));
    }
    if (options.empty()) {
      EXPECT_TRUE(pda.accepting(s)) << "dead end after " << out;
      return out;
    }
    // Closing brackets and quotes are favoured so that the walk ends.
    uint8_t b = options[(*rng)() % options.size()];
    for (uint8_t c : {'"', '}', ']'}) {
      if (next.has(c) && (*rng)() % 3 == 0) b = c;
    }
    out += static_cast<char>(b);
    s = pda.advance(s, b);
  }
  return "";
}

TEST(JsonSchemaTest, AnyValueAndBooleanSchemas) {
  for (const char* schema : {"{}", "true", R"({"title": "x", "description": "y"})"}) {
    const Grammar g = compile(schema);
    for (const char* ok : {"1", "-0.5e-3", "\"s\"", "true", "false", "null", "[]", "[1, \"a\"]",
                           "{}", R"({"a": {"b": [null, {}]}})", "{ }", "[\n1]"}) {
      EXPECT_TRUE(matches(g, ok)) << schema << " " << ok;
    }
    for (const char* bad : {"", " 1", "1 ", "[1,]", "{\"a\"}", "nul", "01", "[  1]"}) {
      EXPECT_FALSE(matches(g, bad)) << schema << " " << bad;
    }
  }
  EXPECT_TRUE(has(error_of("false"), "'false' matches nothing at #"));
  EXPECT_TRUE(has(error_of("{\"type\": "), "not valid JSON"));
  EXPECT_TRUE(has(error_of("3"), "must be an object or a boolean at #"));
}

TEST(JsonSchemaTest, JsonObjectGrammar) {
  const Grammar g = json_object_grammar();
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5, -3e+2, {"b": null}], "c": "\u00e9\n"})"));
  EXPECT_TRUE(matches(g, "{\n\"a\":true\n}"));
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_FALSE(matches(g, "\"x\""));
  EXPECT_FALSE(matches(g, "{} "));
  EXPECT_FALSE(matches(g, "{\"a\":1e999}"));  // exponents stay finite
}

TEST(JsonSchemaTest, WhitespaceAndPropertyCommas) {
  const Grammar g = compile(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
      "required": ["a", "c"]})");
  EXPECT_TRUE(matches(g, R"({"a":1,"c":2})"));
  EXPECT_TRUE(matches(g, R"({"a":1,"b":3,"c":2})"));
  EXPECT_TRUE(matches(g, R"({ "a": 1, "c": 2 })"));
  EXPECT_TRUE(matches(g, "{\n\"a\" :1 ,\n\"c\":\n2\n}"));
  EXPECT_FALSE(matches(g, R"({"a":1,,"c":2})"));
  EXPECT_FALSE(matches(g, R"({"a":1,"c":2,})"));
  EXPECT_FALSE(matches(g, R"({,"a":1,"c":2})"));
  EXPECT_FALSE(matches(g, R"({"a":1})"));              // c is required
  EXPECT_FALSE(matches(g, R"({"c":2,"a":1})"));        // schema order
  EXPECT_FALSE(matches(g, R"({"a":1,"c":2,"d":3})"));  // no additional properties
  EXPECT_FALSE(matches(g, R"({  "a":1,"c":2})"));      // at most one space
  EXPECT_FALSE(matches(g, "{ \n\"a\":1,\"c\":2}"));
  EXPECT_FALSE(matches(g, R"({"a":1,"c":2} )"));  // nothing after the value
  EXPECT_FALSE(matches(g, R"( {"a":1,"c":2})"));
  EXPECT_FALSE(matches(g, "{\"a\":1,\"c\":2}\n"));
  EXPECT_FALSE(matches(g, "{\"a\":1,\t\"c\":2}"));

  // Every subset of three optional properties, with and without whitespace.
  const Grammar opt = compile(R"({"type": "object", "properties": {
      "a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}})");
  for (int mask = 0; mask < 8; ++mask) {
    std::string compact = "{", spaced = "{ ";
    bool first = true;
    for (int i = 0; i < 3; ++i) {
      if (!(mask >> i & 1)) continue;
      const std::string m =
          std::string("\"") + static_cast<char>('a' + i) + "\":" + std::to_string(i);
      compact += (first ? "" : ",") + m;
      spaced += (first ? "" : ", ") + m;
      first = false;
    }
    EXPECT_TRUE(matches(opt, compact + "}")) << compact;
    EXPECT_TRUE(matches(opt, spaced + (mask ? " }" : "}"))) << spaced;
    if (mask) {
      EXPECT_FALSE(matches(opt, compact + ",}")) << compact;
    }
    if (mask) {
      EXPECT_FALSE(matches(opt, "{," + compact.substr(1) + "}")) << compact;
    }
  }
  EXPECT_FALSE(matches(opt, "{  }"));
}

TEST(JsonSchemaTest, Strings) {
  const Grammar g = compile(R"({"type": "string"})");
  for (const char* ok : {R"("")", R"("abc")", R"("a\"b\\c\/d\b\f\n\r\t")", R"("\u00e9\uFFFF")",
                         "\"\xC3\xA9\xF0\x9F\x98\x80\"", R"("\u0000")"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad :
       {"abc", "\"abc", "\"a\"b\"", "\"\\x\"", "\"\\u12\"", "\"\\ud800\"", "\"\\uDFFF\"",
        "\"a\nb\"", "\"\x01\"", "\"\xED\xA0\x80\"", "\"\xC0\xAF\"", "\"\\\""}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
  // Lengths count characters: an escape or a multi-byte character is one.
  const Grammar len = compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(matches(len, R"("a")"));
  EXPECT_TRUE(matches(len, R"("ab")"));
  EXPECT_TRUE(matches(len, R"("abc")"));
  EXPECT_FALSE(matches(len, R"("abcd")"));
  EXPECT_TRUE(matches(len, R"("\n\u0041\"")"));
  EXPECT_FALSE(matches(len, R"("\n\u0041\"x")"));
  EXPECT_TRUE(matches(len, "\"\xC3\xA9\xF0\x9F\x98\x80\""));
  EXPECT_FALSE(matches(len, "\"\xF0\x9F\x98\x80\""));
  const Grammar min_only = compile(R"({"type": "string", "minLength": 1})");
  EXPECT_FALSE(matches(min_only, R"("")"));
  EXPECT_TRUE(matches(min_only, R"("a very long string indeed")"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "minLength": 3, "maxLength": 2})"),
                  "'maxLength' is below 'minLength' at #"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "maxLength": -1})"),
                  "'maxLength' must be a non-negative integer at #/maxLength"));
}

TEST(JsonSchemaTest, IntegerRangesAreExact) {
  const std::vector<int> bounds = {-120, -101, -100, -99, -11, -10, -9,  -1, 0,
                                   1,    9,    10,   11,  99,  100, 101, 120};
  for (int lo : bounds) {
    for (int hi : bounds) {
      if (hi < lo) continue;
      const Grammar g = compile(R"({"type": "integer", "minimum": )" + std::to_string(lo) +
                                R"(, "maximum": )" + std::to_string(hi) + "}");
      for (int i = -200; i <= 200; ++i) {
        ASSERT_EQ(matches(g, std::to_string(i)), lo <= i && i <= hi)
            << "[" << lo << ", " << hi << "] " << i;
      }
      EXPECT_FALSE(matches(g, "-0"));
      EXPECT_FALSE(matches(g, "00"));
      if (lo <= 5 && 5 <= hi) {
        EXPECT_FALSE(matches(g, "05"));
      }
      EXPECT_FALSE(matches(g, "1.0"));
    }
  }
  // Random ranges, exclusive and float bounds (rounded inward).
  std::mt19937 rng(7);
  for (int round = 0; round < 40; ++round) {
    const int a = static_cast<int>(rng() % 2001) - 1000;
    const int b = a + static_cast<int>(rng() % 700);
    const double fa = a + 0.5, fb = b - 0.25;
    const Grammar g = compile(R"({"type": "integer", "exclusiveMinimum": )" + std::to_string(a) +
                              R"(, "maximum": )" + std::to_string(fb) + "}");
    const Grammar h = compile(R"({"type": "integer", "minimum": )" + std::to_string(fa) +
                              R"(, "exclusiveMaximum": )" + std::to_string(b) + "}");
    for (int i = a - 30; i <= b + 30; ++i) {
      ASSERT_EQ(matches(g, std::to_string(i)), i > a && i <= fb) << a << " " << fb << " " << i;
      ASSERT_EQ(matches(h, std::to_string(i)), i >= fa && i < b) << fa << " " << b << " " << i;
    }
  }
  // Draft 4's boolean exclusiveMinimum/exclusiveMaximum.
  const Grammar d4 = compile(R"({"type": "integer", "minimum": 1, "exclusiveMinimum": true,
                                 "maximum": 5, "exclusiveMaximum": true})");
  for (int i = -3; i <= 8; ++i) EXPECT_EQ(matches(d4, std::to_string(i)), i > 1 && i < 5) << i;
}

TEST(JsonSchemaTest, IntegerOpenSidesAreCappedAt15Digits) {
  const Grammar any = compile(R"({"type": "integer"})");
  EXPECT_TRUE(matches(any, "0"));
  EXPECT_TRUE(matches(any, "-7"));
  EXPECT_TRUE(matches(any, "999999999999999"));
  EXPECT_TRUE(matches(any, "-999999999999999"));
  EXPECT_FALSE(matches(any, "1000000000000000"));
  EXPECT_FALSE(matches(any, "-0"));
  EXPECT_FALSE(matches(any, "007"));
  EXPECT_FALSE(matches(any, "1.5"));
  EXPECT_FALSE(matches(any, "1e3"));

  const Grammar lower = compile(R"({"type": "integer", "minimum": -5})");
  EXPECT_FALSE(matches(lower, "-6"));
  EXPECT_TRUE(matches(lower, "-5"));
  EXPECT_TRUE(matches(lower, "999999999999999"));
  EXPECT_FALSE(matches(lower, "1000000000000000"));
  const Grammar upper = compile(R"({"type": "integer", "exclusiveMaximum": 0})");
  EXPECT_TRUE(matches(upper, "-1"));
  EXPECT_FALSE(matches(upper, "0"));
  EXPECT_TRUE(matches(upper, "-999999999999999"));
  EXPECT_FALSE(matches(upper, "-1000000000000000"));
  // A bound past the cap keeps the open side at its own digit count.
  const Grammar big = compile(R"({"type": "integer", "minimum": 12345678901234567})");
  EXPECT_FALSE(matches(big, "12345678901234566"));
  EXPECT_TRUE(matches(big, "12345678901234567"));
  EXPECT_TRUE(matches(big, "99999999999999999"));
  EXPECT_FALSE(matches(big, "100000000000000000"));
  // Two explicit bounds are not capped.
  const Grammar wide =
      compile(R"({"type": "integer", "minimum": -100000000000000000, "maximum": 5})");
  EXPECT_TRUE(matches(wide, "-100000000000000000"));
  EXPECT_FALSE(matches(wide, "-100000000000000001"));
  // multipleOf 1 says nothing new for integers; anything else is refused.
  const Grammar one = compile(R"({"type": "integer", "multipleOf": 1, "maximum": 3})");
  EXPECT_TRUE(matches(one, "3"));
  EXPECT_TRUE(has(error_of(R"({"type": "integer", "multipleOf": 2})"),
                  "'multipleOf' is not supported (except 1 for integers) at #/multipleOf"));
  EXPECT_TRUE(has(error_of(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
                  "no integer satisfies the bounds at #"));
  EXPECT_TRUE(has(error_of(R"({"type": "integer", "minimum": 4.5, "maximum": 4.9})"),
                  "no integer satisfies the bounds at #"));
}

TEST(JsonSchemaTest, UnboundedNumbers) {
  const Grammar g = compile(R"({"type": "number"})");
  for (const char* ok : {"0", "-0", "1.5", "-0.25", "1e5", "1E+05", "-2.5e-3", "123456789012345",
                         "0.123456789012345", "7e99"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {"01", ".5", "1.", "+1", "1e", "1e999", "1234567890123456",
                          "0.1234567890123456", "NaN", "Infinity", "- 1"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
}

// The decimal value of a number's spelling, as a JSON reader takes it.
double value_of(const std::string& s) { return std::strtod(s.c_str(), nullptr); }

TEST(JsonSchemaTest, BoundedNumbersStayInside) {
  EXPECT_TRUE(has(error_of(R"({"type": "number", "multipleOf": 0.5})"),
                  "'multipleOf' is not supported (except 1 for integers) at #/multipleOf"));
  {
    const Grammar g =
        compile(R"({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1})");
    for (const char* ok : {"0.5", "0.000000000000001", "0.999999999999999", "0.1"}) {
      EXPECT_TRUE(matches(g, ok)) << ok;
    }
    for (const char* bad : {"0", "0.0", "0.000", "1", "1.0", "-0.5", "-0", "1.5", "5e-1"}) {
      EXPECT_FALSE(matches(g, bad)) << bad;
    }
  }
  {
    const Grammar g = compile(R"({"type": "number", "minimum": 0.1, "maximum": 0.2})");
    for (const char* ok : {"0.1", "0.15", "0.2", "0.100", "0.2000", "0.123456789012345"}) {
      EXPECT_TRUE(matches(g, ok)) << ok;
    }
    for (const char* bad : {"0.09", "0.0999999999", "0.2000001", "0.25", "0", "1", "0.3"}) {
      EXPECT_FALSE(matches(g, bad)) << bad;
    }
  }
  {
    const Grammar g = compile(R"({"type": "number", "minimum": -3.5, "maximum": -1})");
    for (const char* ok : {"-3.5", "-3.49", "-3", "-2", "-1.5", "-1", "-1.0"}) {
      EXPECT_TRUE(matches(g, ok)) << ok;
    }
    for (const char* bad : {"-3.51", "-4", "-0.5", "0", "1", "-0.999", "-3.6"}) {
      EXPECT_FALSE(matches(g, bad)) << bad;
    }
  }
  {
    // Past an exclusive bound by less than a double's step reads back as the bound itself.
    const Grammar g = compile(R"({"type": "number", "exclusiveMinimum": 100, "maximum": 101})");
    EXPECT_FALSE(matches(g, "100"));
    EXPECT_FALSE(matches(g, "100.000000000000001"));
    EXPECT_TRUE(matches(g, "100.00000000000002"));
    EXPECT_TRUE(matches(g, "100.5"));
    EXPECT_TRUE(matches(g, "101"));
    EXPECT_FALSE(matches(g, "101.000000000000001"));
  }
  {
    const Grammar g = compile(R"({"type": "number", "minimum": 0})");
    EXPECT_TRUE(matches(g, "0"));
    EXPECT_TRUE(matches(g, "999999999999999.999999999999999"));
    EXPECT_FALSE(matches(g, "1000000000000000"));
    EXPECT_FALSE(matches(g, "-0.1"));
    EXPECT_FALSE(matches(g, "1e3"));  // no exponent with bounds
  }
  // Random bounds: a spelling that matches reads back inside; one well inside matches.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> dist(-1000, 1000);
  for (int round = 0; round < 30; ++round) {
    double lo = std::round(dist(rng) * 1000) / 1000;
    double hi = lo + std::round(std::abs(dist(rng)) * 100) / 1000;
    const bool lo_ex = rng() % 2, hi_ex = rng() % 2;
    char schema[256];
    std::snprintf(schema, sizeof schema, R"({"type": "number", "%s": %.17g, "%s": %.17g})",
                  lo_ex ? "exclusiveMinimum" : "minimum", lo,
                  hi_ex ? "exclusiveMaximum" : "maximum", hi);
    const nlohmann::json js = nlohmann::json::parse(schema);
    lo = js[lo_ex ? "exclusiveMinimum" : "minimum"].get<double>();
    hi = js[hi_ex ? "exclusiveMaximum" : "maximum"].get<double>();
    const Grammar g = compile(schema);
    auto inside = [&](double v) {
      return (lo_ex ? v > lo : v >= lo) && (hi_ex ? v < hi : v <= hi);
    };
    std::uniform_real_distribution<double> near(lo - 2, hi + 2);
    for (int i = 0; i < 300; ++i) {
      const double v = near(rng);
      char text[64];
      std::snprintf(text, sizeof text, "%.*f", static_cast<int>(rng() % 8), v);
      const std::string t = text;
      const bool m = matches(g, t);
      if (m) {
        ASSERT_TRUE(inside(value_of(t))) << schema << " " << t;
      }
      // A spelling well inside matches (but zero is never written "-0...").
      const double w = value_of(t);
      if (w > lo + 1e-9 && w < hi - 1e-9 && !(t[0] == '-' && w == 0)) {
        ASSERT_TRUE(m) << schema << " " << t;
      }
    }
  }
}

bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }
int days_in(int y, int m) {
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return m == 2 && leap(y) ? 29 : kDays[m - 1];
}

TEST(JsonSchemaTest, DateFormat) {
  const Grammar g = compile(R"({"type": "string", "format": "date"})");
  char buf[32];
  for (int y : {1900, 2000, 2023, 2024}) {
    for (int m = 0; m <= 13; ++m) {
      for (int d = 0; d <= 32; ++d) {
        std::snprintf(buf, sizeof buf, "\"%04d-%02d-%02d\"", y, m, d);
        const bool valid = m >= 1 && m <= 12 && d >= 1 && d <= days_in(y, m);
        ASSERT_EQ(matches(g, buf), valid) << buf;
      }
    }
  }
  for (int y = 1; y <= 9999; y += (y < 500 ? 1 : 37)) {
    std::snprintf(buf, sizeof buf, "\"%04d-02-29\"", y);
    ASSERT_EQ(matches(g, buf), leap(y)) << buf;
  }
  EXPECT_FALSE(matches(g, "\"0000-01-01\""));
  EXPECT_TRUE(matches(g, "\"0001-01-01\""));
  EXPECT_TRUE(matches(g, "\"9999-12-31\""));
  EXPECT_FALSE(matches(g, "\"2024-1-01\""));
  EXPECT_FALSE(matches(g, "\"20240101\""));
  EXPECT_FALSE(matches(g, "\"2024-01-01T00:00:00Z\""));
}

TEST(JsonSchemaTest, TimeAndDateTimeFormats) {
  const Grammar dt = compile(R"({"type": "string", "format": "date-time"})");
  for (const char* ok : {"2024-02-29T23:59:59Z", "0001-01-01T00:00:00+00:00",
                         "2023-12-31T12:30:45.123456789-05:30", "2023-06-15T08:00:00.5Z"}) {
    EXPECT_TRUE(matches(dt, std::string("\"") + ok + "\"")) << ok;
  }
  for (const char* bad : {"2023-02-29T00:00:00Z", "2024-01-01T24:00:00Z", "2024-01-01T00:60:00Z",
                          "2024-01-01T00:00:60Z", "2024-01-01T00:00:00", "2024-01-01 00:00:00Z",
                          "2024-01-01T00:00:00.Z", "2024-01-01T00:00:00.1234567890Z",
                          "2024-01-01T00:00:00+24:00", "2024-01-01T00:00:00+05"}) {
    EXPECT_FALSE(matches(dt, std::string("\"") + bad + "\"")) << bad;
  }
  const Grammar t = compile(R"({"type": "string", "format": "time"})");
  EXPECT_TRUE(matches(t, "\"12:34:56Z\""));
  EXPECT_TRUE(matches(t, "\"23:59:59.999+14:00\""));
  EXPECT_FALSE(matches(t, "\"12:34:56\""));
  EXPECT_FALSE(matches(t, "\"12:34Z\""));
}

TEST(JsonSchemaTest, UuidEmailIpv4Formats) {
  const Grammar u = compile(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(matches(u, "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_TRUE(matches(u, "\"123E4567-E89B-12D3-A456-426614174000\""));
  EXPECT_FALSE(matches(u, "\"123e4567e89b12d3a456426614174000\""));
  EXPECT_FALSE(matches(u, "\"123e4567-e89b-12d3-a456-42661417400\""));
  EXPECT_FALSE(matches(u, "\"123e4567-e89b-12d3-a456-4266141740000\""));
  EXPECT_FALSE(matches(u, "\"g23e4567-e89b-12d3-a456-426614174000\""));

  const Grammar e = compile(R"({"type": "string", "format": "email"})");
  const std::string l63(63, 'a'), l64(64, 'a');
  for (const std::string& ok :
       std::vector<std::string>{"a@b.co", "first.last+tag@ex-ample.co.uk", "x_%1@a.b.c.d.e",
                                l64 + "@x.y", "a@" + l63 + ".com"}) {
    EXPECT_TRUE(matches(e, "\"" + ok + "\"")) << ok;
  }
  for (const std::string& bad :
       std::vector<std::string>{"a@b", "@b.co", "a@-b.co", "a@b-.co", "a@b..co", "a b@c.de",
                                l64 + "a@x.y", "a@" + l64 + ".com", "a@b.c.d.e.f.g"}) {
    EXPECT_FALSE(matches(e, "\"" + bad + "\"")) << bad;
  }

  const Grammar ip = compile(R"({"type": "string", "format": "ipv4"})");
  for (int i = 0; i <= 300; ++i) {
    const std::string o = std::to_string(i);
    ASSERT_EQ(matches(ip, "\"" + o + ".0.0.1\""), i <= 255) << i;
    ASSERT_EQ(matches(ip, "\"10.0.0." + o + "\""), i <= 255) << i;
  }
  EXPECT_FALSE(matches(ip, "\"01.0.0.1\""));
  EXPECT_FALSE(matches(ip, "\"1.2.3\""));
  EXPECT_FALSE(matches(ip, "\"1.2.3.4.5\""));

  EXPECT_TRUE(has(
      error_of(
          R"({"type": "object", "properties": {"h": {"type": "string", "format": "hostname"}}})"),
      "unsupported string format 'hostname'"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "format": "hostname"})"), "at #/format"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "format": "date", "maxLength": 5})"),
                  "'format' together with"));
  // Format applies to strings only: a number next to it is free.
  const Grammar sn = compile(R"({"type": ["string", "integer"], "format": "date"})");
  EXPECT_TRUE(matches(sn, "12"));
  EXPECT_TRUE(matches(sn, "\"2024-01-01\""));
  EXPECT_FALSE(matches(sn, "\"x\""));
}

TEST(JsonSchemaTest, EnumAndConst) {
  const Grammar g = compile(R"({"enum": ["a\"b", "c\\d", "line\nbreak", "\u00e9", "\u0001", 1,
                                        2.5, null, true, {"k": [1, 2]}, [1, "x"]]})");
  for (const char* ok :
       {R"("a\"b")", R"("c\\d")", R"("line\nbreak")", "\"\xC3\xA9\"", R"("\u0001")", "1", "2.5",
        "null", "true", R"({"k":[1,2]})", R"([1,"x"])"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {R"("a"b")", R"("\u00e9")", "\"line\nbreak\"", "false", "2", "1.0",
                          R"({"k": [1, 2]})", R"({"k":[1]})", R"("x")"}) {
    EXPECT_FALSE(matches(g, bad)) << bad;
  }
  const Grammar c = compile(R"({"const": "only", "title": "C"})");
  EXPECT_TRUE(matches(c, R"("only")"));
  EXPECT_FALSE(matches(c, R"("other")"));
  // The other keywords still constrain: values they refuse are dropped.
  const Grammar typed = compile(R"({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1})");
  EXPECT_TRUE(matches(typed, R"("a")"));
  EXPECT_FALSE(matches(typed, "1"));
  EXPECT_FALSE(matches(typed, R"("bb")"));
  const Grammar ranged = compile(R"({"type": "integer", "minimum": 2, "enum": [1, 2, 3, 2.5]})");
  EXPECT_FALSE(matches(ranged, "1"));
  EXPECT_TRUE(matches(ranged, "2"));
  EXPECT_TRUE(matches(ranged, "3"));
  EXPECT_FALSE(matches(ranged, "2.5"));
  const Grammar both = compile(R"({"enum": [1, 2, 3], "const": 2})");
  EXPECT_TRUE(matches(both, "2"));
  EXPECT_FALSE(matches(both, "1"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "enum": [1, 2]})"),
                  "no value of 'enum'/'const' satisfies the schema's other keywords at #"));
  EXPECT_TRUE(has(error_of(R"({"enum": []})"), "no value of 'enum'/'const'"));
}

TEST(JsonSchemaTest, TypeListsAnyOfOneOfAllOf) {
  const Grammar list = compile(R"({"type": ["string", "null"], "maxLength": 2})");
  EXPECT_TRUE(matches(list, "null"));
  EXPECT_TRUE(matches(list, R"("ab")"));
  EXPECT_FALSE(matches(list, R"("abc")"));
  EXPECT_FALSE(matches(list, "1"));
  const Grammar b = compile(R"({"type": "boolean"})");
  EXPECT_TRUE(matches(b, "true"));
  EXPECT_TRUE(matches(b, "false"));
  EXPECT_FALSE(matches(b, "1"));
  const Grammar any_of = compile(R"({"anyOf": [{"type": "integer", "maximum": 3},
                                               {"type": "string", "maxLength": 1}, false]})");
  EXPECT_TRUE(matches(any_of, "3"));
  EXPECT_FALSE(matches(any_of, "4"));
  EXPECT_TRUE(matches(any_of, R"("x")"));
  EXPECT_FALSE(matches(any_of, R"("xy")"));
  const Grammar one_of = compile(R"({"oneOf": [{"type": "null"}, {"type": "boolean"}],
                                     "discriminator": {"propertyName": "x"}})");
  EXPECT_TRUE(matches(one_of, "null"));
  EXPECT_TRUE(matches(one_of, "true"));
  EXPECT_FALSE(matches(one_of, "1"));
  const Grammar all_of = compile(R"({"allOf": [{"type": "integer", "minimum": 7}],
                                     "description": "d"})");
  EXPECT_TRUE(matches(all_of, "7"));
  EXPECT_FALSE(matches(all_of, "6"));
  // Without a type, the keywords say which types are meant.
  const Grammar inferred = compile(R"({"properties": {"a": {"type": "null"}}, "required": ["a"]})");
  EXPECT_TRUE(matches(inferred, R"({"a":null})"));
  EXPECT_FALSE(matches(inferred, "null"));
  EXPECT_TRUE(has(error_of(R"({"allOf": [{"type": "integer"}, {"minimum": 1}]})"),
                  "'allOf' with more than one subschema is not supported at #/allOf"));
  EXPECT_TRUE(has(error_of(R"({"type": "object", "anyOf": [{"required": ["a"]}]})"),
                  "keyword 'type' next to 'anyOf' is not supported at #"));
  EXPECT_TRUE(has(error_of(R"({"anyOf": []})"), "'anyOf' must be a non-empty array at #/anyOf"));
  EXPECT_TRUE(has(error_of(R"({"anyOf": [false]})"), "every branch is 'false' at #/anyOf"));
  EXPECT_TRUE(has(error_of(R"({"type": "decimal"})"), "unknown type 'decimal' at #/type"));
}

TEST(JsonSchemaTest, ReferencesAndRecursion) {
  const Grammar tree = compile(R"({
    "$defs": {"node": {"type": "object", "properties": {
      "value": {"type": "integer"},
      "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["value", "children"]}},
    "$ref": "#/$defs/node"})");
  EXPECT_TRUE(matches(tree, R"({"value":1,"children":[]})"));
  EXPECT_TRUE(
      matches(tree, R"({"value":1,"children":[{"value":2,"children":[{"value":3,"children":[]}]},)"
                    R"( {"value":4,"children":[]}]})"));
  EXPECT_FALSE(matches(tree, R"({"value":1,"children":[{"value":2}]})"));
  EXPECT_FALSE(matches(tree, R"({"value":1,"children":[1]})"));

  const Grammar root = compile(R"({"type": "object", "properties": {
      "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "required": ["next"]})");
  EXPECT_TRUE(matches(root, R"({"next":{"next":{"next":null}}})"));
  EXPECT_FALSE(matches(root, R"({"next":{}})"));

  const Grammar escaped =
      compile(R"({"definitions": {"a/b": {"type": "null"}, "c~d": {"type": "boolean"},
      "e f": {"const": 1}},
      "type": "array", "prefixItems": [{"$ref": "#/definitions/a~1b"}, {"$ref": "#/definitions/c~0d"},
                                       {"$ref": "#/definitions/e%20f"}], "minItems": 3})");
  EXPECT_TRUE(matches(escaped, "[null,true,1]"));
  EXPECT_FALSE(matches(escaped, "[null,true]"));
  const Grammar indexed = compile(R"({"anyOf": [{"type": "null"}, {"$ref": "#/anyOf/0"}]})");
  EXPECT_TRUE(matches(indexed, "null"));

  EXPECT_TRUE(has(error_of(R"({"$ref": "https://example.com/s.json"})"),
                  "remote $ref 'https://example.com/s.json' is not supported"));
  EXPECT_TRUE(has(error_of(R"({"$ref": "other.json#/a"})"), "at #/$ref"));
  EXPECT_TRUE(has(error_of(R"({"$ref": "#/$defs/missing"})"),
                  "$ref '#/$defs/missing' does not resolve at #/$ref"));
  EXPECT_TRUE(has(error_of(R"({"$ref": "#anchor"})"), "names an anchor"));
  EXPECT_TRUE(
      has(error_of(R"({"$defs": {"a": {"type": "null"}}, "$ref": "#/$defs/a", "type": "null"})"),
          "keyword 'type' next to '$ref' is not supported at #"));
  const Grammar ref_enum = compile(R"({"$defs": {"small": {"type": "integer", "maximum": 2}},
                                       "$ref": "#/$defs/small", "enum": [1, 2, 3]})");
  EXPECT_TRUE(matches(ref_enum, "2"));
  EXPECT_FALSE(matches(ref_enum, "3"));
  const Grammar annotated = compile(R"({"$defs": {"a": {"type": "null"}}, "$ref": "#/$defs/a",
                                        "description": "d", "default": null})");
  EXPECT_TRUE(matches(annotated, "null"));
  // Recursion with no finite text, or through no text at all, is refused.
  EXPECT_FALSE(compile_json_schema(R"({"$ref": "#"})").ok());
  EXPECT_FALSE(compile_json_schema(R"({"type": "object", "properties": {"a": {"$ref": "#"}},
                                       "required": ["a"]})")
                   .ok());
  EXPECT_FALSE(compile_json_schema(R"({"anyOf": [{"$ref": "#"}, {"type": "null"}]})").ok());
  // An error inside a referenced schema names the place it is at.
  EXPECT_TRUE(
      has(error_of(R"({"$defs": {"x": {"type": "string", "format": "uri"}}, "$ref": "#/$defs/x"})"),
          "unsupported string format 'uri' (supported: date, time, date-time, uuid, email, "
          "ipv4) at #/$defs/x/format"));
}

TEST(JsonSchemaTest, AdditionalProperties) {
  const Grammar g = compile(R"({"type": "object", "properties": {"a": {"type": "integer"}},
                                "additionalProperties": true})");
  EXPECT_TRUE(matches(g, R"({})"));
  EXPECT_TRUE(matches(g, R"({"a":1})"));
  EXPECT_TRUE(matches(g, R"({"a":1,"ab":[1,{"x":null}]})"));
  EXPECT_TRUE(matches(g, R"({"ab":"x","b":2, "":3})"));
  EXPECT_TRUE(matches(g, "{\"\xC3\xA9\":1}"));
  EXPECT_FALSE(matches(g, R"({"a":1,"a":2})"));  // a declared name is not an extra one
  EXPECT_FALSE(matches(g, R"({"b":1,"a":2})"));  // declared ones first
  EXPECT_FALSE(matches(g, R"({"\u0061":2})"));   // extra names are written without escapes
  EXPECT_FALSE(matches(g, R"({"a":"x"})"));

  const Grammar names = compile(R"({"type": "object", "properties": {"ab": {}, "abc": {}, "b": {}},
                                    "additionalProperties": {"type": "integer"}})");
  for (const char* extra : {"a", "abd", "abcd", "bb", "c", "", "ba"}) {
    EXPECT_TRUE(matches(names, std::string("{\"") + extra + "\":1}")) << extra;
    EXPECT_FALSE(matches(names, std::string("{\"") + extra + "\":\"s\"}")) << extra;
  }
  // After the last declared property only extra names can come: never a declared one.
  for (const char* declared : {"ab", "abc", "b"}) {
    EXPECT_FALSE(matches(names, std::string("{\"b\":1,\"") + declared + "\":1}")) << declared;
  }

  const Grammar dict =
      compile(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(matches(dict, R"({"x":1, "y":2})"));
  EXPECT_FALSE(matches(dict, R"({"x":"s"})"));
  // Absent next to properties: none (strict mode). Absent with no properties: any object.
  const Grammar any = compile(R"({"type": "object"})");
  EXPECT_TRUE(matches(any, R"({"x":{"y":[1]}, "z":null})"));
  EXPECT_FALSE(matches(any, "[]"));
  const Grammar closed =
      compile(R"({"type": "object", "properties": {"a": {}}, "additionalProperties": false})");
  EXPECT_FALSE(matches(closed, R"({"b":1})"));
  // A required name with no properties entry takes the additional schema.
  const Grammar req = compile(R"({"type": "object", "required": ["id"],
                                  "additionalProperties": {"type": "string"}})");
  EXPECT_TRUE(matches(req, R"({"id":"x","other":"y"})"));
  EXPECT_FALSE(matches(req, R"({"other":"y"})"));
  EXPECT_FALSE(matches(req, R"({"id":1})"));
  EXPECT_TRUE(
      has(error_of(R"({"type": "object", "required": ["id"], "additionalProperties": false})"),
          "required property 'id' is not allowed by additionalProperties false at #"));
  // A property whose schema is false never appears.
  const Grammar never =
      compile(R"({"type": "object", "properties": {"a": false, "b": {"type": "null"}},
                                    "additionalProperties": true})");
  EXPECT_TRUE(matches(never, R"({"b":null})"));
  EXPECT_FALSE(matches(never, R"({"a":null})"));
  EXPECT_TRUE(matches(never, R"({"c":null})"));
  EXPECT_TRUE(has(error_of(R"({"type": "object", "properties": {"a": false}, "required": ["a"]})"),
                  "a required property has the schema 'false' at #/properties/a"));
}

TEST(JsonSchemaTest, PropertyCounts) {
  const Grammar g = compile(R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}},
                                "minProperties": 1, "maxProperties": 2})");
  EXPECT_FALSE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, R"({"b":1})"));
  EXPECT_TRUE(matches(g, R"({"a":1,"c":1})"));
  EXPECT_FALSE(matches(g, R"({"a":1,"b":1,"c":1})"));
  const Grammar extra = compile(R"({"type": "object", "properties": {"a": {}}, "required": ["a"],
                                    "additionalProperties": true, "maxProperties": 3})");
  EXPECT_TRUE(matches(extra, R"({"a":1,"x":1,"y":1})"));
  EXPECT_FALSE(matches(extra, R"({"a":1,"x":1,"y":1,"z":1})"));
  EXPECT_TRUE(has(error_of(R"({"type": "object", "minProperties": 1})"),
                  "'minProperties' beyond the declared properties is not supported at #"));
  EXPECT_TRUE(has(error_of(R"({"type": "object", "properties": {"a": {}}, "required": ["a"],
                               "maxProperties": 0})"),
                  "'maxProperties' is below the required count at #"));
}

TEST(JsonSchemaTest, Arrays) {
  const Grammar any = compile(R"({"type": "array"})");
  EXPECT_TRUE(matches(any, "[]"));
  EXPECT_TRUE(matches(any, R"([1, "a", [null]])"));
  const Grammar g = compile(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1,
                                "maxItems": 3})");
  EXPECT_FALSE(matches(g, "[]"));
  EXPECT_TRUE(matches(g, "[1]"));
  EXPECT_TRUE(matches(g, "[ 1, 2 ,3 ]"));
  EXPECT_TRUE(matches(g, "[\n1,\n2\n]"));
  EXPECT_FALSE(matches(g, "[1,2,3,4]"));
  EXPECT_FALSE(matches(g, "[1,]"));
  EXPECT_FALSE(matches(g, "[,1]"));
  EXPECT_FALSE(matches(g, "[\"a\"]"));
  EXPECT_FALSE(matches(g, "[  1]"));

  const Grammar tuple = compile(R"({"type": "array", "prefixItems": [{"type": "integer"},
                                    {"type": "string"}], "minItems": 2, "maxItems": 2})");
  EXPECT_TRUE(matches(tuple, R"([1,"a"])"));
  EXPECT_FALSE(matches(tuple, R"(["a",1])"));
  EXPECT_FALSE(matches(tuple, R"([1])"));
  EXPECT_FALSE(matches(tuple, R"([1,"a",2])"));
  const Grammar short_ok = compile(R"({"type": "array", "prefixItems": [{"type": "integer"},
                                       {"type": "string"}]})");
  EXPECT_TRUE(matches(short_ok, "[]"));
  EXPECT_TRUE(matches(short_ok, "[1]"));
  EXPECT_TRUE(matches(short_ok, R"([1,"a"])"));
  EXPECT_FALSE(matches(short_ok, R"([1,"a",null])"));  // no items past the tuple
  const Grammar rest = compile(R"({"type": "array", "prefixItems": [{"type": "string"}],
                                   "items": {"type": "null"}, "minItems": 2})");
  EXPECT_FALSE(matches(rest, R"(["a"])"));
  EXPECT_TRUE(matches(rest, R"(["a",null])"));
  EXPECT_TRUE(matches(rest, R"(["a",null,null])"));
  EXPECT_FALSE(matches(rest, R"(["a",null,1])"));
  const Grammar draft7 = compile(R"({"type": "array", "items": [{"type": "null"}],
                                     "additionalItems": {"type": "boolean"}})");
  EXPECT_TRUE(matches(draft7, "[null,true,false]"));
  EXPECT_FALSE(matches(draft7, "[true]"));
  const Grammar closed = compile(R"({"type": "array", "prefixItems": [{}], "items": false})");
  EXPECT_TRUE(matches(closed, "[1]"));
  EXPECT_FALSE(matches(closed, "[1,2]"));
  const Grammar unique_false = compile(R"({"type": "array", "uniqueItems": false, "maxItems": 1})");
  EXPECT_TRUE(matches(unique_false, "[1]"));
  EXPECT_TRUE(has(error_of(R"({"type": "array", "uniqueItems": true})"),
                  "'uniqueItems: true' is not supported at #/uniqueItems"));
  EXPECT_TRUE(has(error_of(R"({"type": "array", "contains": {"type": "integer"}})"),
                  "unsupported JSON Schema keyword 'contains' at #"));
  EXPECT_TRUE(
      has(error_of(R"({"type": "array", "prefixItems": [{}], "items": false, "minItems": 2})"),
          "no array satisfies the item counts at #"));
}

TEST(JsonSchemaTest, UnsupportedKeywordsAreNamedWithTheirPlace) {
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"tags": {"type": "object",
                         "patternProperties": {"^x": {}}}}})"),
            "unsupported JSON Schema keyword 'patternProperties' at #/properties/tags");
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"a/b~c": {"not": {}}}})"),
            "unsupported JSON Schema keyword 'not' at #/properties/a~1b~0c");
  EXPECT_EQ(error_of(R"({"type": "array", "items": {"if": {}}})"),
            "unsupported JSON Schema keyword 'if' at #/items");
  EXPECT_EQ(error_of(R"({"anyOf": [{"type": "null"}, {"nullable": true}]})"),
            "unsupported JSON Schema keyword 'nullable' at #/anyOf/1");
  // Annotations are ignored.
  const Grammar g = compile(R"({"type": "null", "title": "t", "description": "d", "default": null,
      "examples": [null], "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x",
      "$comment": "c", "deprecated": false, "readOnly": true, "writeOnly": false,
      "contentMediaType": "text/plain", "contentEncoding": "base64", "x-extension": {"any": 1}})");
  EXPECT_TRUE(matches(g, "null"));
}

TEST(JsonSchemaTest, HugeSchemasAreRefused) {
  EXPECT_TRUE(has(error_of(R"({"type": "string", "maxLength": 5000000})"),
                  "string lengths above 1048576 are not supported at #"));
  EXPECT_TRUE(has(error_of(R"({"type": "array", "minItems": 3000000})"),
                  "array lengths above 1048576 are not supported at #"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "minLength": 900000, "maxLength": 1000000})"),
                  "too large"));
  // Many properties, each a long string: the total is what counts.
  std::string big = R"({"type": "object", "properties": {)";
  for (int i = 0; i < 40; ++i) {
    big += (i ? "," : "") + std::string("\"p") + std::to_string(i) +
           R"(": {"type": "string", "maxLength": 30000})";
  }
  EXPECT_TRUE(has(error_of(big + "}}"), "too large"));
}

TEST(JsonSchemaTest, DeepNestingIsRefusedNotFollowed) {
  auto nested_schema = [](int depth) {
    std::string schema;
    for (int i = 0; i < depth; ++i) schema += R"({"type": "array", "items": )";
    schema += "{}";
    for (int i = 0; i < depth; ++i) schema += "}";
    return schema;
  };
  EXPECT_TRUE(has(error_of(nested_schema(100000)), "nested too deeply (more than 1000 levels"));
  std::string items65 = "#";
  for (int i = 0; i < 65; ++i) items65 += "/items";
  EXPECT_EQ(error_of(nested_schema(65)),
            "the schema is nested too deeply (more than 64 levels) at " + items65);
  EXPECT_TRUE(compile_json_schema(nested_schema(64)).ok());
  // References and combinators count as levels too.
  std::string any_of;
  for (int i = 0; i < 65; ++i) any_of += R"({"anyOf": [{"type": "null"}, )";
  any_of += "{}";
  for (int i = 0; i < 65; ++i) any_of += "]}";
  EXPECT_TRUE(has(error_of(any_of), "nested too deeply (more than 64 levels) at #/anyOf/1/"));
  const std::string deep(100000, '[');
  EXPECT_TRUE(has(error_of(R"({"default": )" + deep + "}"), "nested too deeply"));
  const std::string value = std::string(500, '[') + std::string(500, ']');
  EXPECT_TRUE(has(error_of(R"({"enum": [)" + value + "]}"),
                  "an 'enum'/'const' value is nested too deeply at #"));
  EXPECT_TRUE(has(error_of(R"({"type": [)" + value + "]}"), "a type name must be a string"));
  // Brackets inside strings are not nesting; deep annotations and unused definitions are never
  // walked.
  const Grammar g =
      compile(R"({"type": "null", "title": ")" + std::string(5000, '[') + R"(", "default": )" +
              value + R"(, "$defs": {"x": {"enum": [)" + value + "]}}}");
  EXPECT_TRUE(matches(g, "null"));
  EXPECT_TRUE(has(error_of(R"({"$defs": {"a": [1]}, "$ref": "#/$defs/a/99999999999999999999999"})"),
                  "does not resolve"));
}

// How many '[' can follow `prefix` in the grammar's texts.
int open_brackets_after(const Grammar& g, const std::string& prefix) {
  int n = 0;
  while (n < 1000 && matches_prefix(g, prefix + std::string(static_cast<size_t>(n + 1), '['))) ++n;
  return n;
}

// The most frames of the automaton's parse stacks along `text` (which must be a prefix).
size_t most_frames(const Grammar& g, const std::string& text) {
  Pda pda(g);
  StackSet s = pda.initial();
  size_t most = 0;
  for (char c : text) {
    s = pda.advance(s, static_cast<uint8_t>(c));
    EXPECT_FALSE(s.empty()) << text;
    for (const Stack& st : s) most = std::max(most, st.size());
  }
  return most;
}

TEST(JsonSchemaTest, OpenValuesNestAtMost64Levels) {
  // JSON mode: the object itself and 63 levels inside it.
  const Grammar obj = json_object_grammar();
  EXPECT_EQ(open_brackets_after(obj, "{\"a\": "), 63);
  const std::string deepest = "{\"a\": " + std::string(63, '[');
  EXPECT_TRUE(matches(obj, deepest + "\"x\", 1, true, null" + std::string(63, ']') + "}"));
  EXPECT_FALSE(matches_prefix(obj, deepest + "1, ["));  // only scalars at the last level
  EXPECT_TRUE(matches(obj, deepest + std::string(63, ']') + "}"));
  std::string objects;
  for (int i = 0; i < 64; ++i) objects += "{\"k\": ";
  EXPECT_TRUE(matches_prefix(obj, objects + "\"v\""));
  EXPECT_FALSE(matches_prefix(obj, objects + "{"));
  EXPECT_LT(most_frames(obj, objects + "\"\\u00"), 300u);
  // {} and true: any value, 64 levels.
  for (const char* schema : {"{}", "true"}) {
    EXPECT_EQ(open_brackets_after(compile(schema), ""), 64) << schema;
  }
  // A value left open below some levels of the schema takes the levels left.
  const Grammar nested = compile(R"({"type": "array", "items": {"type": "array", "items": {}}})");
  EXPECT_EQ(open_brackets_after(nested, "[["), 62);
  const Grammar extra = compile(R"({"type": "object", "properties": {"a": {"type": "object",
      "additionalProperties": true}}, "required": ["a"]})");
  EXPECT_EQ(open_brackets_after(extra, R"({"a": {"b": )"), 62);
  // A schema 64 levels deep leaves scalars only, and its deepest path stays well within the
  // automaton's stack limit.
  std::string schema, text;
  for (int i = 0; i < 64; ++i) {
    schema += R"({"type": "object", "properties": {"a": )";
    text += R"({"a": )";
  }
  schema += "{}";
  for (int i = 0; i < 64; ++i) schema += R"(}, "required": ["a"]})";
  const Grammar deep = compile(schema);
  EXPECT_EQ(open_brackets_after(deep, text), 0);
  EXPECT_TRUE(matches(deep, text + "\"x\"" + std::string(64, '}')));
  EXPECT_LT(most_frames(deep, text + "\"\\u00"), 300u);
}

TEST(JsonSchemaTest, ReusedReferencesKeepTheLevelLimit) {
  // X, compiled where it is first used, leaves its values open; used again two levels deeper,
  // it must leave two levels fewer.
  const Grammar g = compile(R"({"$defs": {"X": {"type": "object", "additionalProperties": true}},
      "type": "array", "prefixItems": [{"$ref": "#/$defs/X"},
        {"type": "array", "items": {"type": "array", "items": {"$ref": "#/$defs/X"}}}],
      "minItems": 2, "maxItems": 2})");
  const int shallow = open_brackets_after(g, R"([{"a": )");
  const int deep = open_brackets_after(g, R"([{}, [[{"a": )");
  EXPECT_GT(shallow, 50);
  EXPECT_LE(2 + shallow, 64);
  EXPECT_LE(4 + deep, 64);
  EXPECT_EQ(deep, shallow - 2);
  // A definition with nothing left open is shared, wherever it is used.
  const Grammar shared = compile(R"({"$defs": {"P": {"type": "object", "properties":
      {"x": {"type": "integer"}}, "required": ["x"]}},
      "type": "array", "prefixItems": [{"$ref": "#/$defs/P"},
        {"type": "array", "items": {"type": "array", "items": {"$ref": "#/$defs/P"}}}]})");
  EXPECT_TRUE(matches(shared, R"([{"x":1},[[{"x":2}]]])"));
  int refs = 0;
  for (const Rule& r : shared.rules()) refs += r.name.rfind("ref ", 0) == 0;
  EXPECT_EQ(refs, 1);
}

TEST(JsonSchemaTest, OneOfNeedsDisjointBranches) {
  // Disjoint types.
  const Grammar types =
      compile(R"({"oneOf": [{"type": "integer"}, {"type": ["string", "null"]}, false]})");
  EXPECT_TRUE(matches(types, "-90018"));
  EXPECT_TRUE(matches(types, R"("x")"));
  EXPECT_TRUE(matches(types, "null"));
  EXPECT_FALSE(matches(types, "true"));
  // Disjoint enum/const values.
  const Grammar values = compile(R"({"oneOf": [{"const": "a", "title": "A"},
      {"enum": ["b", 1]}, {"type": "string", "enum": ["c", "d"]}]})");
  EXPECT_TRUE(matches(values, R"("a")"));
  EXPECT_TRUE(matches(values, "1"));
  EXPECT_TRUE(matches(values, R"("d")"));
  EXPECT_FALSE(matches(values, R"("e")"));
  // A discriminated union, as pydantic writes it: objects whose required tag differs.
  const Grammar pets = compile(R"({
    "$defs": {
      "Cat": {"properties": {"pet_type": {"const": "cat", "title": "Pet Type", "type": "string"},
                             "meows": {"title": "Meows", "type": "integer"}},
              "required": ["pet_type", "meows"], "title": "Cat", "type": "object"},
      "Dog": {"properties": {"pet_type": {"enum": ["dog"], "title": "Pet Type", "type": "string"},
                             "barks": {"title": "Barks", "type": "number"}},
              "required": ["pet_type", "barks"], "title": "Dog", "type": "object"}},
    "properties": {"pet": {"discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"},
                                             "propertyName": "pet_type"},
                           "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                           "title": "Pet"}},
    "required": ["pet"], "title": "Model", "type": "object"})");
  EXPECT_TRUE(matches(pets, R"({"pet":{"pet_type":"cat","meows":3}})"));
  EXPECT_TRUE(matches(pets, R"({"pet":{"pet_type":"dog","barks":0.5}})"));
  EXPECT_FALSE(matches(pets, R"({"pet":{"pet_type":"dog","meows":3}})"));
  // Overlapping branches are refused, naming the place.
  EXPECT_EQ(error_of(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})"),
            "'oneOf' whose branches may overlap is not supported at #/oneOf (branches 0 and 1 may "
            "both match one value)");
  for (const char* schema :
       {R"({"oneOf": [{"type": "string", "maxLength": 2}, {"type": "string", "minLength": 1}]})",
        R"({"oneOf": [{"type": "null"}, {"properties": {"a": {}}}]})",  // no type: any type
        R"({"oneOf": [{"const": 1}, {"enum": [2, 1.0]}]})",
        R"({"oneOf": [{"const": [1]}, {"const": [2]}]})",  // arrays are not compared
        R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}},
                         {"type": "object", "properties": {"k": {"const": "b"}}}]})",  // optional
        R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
                         {"type": "object", "properties": {"k": {"enum": ["b", "a"]}},
                          "required": ["k"]}]})",
        R"({"oneOf": [{"type": ["object", "null"], "properties": {"k": {"const": "a"}},
                          "required": ["k"]},
                         {"type": ["object", "null"], "properties": {"k": {"const": "b"}},
                          "required": ["k"]}]})",
        R"({"oneOf": [true, {"type": "null"}]})",
        R"({"oneOf": [{"$ref": "#"}, {"type": "null"}]})"}) {
    EXPECT_TRUE(
        has(error_of(schema), "'oneOf' whose branches may overlap is not supported at #/oneOf"))
        << schema;
  }
  EXPECT_TRUE(has(error_of(R"({"type": "object", "properties": {"p": {"oneOf": [{"type": "integer"},
      {"type": "integer", "minimum": 5}]}}})"),
                  "not supported at #/properties/p/oneOf (branches 0 and 1"));
}

TEST(JsonSchemaTest, NestedIdIsRefused) {
  // Below the root, an $id changes what references beneath it resolve against.
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"a": {"$id": "https://example.com/a",
      "type": "null"}}})"),
            "unsupported JSON Schema keyword '$id' at #/properties/a");
  EXPECT_EQ(error_of(R"({"$defs": {"A": {"$id": "https://example.com/a", "$defs": {"B": {"type":
      "null"}}}}, "$ref": "#/$defs/A/$defs/B"})"),
            "unsupported JSON Schema keyword '$id' at #/$defs/A");
  // At the root it is ignored, and a property named "$id" is just a property.
  const Grammar g = compile(R"({"$id": "https://example.com/root", "type": "object",
      "properties": {"$id": {"type": "string"}}, "required": ["$id"]})");
  EXPECT_TRUE(matches(g, R"({"$id":"x"})"));
}

TEST(JsonSchemaTest, Pattern) {
  const Grammar g = compile(R"({"type": "string", "pattern": "^[a-c]+x$"})");
  EXPECT_TRUE(matches(g, R"("abcx")"));
  EXPECT_FALSE(matches(g, R"("x")"));
  EXPECT_FALSE(matches(g, R"("abcxy")"));
  EXPECT_FALSE(matches(g, "abcx"));
  // The decoded text matches the pattern: a quote in it is written escaped.
  const Grammar q = compile(R"({"type": "string", "pattern": "^a\"b$"})");
  EXPECT_TRUE(matches(q, R"("a\"b")"));
  EXPECT_FALSE(matches(q, R"("a"b")"));
  const Grammar in_object = compile(R"({"type": "object", "properties": {"code": {"type": "string",
      "pattern": "^[A-Z]{3}$"}}, "required": ["code"]})");
  EXPECT_TRUE(matches(in_object, R"({"code":"ABC"})"));
  EXPECT_FALSE(matches(in_object, R"({"code":"AB"})"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "pattern": "^a$", "maxLength": 3})"),
                  "'pattern' together with 'minLength' or 'maxLength' is not supported at #"));
  EXPECT_TRUE(has(error_of(R"({"type": "string", "pattern": "(a"})"), "'pattern' at #/pattern"));
}

// The shape pydantic v2 gives a model (as the openai client sends it for
// client.chat.completions.parse(response_format=Model) with strict mode).
constexpr const char* kPydanticSchema = R"({
  "$defs": {
    "Address": {
      "additionalProperties": false,
      "properties": {
        "street": {"title": "Street", "type": "string"},
        "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "title": "Zip"}
      },
      "required": ["street", "zip"],
      "title": "Address",
      "type": "object"
    },
    "Color": {"enum": ["red", "green", "blue"], "title": "Color", "type": "string"}
  },
  "additionalProperties": false,
  "properties": {
    "id": {"format": "uuid", "title": "Id", "type": "string"},
    "name": {"description": "Full name", "title": "Name", "type": "string"},
    "age": {"maximum": 150, "minimum": 0, "title": "Age", "type": "integer"},
    "score": {"anyOf": [{"exclusiveMaximum": 1.0, "exclusiveMinimum": 0.0, "type": "number"},
                        {"type": "null"}], "title": "Score"},
    "created": {"format": "date-time", "title": "Created", "type": "string"},
    "birthday": {"format": "date", "title": "Birthday", "type": "string"},
    "kind": {"const": "person", "title": "Kind", "type": "string"},
    "mood": {"enum": ["happy", "sad"], "title": "Mood", "type": "string"},
    "color": {"$ref": "#/$defs/Color"},
    "tags": {"items": {"type": "string"}, "title": "Tags", "type": "array"},
    "pair": {"maxItems": 2, "minItems": 2, "prefixItems": [{"type": "integer"}, {"type": "boolean"}],
             "title": "Pair", "type": "array"},
    "address": {"$ref": "#/$defs/Address"},
    "previous": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "title": "Previous"},
    "extra": {"additionalProperties": {"type": "integer"}, "title": "Extra", "type": "object"}
  },
  "required": ["id", "name", "age", "score", "created", "birthday", "kind", "mood", "color", "tags",
               "pair", "address", "previous", "extra"],
  "title": "Person",
  "type": "object"
})";

TEST(JsonSchemaTest, PydanticModelCompilesAndSamplesParse) {
  const Grammar g = compile(kPydanticSchema);
  EXPECT_TRUE(matches(g, R"({"id": "123e4567-e89b-12d3-a456-426614174000", "name": "Ada",
"age": 36, "score": 0.5, "created": "2024-02-29T12:00:00Z", "birthday": "1815-12-10",
"kind": "person", "mood": "happy", "color": "red", "tags": ["a", "b"], "pair": [1, true],
"address": {"street": "Main", "zip": null}, "previous": null, "extra": {"k": 1}})"));
  EXPECT_FALSE(matches(g, R"({"id": "x"})"));
  // Random texts of the grammar are JSON with every required property, in order.
  std::mt19937 rng(3);
  const nlohmann::json schema = nlohmann::json::parse(kPydanticSchema);
  int parsed = 0;
  for (int i = 0; i < 30; ++i) {
    const std::string text = sample(g, &rng);
    if (text.empty()) continue;
    nlohmann::ordered_json v;
    ASSERT_NO_THROW(v = nlohmann::ordered_json::parse(text)) << text;
    ASSERT_TRUE(v.is_object()) << text;
    ASSERT_EQ(v.size(), schema["required"].size()) << text;
    EXPECT_EQ(v["kind"], "person");
    EXPECT_GE(v["age"].get<int>(), 0);
    EXPECT_LE(v["age"].get<int>(), 150);
    if (!v["score"].is_null()) {
      EXPECT_GT(v["score"].get<double>(), 0.0);
      EXPECT_LT(v["score"].get<double>(), 1.0);
    }
    ++parsed;
  }
  EXPECT_GT(parsed, 10);
}

TEST(JsonSchemaTest, AddJsonSchemaEmbeds) {
  Grammar g;
  auto e = add_json_schema(&g, R"({"type": "integer", "minimum": 1, "maximum": 3})");
  ASSERT_TRUE(e.ok()) << e.status().message();
  Sequence root = g.literal("<");
  root.push_back(*e);
  const Sequence tail = g.literal(">");
  root.insert(root.end(), tail.begin(), tail.end());
  g.set_root(g.rule("root", {root}));
  ASSERT_TRUE(g.finalize().ok());
  EXPECT_TRUE(matches(g, "<2>"));
  EXPECT_FALSE(matches(g, "<4>"));
  EXPECT_FALSE(add_json_schema(&g, R"({"type": "object", "propertyNames": {}})").ok());
}

}  // namespace
}  // namespace vlm::structured

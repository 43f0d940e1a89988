// The JSON writer (src/jinja/json.h) against Python's json.dumps and repr(float): every expected
// string below is what CPython 3 prints for the same value (json.dumps(x, ensure_ascii=False)
// unless a test says otherwise).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "jinja/jinja.h"
#include "jinja/json.h"

namespace vlm::jinja {
namespace {

using ojson = nlohmann::ordered_json;

// repr(x): fixed notation for decimal exponents in [-4, 16) with ".0" on integral values,
// scientific (at least two exponent digits) outside, shortest round-trip digits throughout.
TEST(JinjaJson, FloatsAsPythonRepr) {
  const struct {
    double x;
    const char* repr;
  } kCases[] = {
      {1e5, "100000.0"},
      {1e-5, "1e-05"},
      {1e16, "1e+16"},
      {1.5e-5, "1.5e-05"},
      {1e-4, "0.0001"},
      {-0.0, "-0.0"},
      {0.0, "0.0"},
      {1.0, "1.0"},
      {100.0, "100.0"},
      {0.1, "0.1"},
      {2.5, "2.5"},
      {1.0 / 3.0, "0.3333333333333333"},
      {1e15, "1000000000000000.0"},
      {9999999999999998.0, "9999999999999998.0"},
      {123456789012345678.0, "1.2345678901234568e+17"},
      {1e22, "1e+22"},
      {1e21, "1e+21"},
      {1e100, "1e+100"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {9007199254740992.0, "9007199254740992.0"},
      {1.0000000000000002, "1.0000000000000002"},
      {123.456, "123.456"},
      {-1.5e-7, "-1.5e-07"},
      {0.00009999, "9.999e-05"},
      {12345.678, "12345.678"},
      {-1e16, "-1e+16"},
      {1e-300, "1e-300"},
      {2.2250738585072014e-308, "2.2250738585072014e-308"},
      {0.1 + 0.2, "0.30000000000000004"},
  };
  for (const auto& c : kCases) {
    EXPECT_EQ(float_repr(c.x), c.repr);
    EXPECT_EQ(json_float(c.x), c.repr);
    EXPECT_EQ(json_dumps(Value(c.x)), c.repr);
    EXPECT_EQ(Value(c.x).repr(), c.repr);  // what {{ x }} prints
  }
}

TEST(JinjaJson, NonFiniteFloats) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(json_float(inf), "Infinity");
  EXPECT_EQ(json_float(-inf), "-Infinity");
  EXPECT_EQ(json_float(nan), "NaN");
  EXPECT_EQ(float_repr(inf), "inf");
  EXPECT_EQ(float_repr(-inf), "-inf");
  EXPECT_EQ(float_repr(nan), "nan");
  EXPECT_EQ(json_dumps(Value(Array{Value(inf), Value(nan)})), "[Infinity, NaN]");
}

std::string quote(std::string_view s, bool ensure_ascii) {
  std::string out;
  json_quote(s, ensure_ascii, &out);
  return out;
}

TEST(JinjaJson, StringEscapes) {
  // ensure_ascii=False: only '"', '\' and the C0 controls; DEL, U+2028 and the rest as they are.
  EXPECT_EQ(quote("é😀\x7f\x01\u2028\b\f\t\r\\\n\"", false),
            "\"é😀\x7f\\u0001\u2028\\b\\f\\t\\r\\\\\\n\\\"\"");
  EXPECT_EQ(quote(std::string("a\0b", 3), false), "\"a\\u0000b\"");
  EXPECT_EQ(quote("\x1f", false), "\"\\u001f\"");
  // ensure_ascii=True: DEL and every non-ASCII character too, surrogate pairs above U+FFFF.
  EXPECT_EQ(quote("é😀\x7f\x01\u2028", true), "\"\\u00e9\\ud83d\\ude00\\u007f\\u0001\\u2028\"");
  // Bytes that are not UTF-8 (a lone continuation byte, a truncated sequence, a surrogate).
  EXPECT_EQ(quote("a\x80z", true), "\"a\\ufffdz\"");
  EXPECT_EQ(quote("\xe2\x82", true), "\"\\ufffd\\ufffd\"");
  EXPECT_EQ(quote("\xed\xa0\x80", true), "\"\\ufffd\\ufffd\\ufffd\"");
  // Lead bytes that start no sequence (0xF5-0xFF, 0xC0, 0xC1): each byte alone.
  EXPECT_EQ(quote("\xf8\x88\x80", true), "\"\\ufffd\\ufffd\\ufffd\"");
  EXPECT_EQ(quote("\xff\xc0\xafz", true), "\"\\ufffd\\ufffd\\ufffdz\"");
  EXPECT_EQ(quote("a\x80z", false), "\"a\x80z\"");  // passed through, as ensure_ascii=False does
}

Value sample() {
  Object inner;
  inner.set("c", Value(Array{}));
  Object o;
  o.set("b", Value(Array{Value(1), Value(std::move(inner)), Value(Object{})}));
  o.set("a", Value("x"));
  return Value(std::move(o));
}

TEST(JinjaJson, LayoutAsJsonDumps) {
  // Default separators (", ", ": "), the dict's own order, empty containers closed at once.
  EXPECT_EQ(json_dumps(sample()), R"({"b": [1, {"c": []}, {}], "a": "x"})");
  // indent=2, sort_keys=True: (",", ": ") and a line per item of a non-empty container.
  JsonFormat f;
  f.indent = "  ";
  f.sort_keys = true;
  EXPECT_EQ(
      json_dumps(sample(), f),
      "{\n  \"a\": \"x\",\n  \"b\": [\n    1,\n    {\n      \"c\": []\n    },\n    {}\n  ]\n}");
  // separators=(",", ":").
  JsonFormat compact;
  compact.separators.emplace(",", ":");
  EXPECT_EQ(json_dumps(sample(), compact), R"({"b":[1,{"c":[]},{}],"a":"x"})");
  // indent="\t", separators=(";", "="): both taken as given.
  JsonFormat odd;
  odd.indent = "\t";
  odd.separators.emplace(";", "=");
  Object o;
  o.set("b", Value(Array{Value(1), Value(2)}));
  o.set("a", Value::none());
  EXPECT_EQ(json_dumps(Value(o), odd), "{\n\t\"b\"=[\n\t\t1;\n\t\t2\n\t];\n\t\"a\"=null\n}");
  // indent=0 still breaks the lines.
  JsonFormat zero;
  zero.indent = "";
  EXPECT_EQ(json_dumps(Value(Array{Value(1), Value(Array{})}), zero), "[\n1,\n[]\n]");
  // Scalars at the top, tuples as lists, undefined as null.
  EXPECT_EQ(json_dumps(Value("q")), "\"q\"");
  EXPECT_EQ(json_dumps(Value::tuple(Array{Value(true), Value(false), Value()})),
            "[true, false, null]");
  EXPECT_EQ(json_dumps(Value(int64_t{-9223372036854775807 - 1})), "-9223372036854775808");
}

TEST(JinjaJson, ParsedJsonAsJsonLoadsThenDumps) {
  // Numbers as json.loads reads them: 1e5 and 1E-5 are floats, integers stay integers (uint64
  // too), key order is kept.
  const ojson j = ojson::parse(
      R"({"z": 1e5, "y": 1E-5, "x": 1e16, "w": 100000.0, "v": -0.0, "u": 18446744073709551615,
          "t": -9223372036854775808, "s": "é\n\"q\"", "r": [true, null, {}], "q": 3})");
  EXPECT_EQ(json_dumps(j),
            R"({"z": 100000.0, "y": 1e-05, "x": 1e+16, "w": 100000.0, "v": -0.0, )"
            R"("u": 18446744073709551615, "t": -9223372036854775808, "s": "é\n\"q\"", )"
            R"("r": [true, null, {}], "q": 3})");
  JsonFormat f;
  f.indent = "  ";
  f.sort_keys = true;
  const ojson k = ojson::parse(R"({"b": [1, {"c": []}, {}], "a": "x"})");
  EXPECT_EQ(json_dumps(k, f), json_dumps(sample(), f));
  // The same document as parsed JSON and as values writes the same text.
  const ojson doc = ojson::parse(R"({"x": 100000.0, "y": 1e-05, "z": 1e16, "n": 3, "s": "é"})");
  EXPECT_EQ(json_dumps(doc), json_dumps(Value::from_json(doc)));
  EXPECT_EQ(json_dumps(doc), R"({"x": 100000.0, "y": 1e-05, "z": 1e+16, "n": 3, "s": "é"})");
}

TEST(JinjaJson, FunctionsAreNotSerializable) {
  const Value fn = Value::function([](Args&) { return Value(); });
  EXPECT_THROW(json_dumps(fn), std::runtime_error);
  auto t = Template::parse("{{ f | tojson }}");
  ASSERT_TRUE(t.ok());
  Object ctx;
  ctx.set("f", fn);
  auto r = t->render(ctx);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("not JSON serializable"), std::string::npos);
}

// The tojson filter takes transformers' arguments: tojson(ensure_ascii=False, indent=None,
// separators=None, sort_keys=False), by keyword or in that order.
TEST(JinjaJson, TojsonFilterArguments) {
  auto render = [](const std::string& src) {
    auto t = Template::parse(src);
    EXPECT_TRUE(t.ok()) << t.status().message();
    Object ctx;
    ctx.set("d", Value::from_json(ojson::parse(R"({"b": [1.5e-5, 1e5], "a": "é"})")));
    auto r = t->render(ctx);
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : std::string();
  };
  EXPECT_EQ(render("{{ d | tojson }}"), R"({"b": [1.5e-05, 100000.0], "a": "é"})");
  EXPECT_EQ(render("{{ d | tojson(ensure_ascii=true) }}"),
            R"({"b": [1.5e-05, 100000.0], "a": "\u00e9"})");
  EXPECT_EQ(render("{{ d | tojson(sort_keys=true, separators=(',', ':')) }}"),
            R"({"a":"é","b":[1.5e-05,100000.0]})");
  EXPECT_EQ(render("{{ d | tojson(indent=1) }}"),
            "{\n \"b\": [\n  1.5e-05,\n  100000.0\n ],\n \"a\": \"é\"\n}");
  EXPECT_EQ(render("{{ d | tojson(false, 1, none, true) }}"),
            "{\n \"a\": \"é\",\n \"b\": [\n  1.5e-05,\n  100000.0\n ]\n}");
}

}  // namespace
}  // namespace vlm::jinja

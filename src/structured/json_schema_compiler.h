// The JSON Schema compiler's internals, shared by json_schema.cc (schemas, strings, objects,
// arrays, references, enums) and json_schema_numbers.cc (integers and decimals in ranges). Not
// an API: json_schema.h is.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "structured/grammar.h"
#include "vlm/status.h"

namespace vlm::structured::json_schema_internal {

using Json = nlohmann::ordered_json;

// Integer parts without an upper bound have at most this many digits (10^15 - 1 < 2^53, so
// every such integer, and every integer part, is exact as a double).
constexpr int64_t kIntCap = 999'999'999'999'999;
constexpr int kFracDigits = 15;
constexpr int kExpDigits = 2;
// Integer bounds are clamped to ±(10^18 - 1) (a subset: the values beyond are not produced), so
// that the arithmetic below stays inside int64.
constexpr int64_t kBoundCap = 999'999'999'999'999'999;
// Schemas nested deeper than this many levels (each subschema of an object, an array or a
// combinator, and each reference, is one level) are refused, and the values a schema leaves open
// hold at most the levels of arrays and objects left. Each level takes a few frames of the
// automaton's parse stacks, so every path stays well under its depth limit (pda.h).
constexpr int kMaxDepth = 64;
// enum/const values are written as literal text (no parse-stack frames); this bounds the
// recursion that writes and compares them.
constexpr int kMaxValueNesting = 200;
constexpr int kMaxTextNesting = 1000;

// JSON types as bits (integers are numbers: a schema's "integer" accepts some "number" values).
constexpr uint8_t kNullBit = 1, kBoolBit = 2, kNumberBit = 4, kStringBit = 8, kArrayBit = 16,
                  kObjectBit = 32, kAllTypes = 63;

// A non-negative decimal k + 0.f with exactly kFracDigits fraction digits.
struct Dec {
  int64_t k = 0;
  std::string f = std::string(kFracDigits, '0');
  bool operator<(const Dec& o) const { return k != o.k ? k < o.k : f < o.f; }
  bool operator<=(const Dec& o) const { return !(o < *this); }
};

// What a schema accepts, over-approximated for telling oneOf branches apart: the JSON types it
// may accept; when it lists its values (enum/const), their keys; and for objects, required
// properties whose values it lists (a discriminated union's tag).
struct Shape {
  uint8_t types = kAllTypes;
  std::optional<std::set<std::string>> values;        // none: not a finite list
  std::map<std::string, std::set<std::string>> tags;  // required property → its values' keys
};

// JSON Pointer of a member (RFC 6901 escapes) or an array element.
std::string child(const std::string& ptr, std::string_view key);
std::string child(const std::string& ptr, size_t i);
Sequence cat(std::initializer_list<Sequence> parts);
Status error_at(const std::string& what, const std::string& ptr);

class Compiler {
 public:
  Compiler(Grammar* g, const Json* doc) : g_(g), doc_(doc) {}

  // skip_enum: compile as if enum and const were absent.
  Result<Element> compile(const Json& s, const std::string& ptr, int depth, bool skip_enum = false);
  // Any JSON value with at most `levels` levels of arrays and objects, and any object with at
  // most `levels` >= 1 (itself included).
  Element any_value(int levels);
  Element any_object(int levels);

 private:
  // The same for a value at schema depth `depth`: as many levels as kMaxDepth leaves there.
  Element any_value_at(int depth);
  Element any_object_at(int depth);
  Element scalar();

  // Shared pieces of JSON text.
  Element ws();
  Element digit();
  Element chars(std::string_view cs);
  Element range(char lo, char hi) {
    return g_->bytes(ByteSet::range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)));
  }
  Element string_char();
  Element plain_char();
  Element any_string();
  Element any_integer();
  Element any_number();
  Element frac_any_opt();
  Element free_frac(int i);
  Element alt(std::vector<Sequence> alts, const char* name);
  void append_alts(Sequence* s, std::vector<Sequence> alts, const char* name);

  // Numbers.
  std::vector<Sequence> fixed_range(std::string_view a, std::string_view b);
  std::vector<Sequence> uint_range(uint64_t lo, uint64_t hi);
  std::vector<Sequence> int_range(int64_t lo, int64_t hi);
  Element frac_digits(const std::string& x, const std::string& y);
  Element frac_opt(const std::string& x, const std::string& y);
  std::vector<Sequence> dec_range(const Dec& a, const Dec& b);

  using Target = std::pair<const Json*, std::string>;
  Result<Target> resolve(const std::string& ref, const std::string& p);
  Result<Element> compile_ref(const Json& s, const std::string& ptr, int depth);
  Shape shape(const Json& s, int depth);
  Result<Element> compile_enum(const Json& s, const std::string& ptr, int depth);
  Result<Element> compile_type(const std::string& type, const Json& s, const std::string& ptr,
                               int depth);
  Result<Element> compile_string(const Json& s, const std::string& ptr);
  Result<Element> compile_format(const std::string& name, const std::string& ptr);
  Result<Element> compile_integer(const Json& s, const std::string& ptr);
  Result<Element> compile_number(const Json& s, const std::string& ptr);
  // An object schema as compile_object reads it: its properties (declared, then required names
  // with no declaration), whether other names may appear, and the property counts.
  struct ObjectSpec {
    struct Prop {
      std::string name;
      bool required = false;
      std::optional<Element> value;  // none: the schema 'false', the property never appears
    };
    std::vector<Prop> props;
    std::vector<std::string> names;      // every declared or required name
    const Json* additional = nullptr;    // additionalProperties, when given
    bool extras = false;                 // names beyond `names` may appear
    std::optional<Element> extra_value;  // their schema, compiled when first needed
    int64_t min_props = 0;
    std::optional<int64_t> max_props;
  };
  Result<Element> compile_object(const Json& s, const std::string& ptr, int depth);
  Result<ObjectSpec> object_spec(const Json& s, const std::string& ptr, int depth);
  Result<Element> object_extra_value(ObjectSpec* o, const std::string& ptr, int depth);
  Result<Element> object_rules(ObjectSpec* o, bool counting, const std::string& ptr, int depth);
  Result<Element> compile_array(const Json& s, const std::string& ptr, int depth);
  Element key_not_in(const std::vector<std::string>& names);

  // A referenced schema compiled at one depth: its rule serves the references at that depth or
  // less, and at more while its deepest level (`reached`) plus the shift stays within kMaxDepth.
  struct RefVersion {
    int depth = 0;
    int32_t rule = -1;
    int reached = 0;
    bool done = false;  // false while its body is compiled: a reference to it then is a recursion
  };

  Grammar* g_;
  const Json* doc_;
  std::map<std::string, std::vector<RefVersion>> refs_;  // JSON Pointer of a referenced schema
  // The deepest level the schema being compiled reaches so far (a value left open reaches
  // kMaxDepth), for RefVersion::reached.
  int reached_ = 0;
  std::map<const Json*, std::optional<Shape>> shapes_;  // none while being computed
  std::map<std::string, Element> formats_;
  std::map<int, Element> free_frac_;
  std::vector<Element> values_, objects_;  // any_value and any_object, per level
  std::optional<Element> ws_, digit_, char_, plain_char_, string_, integer_, number_, scalar_,
      frac_any_opt_, plain_tail_;
};

}  // namespace vlm::structured::json_schema_internal

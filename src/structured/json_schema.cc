// JSON Schema → grammar.
//
// The grammar produces a subset of what the schema accepts, never anything outside it: the
// output of even a random model must validate (Python's `jsonschema` with a FormatChecker is the
// reference). Where the full language is awkward or endless, a smaller one is chosen on purpose:
//   - whitespace is at most one " " or "\n" wherever JSON allows some, and none after the value;
//   - unbounded integer parts have at most 15 digits (finite, and exact as a double), fractions
//     at most 15 digits, exponents ([eE][+-]?, 1–2 digits, never overflowing) only where a number
//     has no bounds;
//   - object properties come in the schema's order; with `properties` and no
//     `additionalProperties` no other property is produced (OpenAI's strict mode; JSON Schema's
//     default would allow any), and additional property names are written without escapes;
//   - `enum`/`const` values are written in their compact spelling only;
//   - arrays and objects nest at most kMaxDepth levels deep where the schema leaves the value
//     open (`{}`, `true`, additionalProperties and items left open): each such value has only the
//     levels left above it (recursive `$ref`s still nest without bound through the recursion).
// `oneOf` is compiled as `anyOf`, which is exact only when no value can match two branches: it is
// accepted only when that is provably so (the branches accept disjoint JSON types, disjoint
// enum/const values, or objects with a required property whose enum/const values differ, as in
// a discriminated union), and refused otherwise. Every keyword that constrains and is not
// enforced here is refused by name with its location.
#include "structured/json_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "structured/json_schema_compiler.h"
#include "structured/pda.h"
#include "structured/regex.h"
#include "structured/utf8.h"

namespace vlm::structured {
namespace json_schema_internal {
// "$id" only at the root: below it, an $id changes the base that references beneath it resolve
// against (compile() refuses it there).
bool is_annotation(const std::string& k) {
  static const std::set<std::string> kAnnotations = {
      "title",        "description", "default",  "examples",  "$schema",          "$id",
      "$comment",     "deprecated",  "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
      "discriminator"};
  return kAnnotations.count(k) > 0 || k.rfind("x-", 0) == 0;
}

// Keywords that hold subschemas only for references to reach; they constrain nothing here.
bool is_container(const std::string& k) { return k == "$defs" || k == "definitions"; }

const std::set<std::string>& string_keywords() {
  static const std::set<std::string> k = {"minLength", "maxLength", "pattern", "format"};
  return k;
}
const std::set<std::string>& number_keywords() {
  static const std::set<std::string> k = {"minimum", "maximum", "exclusiveMinimum",
                                          "exclusiveMaximum", "multipleOf"};
  return k;
}
const std::set<std::string>& object_keywords() {
  static const std::set<std::string> k = {"properties", "required", "additionalProperties",
                                          "minProperties", "maxProperties"};
  return k;
}
const std::set<std::string>& array_keywords() {
  static const std::set<std::string> k = {"items",    "prefixItems", "additionalItems",
                                          "minItems", "maxItems",    "uniqueItems"};
  return k;
}
const std::set<std::string>& general_keywords() {
  static const std::set<std::string> k = {"type",  "enum",  "const", "anyOf",
                                          "oneOf", "allOf", "$ref"};
  return k;
}

bool is_known(const std::string& k) {
  return is_annotation(k) || is_container(k) || general_keywords().count(k) ||
         string_keywords().count(k) || number_keywords().count(k) || object_keywords().count(k) ||
         array_keywords().count(k);
}

// JSON Pointer of a member (RFC 6901 escapes) or an array element.
std::string child(const std::string& ptr, std::string_view key) {
  std::string out = ptr + "/";
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}
std::string child(const std::string& ptr, size_t i) { return ptr + "/" + std::to_string(i); }

Sequence cat(std::initializer_list<Sequence> parts) {
  Sequence out;
  for (const Sequence& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// Characters a JSON string may hold without an escape.
const std::vector<std::pair<uint32_t, uint32_t>> kPlainChars = {
    {0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};

Status error_at(const std::string& what, const std::string& ptr) {
  return invalid_argument(what + " at " + ptr);
}

// How deeply arrays and objects nest in v (counted without recursion, since v may come from a
// hostile request).
int nesting(const Json& v) {
  int deepest = 0;
  std::vector<std::pair<const Json*, int>> todo = {{&v, 0}};
  while (!todo.empty()) {
    const auto [j, d] = todo.back();
    todo.pop_back();
    deepest = std::max(deepest, d);
    if (j->is_structured()) {
      for (const Json& e : *j) todo.emplace_back(&e, d + 1);
    }
  }
  return deepest;
}

uint8_t type_bit(const Json& v) {
  if (v.is_null()) return kNullBit;
  if (v.is_boolean()) return kBoolBit;
  if (v.is_number()) return kNumberBit;
  if (v.is_string()) return kStringBit;
  if (v.is_array()) return kArrayBit;
  return kObjectBit;
}

uint8_t type_bit(const std::string& name) {
  if (name == "null") return kNullBit;
  if (name == "boolean") return kBoolBit;
  if (name == "integer" || name == "number") return kNumberBit;
  if (name == "string") return kStringBit;
  if (name == "array") return kArrayBit;
  if (name == "object") return kObjectBit;
  return kAllTypes;
}

// A key that equal JSON values share, as Python's jsonschema compares them for enum and const:
// numbers by value (1 and 1.0 are equal; integers are compared as doubles, which may make two
// different ones share a key, never the reverse), booleans apart from numbers, strings by their
// text. Arrays and objects are not compared: all arrays share one key, all objects another.
std::string value_key(const Json& v) {
  if (v.is_number()) {
    double d = v.get<double>();
    if (d == 0) d = 0;  // -0 equals 0
    char buf[40];
    std::snprintf(buf, sizeof buf, "#%.17g", d);
    return buf;
  }
  if (v.is_string()) return "s" + v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_null()) return "null";
  return v.is_array() ? "[" : "{";
}

bool share_a_key(const std::set<std::string>& a, const std::set<std::string>& b) {
  const auto& small = a.size() <= b.size() ? a : b;
  const auto& large = a.size() <= b.size() ? b : a;
  return std::any_of(small.begin(), small.end(),
                     [&](const std::string& k) { return large.count(k) > 0; });
}

// Whether no value can be accepted by both.
bool disjoint(const Shape& a, const Shape& b) {
  const uint8_t common = a.types & b.types;
  if (common == 0) return true;
  if (a.values && b.values && !share_a_key(*a.values, *b.values)) return true;
  if (common == kObjectBit) {
    for (const auto& [name, keys] : a.tags) {
      const auto it = b.tags.find(name);
      if (it != b.tags.end() && !share_a_key(keys, it->second)) return true;
    }
  }
  return false;
}

// Values accepted by both: each part of either bounds the intersection.
Shape both(Shape a, const Shape& b) {
  a.types &= b.types;
  if (!a.values || (b.values && b.values->size() < a.values->size())) a.values = b.values;
  for (const auto& [name, keys] : b.tags) a.tags.emplace(name, keys);
  return a;
}

// Values accepted by either.
Shape either(Shape a, const Shape& b) {
  a.types |= b.types;
  if (a.values && b.values) {
    a.values->insert(b.values->begin(), b.values->end());
  } else {
    a.values.reset();
  }
  for (auto it = a.tags.begin(); it != a.tags.end();) {
    const auto other = b.tags.find(it->first);
    if (other == b.tags.end()) {
      it = a.tags.erase(it);
    } else {
      it->second.insert(other->second.begin(), other->second.end());
      ++it;
    }
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Shared pieces.

Element Compiler::alt(std::vector<Sequence> alts, const char* name) {
  if (alts.size() == 1 && alts[0].size() == 1) return alts[0][0];
  return g_->group(std::move(alts), name);
}

void Compiler::append_alts(Sequence* s, std::vector<Sequence> alts, const char* name) {
  if (alts.size() == 1) {
    s->insert(s->end(), alts[0].begin(), alts[0].end());
  } else {
    s->push_back(g_->group(std::move(alts), name));
  }
}

Element Compiler::ws() {
  if (!ws_) ws_ = g_->group({{}, g_->literal(" "), g_->literal("\n")}, "ws");
  return *ws_;
}

Element Compiler::digit() {
  if (!digit_) digit_ = range('0', '9');
  return *digit_;
}

Element Compiler::chars(std::string_view cs) {
  ByteSet s;
  for (char c : cs) s.add(static_cast<uint8_t>(c));
  return g_->bytes(s);
}

Element Compiler::plain_char() {
  if (!plain_char_) plain_char_ = g_->code_points(kPlainChars);
  return *plain_char_;
}

// One character of a JSON string: a plain character or an escape that decodes to exactly one
// character (\u escapes of surrogates are left out, so that minLength and maxLength, which
// count characters, can count escapes as one).
Element Compiler::string_char() {
  if (char_) return *char_;
  const Element hex = chars("0123456789abcdefABCDEF");
  const Element hex_not_d = chars("0123456789abcefABCEF");
  Sequence u = g_->literal("u");
  u.push_back(
      g_->group({{hex_not_d, hex, hex, hex}, {chars("dD"), range('0', '7'), hex, hex}}, "hex4"));
  const Element escape = g_->group({{chars("\"\\/bfnrt")}, u}, "escape");
  char_ = g_->group({{plain_char()}, cat({g_->literal("\\"), {escape}})}, "char");
  return *char_;
}

Element Compiler::any_string() {
  if (!string_) {
    string_ = g_->group({cat({g_->literal("\""), {g_->star({string_char()})}, g_->literal("\"")})},
                        "string");
  }
  return *string_;
}

Element Compiler::any_integer() {
  if (!integer_) integer_ = alt(int_range(-kIntCap, kIntCap), "integer");
  return *integer_;
}

Element Compiler::frac_any_opt() {
  if (!frac_any_opt_) {
    frac_any_opt_ = g_->optional(cat({g_->literal("."), {g_->repeat({digit()}, 1, kFracDigits)}}));
  }
  return *frac_any_opt_;
}

Element Compiler::any_number() {
  if (number_) return *number_;
  Sequence s{g_->optional(g_->literal("-"))};
  append_alts(&s, uint_range(0, static_cast<uint64_t>(kIntCap)), "int");
  s.push_back(frac_any_opt());
  s.push_back(g_->optional(
      {chars("eE"), g_->optional({chars("+-")}), g_->repeat({digit()}, 1, kExpDigits)}));
  number_ = g_->group({std::move(s)}, "number");
  return *number_;
}

// A string, a number, true, false or null.
Element Compiler::scalar() {
  if (!scalar_) {
    scalar_ = g_->group({{any_string()},
                         {any_number()},
                         g_->literal("true"),
                         g_->literal("false"),
                         g_->literal("null")},
                        "scalar");
  }
  return *scalar_;
}

// Unrolled by level, so that a value left open cannot nest arrays and objects without bound
// (which would outgrow the automaton's parse stacks): level 0 is the scalars, and the arrays and
// objects of level k hold values of level k - 1. Members and items carry the whitespace after
// them, so that no two ws ever meet:
//   "{" ws (member ("," ws member)*)? "}",  member ::= string ws ":" ws value ws
Element Compiler::any_value(int levels) {
  levels = std::max(levels, 0);
  if (values_.empty()) {
    values_.push_back(scalar());
    objects_.push_back(scalar());  // unused: an object takes at least one level
  }
  // open ws (entry ("," ws entry)*)? close
  auto container = [&](const char* open, const Sequence& entry, const char* close,
                       const char* name) {
    return g_->group({cat({g_->literal(open), {ws()}, g_->literal(close)}),
                      cat({g_->literal(open),
                           {ws()},
                           entry,
                           {g_->star(cat({g_->literal(","), {ws()}, entry}))},
                           g_->literal(close)})},
                     name);
  };
  while (static_cast<int>(values_.size()) <= levels) {
    const Element inner = values_.back();
    const Element object =
        container("{", cat({{any_string()}, {ws()}, g_->literal(":"), {ws()}, {inner}, {ws()}}),
                  "}", "object");
    const Element array = container("[", {inner, ws()}, "]", "array");
    objects_.push_back(object);
    values_.push_back(g_->group({{object}, {array}, {scalar()}}, "value"));
  }
  return values_[static_cast<size_t>(levels)];
}

Element Compiler::any_object(int levels) {
  levels = std::max(levels, 1);
  any_value(levels);
  return objects_[static_cast<size_t>(levels)];
}

Element Compiler::any_value_at(int depth) {
  reached_ = kMaxDepth;
  return any_value(kMaxDepth - depth);
}

Element Compiler::any_object_at(int depth) {
  reached_ = kMaxDepth;
  return any_object(kMaxDepth - depth);
}

// ---------------------------------------------------------------------------------------------
// Schemas.

Result<Element> Compiler::compile(const Json& s, const std::string& ptr, int depth,
                                  bool skip_enum) {
  if (depth > kMaxDepth) {
    return error_at(
        "the schema is nested too deeply (more than " + std::to_string(kMaxDepth) + " levels)",
        ptr);
  }
  reached_ = std::max(reached_, depth);
  if (g_->num_elements() > kMaxGrammarElements) {
    return error_at("the schema's grammar is too large (more than " +
                        std::to_string(kMaxGrammarElements) + " elements)",
                    ptr);
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return any_value_at(depth);
    return error_at("the schema 'false' matches nothing", ptr);
  }
  if (!s.is_object()) return error_at("a schema must be an object or a boolean", ptr);
  for (auto it = s.begin(); it != s.end(); ++it) {
    // An $id below the root would change what the references beneath it resolve against.
    if (!is_known(it.key()) || (it.key() == "$id" && ptr != "#")) {
      return error_at("unsupported JSON Schema keyword '" + it.key() + "'", ptr);
    }
  }
  if (!skip_enum && (s.contains("enum") || s.contains("const"))) {
    return compile_enum(s, ptr, depth);
  }

  // $ref and the combinators stand alone: next to them only annotations are accepted (applying
  // both would need an intersection of grammars).
  for (const char* kw : {"$ref", "anyOf", "oneOf", "allOf"}) {
    if (!s.contains(kw)) continue;
    for (auto it = s.begin(); it != s.end(); ++it) {
      const bool skipped = skip_enum && (it.key() == "enum" || it.key() == "const");
      if (it.key() != kw && !skipped && !is_annotation(it.key()) && !is_container(it.key())) {
        return error_at(
            std::string("keyword '") + it.key() + "' next to '" + kw + "' is not supported", ptr);
      }
    }
    if (std::string(kw) == "$ref") return compile_ref(s, ptr, depth);
    const Json& v = s[kw];
    const std::string p = child(ptr, kw);
    if (!v.is_array() || v.empty()) {
      return error_at("'" + std::string(kw) + "' must be a non-empty array", p);
    }
    if (std::string(kw) == "allOf") {
      if (v.size() != 1) {
        return error_at("'allOf' with more than one subschema is not supported", p);
      }
      return compile(v[0], child(p, size_t{0}), depth + 1);
    }
    // oneOf as anyOf, when no value can match two branches (see the top of the file). A branch
    // 'false' matches nothing: dropped.
    std::vector<Sequence> alts;
    for (size_t i = 0; i < v.size(); ++i) {
      if (v[i].is_boolean() && !v[i].get<bool>()) continue;
      VLM_ASSIGN_OR_RETURN(const Element e, compile(v[i], child(p, i), depth + 1));
      alts.push_back({e});
    }
    if (alts.empty()) return error_at("every branch is 'false'", p);
    if (std::string(kw) == "oneOf") {
      // Every pair of branches must be told apart by what they accept.
      std::vector<std::pair<size_t, Shape>> shapes;
      for (size_t i = 0; i < v.size(); ++i) {
        if (!(v[i].is_boolean() && !v[i].get<bool>())) {
          shapes.emplace_back(i, shape(v[i], depth + 1));
        }
      }
      for (size_t a = 0; a < shapes.size(); ++a) {
        for (size_t b = a + 1; b < shapes.size(); ++b) {
          if (!disjoint(shapes[a].second, shapes[b].second)) {
            return invalid_argument("'oneOf' whose branches may overlap is not supported at " + p +
                                    " (branches " + std::to_string(shapes[a].first) + " and " +
                                    std::to_string(shapes[b].first) + " may both match one value)");
          }
        }
      }
    }
    return alt(std::move(alts), kw);
  }

  // The types: listed, or else those whose keywords appear, or else any value.
  static const std::vector<std::string> kTypes = {"object",  "array",   "string", "number",
                                                  "integer", "boolean", "null"};
  std::vector<std::string> types;
  if (auto it = s.find("type"); it != s.end()) {
    const std::string p = child(ptr, "type");
    std::vector<const Json*> listed;
    if (it->is_string()) {
      listed.push_back(&*it);
    } else if (it->is_array() && !it->empty()) {
      for (const Json& t : *it) listed.push_back(&t);
    } else {
      return error_at("'type' must be a type name or a non-empty list of them", p);
    }
    for (const Json* tp : listed) {
      const Json& t = *tp;
      if (!t.is_string() ||
          std::find(kTypes.begin(), kTypes.end(), t.get<std::string>()) == kTypes.end()) {
        return error_at(t.is_string() ? "unknown type '" + t.get<std::string>() + "'"
                                      : std::string("a type name must be a string"),
                        p);
      }
      if (std::find(types.begin(), types.end(), t.get<std::string>()) == types.end()) {
        types.push_back(t.get<std::string>());
      }
    }
  } else {
    auto has_any = [&](const std::set<std::string>& kws) {
      return std::any_of(kws.begin(), kws.end(),
                         [&](const std::string& k) { return s.contains(k); });
    };
    if (has_any(object_keywords())) types.push_back("object");
    if (has_any(array_keywords())) types.push_back("array");
    if (has_any(string_keywords())) types.push_back("string");
    if (has_any(number_keywords())) types.push_back("number");
    if (types.empty()) return any_value_at(depth);
  }
  // "number" covers "integer" (with the same bounds).
  if (std::find(types.begin(), types.end(), "number") != types.end()) {
    types.erase(std::remove(types.begin(), types.end(), "integer"), types.end());
  }
  std::vector<Sequence> alts;
  for (const std::string& t : types) {
    VLM_ASSIGN_OR_RETURN(const Element e, compile_type(t, s, ptr, depth));
    alts.push_back({e});
  }
  return alt(std::move(alts), "types");
}

Result<Element> Compiler::compile_type(const std::string& type, const Json& s,
                                       const std::string& ptr, int depth) {
  if (type == "null") return g_->group({g_->literal("null")}, "null");
  if (type == "boolean") return g_->group({g_->literal("true"), g_->literal("false")}, "boolean");
  if (type == "string") return compile_string(s, ptr);
  if (type == "integer") return compile_integer(s, ptr);
  if (type == "number") return compile_number(s, ptr);
  if (type == "object") return compile_object(s, ptr, depth);
  return compile_array(s, ptr, depth);
}

// A local reference: "#" or "#/a/b" (a JSON Pointer, percent-decoded, ~1 → "/", ~0 → "~"); p is
// where the reference is, for errors. The schema it names, and that schema's JSON Pointer in its
// usual spelling. A schema on the way with an "$id" (below the root) is refused: it would change
// what the pointer is resolved against.
Result<Compiler::Target> Compiler::resolve(const std::string& ref, const std::string& p) {
  if (ref.empty() || ref[0] != '#') {
    return error_at("remote $ref '" + ref + "' is not supported (only '#...' within the schema)",
                    p);
  }
  std::string frag;
  for (size_t i = 1; i < ref.size(); ++i) {
    if (ref[i] == '%' && i + 2 < ref.size() && hex_digit(ref[i + 1]) >= 0 &&
        hex_digit(ref[i + 2]) >= 0) {
      frag += static_cast<char>(hex_digit(ref[i + 1]) * 16 + hex_digit(ref[i + 2]));
      i += 2;
    } else {
      frag += ref[i];
    }
  }
  if (!frag.empty() && frag[0] != '/') {
    return error_at("$ref '" + ref + "' names an anchor; only JSON Pointers are supported", p);
  }
  const Json* node = doc_;
  std::string at = "#";
  size_t pos = 1;
  while (pos <= frag.size() && !frag.empty()) {
    const size_t next = std::min(frag.find('/', pos), frag.size());
    std::string token;
    for (size_t i = pos; i < next; ++i) {
      if (frag[i] == '~' && i + 1 < next && (frag[i + 1] == '0' || frag[i + 1] == '1')) {
        token += frag[i + 1] == '0' ? '~' : '/';
        ++i;
      } else {
        token += frag[i];
      }
    }
    if (node->is_object() && node->contains(token)) {
      node = &(*node)[token];
    } else if (node->is_array() && !token.empty() && token.size() <= 18 &&
               token.find_first_not_of("0123456789") == std::string::npos &&
               std::stoull(token) < node->size()) {
      node = &(*node)[std::stoull(token)];
    } else {
      return error_at("$ref '" + ref + "' does not resolve", p);
    }
    at = child(at, token);
    // A string "$id" is the keyword (a property or definition named "$id" holds a schema).
    if (node->is_object() && node->contains("$id") && (*node)["$id"].is_string()) {
      return error_at("unsupported JSON Schema keyword '$id'", at);
    }
    pos = next + 1;
  }
  return Target{node, at};
}

// Each referenced schema becomes a rule, made before its body is compiled, so that recursive
// schemas refer back to it; finalize() refuses a recursion with no finite text. A recursion nests
// as deep as the output goes (a tree of any height): kMaxDepth bounds the schema, not its
// recursion. Without recursion, a rule compiled at one depth is reused where the levels its body
// takes still fit (values left open take all the levels left), and compiled again, for the new
// depth, where they do not.
Result<Element> Compiler::compile_ref(const Json& s, const std::string& ptr, int depth) {
  const std::string p = child(ptr, "$ref");
  if (!s["$ref"].is_string()) return error_at("'$ref' must be a string", p);
  const std::string ref = s["$ref"].get<std::string>();
  VLM_ASSIGN_OR_RETURN(const Target target, resolve(ref, p));
  const Json* node = target.first;
  const std::string& target_ptr = target.second;
  const int at = depth + 1;
  std::vector<RefVersion>& versions = refs_[target_ptr];
  for (const RefVersion& v : versions) {
    if (v.done && v.reached - v.depth + at <= kMaxDepth) {
      reached_ = std::max(reached_, v.reached - v.depth + at);
      return Grammar::ref(v.rule);
    }
  }
  for (const RefVersion& v : versions) {
    if (!v.done) return Grammar::ref(v.rule);  // a recursion
  }
  const size_t index = versions.size();
  const int32_t r = g_->new_rule("ref " + target_ptr);
  versions.push_back(RefVersion{at, r, at, false});
  const int outer = reached_;
  reached_ = at;
  VLM_ASSIGN_OR_RETURN(const Element e, compile(*node, target_ptr, at));
  g_->add_alternative(r, {e});
  // The body cannot have added a version of this schema: a reference to it found this one.
  RefVersion& v = versions[index];
  v.reached = reached_;
  v.done = true;
  reached_ = std::max(outer, reached_);
  return Grammar::ref(r);
}

// The shape of what s accepts (see Shape), for oneOf. Over-approximated wherever the schema is
// not simple (and past kMaxDepth or in a recursion, where it is any value); memoized per schema,
// so that references shared by many branches are followed once.
Shape Compiler::shape(const Json& s, int depth) {
  if (depth > kMaxDepth || !s.is_object()) {
    Shape any;
    if (s.is_boolean() && !s.get<bool>()) {
      any.types = 0;
      any.values.emplace();
    }
    return any;
  }
  if (auto it = shapes_.find(&s); it != shapes_.end()) return it->second.value_or(Shape{});
  shapes_[&s] = std::nullopt;
  Shape out;
  if (auto it = s.find("type"); it != s.end()) {
    if (it->is_string()) {
      out.types = type_bit(it->get<std::string>());
    } else if (it->is_array() && !it->empty()) {
      out.types = 0;
      for (const Json& t : *it) {
        out.types |= t.is_string() ? type_bit(t.get<std::string>()) : kAllTypes;
      }
    }
  }
  // With both, const alone bounds the values.
  if (auto it = s.find("const"); it != s.end()) {
    out.values.emplace({value_key(*it)});
    out.types &= type_bit(*it);
  } else if (auto e = s.find("enum"); e != s.end() && e->is_array()) {
    out.values.emplace();
    uint8_t types = 0;
    for (const Json& v : *e) {
      out.values->insert(value_key(v));
      types |= type_bit(v);
    }
    out.types &= types;
  }
  auto req = s.find("required");
  auto props = s.find("properties");
  if (req != s.end() && req->is_array() && props != s.end() && props->is_object()) {
    for (const Json& name : *req) {
      if (!name.is_string() || !props->contains(name.get<std::string>())) continue;
      const Shape p = shape((*props)[name.get<std::string>()], depth + 1);
      if (p.values) out.tags.emplace(name.get<std::string>(), *p.values);
    }
  }
  if (auto it = s.find("$ref"); it != s.end() && it->is_string()) {
    auto target = resolve(it->get<std::string>(), "#");
    out = both(std::move(out), target.ok() ? shape(*target->first, depth + 1) : Shape{});
  }
  if (auto it = s.find("allOf"); it != s.end() && it->is_array()) {
    for (const Json& sub : *it) out = both(std::move(out), shape(sub, depth + 1));
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    auto it = s.find(kw);
    if (it == s.end() || !it->is_array() || it->empty()) continue;
    std::optional<Shape> any;
    for (const Json& sub : *it) {
      Shape b = shape(sub, depth + 1);
      any = any ? either(std::move(*any), b) : std::move(b);
    }
    out = both(std::move(out), *any);
  }
  shapes_[&s] = out;
  return out;
}

// enum / const: each allowed value in its compact spelling. When other keywords constrain too,
// a value is kept only if the grammar of the schema without enum/const produces that spelling
// (a subset of the values the schema accepts).
Result<Element> Compiler::compile_enum(const Json& s, const std::string& ptr, int depth) {
  std::vector<const Json*> values;
  if (auto it = s.find("enum"); it != s.end()) {
    if (!it->is_array()) return error_at("'enum' must be an array", child(ptr, "enum"));
    for (const Json& v : *it) values.push_back(&v);
  }
  if (auto it = s.find("const"); it != s.end()) values.push_back(&*it);
  // Writing and comparing values recurses into them: refuse deep ones before either.
  for (const Json* v : values) {
    if (nesting(*v) > kMaxValueNesting) {
      return error_at("an 'enum'/'const' value is nested too deeply", ptr);
    }
  }
  if (s.contains("enum") && s.contains("const")) {
    const Json* c = values.back();
    values.pop_back();
    values.erase(
        std::remove_if(values.begin(), values.end(), [&](const Json* v) { return !(*v == *c); }),
        values.end());
  }
  std::vector<std::string> spellings;
  for (const Json* v : values) spellings.push_back(v->dump());
  bool constrained = false;
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    if (k != "enum" && k != "const" && !is_annotation(k) && !is_container(k)) constrained = true;
  }
  if (constrained) {
    Grammar scratch;
    Compiler c(&scratch, doc_);
    VLM_ASSIGN_OR_RETURN(const Element e, c.compile(s, ptr, depth, /*skip_enum=*/true));
    scratch.set_root(scratch.rule("root", {{e}}));
    if (scratch.finalize().ok()) {
      const Pda pda(scratch);
      auto produced = [&](const std::string& t) {
        StackSet st = pda.initial();
        for (char ch : t) {
          st = pda.advance(st, static_cast<uint8_t>(ch));
          if (st.empty()) return false;
        }
        return pda.accepting(st);
      };
      spellings.erase(std::remove_if(spellings.begin(), spellings.end(),
                                     [&](const std::string& t) { return !produced(t); }),
                      spellings.end());
    } else {
      spellings.clear();
    }
  }
  std::sort(spellings.begin(), spellings.end());
  spellings.erase(std::unique(spellings.begin(), spellings.end()), spellings.end());
  if (spellings.empty()) {
    return error_at("no value of 'enum'/'const' satisfies the schema's other keywords", ptr);
  }
  std::vector<Sequence> alts;
  for (const std::string& t : spellings) alts.push_back(g_->literal(t));
  return g_->group(std::move(alts), "enum");
}

Result<int64_t> get_count(const Json& s, const char* kw, const std::string& ptr) {
  const Json& v = s[kw];
  if (v.is_number_unsigned()) {
    return static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX));
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  if (v.is_number_float() && v.get<double>() >= 0 &&
      std::floor(v.get<double>()) == v.get<double>()) {
    return static_cast<int64_t>(std::min(v.get<double>(), 9e18));
  }
  return error_at(std::string("'") + kw + "' must be a non-negative integer", child(ptr, kw));
}

Result<Element> Compiler::compile_string(const Json& s, const std::string& ptr) {
  const bool has_len = s.contains("minLength") || s.contains("maxLength");
  if (auto it = s.find("format"); it != s.end()) {
    if (!it->is_string()) return error_at("'format' must be a string", child(ptr, "format"));
    if (has_len || s.contains("pattern")) {
      return error_at(
          "'format' together with 'minLength', 'maxLength' or 'pattern' is not supported", ptr);
    }
    VLM_ASSIGN_OR_RETURN(const Element f,
                         compile_format(it->get<std::string>(), child(ptr, "format")));
    return g_->group({cat({g_->literal("\""), {f}, g_->literal("\"")})}, "formatted");
  }
  if (auto it = s.find("pattern"); it != s.end()) {
    const std::string p = child(ptr, "pattern");
    if (!it->is_string()) return error_at("'pattern' must be a string", p);
    if (has_len) {
      return error_at("'pattern' together with 'minLength' or 'maxLength' is not supported", ptr);
    }
    auto e = add_regex(g_, it->get<std::string>(), /*in_json_string=*/true);
    if (!e.ok()) return e.status().with_context("'pattern' at " + p);
    return g_->group({cat({g_->literal("\""), {*e}, g_->literal("\"")})}, "pattern");
  }
  if (!has_len) return any_string();
  int64_t lo = 0, hi = -1;
  if (s.contains("minLength")) {
    VLM_ASSIGN_OR_RETURN(lo, get_count(s, "minLength", ptr));
  }
  if (s.contains("maxLength")) {
    VLM_ASSIGN_OR_RETURN(hi, get_count(s, "maxLength", ptr));
    if (hi < lo) return error_at("'maxLength' is below 'minLength'", ptr);
  }
  if (lo > kMaxGrammarElements || hi > kMaxGrammarElements) {
    return error_at(
        "string lengths above " + std::to_string(kMaxGrammarElements) + " are not supported", ptr);
  }
  return g_->group(
      {cat({g_->literal("\""), {g_->repeat({string_char()}, lo, hi)}, g_->literal("\"")})},
      "string");
}

// String formats, as Python's jsonschema FormatChecker checks them.
Result<Element> Compiler::compile_format(const std::string& name, const std::string& ptr) {
  if (auto it = formats_.find(name); it != formats_.end()) return it->second;
  const Element d = digit();
  auto lit = [&](std::string_view t) { return g_->literal(t); };
  auto by = [&](char c) { return g_->byte(static_cast<uint8_t>(c)); };
  auto hexes = [&](int n) {
    const Element h = chars("0123456789abcdefABCDEF");
    return Sequence(static_cast<size_t>(n), h);
  };
  // date: YYYY-MM-DD that datetime.date.fromisoformat accepts: years 0001–9999, days valid for
  // the month, 02-29 only in leap years (divisible by 4, centuries only when divisible by 400).
  auto date = [&] {
    const Element year = g_->group({cat({lit("000"), {range('1', '9')}}),
                                    cat({lit("00"), {range('1', '9'), d}}),
                                    cat({lit("0"), {range('1', '9'), d, d}}),
                                    {range('1', '9'), d, d, d}},
                                   "year");
    const Element m31 = g_->group({{by('0'), chars("13578")}, {by('1'), chars("02")}}, "m31");
    const Element m30 = g_->group({{by('0'), chars("469")}, lit("11")}, "m30");
    const Element d31 =
        g_->group({{by('0'), range('1', '9')}, {chars("12"), d}, {by('3'), chars("01")}}, "d31");
    const Element d30 = g_->group({{by('0'), range('1', '9')}, {chars("12"), d}, lit("30")}, "d30");
    const Element d28 =
        g_->group({{by('0'), range('1', '9')}, {by('1'), d}, {by('2'), range('0', '8')}}, "d28");
    // Two digits that form a non-zero multiple of 4.
    const Element four = g_->group(
        {{by('0'), chars("48")}, {chars("2468"), chars("048")}, {chars("13579"), chars("26")}},
        "mult4");
    const Element leap = g_->group({{d, d, four}, cat({{four}, lit("00")})}, "leap_year");
    return g_->group({cat({{year}, lit("-"), {m31}, lit("-"), {d31}}),
                      cat({{year}, lit("-"), {m30}, lit("-"), {d30}}),
                      cat({{year}, lit("-02-"), {d28}}), cat({{leap}, lit("-02-29")})},
                     "date");
  };
  // time: hh:mm:ss, an optional fraction of 1–9 digits, and an offset (RFC 3339).
  auto time = [&] {
    const Element hh = g_->group({{chars("01"), d}, {by('2'), range('0', '3')}}, "hh");
    const Element mm = g_->group({{range('0', '5'), d}}, "mm");
    const Element offset = g_->group({lit("Z"), {chars("+-"), hh, by(':'), mm}}, "offset");
    return g_->group(
        {{hh, by(':'), mm, by(':'), mm, g_->optional({by('.'), g_->repeat({d}, 1, 9)}), offset}},
        "time");
  };
  Element e;
  if (name == "date") {
    e = date();
  } else if (name == "time") {
    e = time();
  } else if (name == "date-time") {
    VLM_ASSIGN_OR_RETURN(const Element de, compile_format("date", ptr));
    VLM_ASSIGN_OR_RETURN(const Element te, compile_format("time", ptr));
    e = g_->group({{de, by('T'), te}}, "date_time");
  } else if (name == "uuid") {
    e = g_->group({cat({hexes(8), lit("-"), hexes(4), lit("-"), hexes(4), lit("-"), hexes(4),
                        lit("-"), hexes(12)})},
                  "uuid");
  } else if (name == "email") {
    // A bounded subset of addresses (jsonschema only asks for an "@").
    const Element alnum = chars("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789");
    const Element alnum_hyphen =
        chars("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-");
    const Element local = g_->repeat(
        {chars("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")}, 1, 64);
    const Element label =
        g_->group({{alnum, g_->optional({g_->repeat({alnum_hyphen}, 0, 61), alnum})}}, "label");
    e = g_->group({{local, by('@'), label, g_->repeat({by('.'), label}, 1, 4)}}, "email");
  } else if (name == "ipv4") {
    const Element octet = g_->group({{d},
                                     {range('1', '9'), d},
                                     {by('1'), d, d},
                                     {by('2'), range('0', '4'), d},
                                     cat({lit("25"), {range('0', '5')}})},
                                    "octet");
    e = g_->group({{octet, by('.'), octet, by('.'), octet, by('.'), octet}}, "ipv4");
  } else {
    return error_at("unsupported string format '" + name +
                        "' (supported: date, time, date-time, uuid, email, ipv4)",
                    ptr);
  }
  formats_.emplace(name, e);
  return e;
}

// A JSON string, written without escapes, whose text is none of `names`: a walk down the trie
// of the names, where each node may close the string (unless a name ends there), continue along
// a child, or leave the trie with another character and then take any characters.
Element Compiler::key_not_in(const std::vector<std::string>& names) {
  struct Node {
    std::map<uint32_t, int> kids;
    bool terminal = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& name : names) {
    // A name holding a character that is never written unescaped can never be produced.
    std::vector<uint32_t> cps;
    bool plain = true;
    for (size_t pos = 0; plain && pos < name.size();) {
      uint32_t c = 0;
      plain = decode_utf8(name, &pos, &c) && c >= 0x20 && c != '"' && c != '\\';
      cps.push_back(c);
    }
    if (!plain) continue;
    int node = 0;
    for (uint32_t c : cps) {
      auto it = trie[static_cast<size_t>(node)].kids.find(c);
      if (it == trie[static_cast<size_t>(node)].kids.end()) {
        trie.emplace_back();
        it = trie[static_cast<size_t>(node)]
                 .kids.emplace(c, static_cast<int>(trie.size() - 1))
                 .first;
      }
      node = it->second;
    }
    trie[static_cast<size_t>(node)].terminal = true;
  }
  if (!plain_tail_) {
    plain_tail_ = g_->group({cat({{g_->star({plain_char()})}, g_->literal("\"")})}, "key_tail");
  }
  std::vector<int32_t> rules(trie.size());
  for (size_t i = 0; i < trie.size(); ++i) rules[i] = g_->new_rule("key");
  for (size_t i = 0; i < trie.size(); ++i) {
    const Node& n = trie[i];
    if (!n.terminal) g_->add_alternative(rules[i], g_->literal("\""));
    std::vector<std::pair<uint32_t, uint32_t>> others;
    uint32_t from = 0;
    for (const auto& [c, kid] : n.kids) {
      std::string text;
      append_utf8(c, &text);
      Sequence s = g_->literal(text);
      s.push_back(Grammar::ref(rules[static_cast<size_t>(kid)]));
      g_->add_alternative(rules[i], std::move(s));
      if (c > from) others.emplace_back(from, c - 1);
      from = c + 1;
    }
    others.emplace_back(from, 0x10FFFF);
    // Intersect with the plain characters.
    std::vector<std::pair<uint32_t, uint32_t>> allowed;
    for (auto [a, b] : others) {
      for (auto [pa, pb] : kPlainChars) {
        const uint32_t lo = std::max(a, pa), hi = std::min(b, pb);
        if (lo <= hi) allowed.emplace_back(lo, hi);
      }
    }
    if (!allowed.empty()) {
      g_->add_alternative(rules[i], {g_->code_points(allowed), *plain_tail_});
    }
  }
  return g_->group({cat({g_->literal("\""), {Grammar::ref(rules[0])}})}, "key");
}

// The object schema's properties, additionalProperties and property counts, checked.
Result<Compiler::ObjectSpec> Compiler::object_spec(const Json& s, const std::string& ptr,
                                                   int depth) {
  ObjectSpec o;
  std::set<std::string> required;
  if (auto it = s.find("required"); it != s.end()) {
    if (!it->is_array()) {
      return error_at("'required' must be an array of strings", child(ptr, "required"));
    }
    for (const Json& r : *it) {
      if (!r.is_string()) {
        return error_at("'required' must be an array of strings", child(ptr, "required"));
      }
      required.insert(r.get<std::string>());
    }
  }
  const Json* ap = nullptr;
  if (auto it = s.find("additionalProperties"); it != s.end()) {
    ap = &*it;
    if (!ap->is_boolean() && !ap->is_object()) {
      return error_at("'additionalProperties' must be a boolean or a schema",
                      child(ptr, "additionalProperties"));
    }
  }
  o.additional = ap;
  const bool has_props = s.contains("properties");
  o.extras = ap ? !(ap->is_boolean() && !ap->get<bool>()) : !has_props;
  if (has_props) {
    const Json& ps = s["properties"];
    const std::string pp = child(ptr, "properties");
    if (!ps.is_object()) return error_at("'properties' must be an object", pp);
    for (auto it = ps.begin(); it != ps.end(); ++it) {
      ObjectSpec::Prop p{it.key(), required.count(it.key()) > 0, std::nullopt};
      o.names.push_back(it.key());
      if (it.value().is_boolean() && !it.value().get<bool>()) {
        if (p.required) {
          return error_at("a required property has the schema 'false'", child(pp, it.key()));
        }
        continue;
      }
      VLM_ASSIGN_OR_RETURN(p.value, compile(it.value(), child(pp, it.key()), depth + 1));
      o.props.push_back(std::move(p));
    }
  }
  // Required names with no 'properties' entry take the additionalProperties schema (JSON
  // Schema's default, any value, when that is absent).
  if (auto it = s.find("required"); it != s.end()) {
    std::set<std::string> seen;
    for (const Json& r : *it) {
      const std::string name = r.get<std::string>();
      if (std::find(o.names.begin(), o.names.end(), name) != o.names.end() ||
          !seen.insert(name).second) {
        continue;
      }
      if (ap && ap->is_boolean() && !ap->get<bool>()) {
        return error_at(
            "required property '" + name + "' is not allowed by additionalProperties false", ptr);
      }
      ObjectSpec::Prop p{name, true, std::nullopt};
      if (ap && ap->is_object()) {
        VLM_ASSIGN_OR_RETURN(p.value, object_extra_value(&o, ptr, depth));
      } else {
        p.value = any_value_at(depth + 1);
      }
      o.names.push_back(name);
      o.props.push_back(std::move(p));
    }
  }
  if (s.contains("minProperties")) {
    VLM_ASSIGN_OR_RETURN(o.min_props, get_count(s, "minProperties", ptr));
  }
  if (s.contains("maxProperties")) {
    VLM_ASSIGN_OR_RETURN(const int64_t m, get_count(s, "maxProperties", ptr));
    o.max_props = m;
  }
  return o;
}

// The value of the names beyond the declared ones: additionalProperties' schema, else any value.
Result<Element> Compiler::object_extra_value(ObjectSpec* o, const std::string& ptr, int depth) {
  if (!o->extra_value) {
    if (o->additional && o->additional->is_object()) {
      VLM_ASSIGN_OR_RETURN(o->extra_value,
                           compile(*o->additional, child(ptr, "additionalProperties"), depth + 1));
    } else {
      o->extra_value = any_value_at(depth + 1);
    }
  }
  return *o->extra_value;
}

// Objects: "{" ws R(0, 0) "}", where R(i, c) writes the properties from the i-th on after c were
// written (c only tells whether a comma comes first, unless minProperties/maxProperties need the
// count): a required property is written, an optional one written or skipped. Each member is
// followed by its ws. Extra properties come after the declared ones.
Result<Element> Compiler::compile_object(const Json& s, const std::string& ptr, int depth) {
  VLM_ASSIGN_OR_RETURN(ObjectSpec o, object_spec(s, ptr, depth));
  const int n = static_cast<int>(o.props.size());
  const bool extra_schema = o.additional && o.additional->is_object();
  // Nothing declared, anything allowed: any object (whose names may be written with escapes).
  if (n == 0 && o.names.empty() && o.extras && !extra_schema && o.min_props == 0 && !o.max_props) {
    return any_object_at(depth);
  }
  const int64_t n_required = std::count_if(o.props.begin(), o.props.end(),
                                           [](const ObjectSpec::Prop& p) { return p.required; });
  // Extra names may repeat one another (the later one wins in a parser, and its value is valid
  // too), so they cannot be counted towards minProperties: the declared ones must reach it.
  if (o.min_props > n) {
    return error_at("'minProperties' beyond the declared properties is not supported", ptr);
  }
  if (o.max_props && *o.max_props < n_required) {
    return error_at("'maxProperties' is below the required count", ptr);
  }
  const bool counting = o.min_props > n_required || (o.max_props && (o.extras || *o.max_props < n));
  if (counting && static_cast<int64_t>(n + 1) * (n + 1) > kMaxGrammarElements) {
    return error_at("too many properties to count for minProperties/maxProperties", ptr);
  }
  return object_rules(&o, counting, ptr, depth);
}

// The rules R(i, c) of compile_object, from the last property back to the first.
Result<Element> Compiler::object_rules(ObjectSpec* o, bool counting, const std::string& ptr,
                                       int depth) {
  const int n = static_cast<int>(o->props.size());
  const std::optional<int64_t> max_p = o->max_props;
  // One rule per member, shared by every R(i, c) that writes it.
  std::vector<Sequence> members;
  for (const ObjectSpec::Prop& p : o->props) {
    members.push_back({g_->group({cat({g_->literal(Json(p.name).dump()),
                                       {ws()},
                                       g_->literal(":"),
                                       {ws()},
                                       {*p.value},
                                       {ws()}})},
                                 "member")});
  }
  Sequence extra_member;
  if (o->extras) {
    VLM_ASSIGN_OR_RETURN(const Element v, object_extra_value(o, ptr, depth));
    extra_member = cat({{key_not_in(o->names)}, {ws()}, g_->literal(":"), {ws()}, {v}, {ws()}});
  }
  const Sequence comma = cat({g_->literal(","), {ws()}});
  // Extra members after c declared ones, at most emax of them (< 0: unbounded).
  auto extra_seq = [&](int64_t c, int64_t emax) -> Sequence {
    if (!o->extras || emax == 0) return {};
    const Sequence more = cat({comma, extra_member});
    if (c > 0) return {g_->repeat(more, 0, emax)};
    return {g_->optional(cat({extra_member, {g_->repeat(more, 0, emax < 0 ? -1 : emax - 1)}}))};
  };
  const int cmax = counting ? n : 1;
  std::vector<std::vector<int32_t>> rule(static_cast<size_t>(n + 1),
                                         std::vector<int32_t>(static_cast<size_t>(cmax + 1), -1));
  for (int i = n; i >= 0; --i) {
    for (int c = 0; c <= std::min(i, cmax); ++c) {
      std::vector<Sequence> alts;
      if (i == n) {
        if (counting && c < o->min_props) continue;
        if (max_p && counting && c > *max_p) continue;
        alts.push_back(extra_seq(c, max_p ? (counting ? *max_p - c : -1) : -1));
      } else {
        const ObjectSpec::Prop& p = o->props[static_cast<size_t>(i)];
        const int c2 = counting ? c + 1 : 1;
        const int32_t next = rule[static_cast<size_t>(i + 1)][static_cast<size_t>(c2)];
        if (next >= 0 && !(counting && max_p && c + 1 > *max_p)) {
          Sequence take = c > 0 ? comma : Sequence{};
          take.insert(take.end(), members[static_cast<size_t>(i)].begin(),
                      members[static_cast<size_t>(i)].end());
          take.push_back(Grammar::ref(next));
          alts.push_back(std::move(take));
        }
        const int32_t skip = rule[static_cast<size_t>(i + 1)][static_cast<size_t>(c)];
        if (!p.required && skip >= 0) alts.push_back({Grammar::ref(skip)});
      }
      if (alts.empty()) continue;
      rule[static_cast<size_t>(i)][static_cast<size_t>(c)] = g_->rule("props", std::move(alts));
    }
  }
  if (rule[0][0] < 0) return error_at("no object satisfies the property counts", ptr);
  return g_->group({cat({g_->literal("{"), {ws()}, {Grammar::ref(rule[0][0])}, g_->literal("}")})},
                   "object");
}

// Arrays: "[" ws P(0) "]", where P(i) writes the items from the i-th on: the tuple's schemas
// (prefixItems) first, then the rest; each item is followed by its ws.
Result<Element> Compiler::compile_array(const Json& s, const std::string& ptr, int depth) {
  if (auto it = s.find("uniqueItems"); it != s.end()) {
    if (!it->is_boolean()) {
      return error_at("'uniqueItems' must be a boolean", child(ptr, "uniqueItems"));
    }
    if (it->get<bool>()) {
      return error_at("'uniqueItems: true' is not supported", child(ptr, "uniqueItems"));
    }
  }
  // The tuple: prefixItems, or draft 7's array form of items (whose rest is additionalItems).
  const Json* tuple = nullptr;
  std::string tuple_kw;
  const Json* rest = nullptr;
  std::string rest_kw;
  if (s.contains("prefixItems")) {
    tuple = &s["prefixItems"];
    tuple_kw = "prefixItems";
    if (s.contains("items")) {
      rest = &s["items"];
      rest_kw = "items";
    }
    if (s.contains("additionalItems")) {
      return error_at("'additionalItems' next to 'prefixItems' is not supported", ptr);
    }
  } else if (s.contains("items") && s["items"].is_array()) {
    tuple = &s["items"];
    tuple_kw = "items";
    if (s.contains("additionalItems")) {
      rest = &s["additionalItems"];
      rest_kw = "additionalItems";
    }
  } else if (s.contains("items")) {
    rest = &s["items"];
    rest_kw = "items";
  }
  if (tuple && !tuple->is_array()) {
    return error_at("'" + tuple_kw + "' must be an array", child(ptr, tuple_kw));
  }
  // Without a rest schema, no items after a tuple (a subset: JSON Schema allows any), and any
  // items when there is no tuple either.
  std::optional<Element> rest_value;
  if (rest) {
    if (!(rest->is_boolean() && !rest->get<bool>())) {
      VLM_ASSIGN_OR_RETURN(rest_value, compile(*rest, child(ptr, rest_kw), depth + 1));
    }
  } else if (!tuple) {
    rest_value = any_value_at(depth + 1);
  }
  int64_t min_i = 0;
  std::optional<int64_t> max_i;
  if (s.contains("minItems")) {
    VLM_ASSIGN_OR_RETURN(min_i, get_count(s, "minItems", ptr));
  }
  if (s.contains("maxItems")) {
    VLM_ASSIGN_OR_RETURN(const int64_t m, get_count(s, "maxItems", ptr));
    max_i = m;
    if (m < min_i) return error_at("'maxItems' is below 'minItems'", ptr);
  }
  if (min_i > kMaxGrammarElements || (max_i && *max_i > kMaxGrammarElements)) {
    return error_at(
        "array lengths above " + std::to_string(kMaxGrammarElements) + " are not supported", ptr);
  }
  const int k = tuple ? static_cast<int>(tuple->size()) : 0;
  std::vector<std::optional<Element>> items(static_cast<size_t>(k));
  for (int i = 0; i < k; ++i) {
    const Json& t = (*tuple)[static_cast<size_t>(i)];
    if (t.is_boolean() && !t.get<bool>()) continue;  // no item can be there: the array ends before
    VLM_ASSIGN_OR_RETURN(
        items[static_cast<size_t>(i)],
        compile(t, child(child(ptr, tuple_kw), static_cast<size_t>(i)), depth + 1));
  }
  const Sequence comma = cat({g_->literal(","), {ws()}});
  // After the tuple: rest items, between max(0, min - k) and max - k of them.
  int32_t next = -1;
  {
    std::vector<Sequence> alts;
    const int64_t rmin = std::max<int64_t>(0, min_i - k);
    const int64_t rmax = max_i ? *max_i - k : -1;
    if (!rest_value || rmax == 0) {
      if (rmin == 0) alts.push_back({});
    } else {
      const Sequence item = {*rest_value, ws()};
      const Sequence more = cat({comma, item});
      if (k > 0) {
        alts.push_back({g_->repeat(more, rmin, rmax)});
      } else {
        if (rmin == 0) alts.push_back({});
        alts.push_back(cat(
            {item, {g_->repeat(more, std::max<int64_t>(rmin - 1, 0), rmax < 0 ? -1 : rmax - 1)}}));
      }
    }
    if (!alts.empty()) next = g_->rule("items", std::move(alts));
  }
  for (int i = k - 1; i >= 0; --i) {
    std::vector<Sequence> alts;
    if (i >= min_i) alts.push_back({});
    const bool room = !max_i || i < *max_i;
    if (items[static_cast<size_t>(i)] && next >= 0 && room) {
      Sequence take = i > 0 ? comma : Sequence{};
      take.push_back(*items[static_cast<size_t>(i)]);
      take.push_back(ws());
      take.push_back(Grammar::ref(next));
      alts.push_back(std::move(take));
    }
    next = alts.empty() ? -1 : g_->rule("items", std::move(alts));
  }
  if (next < 0) return error_at("no array satisfies the item counts", ptr);
  return g_->group({cat({g_->literal("["), {ws()}, {Grammar::ref(next)}, g_->literal("]")})},
                   "array");
}

// How deeply arrays and objects nest in JSON text. Deep text is refused before parsing: an
// ordered_json object copies its earlier members, recursively, when it grows (its pairs have a
// const key, so they are copied rather than moved), and writing or comparing values recurses
// too, so thousands of levels from a request could exhaust the stack.
int text_nesting(std::string_view t) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

Result<Json> parse_schema(std::string_view text) {
  if (text_nesting(text) > kMaxTextNesting) {
    return invalid_argument("the JSON Schema is nested too deeply (more than " +
                            std::to_string(kMaxTextNesting) + " levels of arrays and objects)");
  }
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return invalid_argument(std::string("the JSON Schema is not valid JSON: ") + e.what());
  }
}

}  // namespace json_schema_internal

using json_schema_internal::Compiler;
using json_schema_internal::Json;
using json_schema_internal::kMaxDepth;
using json_schema_internal::parse_schema;

Result<Element> add_json_schema(Grammar* g, std::string_view schema_json) {
  VLM_ASSIGN_OR_RETURN(const Json doc, parse_schema(schema_json));
  try {
    Compiler c(g, &doc);
    return c.compile(doc, "#", 0);
  } catch (const Json::exception& e) {
    return invalid_argument(std::string("JSON Schema: ") + e.what());
  }
}

Result<Grammar> compile_json_schema(std::string_view schema_json) {
  Grammar g;
  VLM_ASSIGN_OR_RETURN(const Element e, add_json_schema(&g, schema_json));
  g.set_root(g.rule("root", {{e}}));
  VLM_RETURN_IF_ERROR(g.finalize());
  return g;
}

Grammar json_object_grammar() {
  Grammar g;
  Compiler c(&g, nullptr);
  g.set_root(g.rule("root", {{c.any_object(kMaxDepth)}}));
  (void)g.finalize();  // cannot fail; finalizing again is harmless
  return g;
}

}  // namespace vlm::structured

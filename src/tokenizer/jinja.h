// A Jinja2 interpreter for Hugging Face chat templates: the subset they use, with the semantics of
// Python's jinja2 as transformers runs it (ImmutableSandboxedEnvironment, trim_blocks and
// lstrip_blocks on, the loopcontrols extension, `tojson` as json.dumps with ensure_ascii=False,
// `raise_exception` and `strftime_now` as globals). Values are Python's: None, booleans,
// integers, floats, strings, lists, dicts (insertion-ordered), namespaces and callables, printed
// and compared as Python prints and compares them.
//
// Supported: text, {{ }}, {% %} and {# #} with `-` whitespace control; if / elif / else; for
// (tuple targets, an `if` filter, `else`, loop.index/index0/revindex/revindex0/first/last/
// length/previtem/nextitem/cycle, break, continue); set (names, namespace attributes, blocks);
// macro (defaults, caller) and call blocks; filter blocks; the `generation` block (rendered as
// its body). Expressions: literals (strings, numbers, true/false/none in either case, lists,
// tuples, dicts), attribute and item access, Python slicing, calls with keyword arguments,
// filters, tests (`is`, `is not`), `in` / `not in`, comparisons, and / or / not, arithmetic, `~`,
// and the conditional expression. Anything else is an error naming its line and column.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "vlm/status.h"

namespace vlm::jinja {

class Value;
using Array = std::vector<Value>;

// A dict: keys in insertion order (as Python's).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(const std::string& key, Value v);
};

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};
using Function = std::function<Value(Args&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);                                    // NOLINT: implicit, as Python's literals
  Value(int v) : Value(static_cast<int64_t>(v)) {}  // NOLINT
  Value(int64_t v);                                 // NOLINT
  Value(double v);                                  // NOLINT
  Value(std::string s);                             // NOLINT
  Value(const char* s) : Value(std::string(s)) {}   // NOLINT
  Value(Array a);                                   // NOLINT
  Value(Object o);                                  // NOLINT
  static Value function(Function f);
  // A namespace(): a dict whose attributes `set` may assign.
  static Value namespace_of(Object o);
  static Value from_json(const nlohmann::json& j);
  static Value from_json(const nlohmann::ordered_json& j);  // keeps the keys' order
  // A tuple: a list printed as Python prints tuples, e.g. (1, 2), what dict.items() gives.
  static Value tuple(Array a);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_namespace() const { return kind_ == Kind::kObject && ns_; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& str() const { return s_; }
  const Array& array() const { return *arr_; }
  Array& array() { return *arr_; }
  const Object& object() const { return *obj_; }
  Object& object() { return *obj_; }
  const Function& fn() const { return *fn_; }

  bool truthy() const;
  // str(x) as Python prints it (None, True, 1.0, ['a'], {'k': 1}); undefined prints nothing.
  std::string to_string() const;
  // repr(x) (strings quoted).
  std::string repr() const;
  // json.dumps(x, ensure_ascii=False, indent=indent (< 0: none), sort_keys=...).
  std::string to_json(int indent = -1, bool sort_keys = false) const;
  bool operator==(const Value& o) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool ns_ = false;
  bool tuple_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<Array> arr_;
  std::shared_ptr<Object> obj_;
  std::shared_ptr<Function> fn_;
};

struct Options {
  bool trim_blocks = true;  // transformers' settings
  bool lstrip_blocks = true;
};

class Template {
 public:
  // Parses a template; errors carry the line and column.
  static Result<Template> parse(std::string_view source, const Options& options = {});
  // Renders with `context` as the global variables (plus raise_exception, strftime_now,
  // namespace, range, dict). `now` is what strftime_now formats (seconds since the epoch, UTC;
  // < 0: the clock).
  Result<std::string> render(const Object& context, int64_t now = -1) const;

  struct Node;

 private:
  std::shared_ptr<const std::vector<std::shared_ptr<Node>>> body_;
  std::shared_ptr<const std::string> source_;
};

}  // namespace vlm::jinja

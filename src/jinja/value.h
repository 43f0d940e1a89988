// The values of the Jinja interpreter: Python's None, booleans, integers, floats, strings, lists
// (and tuples), dicts (insertion-ordered), namespaces and callables, printed and compared as
// Python prints and compares them. Lists, dicts and functions are shared between copies, as
// Python's references are.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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

}  // namespace vlm::jinja

#include "jinja/ops.h"

#include <algorithm>
#include <cmath>

#include "jinja/error.h"

namespace vlm::jinja {
namespace {

int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

}  // namespace

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kArray:
      return "list";
    case Value::Kind::kObject:
      return v.is_namespace() ? "Namespace" : "dict";
    case Value::Kind::kFunction:
      return "function";
  }
  return "?";
}

Array iterable(const Value& v, size_t pos) {
  switch (v.kind()) {
    case Value::Kind::kArray:
      return v.array();
    case Value::Kind::kObject: {
      Array keys;
      for (const auto& [k, x] : v.object().items) keys.push_back(Value(k));
      return keys;
    }
    case Value::Kind::kString: {
      Array chars;
      const std::string& s = v.str();
      for (size_t i = 0; i < s.size();) {
        size_t n = 1;
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0xF0)
          n = 4;
        else if (c >= 0xE0)
          n = 3;
        else if (c >= 0xC0)
          n = 2;
        chars.push_back(Value(s.substr(i, n)));
        i += n;
      }
      return chars;
    }
    case Value::Kind::kUndefined:
      return {};
    default:
      fail(pos, "'" + type_name(v) + "' object is not iterable");
  }
}

Value getitem(const Value& obj, const Value& key, size_t pos) {
  if (obj.is_object()) {
    if (!key.is_string()) return Value();
    const Value* v = obj.object().find(key.str());
    return v ? *v : Value();
  }
  if (obj.is_array() || obj.is_string()) {
    if (!key.is_number() || key.kind() != Value::Kind::kInt) {
      if (key.is_string() && obj.is_array()) return Value();
      fail(pos, "indices must be integers");
    }
    const int64_t n = obj.is_array() ? static_cast<int64_t>(obj.array().size())
                                     : static_cast<int64_t>(obj.str().size());
    const int64_t i = norm_index(key.as_int(), n);
    if (i < 0 || i >= n) return Value();
    return obj.is_array() ? obj.array()[static_cast<size_t>(i)]
                          : Value(obj.str().substr(static_cast<size_t>(i), 1));
  }
  return Value();
}

Value slice(const Value& obj, const Value& a, const Value& b, const Value& c, size_t pos) {
  const int64_t n = obj.is_array()    ? static_cast<int64_t>(obj.array().size())
                    : obj.is_string() ? static_cast<int64_t>(obj.str().size())
                                      : (fail(pos, "only lists and strings can be sliced"), 0);
  const int64_t step = c.is_number() ? c.as_int() : 1;
  if (step == 0) fail(pos, "slice step cannot be zero");
  auto clampi = [&](const Value& v, int64_t dflt) -> int64_t {
    if (!v.is_number()) return dflt;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t start = clampi(a, step > 0 ? 0 : n - 1), stop = clampi(b, step > 0 ? n : -1);
  if (obj.is_array()) {
    Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      out.push_back(obj.array()[static_cast<size_t>(i)]);
    return Value(std::move(out));
  }
  std::string out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
    out += obj.str()[static_cast<size_t>(i)];
  return Value(out);
}

bool contains(const Value& hay, const Value& needle, size_t pos) {
  if (hay.is_string()) return hay.str().find(needle.to_string()) != std::string::npos;
  if (hay.is_array()) {
    for (const Value& x : hay.array())
      if (x == needle) return true;
    return false;
  }
  if (hay.is_object()) return needle.is_string() && hay.object().find(needle.str()) != nullptr;
  if (hay.is_undefined()) return false;  // jinja2's Undefined iterates as empty
  fail(pos, "argument of type '" + type_name(hay) + "' is not iterable");
}

int compare_values(const Value& a, const Value& b, size_t pos) {
  if (a.is_number() && b.is_number()) {
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string())
    return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
  fail(pos, "'<' not supported between '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Value arith(const std::string& op, const Value& x, const Value& y, size_t pos) {
  if (op == "~") return Value(x.to_string() + y.to_string());
  if (op == "+") {
    if (x.is_string() && y.is_string()) return Value(x.str() + y.str());
    if (x.is_array() && y.is_array()) {
      Array out = x.array();
      out.insert(out.end(), y.array().begin(), y.array().end());
      return Value(std::move(out));
    }
  }
  if (op == "*" && x.is_string() && y.kind() == Value::Kind::kInt) {
    std::string out;
    for (int64_t i = 0; i < y.as_int(); ++i) out += x.str();
    return Value(out);
  }
  if (op == "%" && x.is_string()) {  // '%s' % x (printf-style, %s / %d only)
    Array vals = y.is_array() ? y.array() : Array{y};
    std::string out;
    size_t k = 0;
    for (size_t i = 0; i < x.str().size(); ++i) {
      const char c = x.str()[i];
      if (c == '%' && i + 1 < x.str().size()) {
        const char f = x.str()[++i];
        if (f == '%') {
          out += '%';
        } else if (k < vals.size()) {
          out += vals[k++].to_string();
        }
      } else {
        out += c;
      }
    }
    return Value(out);
  }
  auto num = [&](const Value& v) {
    if (v.kind() == Value::Kind::kBool) return Value(int64_t{v.as_bool()});
    if (!v.is_number())
      fail(pos, "unsupported operand types for " + op + ": '" + type_name(x) + "' and '" +
                    type_name(y) + "'");
    return v;
  };
  const Value a = num(x), b = num(y);
  const bool ints = a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt;
  if (op == "+")
    return ints ? Value(a.as_int() + b.as_int()) : Value(a.as_double() + b.as_double());
  if (op == "-")
    return ints ? Value(a.as_int() - b.as_int()) : Value(a.as_double() - b.as_double());
  if (op == "*")
    return ints ? Value(a.as_int() * b.as_int()) : Value(a.as_double() * b.as_double());
  if (op == "/") {
    if (b.as_double() == 0) fail(pos, "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0) fail(pos, "division by zero");
    if (ints) {
      const int64_t q = a.as_int() / b.as_int(), r = a.as_int() % b.as_int();
      const bool adjust = r != 0 && ((r < 0) != (b.as_int() < 0));
      if (op == "//") return Value(adjust ? q - 1 : q);
      return Value(adjust ? r + b.as_int() : r);
    }
    const double q = std::floor(a.as_double() / b.as_double());
    return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
      return Value(r);
    }
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  fail(pos, "unknown operator " + op);
}

}  // namespace vlm::jinja

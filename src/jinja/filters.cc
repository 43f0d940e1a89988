#include "jinja/filters.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string_view>
#include <utility>

#include "jinja/error.h"
#include "jinja/json.h"
#include "jinja/methods.h"
#include "jinja/ops.h"

namespace vlm::jinja {
namespace {

// One filter's call: `v | name(a)`.
struct FilterCall {
  const std::string& name;
  const Value& v;
  Args& a;
  size_t pos;

  // The argument called `kw`, else the i-th positional one, else undefined.
  Value arg(size_t i, const char* kw) const {
    for (auto& [k, x] : a.keywords)
      if (k == kw) return x;
    return i < a.positional.size() ? a.positional[i] : Value();
  }
};

constexpr size_t kKeywordOnly = ~size_t{0};  // FilterCall::arg: no positional place

// The value at an attribute= path ("a.b", "items.0"), as jinja2's filters read it.
Value getattr_or_item(const Value& x, const Value& attr, size_t pos) {
  Value cur = x;
  const std::string path = attr.to_string();
  size_t i = 0;
  for (;;) {
    const size_t j = path.find('.', i);
    const std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if (cur.is_object()) {
      const Value* v = cur.object().find(part);
      cur = v ? *v : Value();
    } else if (cur.is_array() && !part.empty() &&
               std::isdigit(static_cast<unsigned char>(part[0]))) {
      cur = getitem(cur, Value(static_cast<int64_t>(std::stoll(part))), pos);
    } else {
      cur = Value();
    }
    if (j == std::string::npos) return cur;
    i = j + 1;
  }
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
// json.dumps with those arguments.
Value filter_tojson(const FilterCall& c) {
  JsonFormat format;
  format.ensure_ascii = c.arg(0, "ensure_ascii").truthy();
  const Value indent = c.arg(1, "indent");
  if (indent.is_string()) {
    format.indent = indent.str();
  } else if (indent.kind() == Value::Kind::kInt) {
    format.indent = std::string(static_cast<size_t>(std::max<int64_t>(indent.as_int(), 0)), ' ');
  }
  const Value separators = c.arg(2, "separators");
  if (separators.is_array() && separators.array().size() == 2) {
    format.separators.emplace(separators.array()[0].to_string(), separators.array()[1].to_string());
  }
  format.sort_keys = c.arg(3, "sort_keys").truthy();
  return Value(json_dumps(c.v, format));
}

Value filter_trim(const FilterCall& c) {
  return Value(strip(c.v.to_string(), nullptr, true, true));
}

Value filter_length(const FilterCall& c) {
  const Value& v = c.v;
  if (v.is_array()) return Value(static_cast<int64_t>(v.array().size()));
  if (v.is_object()) return Value(static_cast<int64_t>(v.object().items.size()));
  if (v.is_string()) return Value(static_cast<int64_t>(iterable(v, c.pos).size()));
  if (v.is_undefined()) return Value(int64_t{0});
  fail(c.pos, "object of type '" + type_name(v) + "' has no len()");
}

Value filter_items(const FilterCall& c) {
  return dict_method(c.v.is_object() ? c.v : Value(Object{}), "items").fn()(c.a);
}

Value filter_list(const FilterCall& c) { return Value(iterable(c.v, c.pos)); }

Value filter_string(const FilterCall& c) { return Value(c.v.to_string()); }

// upper, lower, title, capitalize, replace: the str method of the same name.
Value filter_str_method(const FilterCall& c) {
  return string_method(c.v.to_string(), c.name).fn()(c.a);
}

Value filter_int(const FilterCall& c) {
  if (c.v.is_number()) return Value(static_cast<int64_t>(c.v.as_double()));
  try {
    return Value(static_cast<int64_t>(std::stoll(c.v.to_string())));
  } catch (...) {
    return Value(int64_t{0});
  }
}

Value filter_float(const FilterCall& c) {
  if (c.v.is_number()) return Value(c.v.as_double());
  try {
    return Value(std::stod(c.v.to_string()));
  } catch (...) {
    return Value(0.0);
  }
}

Value filter_abs(const FilterCall& c) {
  return c.v.kind() == Value::Kind::kInt ? Value(std::abs(c.v.as_int()))
                                         : Value(std::fabs(c.v.as_double()));
}

Value filter_join(const FilterCall& c) {
  const std::string sep = c.arg(0, "d").to_string();
  const Value attr = c.arg(1, "attribute");
  std::string out;
  bool first = true;
  for (const Value& x : iterable(c.v, c.pos)) {
    if (!first) out += sep;
    first = false;
    out += (attr.is_undefined() ? x : getattr_or_item(x, attr, c.pos)).to_string();
  }
  return Value(out);
}

// first, last.
Value filter_first_last(const FilterCall& c) {
  Array items = iterable(c.v, c.pos);
  if (items.empty()) return Value();
  return c.name == "first" ? items.front() : items.back();
}

Value filter_reverse(const FilterCall& c) {
  if (c.v.is_string()) {
    std::string s = c.v.str();
    std::reverse(s.begin(), s.end());
    return Value(s);
  }
  Array items = iterable(c.v, c.pos);
  std::reverse(items.begin(), items.end());
  return Value(std::move(items));
}

Value filter_unique(const FilterCall& c) {
  Array out;
  for (const Value& x : iterable(c.v, c.pos)) {
    if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
  }
  return Value(std::move(out));
}

// default, d.
Value filter_default(const FilterCall& c) {
  const bool boolean = c.arg(1, "boolean").truthy();
  if (c.v.is_undefined() || (boolean && !c.v.truthy())) {
    Value d = c.arg(0, "default_value");
    return d.is_undefined() ? Value("") : d;
  }
  return c.v;
}

// select, reject (by a test of the item), selectattr, rejectattr (of an attribute).
Value filter_select(const FilterCall& c) {
  const bool attr = c.name == "selectattr" || c.name == "rejectattr";
  const bool keep = c.name == "selectattr" || c.name == "select";
  const std::vector<Value>& pa = c.a.positional;
  Array out;
  const size_t t0 = attr ? 1 : 0;
  for (const Value& x : iterable(c.v, c.pos)) {
    const Value subject = attr ? getattr_or_item(x, pa.at(0), c.pos) : x;
    bool ok;
    if (pa.size() > t0) {
      Args ta;
      ta.positional.assign(pa.begin() + static_cast<long>(t0) + 1, pa.end());
      ok = apply_test(pa[t0].to_string(), subject, ta, c.pos);
    } else {
      ok = subject.truthy();
    }
    if (ok == keep) out.push_back(x);
  }
  return Value(std::move(out));
}

// map(attribute=..., default=...) or map('filter', *args).
Value filter_map(const FilterCall& c) {
  Array out;
  const Value attr = c.arg(kKeywordOnly, "attribute");
  for (const Value& x : iterable(c.v, c.pos)) {
    if (!attr.is_undefined()) {
      Value y = getattr_or_item(x, attr, c.pos);
      if (y.is_undefined()) {
        const Value d = c.arg(kKeywordOnly, "default");
        if (!d.is_undefined()) y = d;
      }
      out.push_back(y);
    } else {
      Args fa;
      fa.positional.assign(c.a.positional.begin() + 1, c.a.positional.end());
      out.push_back(apply_filter(c.a.positional.at(0).to_string(), x, fa, c.pos));
    }
  }
  return Value(std::move(out));
}

Value filter_dictsort(const FilterCall& c) {
  Array out = dict_method(c.v, "items").fn()(c.a).array();
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    return compare_values(x.array()[0], y.array()[0], c.pos) < 0;
  });
  return Value(std::move(out));
}

Value filter_sort(const FilterCall& c) {
  Array out = iterable(c.v, c.pos);
  const Value attr = c.arg(kKeywordOnly, "attribute");
  const bool rev = c.arg(0, "reverse").truthy();
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    const Value xa = attr.is_undefined() ? x : getattr_or_item(x, attr, c.pos);
    const Value ya = attr.is_undefined() ? y : getattr_or_item(y, attr, c.pos);
    return rev ? compare_values(ya, xa, c.pos) < 0 : compare_values(xa, ya, c.pos) < 0;
  });
  return Value(std::move(out));
}

Value filter_indent(const FilterCall& c) {
  const Value w = c.arg(0, "width");
  const std::string pad =
      w.is_string() ? w.str()
                    : std::string(static_cast<size_t>(w.is_number() ? w.as_int() : 4), ' ');
  const bool first = c.arg(1, "first").truthy(), blank = c.arg(2, "blank").truthy();
  const std::string s = c.v.to_string();
  std::string out;
  size_t i = 0;
  bool line0 = true;
  while (i <= s.size()) {
    size_t j = s.find('\n', i);
    const std::string line = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    if ((!line0 || first) && (blank || !line.empty())) out += pad;
    out += line;
    if (j == std::string::npos) break;
    out += '\n';
    i = j + 1;
    line0 = false;
  }
  return Value(out);
}

Value filter_safe(const FilterCall& c) { return c.v; }

// escape, e: HTML's special characters as entities.
Value filter_escape(const FilterCall& c) {
  std::string out;
  for (char ch : c.v.to_string()) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return Value(out);
}

Value filter_round(const FilterCall& c) {
  const Value precision = c.arg(0, "precision");
  const int64_t prec = precision.is_number() ? precision.as_int() : 0;
  const double m = std::pow(10.0, static_cast<double>(prec));
  return Value(std::nearbyint(c.v.as_double() * m) / m);
}

Value filter_wordcount(const FilterCall& c) {
  Args none;
  return Value(
      static_cast<int64_t>(string_method(c.v.to_string(), "split").fn()(none).array().size()));
}

using FilterFn = Value (*)(const FilterCall&);

constexpr std::pair<std::string_view, FilterFn> kFilters[] = {
    {"tojson", filter_tojson},
    {"trim", filter_trim},
    {"length", filter_length},
    {"count", filter_length},
    {"items", filter_items},
    {"list", filter_list},
    {"string", filter_string},
    {"upper", filter_str_method},
    {"lower", filter_str_method},
    {"title", filter_str_method},
    {"capitalize", filter_str_method},
    {"replace", filter_str_method},
    {"int", filter_int},
    {"float", filter_float},
    {"abs", filter_abs},
    {"join", filter_join},
    {"first", filter_first_last},
    {"last", filter_first_last},
    {"reverse", filter_reverse},
    {"unique", filter_unique},
    {"default", filter_default},
    {"d", filter_default},
    {"selectattr", filter_select},
    {"rejectattr", filter_select},
    {"select", filter_select},
    {"reject", filter_select},
    {"map", filter_map},
    {"dictsort", filter_dictsort},
    {"sort", filter_sort},
    {"indent", filter_indent},
    {"safe", filter_safe},
    {"e", filter_escape},
    {"escape", filter_escape},
    {"round", filter_round},
    {"wordcount", filter_wordcount},
};

}  // namespace

Value apply_filter(const std::string& name, const Value& v, Args& a, size_t pos) {
  for (const auto& [n, fn] : kFilters) {
    if (n == name) return fn(FilterCall{name, v, a, pos});
  }
  fail(pos, "unknown filter '" + name + "'");
}

bool apply_test(const std::string& name, const Value& v, const Args& a, size_t pos) {
  auto arg = [&](size_t i) { return i < a.positional.size() ? a.positional[i] : Value(); };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::kInt;
  if (name == "float") return v.kind() == Value::Kind::kFloat;
  if (name == "boolean") return v.kind() == Value::Kind::kBool;
  if (name == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
  if (name == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_array() || v.is_object() || v.is_string();
  if (name == "sequence") return v.is_array() || v.is_string() || v.is_object();
  if (name == "callable") return v.is_function();
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return v == arg(0);
  if (name == "ne" || name == "!=") return !(v == arg(0));
  if (name == "odd") return v.as_int() % 2 != 0;
  if (name == "even") return v.as_int() % 2 == 0;
  if (name == "divisibleby") return arg(0).as_int() != 0 && v.as_int() % arg(0).as_int() == 0;
  if (name == "in") return contains(arg(0), v, pos);
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    for (char c : v.str()) {
      if (name == "lower" ? std::isupper(static_cast<unsigned char>(c))
                          : std::islower(static_cast<unsigned char>(c)))
        return false;
    }
    return true;
  }
  fail(pos, "unknown test '" + name + "'");
}

}  // namespace vlm::jinja

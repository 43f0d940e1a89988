#include "jinja/methods.h"

#include <cctype>

#include "jinja/error.h"

namespace vlm::jinja {
namespace {

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (from.empty()) return s;
  std::string out;
  size_t i = 0;
  int64_t n = 0;
  for (size_t k = s.find(from); k != std::string::npos && (count < 0 || n < count);
       k = s.find(from, i)) {
    out += s.substr(i, k - i) + to;
    i = k + from.size();
    ++n;
  }
  return out + s.substr(i);
}

std::string capitalize(const std::string& s) {
  std::string o = s;
  for (size_t i = 0; i < o.size(); ++i)
    o[i] = static_cast<char>(i == 0 ? std::toupper(static_cast<unsigned char>(o[i]))
                                    : std::tolower(static_cast<unsigned char>(o[i])));
  return o;
}

std::string to_title(const std::string& s) {
  std::string o = s;
  bool start = true;
  for (char& c : o) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = true;
    }
  }
  return o;
}

// str.split(sep=None, maxsplit=-1): on runs of whitespace without a separator.
Value split(const std::string& s, Args& a) {
  const Value* sep =
      !a.positional.empty() && !a.positional[0].is_none() ? &a.positional[0] : nullptr;
  int64_t maxsplit = a.positional.size() > 1 ? a.positional[1].as_int() : -1;
  for (auto& [k, v] : a.keywords) {
    if (k == "sep" && !v.is_none()) sep = &v;
    if (k == "maxsplit") maxsplit = v.as_int();
  }
  Array out;
  if (sep == nullptr) {
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(Value(strip(s.substr(i), nullptr, false, true)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_space(s[j])) ++j;
      out.push_back(Value(s.substr(i, j - i)));
      i = j;
    }
    return Value(std::move(out));
  }
  const std::string d = sep->to_string();
  if (d.empty()) fail(0, "empty separator");
  size_t i = 0;
  for (;;) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    const size_t j = s.find(d, i);
    if (j == std::string::npos) break;
    out.push_back(Value(s.substr(i, j - i)));
    i = j + d.size();
  }
  out.push_back(Value(s.substr(i)));
  return Value(std::move(out));
}

}  // namespace

std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  auto drop = [&](char c) {
    return chars && chars->is_string() ? chars->str().find(c) != std::string::npos : is_space(c);
  };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

Value dict_method(const Value& obj, const std::string& name) {
  if (name == "get") {
    return Value::function([obj](Args& a) -> Value {
      if (a.positional.empty() || !a.positional[0].is_string()) return Value::none();
      const Value* v = obj.object().find(a.positional[0].str());
      if (v) return *v;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    });
  }
  if (name == "items") {
    return Value::function([obj](Args&) -> Value {
      Array out;
      for (const auto& [k, v] : obj.object().items) out.push_back(Value::tuple(Array{Value(k), v}));
      return Value(std::move(out));
    });
  }
  if (name == "keys") {
    return Value::function([obj](Args&) -> Value {
      Array out;
      for (const auto& [k, v] : obj.object().items) out.push_back(Value(k));
      return Value(std::move(out));
    });
  }
  if (name == "values") {
    return Value::function([obj](Args&) -> Value {
      Array out;
      for (const auto& [k, v] : obj.object().items) out.push_back(v);
      return Value(std::move(out));
    });
  }
  return Value();
}

Value string_method(const std::string& s, const std::string& name) {
  auto arg = [](Args& a, size_t i) -> const Value* {
    return i < a.positional.size() ? &a.positional[i] : nullptr;
  };
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return Value::function([s, start](Args& a) -> Value {
      auto test = [&](const std::string& p) {
        return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0
                                              : s.compare(s.size() - p.size(), p.size(), p) == 0);
      };
      if (a.positional.empty()) return Value(false);
      const Value& p = a.positional[0];
      if (p.is_array()) {
        for (const Value& x : p.array())
          if (test(x.to_string())) return Value(true);
        return Value(false);
      }
      return Value(test(p.to_string()));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool l = name != "rstrip", r = name != "lstrip";
    return Value::function(
        [s, l, r, arg](Args& a) -> Value { return Value(strip(s, arg(a, 0), l, r)); });
  }
  if (name == "upper" || name == "lower") {
    const bool up = name == "upper";
    return Value::function([s, up](Args&) -> Value {
      std::string o = s;
      for (char& c : o)
        c = static_cast<char>(up ? std::toupper(static_cast<unsigned char>(c))
                                 : std::tolower(static_cast<unsigned char>(c)));
      return Value(o);
    });
  }
  if (name == "title" || name == "capitalize") {
    const bool title = name == "title";
    return Value::function(
        [s, title](Args&) -> Value { return Value(title ? to_title(s) : capitalize(s)); });
  }
  if (name == "replace") {
    return Value::function([s](Args& a) -> Value {
      if (a.positional.size() < 2) return Value(s);
      return Value(replace_all(s, a.positional[0].to_string(), a.positional[1].to_string(),
                               a.positional.size() > 2 ? a.positional[2].as_int() : -1));
    });
  }
  if (name == "split" || name == "rsplit") {
    return Value::function([s](Args& a) -> Value { return split(s, a); });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return Value::function([s, find](Args& a) -> Value {
      const std::string p = a.positional.empty() ? "" : a.positional[0].to_string();
      if (find) {
        const size_t k = s.find(p);
        return Value(k == std::string::npos ? int64_t{-1} : static_cast<int64_t>(k));
      }
      int64_t n = 0;
      if (p.empty()) return Value(static_cast<int64_t>(s.size() + 1));
      for (size_t k = s.find(p); k != std::string::npos; k = s.find(p, k + p.size())) ++n;
      return Value(n);
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace") {
    return Value::function([s, name](Args&) -> Value {
      if (s.empty()) return Value(false);
      for (char c : s) {
        const unsigned char u = static_cast<unsigned char>(c);
        const bool ok = name == "isdigit"   ? std::isdigit(u)
                        : name == "isalpha" ? std::isalpha(u)
                                            : std::isspace(u);
        if (!ok) return Value(false);
      }
      return Value(true);
    });
  }
  return Value();
}

Value getattr(const Value& obj, const std::string& name, size_t pos) {
  if (obj.is_object()) {
    if (!obj.is_namespace()) {
      if (Value m = dict_method(obj, name); m.is_function()) return m;
    }
    if (const Value* v = obj.object().find(name)) return *v;
    return Value();
  }
  if (obj.is_string()) return string_method(obj.str(), name);
  if (obj.is_array()) {
    if (name == "append" || name == "pop" || name == "insert" || name == "extend")
      fail(pos, "lists cannot be modified in a chat template (sandbox)");
    return Value();
  }
  if (obj.is_undefined()) return Value();
  return Value();
}

}  // namespace vlm::jinja

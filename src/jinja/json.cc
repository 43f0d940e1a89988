#include "jinja/json.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "jinja/value.h"

namespace vlm::jinja {

std::string float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  // std::to_chars gives the shortest round-trip digits (as Python's repr does) as d.ddde±x;
  // what follows lays them out as Python does.
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(r.ptr - buf));
  std::string out;
  if (sci.front() == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;  // the significant digits, without the point
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  std::string_view exp_text = sci.substr(e + 1);
  if (exp_text.front() == '+') exp_text.remove_prefix(1);
  int exp = 0;
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp);
  const int n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {  // 0.000ddd
      out += "0.";
      out.append(static_cast<size_t>(-exp - 1), '0');
      out += digits;
    } else if (n <= exp + 1) {  // ddd000.0
      out += digits;
      out.append(static_cast<size_t>(exp + 1 - n), '0');
      out += ".0";
    } else {  // ddd.ddd
      out.append(digits, 0, static_cast<size_t>(exp + 1));
      out += '.';
      out.append(digits, static_cast<size_t>(exp + 1));
    }
    return out;
  }
  out += digits[0];
  if (n > 1) {
    out += '.';
    out.append(digits, 1);
  }
  out += exp < 0 ? "e-" : "e+";
  if (std::abs(exp) < 10) out += '0';
  out += std::to_string(std::abs(exp));
  return out;
}

std::string json_float(double x) {
  if (std::isnan(x)) return "NaN";
  if (std::isinf(x)) return x > 0 ? "Infinity" : "-Infinity";
  return float_repr(x);
}

namespace {

void append_u(uint32_t unit, std::string* out) {
  char b[8];
  std::snprintf(b, sizeof b, "\\u%04x", unit);
  *out += b;
}

// The escape json.dumps writes for a byte of its own, or null.
const char* short_escape(unsigned char c) {
  switch (c) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      return nullptr;
  }
}

// The code point of the UTF-8 sequence at s[*i], advancing *i past it; U+FFFD and one byte for
// a byte that does not start a well-formed sequence.
uint32_t next_code_point(std::string_view s, size_t* i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(*i);
  const int len = c >= 0xF0 && c <= 0xF4   ? 4
                  : c >= 0xE0 && c <= 0xEF ? 3
                  : c >= 0xC2 && c < 0xE0  ? 2
                                           : 0;
  uint32_t cp = len == 4 ? c & 0x07u : len == 3 ? c & 0x0Fu : c & 0x1Fu;
  bool ok = len > 0 && *i + static_cast<size_t>(len) <= s.size();
  for (int k = 1; ok && k < len; ++k) {
    const unsigned char b = byte(*i + static_cast<size_t>(k));
    ok = (b & 0xC0) == 0x80;
    cp = (cp << 6) | (b & 0x3Fu);
  }
  // Overlong forms, surrogates and code points above U+10FFFF are not UTF-8.
  ok = ok && !(len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp < 0xE000))) &&
       !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF));
  *i += ok ? static_cast<size_t>(len) : 1;
  return ok ? cp : 0xFFFD;
}

}  // namespace

void json_quote(std::string_view s, bool ensure_ascii, std::string* out) {
  *out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (const char* e = short_escape(c)) {
      *out += e;
      ++i;
    } else if (c < 0x20 || (ensure_ascii && c == 0x7f)) {
      append_u(c, out);
      ++i;
    } else if (c < 0x80 || !ensure_ascii) {
      *out += static_cast<char>(c);
      ++i;
    } else if (const uint32_t cp = next_code_point(s, &i); cp < 0x10000) {
      append_u(cp, out);
    } else {
      append_u(0xD800 + ((cp - 0x10000) >> 10), out);
      append_u(0xDC00 + ((cp - 0x10000) & 0x3FF), out);
    }
  }
  *out += '"';
}

namespace {

// Writes one JSON document, item by item, laid out as json.dumps lays it out: separators between
// items, and with an indent a line for each item of a non-empty list or dict.
class Writer {
 public:
  Writer(const JsonFormat& f, std::string* out)
      : indent_(f.indent),
        item_sep_(f.separators ? f.separators->first
                  : f.indent   ? ","
                               : ", "),
        key_sep_(f.separators ? f.separators->second : ": "),
        ensure_ascii_(f.ensure_ascii),
        out_(out) {}

  void scalar(std::string_view text) {
    begin_item();
    *out_ += text;
  }
  void string(std::string_view s) {
    begin_item();
    json_quote(s, ensure_ascii_, out_);
  }
  void key(std::string_view k) {
    begin_item();
    json_quote(k, ensure_ascii_, out_);
    *out_ += key_sep_;
    after_key_ = true;
  }
  void open(char bracket) {
    begin_item();
    *out_ += bracket;
    counts_.push_back(0);
  }
  void close(char bracket) {
    const bool any = counts_.back() > 0;
    counts_.pop_back();
    if (any) newline();
    *out_ += bracket;
  }

 private:
  // Before a list item, a key, or a value at the top: the separator and the line break.
  void begin_item() {
    if (after_key_) {  // a dict's value, on its key's line
      after_key_ = false;
      return;
    }
    if (counts_.empty()) return;
    if (counts_.back()++ > 0) *out_ += item_sep_;
    newline();
  }
  void newline() {
    if (!indent_) return;
    *out_ += '\n';
    for (size_t k = 0; k < counts_.size(); ++k) *out_ += *indent_;
  }

  const std::optional<std::string> indent_;
  const std::string item_sep_, key_sep_;
  const bool ensure_ascii_;
  std::string* out_;
  std::vector<size_t> counts_;  // items so far in each open list or dict, outermost first
  bool after_key_ = false;
};

// A dict's entries in order, or sorted by key as sort_keys does.
template <class V>
using Entries = std::vector<std::pair<const std::string*, const V*>>;
template <class V>
void sort_entries(bool sort_keys, Entries<V>* entries) {
  if (!sort_keys) return;
  std::stable_sort(entries->begin(), entries->end(),
                   [](const auto& a, const auto& b) { return *a.first < *b.first; });
}

void write_value(const Value& v, bool sort_keys, Writer* w) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      w->scalar("null");
      return;
    case Value::Kind::kBool:
      w->scalar(v.as_bool() ? "true" : "false");
      return;
    case Value::Kind::kInt:
      w->scalar(std::to_string(v.as_int()));
      return;
    case Value::Kind::kFloat:
      w->scalar(json_float(v.as_double()));
      return;
    case Value::Kind::kString:
      w->string(v.str());
      return;
    case Value::Kind::kArray:
      w->open('[');
      for (const Value& e : v.array()) write_value(e, sort_keys, w);
      w->close(']');
      return;
    case Value::Kind::kObject: {
      Entries<Value> entries;
      for (const auto& [k, x] : v.object().items) entries.emplace_back(&k, &x);
      sort_entries(sort_keys, &entries);
      w->open('{');
      for (const auto& [k, x] : entries) {
        w->key(*k);
        write_value(*x, sort_keys, w);
      }
      w->close('}');
      return;
    }
    case Value::Kind::kFunction:
      throw std::runtime_error("Object of type function is not JSON serializable");
  }
}

void write_json(const nlohmann::ordered_json& j, bool sort_keys, Writer* w) {
  using Type = nlohmann::ordered_json::value_t;
  switch (j.type()) {
    case Type::null:
    case Type::discarded:
    case Type::binary:  // neither comes from parsing JSON text
      w->scalar("null");
      return;
    case Type::boolean:
      w->scalar(j.get<bool>() ? "true" : "false");
      return;
    case Type::number_integer:
      w->scalar(std::to_string(j.get<int64_t>()));
      return;
    case Type::number_unsigned:
      w->scalar(std::to_string(j.get<uint64_t>()));
      return;
    case Type::number_float:
      w->scalar(json_float(j.get<double>()));
      return;
    case Type::string:
      w->string(j.get_ref<const std::string&>());
      return;
    case Type::array:
      w->open('[');
      for (const auto& e : j) write_json(e, sort_keys, w);
      w->close(']');
      return;
    case Type::object: {
      Entries<nlohmann::ordered_json> entries;
      for (auto it = j.begin(); it != j.end(); ++it) entries.emplace_back(&it.key(), &it.value());
      sort_entries(sort_keys, &entries);
      w->open('{');
      for (const auto& [k, x] : entries) {
        w->key(*k);
        write_json(*x, sort_keys, w);
      }
      w->close('}');
      return;
    }
  }
}

}  // namespace

std::string json_dumps(const Value& v, const JsonFormat& format) {
  std::string out;
  Writer w(format, &out);
  write_value(v, format.sort_keys, &w);
  return out;
}

std::string json_dumps(const nlohmann::ordered_json& j, const JsonFormat& format) {
  std::string out;
  Writer w(format, &out);
  write_json(j, format.sort_keys, &w);
  return out;
}

}  // namespace vlm::jinja

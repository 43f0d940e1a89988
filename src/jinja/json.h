// The one JSON writer for templates (the tokenizer and engine layers use it too): Python's
// json.dumps as transformers' `tojson` filter calls it (json.dumps(x, ensure_ascii=False,
// indent=..., separators=..., sort_keys=...)), over the interpreter's values and over parsed JSON
// (nlohmann::ordered_json, its keys' order kept). Whatever the tokenizer layer writes as JSON for a
// template goes through here, so that a tool's definition or a call's arguments read the same as
// transformers renders them.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "jinja/value.h"

namespace vlm::jinja {

// json.dumps' keyword arguments.
struct JsonFormat {
  // indent=: unset is None (one line); else the text each level of nesting adds (json.dumps
  // takes an int n as n spaces; 0 or less still breaks the lines).
  std::optional<std::string> indent;
  // separators=(item, key); unset: (", ", ": "), or (",", ": ") with an indent.
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;     // by code point (UTF-8 byte order), at every level
  bool ensure_ascii = false;  // transformers' tojson default; json.dumps' own is true
};

// repr(x) of a Python float: the shortest digits that read back as x; fixed notation when the
// decimal exponent is in [-4, 16), with ".0" on integral values (100000.0, 0.0001, -0.0),
// scientific otherwise with at least two exponent digits (1e+16, 1e-05, 5e-324); nan, inf, -inf.
std::string float_repr(double x);

// A float as json.dumps writes it: float_repr, except NaN, Infinity and -Infinity.
std::string json_float(double x);

// Appends `s` (UTF-8) as a JSON string: '"', '\' and the control characters escaped (\n, \r, \t,
// \b, \f, others \u00XX, lowercase hex); with ensure_ascii also DEL and every non-ASCII character
// (\uXXXX, a surrogate pair above U+FFFF; a byte that is not UTF-8 as \ufffd).
void json_quote(std::string_view s, bool ensure_ascii, std::string* out);

// json.dumps(v): dicts in their order (or sorted), integers as integers, floats as json_float,
// tuples as lists. Undefined writes null; a function throws std::runtime_error (Python's
// TypeError: not JSON serializable).
std::string json_dumps(const Value& v, const JsonFormat& format = {});

// json.dumps(json.loads(text)) for JSON nlohmann parsed: integers that fit int64 or uint64 stay
// integers, any other number is a float (nlohmann reads 1e5 as the float 100000.0, as json.loads
// does; an integer beyond uint64 becomes a float too, where Python keeps it exact).
std::string json_dumps(const nlohmann::ordered_json& j, const JsonFormat& format = {});

}  // namespace vlm::jinja

// Attributes of the interpreter's values: a dict's entries and its methods (get, items, keys,
// values), a string's methods (startswith, strip, split, replace, ...), as Python's. Lists have
// none (their mutating methods are refused, as the sandbox does).
#pragma once

#include <cstddef>
#include <string>

#include "jinja/value.h"

namespace vlm::jinja {

// obj.name: a method (a function value), a dict's entry, or undefined.
Value getattr(const Value& obj, const std::string& name, size_t pos);
// The dict method `name` bound to obj, or undefined.
Value dict_method(const Value& obj, const std::string& name);
// The str method `name` bound to s, or undefined.
Value string_method(const std::string& s, const std::string& name);
// str.strip / lstrip / rstrip: whitespace, or the characters of `chars` (a string) when given.
std::string strip(const std::string& s, const Value* chars, bool left, bool right);

}  // namespace vlm::jinja

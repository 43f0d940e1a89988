// Python's operations on the interpreter's values, as jinja2 evaluates them: type names,
// iteration, item access and slicing, `in`, ordering, and the arithmetic operators. Errors throw
// Error at `pos`, the expression's offset in the source.
#pragma once

#include <cstddef>
#include <string>

#include "jinja/value.h"

namespace vlm::jinja {

// Python's type name: "str", "list", "dict", "NoneType", ...
std::string type_name(const Value& v);
// What a for loop walks: a list's items, a dict's keys, a string's characters (UTF-8); nothing
// for undefined.
Array iterable(const Value& v, size_t pos);
// obj[key]: a dict's entry, a list's or a string's item (negative indices from the end);
// undefined when there is none.
Value getitem(const Value& obj, const Value& key, size_t pos);
// obj[a:b:c] of a list or a string (each bound optional: undefined).
Value slice(const Value& obj, const Value& a, const Value& b, const Value& c, size_t pos);
// needle in hay: a substring, a list's item, a dict's key.
bool contains(const Value& hay, const Value& needle, size_t pos);
// -1, 0 or 1 for two numbers or two strings; anything else cannot be ordered.
int compare_values(const Value& a, const Value& b, size_t pos);
// x op y for op in + - * / // % ** ~ (strings and lists concatenate, a string repeats, `%`
// formats a string printf-style with %s and %d).
Value arith(const std::string& op, const Value& x, const Value& y, size_t pos);

}  // namespace vlm::jinja

// jinja2's filters (`x | name(args)`) and tests (`x is name args`), those chat templates use,
// with Python's semantics; `tojson` is transformers' (json.dumps with ensure_ascii=False).
// Errors throw Error at `pos`, the expression's offset in the source.
#pragma once

#include <cstddef>
#include <string>

#include "jinja/value.h"

namespace vlm::jinja {

// name(v, *a): an unknown name is an error.
Value apply_filter(const std::string& name, const Value& v, Args& a, size_t pos);
// `v is name(*a)`: an unknown name is an error.
bool apply_test(const std::string& name, const Value& v, const Args& a, size_t pos);

}  // namespace vlm::jinja

// Evaluation: a parsed template's statements run over its variables, with jinja2's scoping (a
// for loop's assignments stay in the loop, a macro sees its arguments and the globals, a
// namespace's attributes are set where it lives).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "jinja/ast.h"

namespace vlm::jinja {

// Appends what `body` renders to *out: `globals` are the variables (besides raise_exception,
// strftime_now, namespace, dict and range), `now` the time strftime_now formats (seconds since
// the epoch, UTC; < 0: the clock). Throws Error, or std::exception from a value's operation.
void render_nodes(const std::vector<NodeP>& body, const Object& globals, int64_t now,
                  std::string* out);

}  // namespace vlm::jinja

// A Jinja2 interpreter for Hugging Face chat templates: the subset they use, with the semantics of
// Python's jinja2 as transformers runs it (ImmutableSandboxedEnvironment, trim_blocks and
// lstrip_blocks on, the loopcontrols extension, `tojson` as json.dumps with ensure_ascii=False,
// `raise_exception` and `strftime_now` as globals). Values are Python's: None, booleans,
// integers, floats, strings, lists, dicts (insertion-ordered), namespaces and callables, printed
// and compared as Python prints and compares them.
//
// Supported: text, {{ }}, {% %} and {# #} with `-` whitespace control; if / elif / else; for
// (tuple targets, an `if` filter, `else`, loop.index/index0/revindex/revindex0/first/last/
// length/previtem/nextitem/cycle, break, continue); set (names, namespace attributes, blocks);
// macro (defaults, caller) and call blocks; filter blocks; the `generation` block (rendered as
// its body). Expressions: literals (strings, numbers, true/false/none in either case, lists,
// tuples, dicts), attribute and item access, Python slicing, calls with keyword arguments,
// filters, tests (`is`, `is not`), `in` / `not in`, comparisons, and / or / not, arithmetic, `~`,
// and the conditional expression. Anything else is an error naming its line and column.
//
// The interpreter's files: value (the values), json (json.dumps, the `tojson` filter), lexer,
// ast, parser, renderer (evaluation), methods (str and dict methods), ops (Python's operators and
// item access), filters (the filters and tests).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"
#include "vlm/status.h"

namespace vlm::jinja {

struct Options {
  bool trim_blocks = true;  // transformers' settings
  bool lstrip_blocks = true;
};

class Template {
 public:
  // Parses a template; errors carry the line and column.
  static Result<Template> parse(std::string_view source, const Options& options = {});
  // Renders with `context` as the global variables (plus raise_exception, strftime_now,
  // namespace, range, dict). `now` is what strftime_now formats (seconds since the epoch, UTC;
  // < 0: the clock).
  Result<std::string> render(const Object& context, int64_t now = -1) const;

  struct Node;

 private:
  std::shared_ptr<const std::vector<std::shared_ptr<Node>>> body_;
  std::shared_ptr<const std::string> source_;
};

}  // namespace vlm::jinja

// Regular expressions → grammar. The output must match the whole pattern (as vLLM's and
// xgrammar's regex outputs do).
#pragma once

#include <string_view>

#include "structured/grammar.h"
#include "vlm/status.h"

namespace vlm::structured {

// A grammar whose language is the strings the pattern matches in full. Errors (syntax, or a
// feature no grammar can express such as a backreference or a lookaround) are invalid_argument
// naming the feature and its offset in the pattern.
Result<Grammar> compile_regex(std::string_view pattern);

// Adds the rules for `pattern` to g and returns a reference to them. With in_json_string the
// matched text is the content of a JSON string: what the pattern matches is produced in its JSON
// spelling (a '"' as \", a '\' as \\, control characters as \n, \t, ... or \u00XX), so that the
// decoded string matches the pattern. g is not finalized.
Result<Element> add_regex(Grammar* g, std::string_view pattern, bool in_json_string);

}  // namespace vlm::structured

// GBNF text → grammar: llama.cpp's grammar format, which is also what vLLM's `grammar`
// structured output takes (xgrammar's EBNF is the same notation).
#pragma once

#include <string_view>

#include "structured/grammar.h"
#include "vlm/status.h"

namespace vlm::structured {

// Parses `text` (rules `name ::= ...`; the start rule is `root`) into a finalized grammar.
// Errors are invalid_argument with the line and column.
Result<Grammar> parse_gbnf(std::string_view text);

}  // namespace vlm::structured

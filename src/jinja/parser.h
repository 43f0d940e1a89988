// The parser: a template's tokens (jinja/lexer.h) as its syntax tree (jinja/ast.h), by recursive
// descent with jinja2's operator precedence.
#pragma once

#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace vlm::jinja {

// The template's statements. Throws Error at the first token that does not fit.
std::vector<NodeP> parse_tokens(std::vector<Tok> toks);

}  // namespace vlm::jinja

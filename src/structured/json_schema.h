// JSON Schema → grammar: the output is one JSON value that validates against the schema.
//
// Whitespace between tokens is at most one space or one newline, so that a model cannot pad the
// output forever. Object properties come in the schema's order; required ones always, optional
// ones may be left out. With no `additionalProperties` no other property is produced (as in
// OpenAI's strict mode); `additionalProperties: true` or a schema allows others, whose names
// differ from the declared ones. Keywords that only annotate (title, description, examples, ...)
// are ignored; any other keyword this compiler does not enforce is refused by name, so that no
// output can break a constraint the caller asked for.
#pragma once

#include <string_view>

#include "structured/grammar.h"
#include "vlm/status.h"

namespace vlm::structured {

// A grammar for one JSON value valid under `schema_json` (the schema as JSON text). Errors are
// invalid_argument naming the keyword and where it is ("unsupported JSON Schema keyword
// 'patternProperties' at #/properties/tags").
Result<Grammar> compile_json_schema(std::string_view schema_json);

// Adds the rules for a value valid under `schema_json` to g and returns a reference to them
// (for grammars that embed JSON, such as tool calls). g is not finalized.
Result<Element> add_json_schema(Grammar* g, std::string_view schema_json);

// Any JSON object (OpenAI's JSON mode, response_format {"type": "json_object"}), finalized.
Grammar json_object_grammar();

}  // namespace vlm::structured

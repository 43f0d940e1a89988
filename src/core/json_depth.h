// How deeply a JSON text nests, found by one scan of its bytes (no parse, no recursion), so that a
// request nested 100,000 levels deep is refused before any recursive walk of it.
#pragma once

#include <cstddef>
#include <string_view>

namespace vlm {

// How deep a request's JSON may nest (the server refuses deeper bodies with 400 before parsing).
inline constexpr int kMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in `text` (brackets inside strings, with their
// escapes, do not count); stops counting at `cap` + 1. Not a validator: malformed text is left to
// the parser.
int json_nesting_depth(std::string_view text, int cap);

}  // namespace vlm

// The lexer: a template's source as text and tags, whitespace control applied (`-` and `+`,
// trim_blocks, lstrip_blocks), each tag as its tokens.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "jinja/jinja.h"

namespace vlm::jinja {

struct Tok {
  enum Type { kText, kPrint, kBlock, kName, kString, kInt, kFloat, kOp, kEnd };
  Type type;
  std::string text;
  size_t pos;
};

// A tag's tokens follow a kPrint ({{) or kBlock ({%) marker and end with a kEnd; comments leave
// nothing. Throws Error on an unterminated tag, comment or string, or an unknown character.
std::vector<Tok> lex(const std::string& src, const Options& opt);

}  // namespace vlm::jinja

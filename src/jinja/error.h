// An error of parsing or rendering: thrown inside the interpreter, and turned into a Status that
// names the line and column at Template::parse / Template::render.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

namespace vlm::jinja {

struct Error {
  std::string message;
  size_t pos;  // offset in the source (0 where no place is known)
};

[[noreturn]] inline void fail(size_t pos, std::string msg) { throw Error{std::move(msg), pos}; }

// "line L, column C" (from 1) of an offset in the source.
inline std::string line_col(std::string_view src, size_t pos) {
  int line = 1, col = 1;
  for (size_t i = 0; i < pos && i < src.size(); ++i) {
    if (src[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

}  // namespace vlm::jinja

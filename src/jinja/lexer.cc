#include "jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "jinja/error.h"

namespace vlm::jinja {
namespace {

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

// The next `{{`, `{%` or `{#` at or after i, or npos.
size_t find_tag_open(const std::string& src, size_t i) {
  size_t open = src.find('{', i);
  while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
         src[open + 1] != '%' && src[open + 1] != '#') {
    open = src.find('{', open + 1);
  }
  if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
  return open;
}

// A number at p (digits with `_` separators, a fraction, an exponent): the offset after it.
size_t lex_number(const std::string& src, size_t p, std::vector<Tok>* out) {
  const size_t start = p;
  while (p < src.size() && (is_digit(src[p]) || src[p] == '_')) ++p;
  bool is_float = false;
  if (p + 1 < src.size() && src[p] == '.' && is_digit(src[p + 1])) {
    is_float = true;
    ++p;
    while (p < src.size() && is_digit(src[p])) ++p;
  }
  if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
    is_float = true;
    ++p;
    if (p < src.size() && (src[p] == '+' || src[p] == '-')) ++p;
    while (p < src.size() && is_digit(src[p])) ++p;
  }
  std::string num = src.substr(start, p - start);
  num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
  out->push_back({is_float ? Tok::kFloat : Tok::kInt, num, start});
  return p;
}

// A quoted string at p, its escapes (\n, \t, \r, \\, \', \") read: the offset after it. Other
// backslashes stay as they are.
size_t lex_string(const std::string& src, size_t p, std::vector<Tok>* out) {
  const size_t start = p;
  const char quote = src[p++];
  std::string s;
  while (p < src.size() && src[p] != quote) {
    if (src[p] == '\\' && p + 1 < src.size()) {
      const char e = src[++p];
      switch (e) {
        case 'n':
          s += '\n';
          break;
        case 't':
          s += '\t';
          break;
        case 'r':
          s += '\r';
          break;
        case '\\':
        case '\'':
        case '"':
          s += e;
          break;
        default:
          s += '\\';
          s += e;
      }
      ++p;
    } else {
      s += src[p++];
    }
  }
  if (p >= src.size()) fail(start, "unterminated string");
  out->push_back({Tok::kString, s, start});
  return p + 1;
}

// An operator at p (the longest that matches): the offset after it.
size_t lex_op(const std::string& src, size_t p, std::vector<Tok>* out) {
  static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                               "-",  "*",  "/",  "%",  "~",  "|",  ".", ",", ":",
                               "(",  ")",  "[",  "]",  "{",  "}",  "="};
  for (const char* op : kOps) {
    const size_t n = std::strlen(op);
    if (src.compare(p, n, op) == 0) {
      out->push_back({Tok::kOp, op, p});
      return p + n;
    }
  }
  fail(p, std::string("unexpected character '") + src[p] + "'");
}

// The tokens of the tag opened at `open` whose body starts at `body`, and its kEnd: the offset
// after its closer. *strip_next: the closer has a `-`.
size_t lex_tag(const std::string& src, size_t open, size_t body, const std::string& closer,
               bool* strip_next, std::vector<Tok>* out) {
  size_t p = body;
  for (;;) {
    while (p < src.size() && is_space(src[p])) ++p;
    if (p >= src.size()) fail(open, "unterminated tag");
    if ((src[p] == '-' || src[p] == '+') && src.compare(p + 1, 2, closer) == 0) {
      *strip_next = src[p] == '-';
      p += 3;
      break;
    }
    if (src.compare(p, 2, closer) == 0) {
      p += 2;
      break;
    }
    const char c = src[p];
    if (is_name_start(c)) {
      const size_t start = p;
      while (p < src.size() && is_name_char(src[p])) ++p;
      out->push_back({Tok::kName, src.substr(start, p - start), start});
    } else if (is_digit(c)) {
      p = lex_number(src, p, out);
    } else if (c == '\'' || c == '"') {
      p = lex_string(src, p, out);
    } else {
      p = lex_op(src, p, out);
    }
  }
  out->push_back({Tok::kEnd, "", p});
  return p;
}

}  // namespace

std::vector<Tok> lex(const std::string& src, const Options& opt) {
  std::vector<Tok> out;
  size_t i = 0;
  bool strip_next = false;    // a `-` closed the last tag: strip the text's leading whitespace
  bool trim_newline = false;  // trim_blocks after a block tag or comment
  while (i <= src.size()) {
    const size_t open = find_tag_open(src, i);
    std::string text = src.substr(i, (open == std::string::npos ? src.size() : open) - i);
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    }
    strip_next = trim_newline = false;
    if (open == std::string::npos) {
      if (!text.empty()) out.push_back({Tok::kText, text, i});
      break;
    }
    const char kind = src[open + 1];
    const bool minus = open + 2 < src.size() && src[open + 2] == '-';
    const bool plus = open + 2 < src.size() && src[open + 2] == '+';
    if (minus) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (opt.lstrip_blocks && kind != '{' && !plus) {
      // Blanks from the start of the line up to a block tag or comment go.
      size_t k = open;
      while (k > 0 && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k;
      if (k == 0 || src[k - 1] == '\n') {
        const size_t blanks = std::min(open - k, text.size());
        text.erase(text.size() - blanks);
      }
    }
    if (!text.empty()) out.push_back({Tok::kText, text, i});
    const size_t body = open + 2 + ((minus || plus) ? 1 : 0);
    if (kind == '#') {
      const size_t close = src.find("#}", body);
      if (close == std::string::npos) fail(open, "unterminated comment");
      strip_next = close > 0 && src[close - 1] == '-';
      trim_newline = opt.trim_blocks && !strip_next;
      i = close + 2;
      continue;
    }
    out.push_back({kind == '{' ? Tok::kPrint : Tok::kBlock, "", open});
    i = lex_tag(src, open, body, kind == '{' ? "}}" : "%}", &strip_next, &out);
    trim_newline = kind == '%' && opt.trim_blocks && !strip_next;
  }
  return out;
}

}  // namespace vlm::jinja

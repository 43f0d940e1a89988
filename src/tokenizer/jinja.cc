#include "tokenizer/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace vlm::jinja {

// ---------------------------------------------------------------------------------- values

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}
Value* Object::find(std::string_view key) {
  for (auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}
void Object::set(const std::string& key, Value v) {
  if (Value* p = find(key)) {
    *p = std::move(v);
  } else {
    items.emplace_back(key, std::move(v));
  }
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t v) : kind_(Kind::kInt), i_(v) {}
Value::Value(double v) : kind_(Kind::kFloat), f_(v) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}
Value::Value(Array a) : kind_(Kind::kArray), arr_(std::make_shared<Array>(std::move(a))) {}
Value::Value(Object o) : kind_(Kind::kObject), obj_(std::make_shared<Object>(std::move(o))) {}
Value Value::function(Function f) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.fn_ = std::make_shared<Function>(std::move(f));
  return v;
}
Value Value::namespace_of(Object o) {
  Value v(std::move(o));
  v.ns_ = true;
  return v;
}

namespace {

template <class Json>
Value value_from_json(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(value_from_json(e));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      Object o;
      for (auto it = j.begin(); it != j.end(); ++it) o.set(it.key(), value_from_json(it.value()));
      return Value(std::move(o));
    }
    default:
      return Value();
  }
}

}  // namespace

Value Value::from_json(const nlohmann::json& j) { return value_from_json(j); }
Value Value::from_json(const nlohmann::ordered_json& j) { return value_from_json(j); }
Value Value::tuple(Array a) {
  Value v(std::move(a));
  v.tuple_ = true;
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kArray:
      return !arr_->empty();
    case Kind::kObject:
      return ns_ || !obj_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

namespace {

// repr(float) as Python writes it: the shortest digits that round-trip, fixed notation for
// exponents in [-4, 16), scientific otherwise, and ".0" on integral values.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  const size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  bool neg = false;
  if (!mant.empty() && mant[0] == '-') {
    neg = true;
    mant.erase(0, 1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (static_cast<int>(digits.size()) <= exp + 1) {
        out = digits + std::string(static_cast<size_t>(exp + 1) - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
              digits.substr(static_cast<size_t>(exp + 1));
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string py_quote(const std::string& s) {
  // Python's repr of a str: single quotes unless the text has ' and no ".
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(q)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += q;
  return out;
}

void json_string(const std::string& s, std::string* out) {
  *out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          *out += b;
        } else {
          *out += static_cast<char>(c);
        }
    }
  }
  *out += '"';
}

void json_dump(const Value& v, int indent, bool sort_keys, int depth, std::string* out) {
  const std::string nl =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * (depth + 1)), ' ') : "";
  const std::string nl_end =
      indent >= 0 ? "\n" + std::string(static_cast<size_t>(indent * depth), ' ') : "";
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      *out += "null";
      return;
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      *out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : float_repr(d);
      return;
    }
    case Value::Kind::kString:
      json_string(v.str(), out);
      return;
    case Value::Kind::kArray: {
      if (v.array().empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      bool first = true;
      for (const Value& e : v.array()) {
        if (!first) *out += item_sep;
        first = false;
        *out += nl;
        json_dump(e, indent, sort_keys, depth + 1, out);
      }
      *out += nl_end + "]";
      return;
    }
    case Value::Kind::kObject: {
      if (v.object().items.empty()) {
        *out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.object().items) items.push_back(&kv);
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) *out += item_sep;
        first = false;
        *out += nl;
        json_string(kv->first, out);
        *out += ": ";
        json_dump(kv->second, indent, sort_keys, depth + 1, out);
      }
      *out += nl_end + "}";
      return;
    }
    case Value::Kind::kFunction:
      throw std::runtime_error("Object of type function is not JSON serializable");
  }
}

}  // namespace

std::string Value::to_string() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return s_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return float_repr(f_);
    case Kind::kString:
      return py_quote(s_);
    case Kind::kArray: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < arr_->size(); ++i) {
        if (i) out += ", ";
        out += (*arr_)[i].repr();
      }
      if (tuple_ && arr_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kObject: {
      if (ns_) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : obj_->items) {
        if (!first) out += ", ";
        first = false;
        out += py_quote(k) + ": " + v.repr();
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

std::string Value::to_json(int indent, bool sort_keys) const {
  std::string out;
  json_dump(*this, indent, sort_keys, 0, &out);
  return out;
}

bool Value::operator==(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kInt && o.kind_ == Kind::kInt) return i_ == o.i_;
    return as_double() == o.as_double();
  }
  if (kind_ == Kind::kBool && o.is_number()) return Value(int64_t{b_}) == o;
  if (is_number() && o.kind_ == Kind::kBool) return *this == Value(int64_t{o.b_});
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == o.b_;
    case Kind::kString:
      return s_ == o.s_;
    case Kind::kArray:
      return *arr_ == *o.arr_;
    case Kind::kObject: {
      if (obj_ == o.obj_) return true;
      if (obj_->items.size() != o.obj_->items.size()) return false;
      for (const auto& [k, v] : obj_->items) {
        const Value* w = o.obj_->find(k);
        if (w == nullptr || !(v == *w)) return false;
      }
      return true;
    }
    case Kind::kFunction:
      return fn_ == o.fn_;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------- errors

namespace {

struct Error {
  std::string message;
  size_t pos;  // offset in the source
};

[[noreturn]] void fail(size_t pos, std::string msg) { throw Error{std::move(msg), pos}; }

// ---------------------------------------------------------------------------------- lexer

struct Tok {
  enum Type { kText, kPrint, kBlock, kName, kString, kInt, kFloat, kOp, kEnd };
  Type type;
  std::string text;
  size_t pos;
};

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Splits the source into text and tags, applying whitespace control, then each tag into tokens.
// A tag's tokens follow a kPrint / kBlock marker and end with a kEnd.
std::vector<Tok> lex(const std::string& src, const Options& opt) {
  std::vector<Tok> out;
  size_t i = 0;
  bool strip_next = false;    // a `-` closed the last tag: strip the text's leading whitespace
  bool trim_newline = false;  // trim_blocks after a block tag or comment
  while (i <= src.size()) {
    size_t open = src.find('{', i);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#') {
      open = src.find('{', open + 1);
    }
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(i, (open == std::string::npos ? src.size() : open) - i);
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
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
      while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.pop_back();
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
    size_t body = open + 2 + ((minus || plus) ? 1 : 0);
    if (kind == '#') {
      const size_t close = src.find("#}", body);
      if (close == std::string::npos) fail(open, "unterminated comment");
      strip_next = close > 0 && src[close - 1] == '-';
      trim_newline = opt.trim_blocks && !strip_next;
      i = close + 2;
      continue;
    }
    const std::string closer = kind == '{' ? "}}" : "%}";
    out.push_back({kind == '{' ? Tok::kPrint : Tok::kBlock, "", open});
    size_t p = body;
    for (;;) {
      while (p < src.size() && std::isspace(static_cast<unsigned char>(src[p]))) ++p;
      if (p >= src.size()) fail(open, "unterminated tag");
      if ((src[p] == '-' || src[p] == '+') && src.compare(p + 1, 2, closer) == 0) {
        strip_next = src[p] == '-';
        p += 3;
        break;
      }
      if (src.compare(p, 2, closer) == 0) {
        p += 2;
        break;
      }
      const size_t start = p;
      const char c = src[p];
      if (is_name_start(c)) {
        while (p < src.size() && is_name_char(src[p])) ++p;
        out.push_back({Tok::kName, src.substr(start, p - start), start});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        while (p < src.size() &&
               (std::isdigit(static_cast<unsigned char>(src[p])) || src[p] == '_'))
          ++p;
        bool is_float = false;
        if (p + 1 < src.size() && src[p] == '.' &&
            std::isdigit(static_cast<unsigned char>(src[p + 1]))) {
          is_float = true;
          ++p;
          while (p < src.size() && std::isdigit(static_cast<unsigned char>(src[p]))) ++p;
        }
        if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
          is_float = true;
          ++p;
          if (p < src.size() && (src[p] == '+' || src[p] == '-')) ++p;
          while (p < src.size() && std::isdigit(static_cast<unsigned char>(src[p]))) ++p;
        }
        std::string num = src.substr(start, p - start);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        out.push_back({is_float ? Tok::kFloat : Tok::kInt, num, start});
      } else if (c == '\'' || c == '"') {
        std::string s;
        ++p;
        while (p < src.size() && src[p] != c) {
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
        ++p;
        out.push_back({Tok::kString, s, start});
      } else {
        static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                                     "-",  "*",  "/",  "%",  "~",  "|",  ".", ",", ":",
                                     "(",  ")",  "[",  "]",  "{",  "}",  "="};
        bool found = false;
        for (const char* op : kOps) {
          const size_t n = std::strlen(op);
          if (src.compare(p, n, op) == 0) {
            out.push_back({Tok::kOp, op, p});
            p += n;
            found = true;
            break;
          }
        }
        if (!found) fail(p, std::string("unexpected character '") + c + "'");
      }
    }
    out.push_back({Tok::kEnd, "", p});
    trim_newline = kind == '%' && opt.trim_blocks && !strip_next;
    i = p;
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------- AST

struct Expr;
using ExprP = std::shared_ptr<Expr>;

struct Expr {
  enum Kind {
    kLiteral,
    kName,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kBinary,
    kAnd,
    kOr,
    kCompare,
    kCond,
    kList,
    kTuple,
    kDict
  } kind;
  size_t pos = 0;
  Value literal;
  std::string name;         // name, attribute, filter / test, operator
  std::vector<ExprP> args;  // operands, elements, call / filter / test arguments
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;  // kCompare: the operators between args
  bool negated = false;          // kTest: `is not`
};

struct Template::Node {
  enum Kind {
    kText,
    kPrint,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kCallBlock,
    kBreak,
    kContinue,
    kFilterBlock,
    kBlock
  } kind;
  size_t pos = 0;
  std::string text;                // kText; kSet / kSetBlock: the name; kMacro: the name
  std::string attr;                // kSet of a namespace attribute
  std::vector<std::string> names;  // kFor targets; kMacro / kCallBlock parameters
  std::vector<ExprP> defaults;     // kMacro / kCallBlock: parameter defaults (null: none)
  ExprP expr;                      // kPrint, kFor iterable, kSet value, kCallBlock call
  ExprP cond;                      // kFor filter
  std::vector<std::pair<ExprP, std::vector<std::shared_ptr<Node>>>> branches;  // kIf
  std::vector<std::shared_ptr<Node>> body, else_body;
  ExprP filter;  // kFilterBlock: a filter expression applied to the body's text
};

using NodeP = std::shared_ptr<Template::Node>;
using Node = Template::Node;

namespace {

// ---------------------------------------------------------------------------------- parser

class Parser {
 public:
  explicit Parser(std::vector<Tok> toks) : t_(std::move(toks)) {}

  std::vector<NodeP> parse_all() {
    std::vector<NodeP> body = parse_body({});
    if (p_ < t_.size()) fail(t_[p_].pos, "unexpected '" + block_keyword() + "'");
    return body;
  }

 private:
  const Tok& cur() const { return t_[p_]; }
  bool at_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool at_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  void expect_op(const char* op) {
    if (!at_op(op)) fail(cur().pos, std::string("expected '") + op + "'");
    ++p_;
  }
  void expect_end() {
    if (cur().type != Tok::kEnd) fail(cur().pos, "expected the end of the tag");
    ++p_;
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail(cur().pos, "expected a name");
    return t_[p_++].text;
  }
  // The keyword of the block tag at p_ (which must be a kBlock marker), or "".
  std::string block_keyword() const {
    if (p_ + 1 < t_.size() && t_[p_].type == Tok::kBlock && t_[p_ + 1].type == Tok::kName)
      return t_[p_ + 1].text;
    return "";
  }

  // Statements until a block tag whose keyword is in `stop` (left unconsumed).
  std::vector<NodeP> parse_body(const std::vector<std::string>& stop) {
    std::vector<NodeP> out;
    while (p_ < t_.size()) {
      const Tok& tk = cur();
      if (tk.type == Tok::kText) {
        auto n = std::make_shared<Node>();
        n->kind = Node::kText;
        n->text = tk.text;
        n->pos = tk.pos;
        out.push_back(n);
        ++p_;
      } else if (tk.type == Tok::kPrint) {
        ++p_;
        auto n = std::make_shared<Node>();
        n->kind = Node::kPrint;
        n->pos = tk.pos;
        n->expr = parse_expr();
        expect_end();
        out.push_back(n);
      } else if (tk.type == Tok::kBlock) {
        const std::string kw = block_keyword();
        if (std::find(stop.begin(), stop.end(), kw) != stop.end()) return out;
        out.push_back(parse_statement());
      } else {
        fail(tk.pos, "unexpected token");
      }
    }
    if (!stop.empty()) fail(t_.empty() ? 0 : t_.back().pos, "missing '{% " + stop.back() + " %}'");
    return out;
  }

  // At a kBlock marker: consumes `{% keyword`.
  std::string open_block() {
    const size_t pos = cur().pos;
    ++p_;
    if (cur().type != Tok::kName) fail(pos, "expected a statement");
    return t_[p_++].text;
  }
  void close_block(const char* kw) {
    if (block_keyword() != kw) fail(cur().pos, std::string("expected '{% ") + kw + " %}'");
    p_ += 2;
    expect_end();
  }

  NodeP parse_statement() {
    const size_t pos = cur().pos;
    const std::string kw = open_block();
    auto n = std::make_shared<Node>();
    n->pos = pos;
    if (kw == "if") {
      n->kind = Node::kIf;
      ExprP c = parse_expr();
      expect_end();
      for (;;) {
        auto body = parse_body({"elif", "else", "endif"});
        n->branches.emplace_back(c, std::move(body));
        const std::string k = block_keyword();
        p_ += 2;
        if (k == "elif") {
          c = parse_expr();
          expect_end();
        } else if (k == "else") {
          expect_end();
          n->else_body = parse_body({"endif"});
          close_block("endif");
          break;
        } else {
          expect_end();
          break;
        }
      }
    } else if (kw == "for") {
      n->kind = Node::kFor;
      n->names.push_back(expect_name());
      while (at_op(",")) {
        ++p_;
        n->names.push_back(expect_name());
      }
      if (!at_name("in")) fail(cur().pos, "expected 'in'");
      ++p_;
      n->expr = parse_or();  // no conditional expression: `if` starts the filter
      if (at_name("if")) {
        ++p_;
        n->cond = parse_or();
      }
      if (at_name("recursive")) fail(cur().pos, "recursive loops are not supported");
      expect_end();
      n->body = parse_body({"else", "endfor"});
      if (block_keyword() == "else") {
        p_ += 2;
        expect_end();
        n->else_body = parse_body({"endfor"});
      }
      close_block("endfor");
    } else if (kw == "set") {
      const std::string name = expect_name();
      if (at_op(".")) {
        ++p_;
        n->attr = expect_name();
      }
      n->text = name;
      if (at_op("=")) {
        ++p_;
        n->kind = Node::kSet;
        n->expr = parse_expr();
        expect_end();
      } else {
        if (!n->attr.empty()) fail(pos, "a set block cannot assign an attribute");
        n->kind = Node::kSetBlock;
        expect_end();
        n->body = parse_body({"endset"});
        close_block("endset");
      }
    } else if (kw == "macro" || kw == "call") {
      if (kw == "macro") {
        n->kind = Node::kMacro;
        n->text = expect_name();
      } else {
        n->kind = Node::kCallBlock;
      }
      if (at_op("(")) {
        ++p_;
        while (!at_op(")")) {
          n->names.push_back(expect_name());
          ExprP def;
          if (at_op("=")) {
            ++p_;
            def = parse_expr();
          }
          n->defaults.push_back(def);
          if (!at_op(",")) break;
          ++p_;
        }
        expect_op(")");
      }
      if (kw == "call") n->expr = parse_expr();
      expect_end();
      n->body = parse_body({kw == "macro" ? "endmacro" : "endcall"});
      close_block(kw == "macro" ? "endmacro" : "endcall");
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::kBreak : Node::kContinue;
      expect_end();
    } else if (kw == "filter") {
      n->kind = Node::kFilterBlock;
      auto self = std::make_shared<Expr>();
      self->kind = Expr::kLiteral;
      n->filter = parse_filter_chain(self);
      expect_end();
      n->body = parse_body({"endfilter"});
      close_block("endfilter");
    } else if (kw == "generation") {
      n->kind = Node::kBlock;
      expect_end();
      n->body = parse_body({"endgeneration"});
      close_block("endgeneration");
    } else {
      fail(pos, "unknown statement '" + kw + "'");
    }
    return n;
  }

  ExprP make(Expr::Kind k, size_t pos) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }

  ExprP parse_expr() {
    ExprP e = parse_or();
    if (at_name("if")) {
      auto c = make(Expr::kCond, cur().pos);
      ++p_;
      ExprP cond = parse_or();
      ExprP other;
      if (at_name("else")) {
        ++p_;
        other = parse_expr();
      }
      c->args = {cond, e, other};
      return c;
    }
    return e;
  }
  ExprP parse_or() {
    ExprP e = parse_and();
    while (at_name("or")) {
      auto o = make(Expr::kOr, cur().pos);
      ++p_;
      o->args = {e, parse_and()};
      e = o;
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (at_name("and")) {
      auto o = make(Expr::kAnd, cur().pos);
      ++p_;
      o->args = {e, parse_not()};
      e = o;
    }
    return e;
  }
  ExprP parse_not() {
    if (at_name("not")) {
      auto o = make(Expr::kNot, cur().pos);
      ++p_;
      o->args = {parse_not()};
      return o;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    ExprP cmp;
    for (;;) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++p_;
      } else if (at_name("in")) {
        op = "in";
        ++p_;
      } else if (at_name("not") && p_ + 1 < t_.size() && t_[p_ + 1].type == Tok::kName &&
                 t_[p_ + 1].text == "in") {
        op = "not in";
        p_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::kCompare, e->pos);
        cmp->args.push_back(e);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? cmp : e;
  }
  ExprP binary(const std::string& op, ExprP a, ExprP b, size_t pos) {
    auto o = make(Expr::kBinary, pos);
    o->name = op;
    o->args = {std::move(a), std::move(b)};
    return o;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (at_op("+") || at_op("-")) {
      const std::string op = cur().text;
      const size_t pos = cur().pos;
      ++p_;
      e = binary(op, e, parse_concat(), pos);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (at_op("~")) {
      const size_t pos = cur().pos;
      ++p_;
      e = binary("~", e, parse_math2(), pos);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = cur().text;
      const size_t pos = cur().pos;
      ++p_;
      e = binary(op, e, parse_pow(), pos);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary();
    while (at_op("**")) {
      const size_t pos = cur().pos;
      ++p_;
      e = binary("**", e, parse_unary(), pos);
    }
    return e;
  }
  // As jinja2's parse_unary: `-x | f` is f(-x), the filters applying after the sign.
  ExprP parse_unary(bool with_filter = true) {
    ExprP e;
    if (at_op("-")) {
      e = make(Expr::kNeg, cur().pos);
      ++p_;
      e->args = {parse_unary(false)};
    } else if (at_op("+")) {
      ++p_;
      e = parse_unary(false);
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filter_chain(e) : e;
  }
  void parse_call_args(Expr* e) {
    expect_op("(");
    while (!at_op(")")) {
      if (cur().type == Tok::kName && p_ + 1 < t_.size() && t_[p_ + 1].type == Tok::kOp &&
          t_[p_ + 1].text == "=") {
        const std::string k = t_[p_].text;
        p_ += 2;
        e->kwargs.emplace_back(k, parse_expr());
      } else {
        e->args.push_back(parse_expr());
      }
      if (!at_op(",")) break;
      ++p_;
    }
    expect_op(")");
  }
  ExprP parse_filter_chain(ExprP e) {
    for (;;) {
      if (at_op("|")) {
        auto f = make(Expr::kFilter, cur().pos);
        ++p_;
        f->name = expect_name();
        f->args.push_back(e);
        if (at_op("(")) parse_call_args(f.get());
        e = parse_postfix(f);
      } else if (at_name("is")) {
        auto t = make(Expr::kTest, cur().pos);
        ++p_;
        if (at_name("not")) {
          t->negated = true;
          ++p_;
        }
        // `is none`, `is true`...: names; `is equalto x`, `is sameas x`, `is divisibleby(n)`.
        if (cur().type == Tok::kName) {
          t->name = t_[p_++].text;
        } else if (cur().type == Tok::kOp && (cur().text == "==" || cur().text == "!=")) {
          t->name = t_[p_++].text;
        } else {
          fail(cur().pos, "expected a test name");
        }
        t->args.push_back(e);
        if (at_op("(")) {
          parse_call_args(t.get());
        } else if (cur().type == Tok::kString || cur().type == Tok::kInt ||
                   cur().type == Tok::kFloat ||
                   (cur().type == Tok::kName && cur().text != "and" && cur().text != "or" &&
                    cur().text != "if" && cur().text != "else" && cur().text != "in" &&
                    cur().text != "not" && cur().text != "is")) {
          t->args.push_back(parse_primary());
        }
        e = t;
      } else {
        return e;
      }
    }
  }
  ExprP parse_postfix(ExprP e) {
    for (;;) {
      if (at_op(".")) {
        auto a = make(Expr::kAttr, cur().pos);
        ++p_;
        if (cur().type == Tok::kInt) {  // foo.0
          a->kind = Expr::kItem;
          auto idx = make(Expr::kLiteral, cur().pos);
          idx->literal = Value(static_cast<int64_t>(std::stoll(t_[p_++].text)));
          a->args = {e, idx};
        } else {
          a->name = expect_name();
          a->args = {e};
        }
        e = a;
      } else if (at_op("[")) {
        const size_t pos = cur().pos;
        ++p_;
        ExprP parts[3];
        int n = 0;
        bool slice = false;
        for (;;) {
          if (at_op(":")) {
            slice = true;
            ++p_;
            ++n;
            if (n > 2) fail(cur().pos, "too many ':' in a slice");
            continue;
          }
          if (at_op("]")) break;
          parts[n] = parse_expr();
          if (!at_op(":")) break;
        }
        expect_op("]");
        if (slice) {
          auto s = make(Expr::kSlice, pos);
          s->args = {e, parts[0], parts[1], parts[2]};
          e = s;
        } else {
          auto it = make(Expr::kItem, pos);
          it->args = {e, parts[0]};
          e = it;
        }
      } else if (at_op("(")) {
        auto c = make(Expr::kCall, cur().pos);
        c->args.push_back(e);
        parse_call_args(c.get());
        e = c;
      } else {
        return e;
      }
    }
  }
  ExprP parse_primary() {
    const Tok& tk = cur();
    switch (tk.type) {
      case Tok::kString: {
        auto e = make(Expr::kLiteral, tk.pos);
        std::string s = tk.text;
        ++p_;
        while (cur().type == Tok::kString) s += t_[p_++].text;  // adjacent literals join
        e->literal = Value(s);
        return e;
      }
      case Tok::kInt: {
        auto e = make(Expr::kLiteral, tk.pos);
        e->literal = Value(static_cast<int64_t>(std::stoll(tk.text)));
        ++p_;
        return e;
      }
      case Tok::kFloat: {
        auto e = make(Expr::kLiteral, tk.pos);
        e->literal = Value(std::stod(tk.text));
        ++p_;
        return e;
      }
      case Tok::kName: {
        auto e = make(Expr::kLiteral, tk.pos);
        const std::string& n = tk.text;
        ++p_;
        if (n == "true" || n == "True") {
          e->literal = Value(true);
        } else if (n == "false" || n == "False") {
          e->literal = Value(false);
        } else if (n == "none" || n == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::kName;
          e->name = n;
        }
        return e;
      }
      case Tok::kOp:
        if (tk.text == "(") {
          ++p_;
          if (at_op(")")) {
            ++p_;
            return make(Expr::kTuple, tk.pos);
          }
          ExprP first = parse_expr();
          if (at_op(",")) {
            auto t = make(Expr::kTuple, tk.pos);
            t->args.push_back(first);
            while (at_op(",")) {
              ++p_;
              if (at_op(")")) break;
              t->args.push_back(parse_expr());
            }
            expect_op(")");
            return t;
          }
          expect_op(")");
          return first;
        }
        if (tk.text == "[") {
          auto l = make(Expr::kList, tk.pos);
          ++p_;
          while (!at_op("]")) {
            l->args.push_back(parse_expr());
            if (!at_op(",")) break;
            ++p_;
          }
          expect_op("]");
          return l;
        }
        if (tk.text == "{") {
          auto d = make(Expr::kDict, tk.pos);
          ++p_;
          while (!at_op("}")) {
            d->args.push_back(parse_expr());
            expect_op(":");
            d->args.push_back(parse_expr());
            if (!at_op(",")) break;
            ++p_;
          }
          expect_op("}");
          return d;
        }
        break;
      default:
        break;
    }
    fail(tk.pos,
         tk.type == Tok::kEnd ? "unexpected end of the tag" : "unexpected '" + tk.text + "'");
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
};

}  // namespace

Result<Template> Template::parse(std::string_view source, const Options& options) {
  auto src = std::make_shared<const std::string>(source);
  auto line_col = [&](size_t pos) {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < src->size(); ++i) {
      if ((*src)[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(col);
  };
  try {
    Parser p(lex(*src, options));
    Template t;
    t.body_ = std::make_shared<const std::vector<NodeP>>(p.parse_all());
    t.source_ = src;
    return t;
  } catch (const Error& e) {
    return invalid_argument("chat template: " + e.message + " (" + line_col(e.pos) + ")");
  }
}

// ---------------------------------------------------------------------------------- evaluation

namespace {

struct Frame {
  std::map<std::string, Value> vars;
  bool barrier = false;  // a macro's frame: names below it are the globals only
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Object& globals, int64_t now) : now_(now) {
    frames_.emplace_back();
    for (const auto& [k, v] : globals.items) frames_[0].vars[k] = v;
    install_globals();
  }

  void run(const std::vector<NodeP>& body, std::string* out) {
    if (exec(body, out) != Flow::kNormal) fail(0, "break or continue outside a loop");
  }

 private:
  Value lookup(const std::string& n) const {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->vars.find(n);
      if (f != it->vars.end()) return f->second;
      if (it->barrier) {  // a macro's frame sees only the globals below
        auto g = frames_[0].vars.find(n);
        return g != frames_[0].vars.end() ? g->second : Value();
      }
    }
    return Value();
  }
  Value* find_var(const std::string& n) {
    for (auto it = frames_.rbegin(); it != frames_.rend(); ++it) {
      auto f = it->vars.find(n);
      if (f != it->vars.end()) return &f->second;
      if (it->barrier) break;
    }
    auto g = frames_[0].vars.find(n);
    return g != frames_[0].vars.end() ? &g->second : nullptr;
  }
  void assign(const std::string& n, Value v) { frames_.back().vars[n] = std::move(v); }

  void install_globals() {
    auto& g = frames_[0].vars;
    g["raise_exception"] = Value::function([](Args& a) -> Value {
      fail(0, "raise_exception: " + (a.positional.empty() ? "" : a.positional[0].to_string()));
    });
    const int64_t now = now_;
    g["strftime_now"] = Value::function([now](Args& a) -> Value {
      const std::time_t t = now >= 0 ? static_cast<std::time_t>(now) : std::time(nullptr);
      std::tm tm{};
      gmtime_r(&t, &tm);
      char buf[256];
      const std::string fmt = a.positional.empty() ? "" : a.positional[0].to_string();
      const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value(std::string(buf, n));
    });
    g["namespace"] = Value::function([](Args& a) -> Value {
      Object o;
      for (const Value& p : a.positional) {
        if (p.is_object())
          for (const auto& [k, v] : p.object().items) o.set(k, v);
      }
      for (auto& [k, v] : a.keywords) o.set(k, v);
      return Value::namespace_of(std::move(o));
    });
    g["dict"] = Value::function([](Args& a) -> Value {
      Object o;
      for (auto& [k, v] : a.keywords) o.set(k, v);
      return Value(std::move(o));
    });
    g["range"] = Value::function([](Args& a) -> Value {
      int64_t start = 0, stop = 0, step = 1;
      auto num = [&](size_t i) { return a.positional[i].as_int(); };
      if (a.positional.size() == 1) {
        stop = num(0);
      } else if (a.positional.size() >= 2) {
        start = num(0);
        stop = num(1);
        if (a.positional.size() > 2) step = num(2);
      }
      if (step == 0) fail(0, "range() step must not be zero");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        out.push_back(Value(i));
        if (out.size() > 1000000) fail(0, "range() too long");
      }
      return Value(std::move(out));
    });
  }

  // ---- statements

  Flow exec(const std::vector<NodeP>& body, std::string* out) {
    for (const NodeP& n : body) {
      const Flow f = exec(*n, out);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  Flow exec(const Node& n, std::string* out) {
    switch (n.kind) {
      case Node::kText:
        *out += n.text;
        return Flow::kNormal;
      case Node::kPrint:
        *out += eval(*n.expr).to_string();
        return Flow::kNormal;
      case Node::kBlock:
        return exec(n.body, out);
      case Node::kIf:
        for (const auto& [c, body] : n.branches) {
          if (eval(*c).truthy()) return exec(body, out);
        }
        return exec(n.else_body, out);
      case Node::kFor:
        return exec_for(n, out);
      case Node::kSet: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value* ns = find_var(n.text);
          if (ns == nullptr || !ns->is_namespace())
            fail(n.pos, "'" + n.text + "' is not a namespace: its attributes cannot be set");
          ns->object().set(n.attr, std::move(v));
        } else {
          assign(n.text, std::move(v));
        }
        return Flow::kNormal;
      }
      case Node::kSetBlock: {
        std::string s;
        exec(n.body, &s);
        assign(n.text, Value(s));
        return Flow::kNormal;
      }
      case Node::kMacro:
        assign(n.text, make_macro(n, Value()));
        return Flow::kNormal;
      case Node::kCallBlock: {
        const Value caller = make_macro(n, Value());
        // The call expression gets `caller` as a keyword argument the macro binds.
        const Expr& call = *n.expr;
        if (call.kind != Expr::kCall) fail(n.pos, "a call block needs a macro call");
        Value fn = eval(*call.args[0]);
        Args args = eval_args(call, 1);
        args.keywords.emplace_back("caller", caller);
        if (!fn.is_function()) fail(n.pos, "not a macro");
        *out += fn.fn()(args).to_string();
        return Flow::kNormal;
      }
      case Node::kBreak:
        return Flow::kBreak;
      case Node::kContinue:
        return Flow::kContinue;
      case Node::kFilterBlock: {
        std::string s;
        exec(n.body, &s);
        *out += apply_filter_chain(*n.filter, Value(s)).to_string();
        return Flow::kNormal;
      }
    }
    return Flow::kNormal;
  }

  Value apply_filter_chain(const Expr& f, Value self) {
    if (f.kind == Expr::kLiteral) return self;
    if (f.kind != Expr::kFilter) fail(f.pos, "expected a filter");
    Value inner = apply_filter_chain(*f.args[0], std::move(self));
    Args a = eval_args(f, 1);
    return filter(f.name, inner, a, f.pos);
  }

  Array iterable(const Value& v, size_t pos) {
    switch (v.kind()) {
      case Value::Kind::kArray:
        return v.array();
      case Value::Kind::kObject: {
        Array keys;
        for (const auto& [k, x] : v.object().items) keys.push_back(Value(k));
        return keys;
      }
      case Value::Kind::kString: {
        Array chars;
        const std::string& s = v.str();
        for (size_t i = 0; i < s.size();) {
          size_t n = 1;
          const unsigned char c = static_cast<unsigned char>(s[i]);
          if (c >= 0xF0)
            n = 4;
          else if (c >= 0xE0)
            n = 3;
          else if (c >= 0xC0)
            n = 2;
          chars.push_back(Value(s.substr(i, n)));
          i += n;
        }
        return chars;
      }
      case Value::Kind::kUndefined:
        return {};
      default:
        fail(pos, "'" + type_name(v) + "' object is not iterable");
    }
  }

  Flow exec_for(const Node& n, std::string* out) {
    Array items = iterable(eval(*n.expr), n.pos);
    frames_.emplace_back();
    auto bind = [&](const Value& item) {
      if (n.names.size() == 1) {
        assign(n.names[0], item);
      } else {
        if (!item.is_array() || item.array().size() != n.names.size())
          fail(n.pos, "cannot unpack into " + std::to_string(n.names.size()) + " names");
        for (size_t k = 0; k < n.names.size(); ++k) assign(n.names[k], item.array()[k]);
      }
    };
    if (n.cond) {
      Array kept;
      for (const Value& it : items) {
        bind(it);
        if (eval(*n.cond).truthy()) kept.push_back(it);
      }
      items = std::move(kept);
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      bind(items[i]);
      Object loop;
      loop.set("index", Value(i + 1));
      loop.set("index0", Value(i));
      loop.set("revindex", Value(len - i));
      loop.set("revindex0", Value(len - i - 1));
      loop.set("first", Value(i == 0));
      loop.set("last", Value(i == len - 1));
      loop.set("length", Value(len));
      loop.set("previtem", i > 0 ? items[i - 1] : Value());
      loop.set("nextitem", i + 1 < len ? items[i + 1] : Value());
      loop.set("cycle", Value::function([i](Args& a) -> Value {
                 if (a.positional.empty()) return Value();
                 return a.positional[static_cast<size_t>(i) % a.positional.size()];
               }));
      assign("loop", Value(std::move(loop)));
      const Flow f = exec(n.body, out);
      if (f == Flow::kBreak) break;
    }
    frames_.pop_back();
    if (len == 0) return exec(n.else_body, out);
    return Flow::kNormal;
  }

  Value make_macro(const Node& n, Value) {
    const Node* node = &n;
    return Value::function([this, node](Args& a) -> Value {
      frames_.emplace_back();
      frames_.back().barrier = true;
      size_t next = 0;
      for (size_t k = 0; k < node->names.size(); ++k) {
        const std::string& p = node->names[k];
        const Value* kw = nullptr;
        for (const auto& [name, v] : a.keywords)
          if (name == p) kw = &v;
        if (kw != nullptr) {
          assign(p, *kw);
        } else if (next < a.positional.size()) {
          assign(p, a.positional[next++]);
        } else if (node->defaults[k]) {
          assign(p, eval(*node->defaults[k]));
        } else {
          assign(p, Value());
        }
      }
      for (const auto& [name, v] : a.keywords) {
        if (name == "caller") assign("caller", v);
      }
      std::string s;
      exec(node->body, &s);
      frames_.pop_back();
      return Value(s);
    });
  }

  // ---- expressions

  Args eval_args(const Expr& e, size_t from) {
    Args a;
    for (size_t i = from; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keywords.emplace_back(k, eval(*v));
    return a;
  }

  static std::string type_name(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return "Undefined";
      case Value::Kind::kNone:
        return "NoneType";
      case Value::Kind::kBool:
        return "bool";
      case Value::Kind::kInt:
        return "int";
      case Value::Kind::kFloat:
        return "float";
      case Value::Kind::kString:
        return "str";
      case Value::Kind::kArray:
        return "list";
      case Value::Kind::kObject:
        return v.is_namespace() ? "Namespace" : "dict";
      case Value::Kind::kFunction:
        return "function";
    }
    return "?";
  }

  static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

  Value getattr(const Value& obj, const std::string& name, size_t pos) {
    if (obj.is_object()) {
      if (!obj.is_namespace()) {
        if (Value m = dict_method(obj, name); m.is_function()) return m;
      }
      if (const Value* v = obj.object().find(name)) return *v;
      return Value();
    }
    if (obj.is_string()) return string_method(obj.str(), name);
    if (obj.is_array()) {
      if (name == "append" || name == "pop" || name == "insert" || name == "extend")
        fail(pos, "lists cannot be modified in a chat template (sandbox)");
      return Value();
    }
    if (obj.is_undefined()) return Value();
    return Value();
  }

  Value getitem(const Value& obj, const Value& key, size_t pos) {
    if (obj.is_object()) {
      if (!key.is_string()) return Value();
      const Value* v = obj.object().find(key.str());
      return v ? *v : Value();
    }
    if (obj.is_array() || obj.is_string()) {
      if (!key.is_number() || key.kind() != Value::Kind::kInt) {
        if (key.is_string() && obj.is_array()) return Value();
        fail(pos, "indices must be integers");
      }
      const int64_t n = obj.is_array() ? static_cast<int64_t>(obj.array().size())
                                       : static_cast<int64_t>(obj.str().size());
      const int64_t i = norm_index(key.as_int(), n);
      if (i < 0 || i >= n) return Value();
      return obj.is_array() ? obj.array()[static_cast<size_t>(i)]
                            : Value(obj.str().substr(static_cast<size_t>(i), 1));
    }
    return Value();
  }

  Value slice(const Value& obj, const Value& a, const Value& b, const Value& c, size_t pos) {
    const int64_t n = obj.is_array()    ? static_cast<int64_t>(obj.array().size())
                      : obj.is_string() ? static_cast<int64_t>(obj.str().size())
                                        : (fail(pos, "only lists and strings can be sliced"), 0);
    const int64_t step = c.is_number() ? c.as_int() : 1;
    if (step == 0) fail(pos, "slice step cannot be zero");
    auto clampi = [&](const Value& v, int64_t dflt) -> int64_t {
      if (!v.is_number()) return dflt;
      int64_t i = v.as_int();
      if (i < 0) i += n;
      if (step > 0) return std::clamp<int64_t>(i, 0, n);
      return std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t start = clampi(a, step > 0 ? 0 : n - 1), stop = clampi(b, step > 0 ? n : -1);
    if (obj.is_array()) {
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        out.push_back(obj.array()[static_cast<size_t>(i)]);
      return Value(std::move(out));
    }
    std::string out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      out += obj.str()[static_cast<size_t>(i)];
    return Value(out);
  }

  Value dict_method(const Value& obj, const std::string& name) {
    if (name == "get") {
      return Value::function([obj](Args& a) -> Value {
        if (a.positional.empty() || !a.positional[0].is_string()) return Value::none();
        const Value* v = obj.object().find(a.positional[0].str());
        if (v) return *v;
        return a.positional.size() > 1 ? a.positional[1] : Value::none();
      });
    }
    if (name == "items") {
      return Value::function([obj](Args&) -> Value {
        Array out;
        for (const auto& [k, v] : obj.object().items)
          out.push_back(Value::tuple(Array{Value(k), v}));
        return Value(std::move(out));
      });
    }
    if (name == "keys") {
      return Value::function([obj](Args&) -> Value {
        Array out;
        for (const auto& [k, v] : obj.object().items) out.push_back(Value(k));
        return Value(std::move(out));
      });
    }
    if (name == "values") {
      return Value::function([obj](Args&) -> Value {
        Array out;
        for (const auto& [k, v] : obj.object().items) out.push_back(v);
        return Value(std::move(out));
      });
    }
    return Value();
  }

  static bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

  static std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
    auto drop = [&](char c) {
      return chars && chars->is_string() ? chars->str().find(c) != std::string::npos : is_space(c);
    };
    size_t b = 0, e = s.size();
    if (left)
      while (b < e && drop(s[b])) ++b;
    if (right)
      while (e > b && drop(s[e - 1])) --e;
    return s.substr(b, e - b);
  }

  Value string_method(const std::string& s, const std::string& name) {
    auto arg = [](Args& a, size_t i) -> const Value* {
      return i < a.positional.size() ? &a.positional[i] : nullptr;
    };
    if (name == "startswith" || name == "endswith") {
      const bool start = name == "startswith";
      return Value::function([s, start](Args& a) -> Value {
        auto test = [&](const std::string& p) {
          return p.size() <= s.size() && (start ? s.compare(0, p.size(), p) == 0
                                                : s.compare(s.size() - p.size(), p.size(), p) == 0);
        };
        if (a.positional.empty()) return Value(false);
        const Value& p = a.positional[0];
        if (p.is_array()) {
          for (const Value& x : p.array())
            if (test(x.to_string())) return Value(true);
          return Value(false);
        }
        return Value(test(p.to_string()));
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return Value::function(
          [s, l, r, arg](Args& a) -> Value { return Value(strip(s, arg(a, 0), l, r)); });
    }
    if (name == "upper" || name == "lower") {
      const bool up = name == "upper";
      return Value::function([s, up](Args&) -> Value {
        std::string o = s;
        for (char& c : o)
          c = static_cast<char>(up ? std::toupper(static_cast<unsigned char>(c))
                                   : std::tolower(static_cast<unsigned char>(c)));
        return Value(o);
      });
    }
    if (name == "title" || name == "capitalize") {
      const bool title = name == "title";
      return Value::function(
          [this, s, title](Args&) -> Value { return Value(title ? to_title(s) : capitalize(s)); });
    }
    if (name == "replace") {
      return Value::function([s](Args& a) -> Value {
        if (a.positional.size() < 2) return Value(s);
        return Value(replace_all(s, a.positional[0].to_string(), a.positional[1].to_string(),
                                 a.positional.size() > 2 ? a.positional[2].as_int() : -1));
      });
    }
    if (name == "split" || name == "rsplit") {
      return Value::function([s](Args& a) -> Value {
        const Value* sep =
            !a.positional.empty() && !a.positional[0].is_none() ? &a.positional[0] : nullptr;
        int64_t maxsplit = a.positional.size() > 1 ? a.positional[1].as_int() : -1;
        for (auto& [k, v] : a.keywords) {
          if (k == "sep" && !v.is_none()) sep = &v;
          if (k == "maxsplit") maxsplit = v.as_int();
        }
        Array out;
        if (sep == nullptr) {
          size_t i = 0;
          while (i < s.size()) {
            while (i < s.size() && is_space(s[i])) ++i;
            if (i >= s.size()) break;
            if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
              out.push_back(Value(strip(s.substr(i), nullptr, false, true)));
              break;
            }
            size_t j = i;
            while (j < s.size() && !is_space(s[j])) ++j;
            out.push_back(Value(s.substr(i, j - i)));
            i = j;
          }
          return Value(std::move(out));
        }
        const std::string d = sep->to_string();
        if (d.empty()) fail(0, "empty separator");
        size_t i = 0;
        for (;;) {
          if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
          const size_t j = s.find(d, i);
          if (j == std::string::npos) break;
          out.push_back(Value(s.substr(i, j - i)));
          i = j + d.size();
        }
        out.push_back(Value(s.substr(i)));
        return Value(std::move(out));
      });
    }
    if (name == "find" || name == "count") {
      const bool find = name == "find";
      return Value::function([s, find](Args& a) -> Value {
        const std::string p = a.positional.empty() ? "" : a.positional[0].to_string();
        if (find) {
          const size_t k = s.find(p);
          return Value(k == std::string::npos ? int64_t{-1} : static_cast<int64_t>(k));
        }
        int64_t n = 0;
        if (p.empty()) return Value(static_cast<int64_t>(s.size() + 1));
        for (size_t k = s.find(p); k != std::string::npos; k = s.find(p, k + p.size())) ++n;
        return Value(n);
      });
    }
    if (name == "isdigit" || name == "isalpha" || name == "isspace") {
      return Value::function([s, name](Args&) -> Value {
        if (s.empty()) return Value(false);
        for (char c : s) {
          const unsigned char u = static_cast<unsigned char>(c);
          const bool ok = name == "isdigit"   ? std::isdigit(u)
                          : name == "isalpha" ? std::isalpha(u)
                                              : std::isspace(u);
          if (!ok) return Value(false);
        }
        return Value(true);
      });
    }
    return Value();
  }

  static std::string replace_all(const std::string& s, const std::string& from,
                                 const std::string& to, int64_t count) {
    if (from.empty()) return s;
    std::string out;
    size_t i = 0;
    int64_t n = 0;
    for (size_t k = s.find(from); k != std::string::npos && (count < 0 || n < count);
         k = s.find(from, i)) {
      out += s.substr(i, k - i) + to;
      i = k + from.size();
      ++n;
    }
    return out + s.substr(i);
  }
  static std::string capitalize(const std::string& s) {
    std::string o = s;
    for (size_t i = 0; i < o.size(); ++i)
      o[i] = static_cast<char>(i == 0 ? std::toupper(static_cast<unsigned char>(o[i]))
                                      : std::tolower(static_cast<unsigned char>(o[i])));
    return o;
  }
  static std::string to_title(const std::string& s) {
    std::string o = s;
    bool start = true;
    for (char& c : o) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (std::isalpha(u)) {
        c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
        start = false;
      } else {
        start = true;
      }
    }
    return o;
  }

  bool test(const std::string& name, const Value& v, const Args& a, size_t pos) {
    auto arg = [&](size_t i) { return i < a.positional.size() ? a.positional[i] : Value(); };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind() == Value::Kind::kInt;
    if (name == "float") return v.kind() == Value::Kind::kFloat;
    if (name == "boolean") return v.kind() == Value::Kind::kBool;
    if (name == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
    if (name == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
    if (name == "mapping") return v.is_object();
    if (name == "iterable") return v.is_array() || v.is_object() || v.is_string();
    if (name == "sequence") return v.is_array() || v.is_string() || v.is_object();
    if (name == "callable") return v.is_function();
    if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return v == arg(0);
    if (name == "ne" || name == "!=") return !(v == arg(0));
    if (name == "odd") return v.as_int() % 2 != 0;
    if (name == "even") return v.as_int() % 2 == 0;
    if (name == "divisibleby") return arg(0).as_int() != 0 && v.as_int() % arg(0).as_int() == 0;
    if (name == "in") return contains(arg(0), v, pos);
    if (name == "lower" || name == "upper") {
      if (!v.is_string()) return false;
      for (char c : v.str()) {
        if (name == "lower" ? std::isupper(static_cast<unsigned char>(c))
                            : std::islower(static_cast<unsigned char>(c)))
          return false;
      }
      return true;
    }
    fail(pos, "unknown test '" + name + "'");
  }

  bool contains(const Value& hay, const Value& needle, size_t pos) {
    if (hay.is_string()) return hay.str().find(needle.to_string()) != std::string::npos;
    if (hay.is_array()) {
      for (const Value& x : hay.array())
        if (x == needle) return true;
      return false;
    }
    if (hay.is_object()) return needle.is_string() && hay.object().find(needle.str()) != nullptr;
    if (hay.is_undefined()) return false;  // jinja2's Undefined iterates as empty
    fail(pos, "argument of type '" + type_name(hay) + "' is not iterable");
  }

  int compare_values(const Value& a, const Value& b, size_t pos) {
    if (a.is_number() && b.is_number()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.is_string() && b.is_string())
      return a.str().compare(b.str()) < 0 ? -1 : a.str() == b.str() ? 0 : 1;
    fail(pos, "'<' not supported between '" + type_name(a) + "' and '" + type_name(b) + "'");
  }

  Value filter(const std::string& name, const Value& v, Args& a, size_t pos) {
    auto arg = [&](size_t i, const char* kw) -> Value {
      for (auto& [k, x] : a.keywords)
        if (k == kw) return x;
      return i < a.positional.size() ? a.positional[i] : Value();
    };
    if (name == "tojson") {
      const Value ind = arg(0, "indent");
      return Value(v.to_json(ind.is_number() ? static_cast<int>(ind.as_int()) : -1,
                             arg(99, "sort_keys").truthy()));
    }
    if (name == "trim") return Value(strip(v.to_string(), nullptr, true, true));
    if (name == "length" || name == "count") {
      if (v.is_array()) return Value(static_cast<int64_t>(v.array().size()));
      if (v.is_object()) return Value(static_cast<int64_t>(v.object().items.size()));
      if (v.is_string()) return Value(static_cast<int64_t>(iterable(v, pos).size()));
      if (v.is_undefined()) return Value(int64_t{0});
      fail(pos, "object of type '" + type_name(v) + "' has no len()");
    }
    if (name == "items") return dict_method(v.is_object() ? v : Value(Object{}), "items").fn()(a);
    if (name == "list") return Value(iterable(v, pos));
    if (name == "string") return Value(v.to_string());
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      return string_method(v.to_string(), name).fn()(a);
    }
    if (name == "replace") return string_method(v.to_string(), "replace").fn()(a);
    if (name == "int") {
      if (v.is_number()) return Value(static_cast<int64_t>(v.as_double()));
      try {
        return Value(static_cast<int64_t>(std::stoll(v.to_string())));
      } catch (...) {
        return Value(int64_t{0});
      }
    }
    if (name == "float") {
      if (v.is_number()) return Value(v.as_double());
      try {
        return Value(std::stod(v.to_string()));
      } catch (...) {
        return Value(0.0);
      }
    }
    if (name == "abs")
      return v.kind() == Value::Kind::kInt ? Value(std::abs(v.as_int()))
                                           : Value(std::fabs(v.as_double()));
    if (name == "join") {
      const std::string sep = arg(0, "d").to_string();
      const Value attr = arg(1, "attribute");
      std::string out;
      bool first = true;
      for (const Value& x : iterable(v, pos)) {
        if (!first) out += sep;
        first = false;
        out += (attr.is_undefined() ? x : getattr_or_item(x, attr, pos)).to_string();
      }
      return Value(out);
    }
    if (name == "first" || name == "last") {
      Array items = iterable(v, pos);
      if (items.empty()) return Value();
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::string s = v.str();
        std::reverse(s.begin(), s.end());
        return Value(s);
      }
      Array items = iterable(v, pos);
      std::reverse(items.begin(), items.end());
      return Value(std::move(items));
    }
    if (name == "unique") {
      Array out;
      for (const Value& x : iterable(v, pos)) {
        if (std::find(out.begin(), out.end(), x) == out.end()) out.push_back(x);
      }
      return Value(std::move(out));
    }
    if (name == "default" || name == "d") {
      const bool boolean = arg(1, "boolean").truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) {
        Value d = arg(0, "default_value");
        return d.is_undefined() ? Value("") : d;
      }
      return v;
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      const bool attr = name == "selectattr" || name == "rejectattr";
      const bool keep = name == "selectattr" || name == "select";
      Array out;
      const size_t t0 = attr ? 1 : 0;
      for (const Value& x : iterable(v, pos)) {
        const Value subject = attr ? getattr_or_item(x, a.positional.at(0), pos) : x;
        bool ok;
        if (a.positional.size() > t0) {
          Args ta;
          ta.positional.assign(a.positional.begin() + static_cast<long>(t0) + 1,
                               a.positional.end());
          ok = test(a.positional[t0].to_string(), subject, ta, pos);
        } else {
          ok = subject.truthy();
        }
        if (ok == keep) out.push_back(x);
      }
      return Value(std::move(out));
    }
    if (name == "map") {
      Array out;
      const Value attr = arg(99, "attribute");
      for (const Value& x : iterable(v, pos)) {
        if (!attr.is_undefined()) {
          Value y = getattr_or_item(x, attr, pos);
          if (y.is_undefined()) {
            const Value d = arg(99, "default");
            if (!d.is_undefined()) y = d;
          }
          out.push_back(y);
        } else {
          Args fa;
          fa.positional.assign(a.positional.begin() + 1, a.positional.end());
          out.push_back(filter(a.positional.at(0).to_string(), x, fa, pos));
        }
      }
      return Value(std::move(out));
    }
    if (name == "dictsort") {
      Array out = dict_method(v, "items").fn()(a).array();
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        return compare_values(x.array()[0], y.array()[0], pos) < 0;
      });
      return Value(std::move(out));
    }
    if (name == "sort") {
      Array out = iterable(v, pos);
      const Value attr = arg(99, "attribute");
      const bool rev = arg(0, "reverse").truthy();
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        const Value xa = attr.is_undefined() ? x : getattr_or_item(x, attr, pos);
        const Value ya = attr.is_undefined() ? y : getattr_or_item(y, attr, pos);
        return rev ? compare_values(ya, xa, pos) < 0 : compare_values(xa, ya, pos) < 0;
      });
      return Value(std::move(out));
    }
    if (name == "indent") {
      const Value w = arg(0, "width");
      const std::string pad =
          w.is_string() ? w.str()
                        : std::string(static_cast<size_t>(w.is_number() ? w.as_int() : 4), ' ');
      const bool first = arg(1, "first").truthy(), blank = arg(2, "blank").truthy();
      const std::string s = v.to_string();
      std::string out;
      size_t i = 0;
      bool line0 = true;
      while (i <= s.size()) {
        size_t j = s.find('\n', i);
        const std::string line = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
        if ((!line0 || first) && (blank || !line.empty())) out += pad;
        out += line;
        if (j == std::string::npos) break;
        out += '\n';
        i = j + 1;
        line0 = false;
      }
      return Value(out);
    }
    if (name == "safe" || name == "e" || name == "escape") {
      if (name == "safe") return v;
      std::string out;
      for (char c : v.to_string()) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value(out);
    }
    if (name == "round") {
      const int64_t prec = arg(0, "precision").is_number() ? arg(0, "precision").as_int() : 0;
      const double m = std::pow(10.0, static_cast<double>(prec));
      return Value(std::nearbyint(v.as_double() * m) / m);
    }
    if (name == "wordcount") {
      Args none;
      return Value(
          static_cast<int64_t>(string_method(v.to_string(), "split").fn()(none).array().size()));
    }
    fail(pos, "unknown filter '" + name + "'");
  }

  Value getattr_or_item(const Value& x, const Value& attr, size_t pos) {
    // "a.b" paths, as jinja's attribute= arguments.
    Value cur = x;
    const std::string path = attr.to_string();
    size_t i = 0;
    for (;;) {
      const size_t j = path.find('.', i);
      const std::string part = path.substr(i, j == std::string::npos ? std::string::npos : j - i);
      if (cur.is_object()) {
        const Value* v = cur.object().find(part);
        cur = v ? *v : Value();
      } else if (cur.is_array() && !part.empty() &&
                 std::isdigit(static_cast<unsigned char>(part[0]))) {
        cur = getitem(cur, Value(static_cast<int64_t>(std::stoll(part))), pos);
      } else {
        cur = Value();
      }
      if (j == std::string::npos) return cur;
      i = j + 1;
    }
  }

  Value arith(const std::string& op, const Value& x, const Value& y, size_t pos) {
    if (op == "~") return Value(x.to_string() + y.to_string());
    if (op == "+") {
      if (x.is_string() && y.is_string()) return Value(x.str() + y.str());
      if (x.is_array() && y.is_array()) {
        Array out = x.array();
        out.insert(out.end(), y.array().begin(), y.array().end());
        return Value(std::move(out));
      }
    }
    if (op == "*" && x.is_string() && y.kind() == Value::Kind::kInt) {
      std::string out;
      for (int64_t i = 0; i < y.as_int(); ++i) out += x.str();
      return Value(out);
    }
    if (op == "%" && x.is_string()) {  // '%s' % x (printf-style, %s / %d only)
      Array vals = y.is_array() ? y.array() : Array{y};
      std::string out;
      size_t k = 0;
      for (size_t i = 0; i < x.str().size(); ++i) {
        const char c = x.str()[i];
        if (c == '%' && i + 1 < x.str().size()) {
          const char f = x.str()[++i];
          if (f == '%') {
            out += '%';
          } else if (k < vals.size()) {
            out += vals[k++].to_string();
          }
        } else {
          out += c;
        }
      }
      return Value(out);
    }
    auto num = [&](const Value& v) {
      if (v.kind() == Value::Kind::kBool) return Value(int64_t{v.as_bool()});
      if (!v.is_number())
        fail(pos, "unsupported operand types for " + op + ": '" + type_name(x) + "' and '" +
                      type_name(y) + "'");
      return v;
    };
    const Value a = num(x), b = num(y);
    const bool ints = a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt;
    if (op == "+")
      return ints ? Value(a.as_int() + b.as_int()) : Value(a.as_double() + b.as_double());
    if (op == "-")
      return ints ? Value(a.as_int() - b.as_int()) : Value(a.as_double() - b.as_double());
    if (op == "*")
      return ints ? Value(a.as_int() * b.as_int()) : Value(a.as_double() * b.as_double());
    if (op == "/") {
      if (b.as_double() == 0) fail(pos, "division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) fail(pos, "division by zero");
      if (ints) {
        const int64_t q = a.as_int() / b.as_int(), r = a.as_int() % b.as_int();
        const bool adjust = r != 0 && ((r < 0) != (b.as_int() < 0));
        if (op == "//") return Value(adjust ? q - 1 : q);
        return Value(adjust ? r + b.as_int() : r);
      }
      const double q = std::floor(a.as_double() / b.as_double());
      return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
    }
    if (op == "**") {
      if (ints && b.as_int() >= 0) {
        int64_t r = 1;
        for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    fail(pos, "unknown operator " + op);
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral:
        return e.literal;
      case Expr::kName:
        return lookup(e.name);
      case Expr::kAttr:
        return getattr(eval(*e.args[0]), e.name, e.pos);
      case Expr::kItem:
        return getitem(eval(*e.args[0]), eval(*e.args[1]), e.pos);
      case Expr::kSlice: {
        auto opt = [&](const ExprP& p) { return p ? eval(*p) : Value(); };
        return slice(eval(*e.args[0]), opt(e.args[1]), opt(e.args[2]), opt(e.args[3]), e.pos);
      }
      case Expr::kCall: {
        Value fn = eval(*e.args[0]);
        if (!fn.is_function()) {
          const Expr& callee = *e.args[0];
          fail(e.pos, "'" +
                          (callee.kind == Expr::kName   ? callee.name
                           : callee.kind == Expr::kAttr ? callee.name
                                                        : type_name(fn)) +
                          "' is undefined or not callable");
        }
        Args a = eval_args(e, 1);
        return fn.fn()(a);
      }
      case Expr::kFilter: {
        Value v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return filter(e.name, v, a, e.pos);
      }
      case Expr::kTest: {
        Value v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return Value(test(e.name, v, a, e.pos) != e.negated);
      }
      case Expr::kNot:
        return Value(!eval(*e.args[0]).truthy());
      case Expr::kNeg: {
        const Value v = eval(*e.args[0]);
        if (v.kind() == Value::Kind::kInt) return Value(-v.as_int());
        if (v.kind() == Value::Kind::kFloat) return Value(-v.as_double());
        fail(e.pos, "bad operand type for unary -: '" + type_name(v) + "'");
      }
      case Expr::kBinary:
        return arith(e.name, eval(*e.args[0]), eval(*e.args[1]), e.pos);
      case Expr::kAnd: {
        Value a = eval(*e.args[0]);
        return a.truthy() ? eval(*e.args[1]) : a;
      }
      case Expr::kOr: {
        Value a = eval(*e.args[0]);
        return a.truthy() ? a : eval(*e.args[1]);
      }
      case Expr::kCompare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==")
            ok = left == right;
          else if (op == "!=")
            ok = !(left == right);
          else if (op == "in")
            ok = contains(right, left, e.pos);
          else if (op == "not in")
            ok = !contains(right, left, e.pos);
          else {
            const int c = compare_values(left, right, e.pos);
            ok = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
          }
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::kCond:
        if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
        return e.args[2] ? eval(*e.args[2]) : Value();
      case Expr::kList:
      case Expr::kTuple: {
        Array out;
        for (const ExprP& x : e.args) out.push_back(eval(*x));
        return e.kind == Expr::kTuple ? Value::tuple(std::move(out)) : Value(std::move(out));
      }
      case Expr::kDict: {
        Object o;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          o.set(eval(*e.args[i]).to_string(), eval(*e.args[i + 1]));
        }
        return Value(std::move(o));
      }
    }
    return Value();
  }

  std::vector<Frame> frames_;
  int64_t now_;
};

}  // namespace

Result<std::string> Template::render(const Object& context, int64_t now) const {
  std::string out;
  try {
    Renderer r(context, now);
    r.run(*body_, &out);
  } catch (const Error& e) {
    int line = 1, col = 1;
    for (size_t i = 0; i < e.pos && i < source_->size(); ++i) {
      if ((*source_)[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return invalid_argument(
        "chat template: " + e.message +
        (e.pos > 0 ? " (line " + std::to_string(line) + ", column " + std::to_string(col) + ")"
                   : std::string()));
  } catch (const std::exception& e) {
    return invalid_argument(std::string("chat template: ") + e.what());
  }
  return out;
}

}  // namespace vlm::jinja

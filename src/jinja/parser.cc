#include "jinja/parser.h"

#include <algorithm>
#include <string>

#include "jinja/error.h"

namespace vlm::jinja {
namespace {

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
      parse_if(n.get());
    } else if (kw == "for") {
      parse_for(n.get());
    } else if (kw == "set") {
      parse_set(n.get());
    } else if (kw == "macro" || kw == "call") {
      parse_macro_or_call(kw, n.get());
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

  // After `{% if`: the condition, the branches, `{% endif %}`.
  void parse_if(Node* n) {
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
  }

  // After `{% for`: the targets, the iterable and its `if` filter, the body, `else`, `endfor`.
  void parse_for(Node* n) {
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
  }

  // After `{% set`: `name = expr`, `ns.attr = expr`, or a set block up to `{% endset %}`.
  void parse_set(Node* n) {
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
      if (!n->attr.empty()) fail(n->pos, "a set block cannot assign an attribute");
      n->kind = Node::kSetBlock;
      expect_end();
      n->body = parse_body({"endset"});
      close_block("endset");
    }
  }

  // After `{% macro` or `{% call`: the name (a macro's), the parameters and their defaults, the
  // call (a call block's), the body.
  void parse_macro_or_call(const std::string& kw, Node* n) {
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

std::vector<NodeP> parse_tokens(std::vector<Tok> toks) {
  Parser p(std::move(toks));
  return p.parse_all();
}

Result<Template> Template::parse(std::string_view source, const Options& options) {
  auto src = std::make_shared<const std::string>(source);
  try {
    Template t;
    t.body_ = std::make_shared<const std::vector<NodeP>>(parse_tokens(lex(*src, options)));
    t.source_ = src;
    return t;
  } catch (const Error& e) {
    return invalid_argument("chat template: " + e.message + " (" + line_col(*src, e.pos) + ")");
  }
}

}  // namespace vlm::jinja

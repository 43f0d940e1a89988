#include "jinja/renderer.h"

#include <ctime>
#include <map>

#include "jinja/error.h"
#include "jinja/filters.h"
#include "jinja/methods.h"
#include "jinja/ops.h"

namespace vlm::jinja {
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
    return apply_filter(f.name, inner, a, f.pos);
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
        return apply_filter(e.name, v, a, e.pos);
      }
      case Expr::kTest: {
        Value v = eval(*e.args[0]);
        Args a = eval_args(e, 1);
        return Value(apply_test(e.name, v, a, e.pos) != e.negated);
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
void render_nodes(const std::vector<NodeP>& body, const Object& globals, int64_t now,
                  std::string* out) {
  Renderer r(globals, now);
  r.run(body, out);
}

Result<std::string> Template::render(const Object& context, int64_t now) const {
  std::string out;
  try {
    render_nodes(*body_, context, now, &out);
  } catch (const Error& e) {
    return invalid_argument("chat template: " + e.message +
                            (e.pos > 0 ? " (" + line_col(*source_, e.pos) + ")" : std::string()));
  } catch (const std::exception& e) {
    return invalid_argument(std::string("chat template: ") + e.what());
  }
  return out;
}

}  // namespace vlm::jinja

// The syntax tree the parser builds and the renderer walks: expressions (Expr) and statements
// (Template::Node), shared and never changed after parsing.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/jinja.h"

namespace vlm::jinja {

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

}  // namespace vlm::jinja

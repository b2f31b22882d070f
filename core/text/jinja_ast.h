// The syntax tree of a parsed Jinja template (core/text/jinja_parser.h builds it,
// core/text/jinja.h runs it): expressions and statements, each with the line and column of
// its first token, for error messages.
#ifndef LGPT_CORE_TEXT_JINJA_AST_H_
#define LGPT_CORE_TEXT_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/text/jinja_value.h"

namespace lgpt {
namespace jinja {

struct Position {
  int line = 1;
  int column = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,   // value
    kName,      // name
    kList,      // children: the items (also tuples)
    kDict,      // children: key, value, key, value, ...
    kGetAttr,   // children[0].name
    kGetItem,   // children[0][children[1]]
    kSlice,     // children[0][children[1]:children[2]:children[3]], any of 1..3 may be null
    kCall,      // children[0](children[1..], kwargs)
    kFilter,    // children[0] | name(children[1..], kwargs); children[0] null in a filter block
    kTest,      // children[0] is [not] name(children[1..]); negated
    kUnary,     // name ("-", "+", "not") children[0]
    kBinary,    // children[0] name children[1]: + - * / // % ** ~ and or
    kCompare,   // children[0] ops[0] children[1] ops[1] ... (== != < <= > >= in notin)
    kCondition  // children[1] if children[0] else children[2] (null: undefined)
  };

  Kind kind = Kind::kLiteral;
  Position position;
  Value value;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // branches: (condition, body) ..., the else branch's condition null
    kFor,       // for targets in expr [if condition]: body [else: else_body]
    kSet,       // set targets = expr; or set targets[0].attribute = expr
    kSetBlock,  // set targets[0] %} body {% endset
    kMacro,     // macro name(params) body
    kBreak,
    kContinue,
    kScope,        // body rendered in place ({% generation %})
    kFilterBlock,  // {% filter expr %} body: expr is a kFilter with a null operand
  };

  Kind kind = Kind::kText;
  Position position;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attribute;                                // kSet on a namespace
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro; default may be null
  std::vector<std::pair<ExprPtr, Body>> branches;       // kIf
  Body body;
  Body else_body;
};

}  // namespace jinja
}  // namespace lgpt

#endif  // LGPT_CORE_TEXT_JINJA_AST_H_

// Internal: the tokens and the AST of a parsed template (core/chat/parse*.cpp build them, eval*.cpp run
// them).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/chat/value.h"

namespace car::chat {

/// Thrown inside the module (parse*.cpp, eval*.cpp) and turned into an Error at its boundary.
struct TemplateFailure {
  std::string code;
  std::string message;
};

struct Node;
using NodeP = std::shared_ptr<const Node>;

enum class NodeType {
  // expressions
  kLiteral,  // value
  kName,     // name
  kList,     // kids
  kDict,     // kids: key, value, key, value...
  kAttr,     // a . name
  kIndex,    // a [ b ]
  kSlice,    // a [ b : c : d ]  (b, c, d may be null)
  kCall,     // a ( kids, kwargs )
  kFilter,   // a | name ( kids, kwargs ); a null inside a filter block
  kTest,     // a is [not] name ( kids ); negate
  kUnary,    // name: "not", "-", "+"; a
  kBinary,   // name: operator; a, b
  kCompare,  // kids: operands; ops: operators (chained, Python style)
  kCond,     // a if b else c (c may be null)
  // statements
  kBlock,        // kids
  kText,         // text
  kOutput,       // a
  kIf,           // kids: cond, body, cond, body, ...; else body in b (may be null)
  kFor,          // names: targets; a: iterable; b: filter (may be null); c: body; d: else body (may be null)
  kSet,          // names: targets (or name + attr for `set ns.attr`); a: value; c: body for a block set
  kMacro,        // name; names: params; kids: defaults (null for none); c: body
  kCallBlock,    // a: the call expression; names: caller params; kids: their defaults; c: body
  kFilterBlock,  // a: filter chain whose innermost operand is null; c: body
  kBreak,
  kContinue,
};

struct Node {
  NodeType type;
  int line = 0, col = 0;
  /// 1 + the deepest child's depth, set by the parser once the node is complete (Parser::seal), which
  /// refuses a tree deeper than kMaxAstDepth: the evaluator and the tree's destructor recurse over it.
  mutable int depth = 1;
  std::string name;
  std::string attr;  // kSet on a namespace attribute
  bool negate = false;
  Value value;
  std::string text;
  NodeP a, b, c, d;
  std::vector<NodeP> kids;
  std::vector<std::string> names;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, NodeP>> kwargs;
};

/// Parses a whole template (parse.cpp).
NodeP parse_template(std::string_view source);

}  // namespace car::chat

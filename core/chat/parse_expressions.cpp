// The template parser's expressions: recursive descent with Jinja2's precedence (conditional, or, and,
// not, comparisons and tests, + -, ~, * / // %, **, unary), literals, postfix (attribute, index, slice,
// call) and filter chains.
#include <cstring>

#include "core/chat/parse_internal.h"
#include "core/util/error_codes.h"

namespace car::chat::parse_internal {

NodeP Parser::parse_tuple(bool with_cond) {
  const size_t pos = cur().pos;
  NodeP first = parse_expr(with_cond);
  if (!is_op(",")) return first;
  auto n = make(NodeType::kList, pos);
  n->kids.push_back(first);
  while (is_op(",")) {
    advance();
    if (cur().kind == Tok::kStmtClose || cur().kind == Tok::kOutClose || is_name("if")) break;
    n->kids.push_back(parse_expr(with_cond));
  }
  return sealed(n);
}

NodeP Parser::parse_expr(bool with_cond) {
  DepthGuard g(*this);
  const size_t pos = cur().pos;
  NodeP e = parse_or();
  if (!with_cond) return e;
  while (is_name("if")) {
    advance();
    auto n = make(NodeType::kCond, pos);
    n->a = e;
    n->b = parse_or();
    if (is_name("else")) {
      advance();
      n->c = parse_expr();
    }
    e = sealed(n);
  }
  return e;
}

NodeP Parser::binary(const std::string& op, NodeP l, NodeP r, size_t pos) {
  auto n = make(NodeType::kBinary, pos);
  n->name = op;
  n->a = std::move(l);
  n->b = std::move(r);
  return sealed(n);
}

NodeP Parser::parse_or() {
  const size_t pos = cur().pos;
  NodeP l = parse_and();
  while (is_name("or")) {
    advance();
    l = binary("or", l, parse_and(), pos);
  }
  return l;
}

NodeP Parser::parse_and() {
  const size_t pos = cur().pos;
  NodeP l = parse_not();
  while (is_name("and")) {
    advance();
    l = binary("and", l, parse_not(), pos);
  }
  return l;
}

NodeP Parser::parse_not() {
  if (is_name("not")) {
    DepthGuard g(*this);
    auto n = make(NodeType::kUnary, cur().pos);
    advance();
    n->name = "not";
    n->a = parse_not();
    return sealed(n);
  }
  return parse_compare();
}

NodeP Parser::parse_compare() {
  const size_t pos = cur().pos;
  NodeP first = parse_math1();
  std::shared_ptr<Node> n;
  while (true) {
    std::string op;
    if (cur().kind == Tok::kOp && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                   cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
      op = cur().text;
      advance();
    } else if (is_name("in")) {
      op = "in";
      advance();
    } else if (is_name("not") && peek().kind == Tok::kName && peek().text == "in") {
      op = "not in";
      advance();
      advance();
    } else {
      break;
    }
    if (!n) {
      n = make(NodeType::kCompare, pos);
      n->kids.push_back(first);
    }
    n->ops.push_back(op);
    n->kids.push_back(parse_math1());
    seal(*n);
  }
  return n ? NodeP(n) : first;
}

NodeP Parser::parse_math1() {
  const size_t pos = cur().pos;
  NodeP l = parse_concat();
  while (is_op("+") || is_op("-")) {
    const std::string op = cur().text;
    advance();
    l = binary(op, l, parse_concat(), pos);
  }
  return l;
}

NodeP Parser::parse_concat() {
  const size_t pos = cur().pos;
  NodeP l = parse_math2();
  while (is_op("~")) {
    advance();
    l = binary("~", l, parse_math2(), pos);
  }
  return l;
}

NodeP Parser::parse_math2() {
  const size_t pos = cur().pos;
  NodeP l = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    const std::string op = cur().text;
    advance();
    l = binary(op, l, parse_pow(), pos);
  }
  return l;
}

NodeP Parser::parse_pow() {
  const size_t pos = cur().pos;
  NodeP l = parse_unary(true);
  while (is_op("**")) {
    advance();
    l = binary("**", l, parse_unary(true), pos);
  }
  return l;
}

NodeP Parser::parse_unary(bool with_filter) {
  DepthGuard g(*this);
  NodeP node;
  if (is_op("-") || is_op("+")) {
    auto n = make(NodeType::kUnary, cur().pos);
    n->name = cur().text;
    advance();
    n->a = parse_unary(false);
    node = sealed(n);
  } else {
    node = parse_primary();
  }
  node = parse_postfix(node);
  if (with_filter) node = parse_filter_chain(node);
  return node;
}

NodeP Parser::parse_primary() {
  const Token t = cur();
  switch (t.kind) {
    case Tok::kName: {
      advance();
      if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), t.pos);
      if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), t.pos);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), t.pos);
      auto n = make(NodeType::kName, t.pos);
      n->name = t.text;
      return n;
    }
    case Tok::kInt:
      advance();
      return literal(Value::integer(t.ival), t.pos);
    case Tok::kFloat:
      advance();
      return literal(Value::floating(t.fval), t.pos);
    case Tok::kString: {
      std::string s;
      while (cur().kind == Tok::kString) {  // adjacent literals concatenate
        s += cur().text;
        advance();
      }
      return literal(Value::string(std::move(s)), t.pos);
    }
    case Tok::kOp:
      if (t.text == "(") {
        advance();
        if (is_op(")")) {
          advance();
          return make(NodeType::kList, t.pos);
        }
        NodeP e = parse_expr();
        if (is_op(",")) {
          auto n = make(NodeType::kList, t.pos);
          n->kids.push_back(e);
          while (is_op(",")) {
            advance();
            if (is_op(")")) break;
            n->kids.push_back(parse_expr());
          }
          e = sealed(n);
        }
        expect_op(")");
        return e;
      }
      if (t.text == "[") {
        advance();
        auto n = make(NodeType::kList, t.pos);
        while (!is_op("]")) {
          n->kids.push_back(parse_expr());
          if (!is_op(",")) break;
          advance();
        }
        expect_op("]");
        return sealed(n);
      }
      if (t.text == "{") {
        advance();
        auto n = make(NodeType::kDict, t.pos);
        while (!is_op("}")) {
          n->kids.push_back(parse_expr());
          expect_op(":");
          n->kids.push_back(parse_expr());
          if (!is_op(",")) break;
          advance();
        }
        expect_op("}");
        return sealed(n);
      }
      break;
    default:
      break;
  }
  fail("expected an expression, found " + describe(t));
}

void Parser::seal(const Node& n) const {
  int deepest = 0;
  for (const NodeP* c : {&n.a, &n.b, &n.c, &n.d}) {
    if (*c) deepest = std::max(deepest, (*c)->depth);
  }
  for (const NodeP& k : n.kids) {
    if (k) deepest = std::max(deepest, k->depth);
  }
  for (const auto& kw : n.kwargs) {
    if (kw.second) deepest = std::max(deepest, kw.second->depth);
  }
  n.depth = deepest + 1;
  if (n.depth > kMaxAstDepth) {
    throw TemplateFailure{errc::kTemplateSyntax,
                          "line " + std::to_string(n.line) + ":" + std::to_string(n.col) +
                              ": the expression nests deeper than " + std::to_string(kMaxAstDepth) +
                              " levels (a chain of operators, attributes, "
                              "subscripts, calls, filters or tests that long)"};
  }
}

NodeP Parser::literal(Value v, size_t pos) {
  auto n = make(NodeType::kLiteral, pos);
  n->value = std::move(v);
  return n;
}

void Parser::parse_call_args(Node& n) {
  expect_op("(");
  while (!is_op(")")) {
    if (is_op("*") || is_op("**")) fail("unsupported construct: '*args' / '**kwargs' in a call");
    if (cur().kind == Tok::kName && peek().kind == Tok::kOp && peek().text == "=") {
      std::string key = cur().text;
      advance();
      advance();
      n.kwargs.emplace_back(std::move(key), parse_expr());
    } else {
      if (!n.kwargs.empty()) fail("a positional argument follows a keyword argument");
      n.kids.push_back(parse_expr());
    }
    if (!is_op(",")) break;
    advance();
  }
  expect_op(")");
}

NodeP Parser::parse_postfix(NodeP node) {
  while (true) {
    const size_t pos = cur().pos;
    if (is_op(".")) {
      advance();
      auto n = make(NodeType::kAttr, pos);
      n->a = node;
      if (cur().kind == Tok::kInt) {
        auto idx = make(NodeType::kIndex, pos);
        idx->a = node;
        idx->b = literal(Value::integer(cur().ival), pos);
        advance();
        node = sealed(idx);
        continue;
      }
      n->name = expect_name("an attribute name after '.'");
      node = sealed(n);
    } else if (is_op("[")) {
      advance();
      NodeP parts[3] = {nullptr, nullptr, nullptr};
      int colons = 0;
      if (!is_op(":")) parts[0] = parse_expr();
      while (is_op(":") && colons < 2) {
        advance();
        ++colons;
        if (!is_op(":") && !is_op("]")) parts[colons] = parse_expr();
      }
      expect_op("]");
      if (colons == 0) {
        if (!parts[0]) fail_at(p_, pos, "empty subscript '[]'");
        auto n = make(NodeType::kIndex, pos);
        n->a = node;
        n->b = parts[0];
        node = sealed(n);
      } else {
        auto n = make(NodeType::kSlice, pos);
        n->a = node;
        n->b = parts[0];
        n->c = parts[1];
        n->d = parts[2];
        node = sealed(n);
      }
    } else if (is_op("(")) {
      auto n = make(NodeType::kCall, pos);
      n->a = node;
      parse_call_args(*n);
      node = sealed(n);
    } else {
      return node;
    }
  }
}

NodeP Parser::parse_filter(NodeP operand) {
  auto n = make(NodeType::kFilter, cur().pos);
  n->a = std::move(operand);
  n->name = expect_name("a filter name");
  while (is_op(".")) {
    advance();
    n->name += "." + expect_name("a filter name");
  }
  if (is_op("(")) parse_call_args(*n);
  return sealed(n);
}

NodeP Parser::parse_filter_chain(NodeP node) {
  while (true) {
    if (is_op("|")) {
      advance();
      node = parse_filter(node);
    } else if (is_name("is")) {
      auto n = make(NodeType::kTest, cur().pos);
      advance();
      if (is_name("not")) {
        n->negate = true;
        advance();
      }
      n->a = node;
      n->name = expect_name("a test name after 'is'");
      if (is_op("(")) {
        parse_call_args(*n);
      } else if ((cur().kind == Tok::kName || cur().kind == Tok::kString || cur().kind == Tok::kInt ||
                  cur().kind == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
                 !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") && !is_name("is") &&
                 !is_name("in") && !is_name("not")) {
        DepthGuard g(*this);
        n->kids.push_back(parse_postfix(parse_primary()));
      }
      node = sealed(n);
    } else if (is_op("(")) {
      auto n = make(NodeType::kCall, cur().pos);
      n->a = node;
      parse_call_args(*n);
      node = sealed(n);
    } else {
      return node;
    }
  }
}

}  // namespace car::chat::parse_internal

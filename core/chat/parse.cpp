// Lexer and parser of the chat-template Jinja subset. The lexer cuts the source into text and tag tokens,
// applies whitespace control ({%- -%} {{- -}} {#- -#}, trim_blocks, lstrip_blocks), and tokenizes the
// inside of each tag; the parser is recursive descent with Jinja2's operator precedence.
//
// This file: the statements (if, for, set, macro, call and filter blocks) and parse_template(); the
// lexer is parse_lexer.cpp and the expressions parse_expressions.cpp (Parser: parse_internal.h).
#include <cstring>

#include "core/chat/parse_internal.h"

namespace car::chat::parse_internal {

std::string Parser::describe(const Token& t) const {
  switch (t.kind) {
    case Tok::kText:
      return "template text";
    case Tok::kOutOpen:
      return "'{{'";
    case Tok::kOutClose:
      return "end of '{{ ... }}'";
    case Tok::kStmtOpen:
      return "'{%'";
    case Tok::kStmtClose:
      return "end of '{% ... %}'";
    case Tok::kName:
      return "'" + t.text + "'";
    case Tok::kInt:
    case Tok::kFloat:
      return "a number";
    case Tok::kString:
      return "a string";
    case Tok::kOp:
      return "'" + t.text + "'";
    case Tok::kEnd:
      return "the end of the template";
  }
  return "?";
}

NodeP Parser::parse_body(const std::set<std::string>& stops, std::string& stop) {
  DepthGuard g(*this);
  auto block = make(NodeType::kBlock, cur().pos);
  while (true) {
    const Token& t = cur();
    if (t.kind == Tok::kEnd) {
      if (!stops.empty()) {
        std::string want;
        for (const auto& s : stops) want += (want.empty() ? "'" : " or '") + s + "'";
        fail("missing " + want + " before the end of the template");
      }
      stop.clear();
      return sealed(block);
    }
    if (t.kind == Tok::kText) {
      auto n = make(NodeType::kText, t.pos);
      n->text = t.text;
      block->kids.push_back(n);
      advance();
    } else if (t.kind == Tok::kOutOpen) {
      auto n = make(NodeType::kOutput, t.pos);
      advance();
      n->a = parse_expr();
      if (cur().kind != Tok::kOutClose) fail("unexpected " + describe(cur()) + " in '{{ ... }}'");
      advance();
      block->kids.push_back(sealed(n));
    } else if (t.kind == Tok::kStmtOpen) {
      advance();
      if (cur().kind != Tok::kName) fail("expected a statement name after '{%', found " + describe(cur()));
      const std::string kw = cur().text;
      if (stops.count(kw) != 0) {
        stop = kw;
        advance();
        return sealed(block);
      }
      NodeP s = parse_statement();
      if (s) block->kids.push_back(sealed(s));
    } else {
      fail("unexpected " + describe(t));
    }
  }
}

NodeP Parser::parse_statement() {
  const size_t pos = cur().pos;
  const std::string kw = cur().text;
  advance();
  if (kw == "if") return parse_if(pos);
  if (kw == "for") return parse_for(pos);
  if (kw == "set") return parse_set(pos);
  if (kw == "macro") return parse_macro(pos);
  if (kw == "call") return parse_call_block(pos);
  if (kw == "filter") return parse_filter_block(pos);
  if (kw == "break" || kw == "continue") {
    if (loop_depth_ == 0) fail_at(p_, pos, "'" + kw + "' outside a for loop");
    expect_stmt_close(kw);
    return make(kw == "break" ? NodeType::kBreak : NodeType::kContinue, pos);
  }
  if (kw == "generation" || kw == "endgeneration") {  // transformers' assistant-mask markers: no output
    expect_stmt_close(kw);
    return nullptr;
  }
  static const std::set<std::string> kEnds = {"endif",   "endfor",    "endset", "endmacro",
                                              "endcall", "endfilter", "else",   "elif"};
  if (kEnds.count(kw) != 0) fail_at(p_, pos, "unexpected '" + kw + "' with no open block it could close");
  fail_at(p_, pos, "unsupported statement '" + kw + "'");
}

NodeP Parser::parse_if(size_t pos) {
  auto n = make(NodeType::kIf, pos);
  std::string stop = "elif";
  while (stop == "elif") {
    n->kids.push_back(parse_expr());
    expect_stmt_close("if");
    n->kids.push_back(parse_body({"elif", "else", "endif"}, stop));
  }
  if (stop == "else") {
    expect_stmt_close("else");
    n->b = parse_body({"endif"}, stop);
  }
  expect_stmt_close("endif");
  return n;
}

std::vector<std::string> Parser::parse_targets(const char* stmt) {
  std::vector<std::string> names;
  const bool paren = is_op("(");
  if (paren) advance();
  names.push_back(expect_name("a variable name"));
  while (is_op(",")) {
    advance();
    if (cur().kind != Tok::kName) break;
    names.push_back(expect_name("a variable name"));
  }
  if (paren) expect_op(")");
  (void)stmt;
  return names;
}

NodeP Parser::parse_for(size_t pos) {
  auto n = make(NodeType::kFor, pos);
  n->names = parse_targets("for");
  if (!is_name("in")) fail("expected 'in' in 'for' statement, found " + describe(cur()));
  advance();
  n->a = parse_tuple(false);
  if (is_name("if")) {
    advance();
    n->b = parse_expr(false);
  }
  if (is_name("recursive")) fail("unsupported construct 'recursive' loop");
  expect_stmt_close("for");
  ++loop_depth_;
  std::string stop;
  n->c = parse_body({"else", "endfor"}, stop);
  --loop_depth_;
  if (stop == "else") {
    expect_stmt_close("else");
    const int saved = loop_depth_;
    loop_depth_ = 0;
    n->d = parse_body({"endfor"}, stop);
    loop_depth_ = saved;
  }
  expect_stmt_close("endfor");
  return n;
}

NodeP Parser::parse_set(size_t pos) {
  auto n = make(NodeType::kSet, pos);
  std::string first = expect_name("a variable name after 'set'");
  if (is_op(".")) {
    advance();
    n->names = {first};
    n->attr = expect_name("an attribute name");
    expect_op("=");
    n->a = parse_tuple(true);
    expect_stmt_close("set");
    return n;
  }
  n->names = {first};
  while (is_op(",")) {
    advance();
    n->names.push_back(expect_name("a variable name"));
  }
  if (is_op("=")) {
    advance();
    n->a = parse_tuple(true);
    expect_stmt_close("set");
    return n;
  }
  if (n->names.size() != 1) fail("a block 'set' assigns one name");
  if (is_op("|")) fail("unsupported construct: filter on a block 'set'");
  expect_stmt_close("set");
  std::string stop;
  n->c = parse_body({"endset"}, stop);
  expect_stmt_close("endset");
  return n;
}

void Parser::parse_params(Node& n) {
  expect_op("(");
  while (!is_op(")")) {
    n.names.push_back(expect_name("a parameter name"));
    if (is_op("=")) {
      advance();
      n.kids.push_back(parse_expr());
    } else {
      n.kids.push_back(nullptr);
    }
    if (!is_op(",")) break;
    advance();
  }
  expect_op(")");
}

NodeP Parser::parse_macro(size_t pos) {
  auto n = make(NodeType::kMacro, pos);
  n->name = expect_name("a macro name");
  parse_params(*n);
  expect_stmt_close("macro");
  const int saved = loop_depth_;
  loop_depth_ = 0;
  std::string stop;
  n->c = parse_body({"endmacro"}, stop);
  loop_depth_ = saved;
  if (cur().kind == Tok::kName) advance();  // `{% endmacro name %}`
  expect_stmt_close("endmacro");
  return n;
}

NodeP Parser::parse_call_block(size_t pos) {
  auto n = make(NodeType::kCallBlock, pos);
  if (is_op("(")) parse_params(*n);
  n->a = parse_expr();
  if (n->a->type != NodeType::kCall) fail_at(p_, pos, "'call' needs a macro call");
  expect_stmt_close("call");
  const int saved = loop_depth_;
  loop_depth_ = 0;
  std::string stop;
  n->c = parse_body({"endcall"}, stop);
  loop_depth_ = saved;
  expect_stmt_close("endcall");
  return n;
}

NodeP Parser::parse_filter_block(size_t pos) {
  auto n = make(NodeType::kFilterBlock, pos);
  NodeP chain = nullptr;
  do {
    if (chain) advance();  // '|'
    chain = parse_filter(chain);
  } while (is_op("|"));
  n->a = chain;
  expect_stmt_close("filter");
  std::string stop;
  n->c = parse_body({"endfilter"}, stop);
  expect_stmt_close("endfilter");
  return n;
}

}  // namespace car::chat::parse_internal

namespace car::chat {

NodeP parse_template(std::string_view source) {
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);  // keep_trailing_newline=False
  const parse_internal::Positions pos(source);
  parse_internal::Parser parser(parse_internal::lex(source, pos), pos);
  return parser.parse_all();
}

}  // namespace car::chat

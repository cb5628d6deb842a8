// Internal to core/chat: the tokens, source positions and Parser shared by the files of the template
// parser (parse_lexer.cpp: tokens and whitespace control; parse.cpp: statements and the entry point;
// parse_expressions.cpp: expressions by Jinja2's precedence). Not part of the module's interface.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/chat/ast.h"
#include "core/chat/stack_limit.h"
#include "core/util/error_codes.h"

namespace car::chat::parse_internal {

constexpr int kMaxNesting = 96;  // expression and block nesting (a template is untrusted input)
// The depth of the syntax tree. kMaxNesting bounds the parser's recursion, but left-associative chains
// (`1+1+...`, `x.a.a...`, `x|f|f...`, `a is t is t...`) are parsed in a loop and still build a tree as deep
// as the chain is long; the evaluator and the destructor of the tree recurse over it, so it is bounded too.
constexpr int kMaxAstDepth = 256;
// The stack the parser's recursion may use (StackLimit); kMaxNesting keeps it to a small part of this.
constexpr size_t kParseStackBytes = 1u << 20;

enum class Tok { kText, kOutOpen, kOutClose, kStmtOpen, kStmtClose, kName, kInt, kFloat, kString, kOp, kEnd };

struct Token {
  Tok kind;
  std::string text;  // text, name, operator or decoded string
  int64_t ival = 0;
  double fval = 0;
  size_t pos = 0;
};

class Positions {
 public:
  explicit Positions(std::string_view src) {
    starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') starts_.push_back(i + 1);
    }
  }
  void at(size_t pos, int& line, int& col) const {
    size_t lo = 0, hi = starts_.size();
    while (hi - lo > 1) {
      const size_t mid = (lo + hi) / 2;
      if (starts_[mid] <= pos) {
        lo = mid;
      } else {
        hi = mid;
      }
    }
    line = static_cast<int>(lo + 1);
    col = static_cast<int>(pos - starts_[lo] + 1);
  }
  std::string where(size_t pos) const {
    int l, c;
    at(pos, l, c);
    return "line " + std::to_string(l) + ":" + std::to_string(c);
  }

 private:
  std::vector<size_t> starts_;
};

[[noreturn]] inline void fail_at(const Positions& p, size_t pos, const std::string& msg) {
  throw TemplateFailure{errc::kTemplateSyntax, p.where(pos) + ": " + msg};
}

// The source cut into text and tag tokens, whitespace control applied, ending in a kEnd token
// (parse_lexer.cpp).
std::vector<Token> lex(std::string_view src, const Positions& pos);

class Parser {
 public:
  Parser(std::vector<Token> toks, const Positions& p) : t_(std::move(toks)), p_(p) {}

  NodeP parse_all() {
    std::string stop;
    NodeP body = parse_body({}, stop);
    if (cur().kind != Tok::kEnd) fail("unexpected '" + stop + "'");
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().kind == Tok::kOp && cur().text == op; }
  bool is_name(const char* nm) const { return cur().kind == Tok::kName && cur().text == nm; }
  [[noreturn]] void fail(const std::string& msg) const { fail_at(p_, cur().pos, msg); }
  std::string describe(const Token& t) const;
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', found " + describe(cur()));
    advance();
  }
  std::string expect_name(const char* what) {
    if (cur().kind != Tok::kName) fail(std::string("expected ") + what + ", found " + describe(cur()));
    std::string s = cur().text;
    advance();
    return s;
  }
  void expect_stmt_close(const std::string& stmt) {
    if (cur().kind != Tok::kStmtClose) fail("unexpected " + describe(cur()) + " in '" + stmt + "' statement");
    advance();
  }
  std::shared_ptr<Node> make(NodeType type, size_t pos) const {
    auto n = std::make_shared<Node>();
    n->type = type;
    p_.at(pos, n->line, n->col);
    return n;
  }

  // Sets n.depth from its children (each already sealed) and refuses a tree deeper than kMaxAstDepth.
  // Every node with children is sealed once it is complete.
  void seal(const Node& n) const;
  NodeP sealed(NodeP n) const {
    seal(*n);
    return n;
  }

  struct DepthGuard {
    DepthGuard(Parser& p) : p_(p) {  // NOLINT
      if (++p_.depth_ > kMaxNesting) p_.fail("the template nests deeper than " + std::to_string(kMaxNesting));
      if (p_.stack_.exceeded()) p_.fail("the template nests too deeply for the parser's stack");
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  // Statements until one of `stops` opens a tag; `stop` gets that keyword (the parser is left after it).
  NodeP parse_body(const std::set<std::string>& stops, std::string& stop);
  NodeP parse_statement();
  NodeP parse_if(size_t pos);
  std::vector<std::string> parse_targets(const char* stmt);
  NodeP parse_for(size_t pos);
  NodeP parse_set(size_t pos);
  void parse_params(Node& n);
  NodeP parse_macro(size_t pos);
  NodeP parse_call_block(size_t pos);
  NodeP parse_filter_block(size_t pos);

  // ---- expressions ----

  // An expression or an unparenthesised tuple `a, b` (as `set` and `for` allow).
  NodeP parse_tuple(bool with_cond);
  NodeP parse_expr(bool with_cond = true);
  NodeP binary(const std::string& op, NodeP l, NodeP r, size_t pos);
  NodeP parse_or();
  NodeP parse_and();
  NodeP parse_not();
  NodeP parse_compare();
  NodeP parse_math1();
  NodeP parse_concat();
  NodeP parse_math2();
  NodeP parse_pow();
  NodeP parse_unary(bool with_filter);
  NodeP parse_primary();
  NodeP literal(Value v, size_t pos);
  void parse_call_args(Node& n);
  NodeP parse_postfix(NodeP node);

  // One `name` or `name(args)` filter applied to `operand` (null inside a filter block).
  NodeP parse_filter(NodeP operand);
  NodeP parse_filter_chain(NodeP node);
  std::vector<Token> t_;
  size_t i_ = 0;
  const Positions& p_;
  int depth_ = 0;
  int loop_depth_ = 0;
  StackLimit stack_{kParseStackBytes};
};

}  // namespace car::chat::parse_internal

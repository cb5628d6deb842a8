// Lexer and parser of the chat-template Jinja subset. The lexer cuts the source into text and tag tokens,
// applies whitespace control ({%- -%} {{- -}} {#- -#}, trim_blocks, lstrip_blocks), and tokenizes the
// inside of each tag; the parser is recursive descent with Jinja2's operator precedence.
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <set>

#include "core/chat/ast.h"

namespace car::chat {
namespace {

constexpr int kMaxNesting = 96;  // expression and block nesting (a template is untrusted input)

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

[[noreturn]] void fail_at(const Positions& p, size_t pos, const std::string& msg) {
  throw TemplateFailure{"template_syntax", p.where(pos) + ": " + msg};
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// One tag or text piece before whitespace control is applied.
struct Piece {
  enum Kind { kText, kOut, kStmt, kComment } kind;
  size_t begin = 0, end = 0;  // text: the raw range
  char left = 0, right = 0;   // '-' / '+' modifiers
  std::vector<Token> tokens;  // inside of a tag
  size_t pos = 0;             // where the tag starts
};

class Lexer {
 public:
  Lexer(std::string_view src, const Positions& pos) : src_(src), p_(pos) {}

  std::vector<Token> run() {
    std::vector<Piece> pieces;
    size_t i = 0;
    const size_t n = src_.size();
    while (i < n) {
      size_t open = src_.find('{', i);
      while (open != std::string_view::npos && open + 1 < n && src_[open + 1] != '{' &&
             src_[open + 1] != '%' && src_[open + 1] != '#') {
        open = src_.find('{', open + 1);
      }
      if (open == std::string_view::npos || open + 1 >= n) {
        pieces.push_back(Piece{Piece::kText, i, n, 0, 0, {}, i});
        break;
      }
      if (open > i) pieces.push_back(Piece{Piece::kText, i, open, 0, 0, {}, i});
      Piece tag{Piece::kText, 0, 0, 0, 0, {}, open};
      const char k = src_[open + 1];
      size_t j = open + 2;
      if (j < n && (src_[j] == '-' || src_[j] == '+')) tag.left = src_[j++];
      if (k == '#') {
        tag.kind = Piece::kComment;
        const size_t close = src_.find("#}", j);
        if (close == std::string_view::npos) fail_at(p_, open, "unclosed comment '{#'");
        if (close > open + 2 && src_[close - 1] == '-' && close - 1 >= j) tag.right = '-';
        i = close + 2;
      } else {
        tag.kind = k == '{' ? Piece::kOut : Piece::kStmt;
        i = lex_tag(j, k == '{' ? '}' : '%', tag);
      }
      pieces.push_back(std::move(tag));
    }
    return whitespace(pieces);
  }

 private:
  // Tokens of a tag's inside from `i` to its closer; returns the index after the closer.
  size_t lex_tag(size_t i, char closer, Piece& tag) {
    const size_t n = src_.size();
    int depth = 0;  // open brackets: a '}' inside them is an operator, not the closer
    while (true) {
      while (i < n && is_space(src_[i])) ++i;
      if (i >= n) fail_at(p_, tag.pos, closer == '}' ? "unclosed '{{'" : "unclosed '{%'");
      const char c = src_[i];
      if ((c == '-' || c == '+') && i + 2 < n + 0 && src_[i + 1] == closer && src_[i + 2] == '}' &&
          depth == 0) {
        tag.right = c;
        return i + 3;
      }
      if (c == closer && i + 1 < n && src_[i + 1] == '}' && depth == 0) return i + 2;
      Token t{Tok::kOp, "", 0, 0, i};
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = i;
        while (e < n && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        t.kind = Tok::kName;
        t.text = std::string(src_.substr(i, e - i));
        i = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        i = lex_number(i, t);
      } else if (c == '\'' || c == '"') {
        i = lex_string(i, t);
      } else {
        static const char* const kOps[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        bool found = false;
        for (const char* op : kOps) {
          const size_t len = std::strlen(op);
          if (src_.substr(i, len) == op) {
            t.text = op;
            i += len;
            found = true;
            break;
          }
        }
        if (!found) {
          fail_at(p_, i, std::string("unexpected character '") + c + "' in a tag");
        }
        if (t.text == "(" || t.text == "[" || t.text == "{") ++depth;
        if ((t.text == ")" || t.text == "]" || t.text == "}") && depth > 0) --depth;
      }
      tag.tokens.push_back(std::move(t));
    }
  }

  size_t lex_number(size_t i, Token& t) {
    const size_t n = src_.size();
    size_t e = i;
    while (e < n && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
    bool is_float = false;
    if (e + 1 < n && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      while (e < n && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
    }
    if (e < n && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t k = e + 1;
      if (k < n && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < n && std::isdigit(static_cast<unsigned char>(src_[k]))) {
        is_float = true;
        e = k;
        while (e < n && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
      }
    }
    std::string digits;
    for (size_t k = i; k < e; ++k) {
      if (src_[k] != '_') digits += src_[k];
    }
    if (is_float) {
      t.kind = Tok::kFloat;
      t.fval = std::strtod(digits.c_str(), nullptr);
    } else {
      t.kind = Tok::kInt;
      auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), t.ival);
      if (ec != std::errc() || ptr != digits.data() + digits.size()) {
        fail_at(p_, i, "integer literal " + digits + " is out of range");
      }
    }
    return e;
  }

  size_t lex_string(size_t i, Token& t) {
    const size_t n = src_.size();
    const char q = src_[i];
    t.kind = Tok::kString;
    size_t k = i + 1;
    while (true) {
      if (k >= n) fail_at(p_, i, "unterminated string literal");
      const char c = src_[k];
      if (c == q) return k + 1;
      if (c == '\\' && k + 1 < n) {
        const char e = src_[k + 1];
        k += 2;
        switch (e) {
          case 'n':
            t.text += '\n';
            break;
          case 't':
            t.text += '\t';
            break;
          case 'r':
            t.text += '\r';
            break;
          case 'b':
            t.text += '\b';
            break;
          case 'f':
            t.text += '\f';
            break;
          case 'v':
            t.text += '\v';
            break;
          case '0':
            t.text += '\0';
            break;
          case '\\':
          case '\'':
          case '"':
            t.text += e;
            break;
          case '\n':
            break;
          case 'u':
          case 'x': {
            const size_t len = e == 'u' ? 4 : 2;
            if (k + len > n) fail_at(p_, k - 2, "truncated \\" + std::string(1, e) + " escape");
            uint32_t cp = 0;
            for (size_t m = 0; m < len; ++m) {
              const char h = src_[k + m];
              if (!std::isxdigit(static_cast<unsigned char>(h)))
                fail_at(p_, k - 2, "bad hex digit in an escape");
              cp = cp * 16 +
                   static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                             ? h - '0'
                                             : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
            }
            k += len;
            append_utf8(cp, t.text);
            break;
          }
          default:  // Python keeps an unknown escape as written
            t.text += '\\';
            t.text += e;
        }
        continue;
      }
      t.text += c;
      ++k;
    }
  }

  static void append_utf8(uint32_t cp, std::string& out) {
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // Applies whitespace control to the text pieces and flattens everything into one token stream.
  std::vector<Token> whitespace(const std::vector<Piece>& pieces) {
    std::vector<Token> out;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const Piece& pc = pieces[k];
      if (pc.kind == Piece::kText) {
        size_t b = pc.begin, e = pc.end;
        const Piece* prev = k > 0 ? &pieces[k - 1] : nullptr;
        const Piece* next = k + 1 < pieces.size() ? &pieces[k + 1] : nullptr;
        // lstrip_blocks, decided on the raw text: spaces/tabs between a line start and a block or comment
        // tag.
        size_t lstrip_to = e;
        if (next != nullptr && (next->kind == Piece::kStmt || next->kind == Piece::kComment) &&
            next->left != '+') {
          size_t m = e;
          while (m > b && (src_[m - 1] == ' ' || src_[m - 1] == '\t')) --m;
          if ((m > b && src_[m - 1] == '\n') || m == 0) lstrip_to = m;
        }
        if (prev != nullptr && prev->right == '-') {
          while (b < e && is_space(src_[b])) ++b;
        } else if (prev != nullptr && (prev->kind == Piece::kStmt || prev->kind == Piece::kComment) &&
                   prev->right != '+' && b < e && src_[b] == '\n') {
          ++b;  // trim_blocks
        }
        if (next != nullptr && next->left == '-') {
          while (e > b && is_space(src_[e - 1])) --e;
        } else if (lstrip_to < e) {
          e = lstrip_to > b ? lstrip_to : b;
        }
        if (e > b) out.push_back(Token{Tok::kText, std::string(src_.substr(b, e - b)), 0, 0, pc.begin});
        continue;
      }
      if (pc.kind == Piece::kComment) continue;
      out.push_back(Token{pc.kind == Piece::kOut ? Tok::kOutOpen : Tok::kStmtOpen, "", 0, 0, pc.pos});
      for (const Token& t : pc.tokens) out.push_back(t);
      out.push_back(Token{pc.kind == Piece::kOut ? Tok::kOutClose : Tok::kStmtClose, "", 0, 0, pc.pos});
    }
    out.push_back(Token{Tok::kEnd, "", 0, 0, src_.size()});
    return out;
  }

  std::string_view src_;
  const Positions& p_;
};

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
  std::string describe(const Token& t) const {
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

  struct DepthGuard {
    DepthGuard(Parser& p) : p_(p) {  // NOLINT
      if (++p_.depth_ > kMaxNesting) p_.fail("the template nests deeper than " + std::to_string(kMaxNesting));
    }
    ~DepthGuard() { --p_.depth_; }
    Parser& p_;
  };

  // Statements until one of `stops` opens a tag; `stop` gets that keyword (the parser is left after it).
  NodeP parse_body(const std::set<std::string>& stops, std::string& stop) {
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
        return block;
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
        block->kids.push_back(n);
      } else if (t.kind == Tok::kStmtOpen) {
        advance();
        if (cur().kind != Tok::kName) fail("expected a statement name after '{%', found " + describe(cur()));
        const std::string kw = cur().text;
        if (stops.count(kw) != 0) {
          stop = kw;
          advance();
          return block;
        }
        NodeP s = parse_statement();
        if (s) block->kids.push_back(s);
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  NodeP parse_statement() {
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

  NodeP parse_if(size_t pos) {
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

  std::vector<std::string> parse_targets(const char* stmt) {
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

  NodeP parse_for(size_t pos) {
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

  NodeP parse_set(size_t pos) {
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

  void parse_params(Node& n) {
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

  NodeP parse_macro(size_t pos) {
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

  NodeP parse_call_block(size_t pos) {
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

  NodeP parse_filter_block(size_t pos) {
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

  // ---- expressions ----

  // An expression or an unparenthesised tuple `a, b` (as `set` and `for` allow).
  NodeP parse_tuple(bool with_cond) {
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
    return n;
  }

  NodeP parse_expr(bool with_cond = true) {
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
      e = n;
    }
    return e;
  }

  NodeP binary(const std::string& op, NodeP l, NodeP r, size_t pos) {
    auto n = make(NodeType::kBinary, pos);
    n->name = op;
    n->a = std::move(l);
    n->b = std::move(r);
    return n;
  }

  NodeP parse_or() {
    const size_t pos = cur().pos;
    NodeP l = parse_and();
    while (is_name("or")) {
      advance();
      l = binary("or", l, parse_and(), pos);
    }
    return l;
  }
  NodeP parse_and() {
    const size_t pos = cur().pos;
    NodeP l = parse_not();
    while (is_name("and")) {
      advance();
      l = binary("and", l, parse_not(), pos);
    }
    return l;
  }
  NodeP parse_not() {
    if (is_name("not")) {
      DepthGuard g(*this);
      auto n = make(NodeType::kUnary, cur().pos);
      advance();
      n->name = "not";
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  NodeP parse_compare() {
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
    }
    return n ? NodeP(n) : first;
  }
  NodeP parse_math1() {
    const size_t pos = cur().pos;
    NodeP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = cur().text;
      advance();
      l = binary(op, l, parse_concat(), pos);
    }
    return l;
  }
  NodeP parse_concat() {
    const size_t pos = cur().pos;
    NodeP l = parse_math2();
    while (is_op("~")) {
      advance();
      l = binary("~", l, parse_math2(), pos);
    }
    return l;
  }
  NodeP parse_math2() {
    const size_t pos = cur().pos;
    NodeP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().text;
      advance();
      l = binary(op, l, parse_pow(), pos);
    }
    return l;
  }
  NodeP parse_pow() {
    const size_t pos = cur().pos;
    NodeP l = parse_unary(true);
    while (is_op("**")) {
      advance();
      l = binary("**", l, parse_unary(true), pos);
    }
    return l;
  }
  NodeP parse_unary(bool with_filter) {
    DepthGuard g(*this);
    NodeP node;
    if (is_op("-") || is_op("+")) {
      auto n = make(NodeType::kUnary, cur().pos);
      n->name = cur().text;
      advance();
      n->a = parse_unary(false);
      node = n;
    } else {
      node = parse_primary();
    }
    node = parse_postfix(node);
    if (with_filter) node = parse_filter_chain(node);
    return node;
  }

  NodeP parse_primary() {
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
            e = n;
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
          return n;
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
          return n;
        }
        break;
      default:
        break;
    }
    fail("expected an expression, found " + describe(t));
  }

  NodeP literal(Value v, size_t pos) {
    auto n = make(NodeType::kLiteral, pos);
    n->value = std::move(v);
    return n;
  }

  void parse_call_args(Node& n) {
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

  NodeP parse_postfix(NodeP node) {
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
          node = idx;
          continue;
        }
        n->name = expect_name("an attribute name after '.'");
        node = n;
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
          node = n;
        } else {
          auto n = make(NodeType::kSlice, pos);
          n->a = node;
          n->b = parts[0];
          n->c = parts[1];
          n->d = parts[2];
          node = n;
        }
      } else if (is_op("(")) {
        auto n = make(NodeType::kCall, pos);
        n->a = node;
        parse_call_args(*n);
        node = n;
      } else {
        return node;
      }
    }
  }

  // One `name` or `name(args)` filter applied to `operand` (null inside a filter block).
  NodeP parse_filter(NodeP operand) {
    auto n = make(NodeType::kFilter, cur().pos);
    n->a = std::move(operand);
    n->name = expect_name("a filter name");
    while (is_op(".")) {
      advance();
      n->name += "." + expect_name("a filter name");
    }
    if (is_op("(")) parse_call_args(*n);
    return n;
  }

  NodeP parse_filter_chain(NodeP node) {
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
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("is") && !is_name("in") && !is_name("not")) {
          DepthGuard g(*this);
          n->kids.push_back(parse_postfix(parse_primary()));
        }
        node = n;
      } else if (is_op("(")) {
        auto n = make(NodeType::kCall, cur().pos);
        n->a = node;
        parse_call_args(*n);
        node = n;
      } else {
        return node;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const Positions& p_;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

NodeP parse_template(std::string_view source) {
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);  // keep_trailing_newline=False
  const Positions pos(source);
  Lexer lexer(source, pos);
  Parser parser(lexer.run(), pos);
  return parser.parse_all();
}

}  // namespace car::chat

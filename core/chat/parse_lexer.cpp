// The template lexer: cuts the source into text and tag tokens, applies whitespace control ({%- -%}
// {{- -}} {#- -#}, trim_blocks, lstrip_blocks), and tokenizes the inside of each tag (names, numbers,
// strings with their escapes, operators).
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "core/chat/parse_internal.h"

namespace car::chat::parse_internal {

namespace {

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

}  // namespace

std::vector<Token> lex(std::string_view src, const Positions& pos) {
  return Lexer(src, pos).run();
}

}  // namespace car::chat::parse_internal

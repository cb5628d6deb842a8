// Unicode-aware string operations of the template language: whitespace, case mapping, title case, and
// stripping a set of characters, each as the dialect the interpreter runs defines it.
//
// Two dialects (jinja.h's RenderOptions::js_strip_quirk): the reference renderer (@huggingface/jinja, whose
// string methods are JavaScript's) and Python Jinja2 as transformers runs it. They agree on upper and lower
// case (full Unicode mappings, "ß" -> "SS", a final sigma lowered to "ς"), and differ on:
//
//   whitespace  JS: Zs, TAB, LF, VT, FF, CR, U+2028, U+2029, U+FEFF; Python: White_Space (U+0085 too) and
//               U+001C..U+001F, not U+FEFF
//   title       JS: `replace(/\b\w/g, toUpperCase)` - an ASCII letter after a non-[A-Za-z0-9_] character is
//               upper-cased, nothing else changes; Python: the first cased character of every run of cased
//               characters is title-cased, the others lower-cased
//   capitalize  JS: the first UTF-16 unit upper-cased, the rest unchanged; Python: the first character
//               title-cased, the rest lower-cased
//
// Text is UTF-8; bytes that are not valid UTF-8 pass through unchanged. Case mapping is ICU's (root
// locale). Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

namespace car::chat {

/// Whether `cp` is whitespace to the dialect's strip / trim / split.
bool is_space(uint32_t cp, bool js);

/// `s` without leading (`left`) and trailing (`right`) whitespace.
std::string strip_space(const std::string& s, bool left, bool right, bool js);
/// `s` without leading / trailing characters (code points) that occur in `chars` (Python's strip(chars)).
std::string strip_set(const std::string& s, const std::string& chars, bool left, bool right);
/// The non-empty runs of non-whitespace (Python's and the reference's split() without a separator); at
/// most `maxsplit` splits when >= 0, the rest (from its first non-whitespace character on) the last item.
template <typename Out>
void split_space(const std::string& s, int64_t maxsplit, bool js, Out&& emit);

std::string to_upper(const std::string& s);
std::string to_lower(const std::string& s);
std::string to_title(const std::string& s, bool js);
std::string capitalize(const std::string& s, bool js);
/// Python Jinja2's `title` filter (not str.title): the text split before runs of '-', '(', '{', '[', '<'
/// and whitespace; each piece's first character upper-cased, the rest lower-cased.
std::string jinja_title(const std::string& s);

/// Orders two strings as the reference renderer's sort_keys does (JavaScript's localeCompare: the Unicode
/// collation algorithm with the root locale's tailoring, ICU's): negative, 0 or positive.
int collate(const std::string& a, const std::string& b);

/// Decodes the code point at `s[i]` (advancing `i`); an invalid byte is returned as itself (0x80..0xFF)
/// with `valid` false.
uint32_t next_code_point(const std::string& s, size_t& i, bool& valid);

template <typename Out>
void split_space(const std::string& s, int64_t maxsplit, bool js, Out&& emit) {
  size_t i = 0;
  auto space_at = [&](size_t at, size_t& next) {
    bool valid = true;
    next = at;
    const uint32_t cp = next_code_point(s, next, valid);
    return valid && is_space(cp, js);
  };
  size_t next = 0;
  while (i < s.size()) {
    while (i < s.size() && space_at(i, next)) i = next;
    if (i >= s.size()) break;
    if (maxsplit == 0) {
      emit(s.substr(i));  // the rest as it is, trailing whitespace included
      return;
    }
    size_t e = i;
    while (e < s.size() && !space_at(e, next)) e = next;
    emit(s.substr(i, e - i));
    if (maxsplit > 0) --maxsplit;
    i = e;
  }
}

}  // namespace car::chat

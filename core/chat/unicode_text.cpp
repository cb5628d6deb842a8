#include "core/chat/unicode_text.h"

#include <unicode/uchar.h>
#include <unicode/ucasemap.h>
#include <unicode/ucol.h>

#include <cctype>
#include <memory>

#include "core/tokenizer/utf8.h"

namespace car::chat {

uint32_t next_code_point(const std::string& s, size_t& i, bool& valid) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t c = b(i);
  valid = true;
  if (c < 0x80) {
    ++i;
    return c;
  }
  size_t len = 0;
  uint32_t cp = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    cp = c & 0x1Fu;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    cp = c & 0x0Fu;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    cp = c & 0x07u;
  }
  bool ok = len != 0 && i + len <= s.size();
  for (size_t k = 1; ok && k < len; ++k) {
    ok = (b(i + k) & 0xC0) == 0x80;
    cp = (cp << 6) | (b(i + k) & 0x3Fu);
  }
  // No overlong forms, surrogates or values past U+10FFFF.
  ok = ok && !(len == 3 && cp < 0x800) && !(len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) &&
       !(cp >= 0xD800 && cp <= 0xDFFF);
  if (!ok) {
    valid = false;
    ++i;
    return c;
  }
  i += len;
  return cp;
}

bool is_space(uint32_t cp, bool js) {
  const auto c = static_cast<UChar32>(cp);
  if (js) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x2028 || cp == 0x2029 || cp == 0xFEFF ||
           u_charType(c) == U_SPACE_SEPARATOR;
  }
  return (cp >= 0x1C && cp <= 0x1F) || u_hasBinaryProperty(c, UCHAR_WHITE_SPACE);
}

namespace {

// The byte offsets of the code points of `s` that `keep` says to strip from each end.
template <typename Strip>
std::string strip_by(const std::string& s, bool left, bool right, Strip strip) {
  size_t b = 0;
  size_t e = s.size();
  if (left) {
    while (b < e) {
      size_t next = b;
      bool valid = true;
      const uint32_t cp = next_code_point(s, next, valid);
      if (!valid || !strip(cp)) break;
      b = next;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;  // back to the lead byte of the last sequence (at most 3 continuation bytes)
      while (start > b && e - start < 4 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
      size_t next = start;
      bool valid = true;
      const uint32_t cp = next_code_point(s, next, valid);
      if (!valid || next != e || !strip(cp)) break;
      e = start;
    }
  }
  return s.substr(b, e - b);
}

struct CaseMapCloser {
  void operator()(UCaseMap* m) const { ucasemap_close(m); }
};

enum class Mapping { upper, lower, title_first };

// Full case mapping of a UTF-8 string through ICU (root locale). Invalid UTF-8 is mapped piecewise: the
// valid runs are mapped, the invalid bytes copied.
std::string map_valid(const std::string& s, Mapping how) {
  if (s.empty()) return s;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<UCaseMap, CaseMapCloser> map(ucasemap_open("", 0, &status));
  if (U_FAILURE(status)) return s;
  std::string out(s.size() * 3 + 16, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    status = U_ZERO_ERROR;
    int32_t n = 0;
    const auto cap = static_cast<int32_t>(out.size());
    const auto len = static_cast<int32_t>(s.size());
    switch (how) {
      case Mapping::upper:
        n = ucasemap_utf8ToUpper(map.get(), out.data(), cap, s.data(), len, &status);
        break;
      case Mapping::lower:
        n = ucasemap_utf8ToLower(map.get(), out.data(), cap, s.data(), len, &status);
        break;
      case Mapping::title_first:
        // One character: its full title-case mapping (U_TITLECASE_NO_LOWERCASE leaves nothing else to do).
        ucasemap_setOptions(map.get(), U_TITLECASE_NO_BREAK_ADJUSTMENT | U_TITLECASE_NO_LOWERCASE, &status);
        n = ucasemap_utf8ToTitle(map.get(), out.data(), cap, s.data(), len, &status);
        break;
    }
    if (status == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(static_cast<size_t>(n) + 1, '\0');
      continue;
    }
    if (U_FAILURE(status)) return s;
    out.resize(static_cast<size_t>(n));
    return out;
  }
  return s;
}

std::string map_case(const std::string& s, Mapping how) {
  if (tokenizer::valid_utf8_prefix(s) == s.size()) return map_valid(s, how);
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t run = tokenizer::valid_utf8_prefix(std::string_view(s).substr(i));
    out += map_valid(s.substr(i, run), how);
    i += run;
    if (i < s.size()) out += s[i++];
  }
  return out;
}

bool is_cased(uint32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_CASED) != 0; }

struct CollatorCloser {
  void operator()(UCollator* c) const { ucol_close(c); }
};

}  // namespace

int collate(const std::string& a, const std::string& b) {
  // One collator per thread: ucol_strcollUTF8 on a shared collator is safe, but opening is not free and a
  // thread-local one needs no lock.
  thread_local std::unique_ptr<UCollator, CollatorCloser> coll = [] {
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<UCollator, CollatorCloser> c(ucol_open("", &status));
    if (U_FAILURE(status)) c.reset();
    return c;
  }();
  if (coll == nullptr) return a.compare(b);
  UErrorCode status = U_ZERO_ERROR;
  const UCollationResult r = ucol_strcollUTF8(coll.get(), a.data(), static_cast<int32_t>(a.size()), b.data(),
                                              static_cast<int32_t>(b.size()), &status);
  if (U_FAILURE(status)) return a.compare(b);
  return r == UCOL_LESS ? -1 : r == UCOL_GREATER ? 1 : 0;
}

std::string strip_space(const std::string& s, bool left, bool right, bool js) {
  return strip_by(s, left, right, [js](uint32_t cp) { return is_space(cp, js); });
}

std::string strip_set(const std::string& s, const std::string& chars, bool left, bool right) {
  std::u32string set;
  for (size_t i = 0; i < chars.size();) {
    bool valid = true;
    set.push_back(next_code_point(chars, i, valid));
  }
  return strip_by(s, left, right, [&set](uint32_t cp) { return set.find(cp) != std::u32string::npos; });
}

std::string to_upper(const std::string& s) { return map_case(s, Mapping::upper); }
std::string to_lower(const std::string& s) { return map_case(s, Mapping::lower); }

std::string to_title(const std::string& s, bool js) {
  std::string out;
  out.reserve(s.size());
  if (js) {
    // /\b\w/g: \w is [A-Za-z0-9_] whatever the text; every other character (any non-ASCII one) is a
    // non-word character.
    auto word = [](unsigned char c) { return std::isalnum(c) != 0 || c == '_'; };
    bool prev_word = false;
    for (unsigned char c : s) {
      const bool w = c < 0x80 && word(c);
      out += w && !prev_word ? static_cast<char>(std::toupper(c)) : static_cast<char>(c);
      prev_word = w;
    }
    return out;
  }
  // Python: after a cased character lower-case, else title-case; runs to lower are mapped together (so a
  // final sigma sees its word).
  size_t i = 0;
  size_t lower_from = std::string::npos;
  bool prev_cased = false;
  auto flush_lower = [&](size_t end) {
    if (lower_from != std::string::npos) out += to_lower(s.substr(lower_from, end - lower_from));
    lower_from = std::string::npos;
  };
  while (i < s.size()) {
    const size_t at = i;
    bool valid = true;
    const uint32_t cp = next_code_point(s, i, valid);
    if (!valid) {
      flush_lower(at);
      out += s[at];
      prev_cased = false;
      continue;
    }
    if (prev_cased) {
      if (lower_from == std::string::npos) lower_from = at;
    } else {
      flush_lower(at);
      out += map_valid(s.substr(at, i - at), Mapping::title_first);
    }
    prev_cased = is_cased(cp);
  }
  flush_lower(s.size());
  return out;
}

std::string jinja_title(const std::string& s) {
  // Pieces: a run of separators or the text up to the next one (re.split with a capturing group keeps
  // both); each piece gets word[0].upper() + word[1:].lower().
  auto separator = [](uint32_t cp) {
    return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || is_space(cp, false);
  };
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t start = i;
    bool valid = true;
    size_t next = i;
    const uint32_t first_cp = next_code_point(s, next, valid);
    const bool sep = valid && separator(first_cp);
    while (i < s.size()) {
      next = i;
      const uint32_t cp = next_code_point(s, next, valid);
      if ((valid && separator(cp)) != sep) break;
      i = next;
    }
    const std::string piece = s.substr(start, i - start);
    size_t first = 0;
    next_code_point(piece, first, valid);
    out += to_upper(piece.substr(0, first)) + to_lower(piece.substr(first));
  }
  return out;
}

std::string capitalize(const std::string& s, bool js) {
  if (s.empty()) return s;
  size_t i = 0;
  bool valid = true;
  const uint32_t cp = next_code_point(s, i, valid);
  if (!valid) return js ? s : std::string(1, s[0]) + to_lower(s.substr(1));
  if (js) {
    // charAt(0) is one UTF-16 unit: a character past the BMP is half a pair, which no mapping changes.
    if (cp > 0xFFFF) return s;
    return to_upper(s.substr(0, i)) + s.substr(i);
  }
  return map_valid(s.substr(0, i), Mapping::title_first) + to_lower(s.substr(i));
}

}  // namespace car::chat

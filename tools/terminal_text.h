// Text from a file or the command line made safe to print on a terminal (`car gguf inspect`, `car show`).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace car::tools {

// Length of the well-formed UTF-8 sequence at s[i] (1..4), or 0 when the byte there does not start one.
inline size_t utf8_len_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](size_t k, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return i + k < s.size() && b(k) >= lo && b(k) <= hi;
  };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80,
                        hi = c == 0xED ? 0x9F : 0xBF;  // no overlongs, surrogates
    return cont(1, lo, hi) && cont(2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    return cont(1, lo, hi) && cont(2) && cont(3) ? 4 : 0;
  }
  return 0;
}

// Text from the file, safe to print on a terminal: C0 controls, DEL, C1 controls (U+0080..U+009F) and bytes
// that are not UTF-8 become escapes (\n, \t, \r, \xNN, \u0085), so a crafted key, string or tensor name
// cannot move the cursor, clear the screen or retitle the window. Backslashes are doubled (and with `quote`,
// quotes escaped and the result quoted) so the escapes stay unambiguous. At most max_len bytes of `s`.
inline std::string terminal_text(std::string_view s, bool quote, size_t max_len = std::string::npos) {
  std::string out = quote ? "\"" : "";
  for (size_t i = 0; i < s.size();) {
    if (i >= max_len) {
      out += "...";
      break;
    }
    const size_t len = utf8_len_at(s, i);
    const auto c = static_cast<unsigned char>(s[i]);
    char buf[16];
    if (len == 0) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);  // not UTF-8
      out += buf;
      i += 1;
      continue;
    }
    if (len == 2 && c == 0xC2 && static_cast<unsigned char>(s[i + 1]) <= 0x9F) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned char>(s[i + 1]));  // C1 control
      out += buf;
    } else if (c == '\\' || (quote && c == '"')) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  if (quote) out += '"';
  return out;
}

}  // namespace car::tools

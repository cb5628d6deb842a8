#include "daemon/safe_text.h"

#include <cstdint>
#include <cstdio>

namespace car::daemon {

namespace {

/// Decode one UTF-8 sequence at the start of `s`: its code point and length, or length 0 when the bytes
/// there are not valid UTF-8 (overlong forms, surrogates and values above U+10FFFF are invalid).
struct Decoded {
  char32_t cp = 0;
  std::size_t length = 0;
};

Decoded decode(std::string_view s) {
  if (s.empty()) return {};
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return {b0, 1};
  std::size_t n = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    n = 2, cp = b0 & 0x1F, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3, cp = b0 & 0x0F, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4, cp = b0 & 0x07, min = 0x10000;
  } else {
    return {};
  }
  if (s.size() < n) return {};
  for (std::size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return {};
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
  return {cp, n};
}

std::string hex(unsigned v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%0*X", digits, v);
  return buf;
}

}  // namespace

std::size_t utf8_sequence_length(std::string_view s) {
  return decode(s).length;
}

bool is_unsafe_code_point(char32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) return true;       // C0, DEL, C1
  if (cp == 0x2028 || cp == 0x2029) return true;                  // line / paragraph separator
  if (cp == 0x061C || cp == 0x200E || cp == 0x200F) return true;  // ALM, LRM, RLM
  if (cp >= 0x202A && cp <= 0x202E) return true;                  // LRE RLE PDF LRO RLO
  if (cp >= 0x2066 && cp <= 0x2069) return true;                  // LRI RLI FSI PDI
  if ((cp >= 0x200B && cp <= 0x200D) || cp == 0x2060 || cp == 0xFEFF) return true;  // zero-width, BOM
  return false;
}

std::optional<std::string> unsafe_text_reason(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    Decoded d = decode(s.substr(i));
    if (d.length == 0) {
      return "byte 0x" + hex(static_cast<unsigned char>(s[i]), 2) + " at offset " + std::to_string(i) +
             " is not valid UTF-8";
    }
    if (is_unsafe_code_point(d.cp)) {
      return "U+" + hex(static_cast<unsigned>(d.cp), 4) + " at offset " + std::to_string(i) +
             " is a control or invisible formatting character";
    }
    i += d.length;
  }
  return std::nullopt;
}

std::string log_quote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.push_back('"');
  for (std::size_t i = 0; i < s.size();) {
    Decoded d = decode(s.substr(i));
    if (d.length == 0) {
      out += "\\x" + hex(static_cast<unsigned char>(s[i]), 2);
      ++i;
      continue;
    }
    if (d.cp == '"' || d.cp == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(d.cp));
    } else if (is_unsafe_code_point(d.cp)) {
      out += "\\u" + hex(static_cast<unsigned>(d.cp), 4);
    } else {
      out.append(s.substr(i, d.length));
    }
    i += d.length;
  }
  out.push_back('"');
  return out;
}

std::string log_id(const nlohmann::json& id) {
  if (id.is_null()) return "-";
  if (id.is_string()) return log_quote(id.get_ref<const std::string&>());
  return id.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace car::daemon

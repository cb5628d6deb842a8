#include "core/tokenizer/utf8.h"

#include <array>

namespace car::tokenizer {
namespace {

bool is_cont(uint8_t b) {
  return (b & 0xC0) == 0x80;
}

// Strict classification of the sequence starting at p[0] (n > 0 bytes available):
//   > 0: a valid sequence of that length;
//     0: a valid but truncated prefix (more bytes could complete it);
//   < 0: invalid; -k is the length of the maximal invalid subpart to replace with one U+FFFD.
int strict_seq(const uint8_t* p, size_t n) {
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return 1;
  int len = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= n) return 0;
    const uint8_t b = p[i];
    const bool ok = i == 1 ? (b >= lo && b <= hi) : is_cont(b);
    if (!ok) return -i;
  }
  return len;
}

std::array<std::string, 256> make_byte_table() {
  std::array<std::string, 256> t;
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cpt = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
    append_utf8(t[b], cpt);
  }
  return t;
}

const std::array<std::string, 256>& byte_table() {
  static const std::array<std::string, 256> table = make_byte_table();
  return table;
}

}  // namespace

std::vector<uint32_t> decode_lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* p = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b0 = p[i];
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cpt = 0;
    if ((b0 & 0x40) == 0) {
      len = 0;  // a continuation byte cannot start a sequence
    } else if ((b0 & 0x20) == 0) {
      len = 2;
      cpt = b0 & 0x1F;
    } else if ((b0 & 0x10) == 0) {
      len = 3;
      cpt = b0 & 0x0F;
    } else if ((b0 & 0x08) == 0) {
      len = 4;
      cpt = b0 & 0x07;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if (!is_cont(p[i + k])) ok = false;
      cpt = (cpt << 6) | (p[i + k] & 0x3F);
    }
    if (!ok) {
      out.push_back(kReplacementChar);
      ++i;
      continue;
    }
    out.push_back(cpt > 0x10FFFF ? kReplacementChar : cpt);
    i += len;
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt <= 0x7F) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt <= 0x7FF) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0xFFFF) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt <= 0x10FFFF) {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    append_utf8(out, kReplacementChar);
  }
}

size_t valid_utf8_prefix(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    const int r = strict_seq(p + i, bytes.size() - i);
    if (r <= 0) break;
    i += static_cast<size_t>(r);
  }
  return i;
}

size_t incomplete_utf8_tail(std::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t n = bytes.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = p[n - back];
    if (is_cont(b)) continue;
    return strict_seq(p + n - back, back) == 0 ? back : 0;
  }
  return 0;
}

std::string sanitize_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t left = bytes.size() - i;
    int r = strict_seq(p + i, left);
    if (r > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(r)));
      i += static_cast<size_t>(r);
      continue;
    }
    // A truncated sequence at the end is one invalid subpart covering what is there.
    const size_t skip = r == 0 ? left : static_cast<size_t>(-r);
    append_utf8(out, kReplacementChar);
    i += skip;
  }
  return out;
}

const std::string& byte_to_unicode(uint8_t b) {
  return byte_table()[b];
}

int unicode_to_byte(uint32_t cpt) {
  if ((cpt >= 0x21 && cpt <= 0x7E) || (cpt >= 0xA1 && cpt <= 0xAC) || (cpt >= 0xAE && cpt <= 0xFF)) {
    return static_cast<int>(cpt);
  }
  if (cpt < 256 || cpt >= 256 + 68) return -1;
  // The n-th non-printable byte maps to 256 + n.
  int n = static_cast<int>(cpt - 256);
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!printable && n-- == 0) return b;
  }
  return -1;
}

std::string byte_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  const auto& table = byte_table();
  for (char c : bytes) out += table[static_cast<uint8_t>(c)];
  return out;
}

}  // namespace car::tokenizer

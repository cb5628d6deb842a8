#include "core/tokenizer/wordpiece.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/utf16.h>

#include <algorithm>

#include "core/tokenizer/utf8.h"

namespace car::tokenizer {
namespace {

// The first code point of the canonical decomposition of `cpt` (itself when it has none).
uint32_t nfd_first(uint32_t cpt) {
  UErrorCode err = U_ZERO_ERROR;
  static const UNormalizer2* nfd = unorm2_getNFDInstance(&err);
  if (nfd == nullptr || cpt > 0x10FFFF) return cpt;
  UChar buf[32];
  err = U_ZERO_ERROR;
  const int32_t len = unorm2_getDecomposition(nfd, static_cast<UChar32>(cpt), buf, 32, &err);
  if (len <= 0 || U_FAILURE(err)) return cpt;
  UChar32 first = 0;
  int32_t i = 0;
  U16_NEXT(buf, i, len, first);
  return static_cast<uint32_t>(first);
}

bool is_chinese_char(uint32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) ||
         (c >= 0x2B920 && c <= 0x2CEAF) ||  // as Hugging Face's BERT normaliser (0x2B820 in Unicode)
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

}  // namespace

std::vector<std::string> wordpiece_words(std::string_view text, const WordPieceOptions& options) {
  std::vector<std::string> words(1);
  for (uint32_t raw : decode_lenient(text)) {
    const uint32_t cpt = options.strip_accents ? nfd_first(raw) : raw;
    const auto c = static_cast<UChar32>(cpt);
    if (u_isUWhiteSpace(c)) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    const int8_t cat = u_charType(c);
    const bool is_control =
        cat == U_CONTROL_CHAR || cat == U_FORMAT_CHAR || cat == U_PRIVATE_USE_CHAR || cat == U_SURROGATE;
    if (cpt == 0 || cpt == kReplacementChar || is_control) continue;
    // A decomposed accent ("e" + U+0301) goes the way of a precomposed one's: llama.cpp drops every mark
    // (\p{M}: Mn, Mc, Me) when stripping accents.
    const bool is_mark =
        cat == U_NON_SPACING_MARK || cat == U_COMBINING_SPACING_MARK || cat == U_ENCLOSING_MARK;
    if (options.strip_accents && is_mark) continue;
    const bool is_punct = cat == U_DASH_PUNCTUATION || cat == U_START_PUNCTUATION ||
                          cat == U_END_PUNCTUATION || cat == U_CONNECTOR_PUNCTUATION ||
                          cat == U_OTHER_PUNCTUATION || cat == U_INITIAL_PUNCTUATION ||
                          cat == U_FINAL_PUNCTUATION;
    const bool is_symbol =
        cat == U_MATH_SYMBOL || cat == U_CURRENCY_SYMBOL || cat == U_MODIFIER_SYMBOL || cat == U_OTHER_SYMBOL;
    std::string s;
    append_utf8(s, options.lowercase ? static_cast<uint32_t>(u_tolower(c)) : cpt);
    if (is_punct || (cpt < 0x7F && is_symbol) || is_chinese_char(cpt)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = std::move(s);
      words.emplace_back();
    } else {
      words.back() += s;
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

void wordpiece_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out) {
  for (const std::string& w : wordpiece_words(text, vocab.wpm)) {
    if (w.empty()) continue;
    const std::string word = "\xE2\x96\x81" + w;
    const std::string_view wv = word;
    const size_t n = word.size();
    const size_t start_size = out.size();
    for (size_t i = 0; i < n; ++i) {
      bool matched = false;
      for (size_t j = std::min(n, i + vocab.max_token_len + 1); j > i; --j) {
        const int32_t id = vocab.find(wv.substr(i, j - i));
        if (id != kNoToken) {
          out.push_back(id);
          matched = true;
          i = j - 1;
          break;
        }
      }
      if (!matched) {
        out.resize(start_size);  // the word cannot be covered: it becomes one unknown token
        break;
      }
    }
    if (out.size() == start_size && vocab.unk != kNoToken) out.push_back(vocab.unk);
  }
}

}  // namespace car::tokenizer

#include "core/tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdlib>

#include "core/tokenizer/bpe.h"
#include "core/tokenizer/spm.h"
#include "core/tokenizer/utf8.h"
#include "core/tokenizer/wordpiece.h"

namespace car::tokenizer {
namespace {

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's visible space

// C isspace() in the "C" locale, which llama.cpp uses for lstrip/rstrip.
bool is_ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

// A piece of the input: raw text [offset, offset + length) or one already-decided token.
struct Fragment {
  int32_t token;  // kNoToken for raw text
  size_t offset;
  size_t length;
};

// Cuts the text of special tokens out of raw fragments, longest token first (llama.cpp's
// tokenizer_st_partition, including its lstrip / rstrip handling).
std::vector<Fragment> partition(const Vocab& v, std::string_view text, bool parse_special) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back(Fragment{kNoToken, 0, text.size()});
  std::vector<Fragment> next;
  for (int32_t id : v.special_tokens) {
    const TokenData& t = v.tokens[static_cast<size_t>(id)];
    if (!parse_special && (t.attr & (kAttrControl | kAttrUnknown))) continue;
    const std::string_view st = t.text;
    // Cheap rejection: skip the pass when the token text occurs nowhere.
    if (text.find(st) == std::string_view::npos) continue;
    next.clear();
    for (const Fragment& f : frags) {
      if (f.token != kNoToken) {
        next.push_back(f);
        continue;
      }
      size_t base = f.offset;
      size_t len = f.length;
      while (len > 0) {
        const size_t match = text.substr(0, base + len).find(st, base);
        if (match == std::string_view::npos) {
          next.push_back(Fragment{kNoToken, base, len});
          break;
        }
        if (match > base) {
          size_t left_len = match - base;
          if (t.attr & kAttrLstrip) {
            while (left_len > 0 && is_ascii_space(text[base + left_len - 1])) --left_len;
          }
          if (left_len > 0) next.push_back(Fragment{kNoToken, base, left_len});
        }
        next.push_back(Fragment{id, 0, 0});
        size_t right = match + st.size();
        size_t right_len = base + len - right;
        if (t.attr & kAttrRstrip) {
          while (right_len > 0 && is_ascii_space(text[right])) ++right, --right_len;
        }
        base = right;
        len = right_len;
      }
    }
    frags.swap(next);
  }
  return frags;
}

}  // namespace

Result<std::shared_ptr<const Tokenizer>> Tokenizer::from_gguf(const gguf::GgufFile& file) {
  auto vocab = Vocab::load(file);
  if (!vocab) return vocab.error();
  std::shared_ptr<Tokenizer> t(new Tokenizer(std::move(*vocab)));
  if (t->vocab_.type == VocabType::bpe) {
    auto pre = Pretokenizer::create(pre_type_regexes(t->vocab_.pre.type));
    if (!pre) return pre.error();
    t->pretokenizer_ = std::move(*pre);
  }
  return std::shared_ptr<const Tokenizer>(std::move(t));
}

void Tokenizer::encode_fragment(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const {
  switch (vocab_.type) {
    case VocabType::spm: {
      std::string escaped;
      escaped.reserve(text.size() + 8);
      if (prefix_space) escaped += kSpmSpace;
      for (char c : text) {
        if (c == ' ') {
          escaped += kSpmSpace;
        } else {
          escaped += c;
        }
      }
      spm_encode(vocab_, escaped, out);
      break;
    }
    case VocabType::bpe:
      for (const std::string& word : pretokenizer_->split(text)) bpe_encode_word(vocab_, word, out);
      break;
    case VocabType::wpm:
      wordpiece_encode(vocab_, text, out);
      break;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && vocab_.add_bos && vocab_.bos != kNoToken) out.push_back(vocab_.bos);
  bool prev_special = true;  // SentencePiece prefixes a space to text at the start and after special tokens
  for (const Fragment& f : partition(vocab_, text, parse_special)) {
    if (f.token != kNoToken) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    encode_fragment(text.substr(f.offset, f.length), vocab_.add_space_prefix && prev_special, out);
    prev_special = false;
  }
  if (add_special) {
    if (vocab_.type == VocabType::wpm) {
      if (vocab_.add_sep && vocab_.sep != kNoToken) out.push_back(vocab_.sep);
    } else if (vocab_.add_eos && vocab_.eos != kNoToken) {
      out.push_back(vocab_.eos);
    }
  }
  return out;
}

std::string Tokenizer::piece(int32_t id, bool special, bool strip_leading_space) const {
  if (!vocab_.valid(id)) return {};
  const TokenData& t = vocab_.tokens[static_cast<size_t>(id)];
  constexpr uint32_t kSpecial = kAttrUnknown | kAttrControl;
  if (!special && (t.attr & kSpecial)) return {};
  std::string out;
  if (t.attr & (kSpecial | kAttrUserDefined)) {
    out = t.text;
  } else if (t.attr & kAttrNormal) {
    if (vocab_.type == VocabType::bpe) {
      for (uint32_t cpt : decode_lenient(t.text)) {
        const int b = unicode_to_byte(cpt);
        if (b >= 0) {
          out.push_back(static_cast<char>(b));
        } else {  // not a byte-level character: llama.cpp marks it this way
          std::string utf8;
          append_utf8(utf8, cpt);
          out += "[UNK_BYTE_0x";
          for (char c : utf8) {
            static constexpr char kHex[] = "0123456789abcdef";
            out.push_back(kHex[(static_cast<uint8_t>(c) >> 4) & 15]);
            out.push_back(kHex[static_cast<uint8_t>(c) & 15]);
          }
          out += t.text + "]";
        }
      }
    } else {
      // Unescape U+2581 to spaces.
      const std::string_view s = t.text;
      for (size_t i = 0; i < s.size();) {
        if (s.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
          out.push_back(' ');
          i += kSpmSpace.size();
        } else {
          out.push_back(s[i++]);
        }
      }
    }
  } else if ((t.attr & kAttrByte) && vocab_.type != VocabType::bpe) {
    // "<0xNN>"
    if (t.text.size() == 6 && t.text.compare(0, 3, "<0x") == 0) {
      out.push_back(static_cast<char>(std::strtol(t.text.substr(3, 2).c_str(), nullptr, 16)));
    }
  }
  if (strip_leading_space && !out.empty() && out[0] == ' ') out.erase(0, 1);
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id, bool special) const {
  return piece(id, special, false);
}

namespace {

// llama.cpp's clean_up_tokenization_spaces: three in-place passes over the decoded bytes. Each pass
// compacts the buffer (`w` trails `i`), so reads at i - 1 see bytes the pass has already rewritten.
void clean_spaces(std::string& t) {
  // 1: " ?", " !", " .", " ," lose the space.
  size_t n = t.size();
  size_t w = n > 0 ? 1 : 0;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) --w;
    t[w++] = x;
  }
  t.resize(w);
  // 2: " ' " becomes "'".
  n = t.size();
  w = n > 0 ? 1 : 0;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (x == '\'' && i + 1 < n && t[i - 1] == ' ' && t[i + 1] == ' ') {
      --w;         // the space before
      t[++i] = 0;  // and the one after
    }
    t[w++] = x;
  }
  t.resize(w);
  // 3: " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it).
  n = t.size();
  w = n > 0 ? 1 : 0;
  for (size_t i = 1; i < n; ++i) {
    const char x = t[i];
    if (t[i - 1] == ' ' && x == '\'' && i + 1 < n) {
      const char x1 = t[i + 1];
      if (x1 == 's' || x1 == 'm') {
        --w;
      } else if (x1 != 't' && x1 != 'd' && i + 2 < n) {
        const char x2 = t[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) --w;
      }
    }
    t[w++] = x;
  }
  t.resize(w);
}

}  // namespace

std::string Tokenizer::decode(std::span<const int32_t> ids, bool remove_special, bool unparse_special) const {
  bool remove_space = vocab_.add_space_prefix;
  if (remove_special && vocab_.add_bos && !ids.empty() && ids.front() == vocab_.bos) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (remove_special && vocab_.add_eos && !ids.empty() && ids.back() == vocab_.eos) {
    ids = ids.subspan(0, ids.size() - 1);
  }
  std::string text;
  for (int32_t id : ids) {
    text += piece(id, unparse_special, remove_space);
    remove_space = false;
  }
  if (vocab_.clean_spaces) clean_spaces(text);
  return text;
}

bool Tokenizer::is_eog(int32_t id) const {
  return id != kNoToken && std::binary_search(vocab_.eog_ids.begin(), vocab_.eog_ids.end(), id);
}

std::string_view Tokenizer::token_text(int32_t id) const {
  return vocab_.valid(id) ? std::string_view(vocab_.tokens[static_cast<size_t>(id)].text)
                          : std::string_view();
}

float Tokenizer::token_score(int32_t id) const {
  return vocab_.valid(id) ? vocab_.tokens[static_cast<size_t>(id)].score : 0.0f;
}

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool special)
    : tokenizer_(std::move(tokenizer)), special_(special) {
  CAR_CHECK(tokenizer_ != nullptr);
}

std::string StreamDecoder::push(int32_t id) {
  return push_bytes(tokenizer_->token_to_piece(id, special_));
}

std::string StreamDecoder::push_bytes(std::string_view bytes) {
  pending_.append(bytes);
  const size_t tail = incomplete_utf8_tail(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, pending_.size() - tail));
  pending_.erase(0, pending_.size() - tail);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace car::tokenizer

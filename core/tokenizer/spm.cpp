#include "core/tokenizer/spm.h"

#include <algorithm>

#include "core/tokenizer/merge.h"
#include "core/tokenizer/utf8.h"

namespace car::tokenizer {
namespace {

// The merge loop over one stretch of text.
void encode_segment(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out) {
  if (text.empty()) return;
  std::vector<merge::Symbol> symbols = merge::split_characters(text);
  merge::merge_pairs<float>(
      symbols,
      [&](const merge::Symbol& l, const merge::Symbol& r, float& score) {
        const int32_t id = vocab.find(text.substr(l.offset, l.n + r.n));
        if (id == kNoToken) return false;
        score = vocab.tokens[static_cast<size_t>(id)].score;
        return true;
      },
      [](float a, float b) { return a > b; });  // the highest token score first

  merge::for_each_piece(symbols, text, [&](std::string_view piece) {
    const int32_t id = vocab.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    for (char c : piece) {
      const int32_t byte_id = vocab.byte_token[static_cast<uint8_t>(c)];
      if (byte_id != kNoToken) {
        out.push_back(byte_id);
      } else if (vocab.unk != kNoToken) {
        out.push_back(vocab.unk);
      }
    }
  });
}

}  // namespace

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out) {
  if (!vocab.spm_split_at_spaces) {
    encode_segment(vocab, text, out);
    return;
  }
  // No token holds U+2581 after another character, so no merge can join a character to a following
  // U+2581; merges on either side of such a point never interact and the text can be encoded in pieces
  // with the same result (and a far smaller queue). Cut only at character starts, as the merger sees them.
  constexpr std::string_view kSp = "\xE2\x96\x81";
  size_t seg = 0;
  size_t prev = 0;  // start of the previous character
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_seq_len(static_cast<uint8_t>(text[off])), text.size() - off);
    if (off > seg && text.compare(off, kSp.size(), kSp) == 0 && len == kSp.size() &&
        text.substr(prev, off - prev) != kSp) {
      encode_segment(vocab, text.substr(seg, off - seg), out);
      seg = off;
    }
    prev = off;
    off += len;
  }
  encode_segment(vocab, text.substr(seg), out);
}

}  // namespace car::tokenizer

#include "core/tokenizer/bpe.h"

#include <string>

#include "core/tokenizer/merge.h"
#include "core/tokenizer/utf8.h"

namespace car::tokenizer {

void bpe_encode_word(const Vocab& vocab, std::string_view raw_word, std::vector<int32_t>& out) {
  if (raw_word.empty()) return;
  const std::string word = byte_encode(raw_word);
  if (vocab.ignore_merges) {
    const int32_t id = vocab.find(word);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
  }
  std::vector<merge::Symbol> symbols = merge::split_characters(word);
  std::string key;
  merge::merge_pairs<int32_t>(
      symbols,
      [&](const merge::Symbol& l, const merge::Symbol& r, int32_t& rank) {
        key.assign(word, l.offset, l.n);
        key.push_back(' ');
        key.append(word, r.offset, r.n);
        rank = vocab.merge_rank.find(key);
        return rank != StringTable::kAbsent;
      },
      [](int32_t a, int32_t b) { return a < b; });  // the lowest merge rank first

  merge::for_each_piece(symbols, word, [&](std::string_view piece) {
    const int32_t id = vocab.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      return;
    }
    for (size_t k = 0; k < piece.size(); ++k) {
      const int32_t byte_id = vocab.find(piece.substr(k, 1));
      if (byte_id != kNoToken) out.push_back(byte_id);
    }
  });
}

}  // namespace car::tokenizer

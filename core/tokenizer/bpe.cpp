#include "core/tokenizer/bpe.h"

#include <algorithm>
#include <queue>
#include <string>

#include "core/tokenizer/utf8.h"

namespace car::tokenizer {
namespace {

// As in spm.cpp: pieces in a linked list; a merged-away piece has n == 0.
struct Symbol {
  int prev;
  int next;
  size_t offset;
  size_t n;
};

struct Bigram {
  int left;
  int right;
  int32_t rank;
  size_t size;  // bytes of left + right when queued; a mismatch later means the entry is stale
};

struct BigramOrder {
  // Lowest rank first; among equal ranks the leftmost pair.
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.rank > r.rank || (l.rank == r.rank && l.left > r.left);
  }
};

}  // namespace

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
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t off = 0; off < word.size();) {
    const size_t len = std::min(utf8_seq_len(static_cast<uint8_t>(word[off])), word.size() - off);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{index - 1, off + len == word.size() ? -1 : index + 1, off, len});
    off += len;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  std::string key;
  auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    key.assign(word, l.offset, l.n);
    key.push_back(' ');
    key.append(word, r.offset, r.n);
    const int32_t rank = vocab.merge_rank.find(key);
    if (rank == StringTable::kAbsent) return;
    queue.push(Bigram{left, right, rank, l.n + r.n});
  };
  for (size_t i = 1; i < symbols.size(); ++i) try_add(static_cast<int>(i - 1), static_cast<int>(i));

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[static_cast<size_t>(b.left)];
    Symbol& r = symbols[static_cast<size_t>(b.right)];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  const std::string_view w = word;
  for (int i = 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    const std::string_view piece = w.substr(s.offset, s.n);
    const int32_t id = vocab.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (size_t k = 0; k < piece.size(); ++k) {
      const int32_t byte_id = vocab.find(piece.substr(k, 1));
      if (byte_id != kNoToken) out.push_back(byte_id);
    }
  }
}

}  // namespace car::tokenizer

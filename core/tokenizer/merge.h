// The pair-merging loop that SentencePiece (spm.cpp) and byte-level BPE (bpe.cpp) share, as llama.cpp's
// llm_tokenizer_spm_session and llm_tokenizer_bpe_session both run it: the text is cut into characters
// (UTF-8 sequences) held in a doubly linked list; every adjacent pair the vocabulary knows is queued with
// its priority; the best pair is merged (its left piece absorbs the right one), and the new piece's pairs
// with its neighbours are queued; stale entries (a side merged away or grown since) are skipped.
//
// What differs between the two is the priority and its direction (BPE: the lowest merge rank first; SPM:
// the highest token score first) and what a final piece becomes (each file's own fallback), so those stay
// with the callers. Among equal priorities the leftmost pair merges first in both.
#pragma once

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string_view>
#include <vector>

#include "core/tokenizer/utf8.h"

namespace car::tokenizer::merge {

// One piece of the text; merged pieces absorb their right neighbour (which keeps n == 0 afterwards).
// Pieces form a doubly linked list in text order through prev/next (-1 at the ends).
struct Symbol {
  int prev;
  int next;
  size_t offset;  // into the text
  size_t n;       // bytes; 0 once merged away
};

// One Symbol per UTF-8 character of `text` (a truncated last sequence is one short character).
inline std::vector<Symbol> split_characters(std::string_view text) {
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_seq_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{index - 1, off + len == text.size() ? -1 : index + 1, off, len});
    off += len;
  }
  return symbols;
}

// Merges `symbols` (from split_characters, not empty) until no known pair is left.
// `priority(l, r, p)` says whether the pair l|r may merge and gives its priority p; `first(a, b)` is true
// when priority a merges before priority b.
template <typename Priority, typename PairPriority, typename First>
void merge_pairs(std::vector<Symbol>& symbols, PairPriority priority, First first) {
  struct Bigram {
    int left;
    int right;
    Priority priority;
    size_t size;  // bytes of left + right when queued; a mismatch later means the entry is stale
  };
  // The queue's top is the pair that merges first; among equal priorities the leftmost pair.
  const auto order = [&first](const Bigram& l, const Bigram& r) {
    return first(r.priority, l.priority) || (l.priority == r.priority && l.left > r.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(order)> queue(order);
  auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    Priority p{};
    if (!priority(l, r, p)) return;
    queue.push(Bigram{left, right, p, l.n + r.n});
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
}

// Calls `piece(text_of_piece)` for each piece left after merge_pairs, in text order.
template <typename Piece>
void for_each_piece(const std::vector<Symbol>& symbols, std::string_view text, Piece piece) {
  for (int i = 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    piece(text.substr(s.offset, s.n));
  }
}

}  // namespace car::tokenizer::merge

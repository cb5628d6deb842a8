#include "core/tokenizer/spm.h"

#include <algorithm>
#include <queue>

#include "core/tokenizer/utf8.h"

namespace car::tokenizer {
namespace {

// One piece of the text; merged pieces absorb their right neighbour (which keeps n == 0 afterwards).
// Pieces form a doubly linked list in text order through prev/next (-1 at the ends).
struct Symbol {
  int prev;
  int next;
  size_t offset;  // into the text
  size_t n;       // bytes; 0 once merged away
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;  // bytes of left + right when queued; a mismatch later means the entry is stale
};

struct BigramOrder {
  // Highest score first; among equal scores the leftmost pair.
  bool operator()(const Bigram& l, const Bigram& r) const {
    return l.score < r.score || (l.score == r.score && l.left > r.left);
  }
};

}  // namespace

namespace {

// The merge loop over one stretch of text.
void encode_segment(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out) {
  if (text.empty()) return;
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_seq_len(static_cast<uint8_t>(text[off])), text.size() - off);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back(Symbol{index - 1, off + len == text.size() ? -1 : index + 1, off, len});
    off += len;
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const size_t size = l.n + r.n;
    const int32_t id = vocab.find(text.substr(l.offset, size));
    if (id == kNoToken) return;
    queue.push(Bigram{left, right, vocab.tokens[static_cast<size_t>(id)].score, size});
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

  for (int i = 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& s = symbols[static_cast<size_t>(i)];
    const std::string_view piece = text.substr(s.offset, s.n);
    const int32_t id = vocab.find(piece);
    if (id != kNoToken) {
      out.push_back(id);
      continue;
    }
    for (char c : piece) {
      const int32_t byte_id = vocab.byte_token[static_cast<uint8_t>(c)];
      if (byte_id != kNoToken) {
        out.push_back(byte_id);
      } else if (vocab.unk != kNoToken) {
        out.push_back(vocab.unk);
      }
    }
  }
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

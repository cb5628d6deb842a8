// The embedded SentencePiece vocabulary of synthetic models (see synth_model.h).
//
// Layout: <unk> (UNKNOWN), <s>, </s> (CONTROL), <0x00>..<0xFF> (BYTE), then NORMAL pieces: "▁", single
// characters, common English words with "▁" (each preceded by all of its prefixes, so SentencePiece's
// pairwise merges can always reach the whole word), common suffixes, and generated letter pairs/triples to
// fill the requested size. Scores descend with rank (earlier pieces merge first); specials and bytes score 0.
#include <cstdio>
#include <string>
#include <unordered_set>

#include "core/synth/synth_model.h"

namespace car::synth {
namespace {

constexpr const char* kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's word-boundary mark

constexpr const char* kWords[] = {
    "the", "a", "and", "to", "of", "in", "is", "was", "it", "he", "she", "you", "that", "for", "on", "with",
    "as", "his", "her", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by", "but", "not",
    "what", "all", "were", "we", "when", "your", "can", "said", "there", "an", "each", "which", "do", "how",
    "their", "if", "will", "up", "other", "about", "out", "many", "then", "them", "so", "some", "would",
    "make", "like", "him", "into", "time", "has", "look", "two", "more", "go", "see", "no", "way", "could",
    "my", "than", "first", "been", "who", "now", "day", "did", "get", "come", "made", "may", "once", "upon",
    "little", "girl", "boy", "happy", "big", "play", "friend", "mom", "dog", "cat", "sun", "tree", "ball",
    "saw", "very", "wanted", "went", "Lily", "Tim", "Hello", "world", "The", "I", "A", "He", "She", "It",
    "They", "One", "Once", "day", "fun", "good", "new", "old", "red", "blue", "help", "love", "home"};

constexpr const char* kSuffixes[] = {"ing", "ed", "er", "es", "ly", "s", "th", "he", "in", "an", "re", "on",
                                     "en", "at", "nd", "st", "or", "ou", "it", "is", "ll", "ay", "ar", "al"};

class Builder {
 public:
  explicit Builder(uint32_t n_vocab) : n_vocab_(n_vocab) {}

  bool full() const { return v_.tokens.size() >= n_vocab_; }

  void special(const std::string& piece, int32_t type) {
    v_.tokens.push_back(piece);
    v_.scores.push_back(0.0f);
    v_.token_types.push_back(type);
    seen_.insert(piece);
  }

  void normal(const std::string& piece) {
    if (full() || !seen_.insert(piece).second) return;
    v_.tokens.push_back(piece);
    v_.scores.push_back(-static_cast<float>(rank_++));
    v_.token_types.push_back(1);
  }

  /// A word and, first, every prefix of it (at character boundaries; the words are ASCII).
  void word_with_prefixes(const std::string& w) {
    for (size_t len = 1; len <= w.size(); ++len) normal(kSpace + w.substr(0, len));
  }

  SynthVocab take() { return std::move(v_); }

 private:
  uint32_t n_vocab_;
  uint32_t rank_ = 0;
  SynthVocab v_;
  std::unordered_set<std::string> seen_;
};

}  // namespace

SynthVocab make_synth_vocab(uint32_t n_vocab) {
  Builder b(n_vocab);
  b.special("<unk>", 2);
  b.special("<s>", 3);
  b.special("</s>", 3);
  for (int i = 0; i < 256; ++i) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", i);
    b.special(buf, 6);
  }
  b.normal(kSpace);
  for (char c = 'a'; c <= 'z'; ++c) b.normal(std::string(1, c));
  for (char c = 'A'; c <= 'Z'; ++c) b.normal(std::string(1, c));
  for (char c = '0'; c <= '9'; ++c) b.normal(std::string(1, c));
  for (char c : std::string(".,!?'\"-:;()")) b.normal(std::string(1, c));
  for (const char* w : kWords) b.word_with_prefixes(w);
  for (const char* s : kSuffixes) b.normal(s);
  // Fill: letter pairs with and without the word mark, then triples, until the vocabulary is full.
  for (char x = 'a'; x <= 'z' && !b.full(); ++x) {
    for (char y = 'a'; y <= 'z' && !b.full(); ++y) {
      b.normal(std::string{x, y});
      b.normal(kSpace + std::string{x, y});
    }
  }
  for (char x = 'a'; x <= 'z' && !b.full(); ++x) {
    for (char y = 'a'; y <= 'z' && !b.full(); ++y) {
      for (char z = 'a'; z <= 'z' && !b.full(); ++z) {
        b.normal(std::string{x, y, z});
        b.normal(kSpace + std::string{x, y, z});
      }
    }
  }
  // Beyond ~37k pieces: numbered fillers (still unique, still valid pieces).
  for (uint64_t i = 0; !b.full(); ++i) b.normal("<fill" + std::to_string(i) + ">");
  return b.take();
}

}  // namespace car::synth

// Tokenizer: text <-> token ids for a GGUF vocabulary, exact against llama.cpp's llama_tokenize /
// llama_token_to_piece / llama_detokenize.
//
// Three models: SentencePiece-style (`llama`: score-driven merges, byte fallback, space prefix, U+2581 for
// spaces), byte-level BPE (`gpt2`: a pre-tokenizer regex sequence chosen by `tokenizer.ggml.pre`, then
// rank-driven merges) and WordPiece (`bert`). Before any of them, special-token text is cut out of the raw
// text (longest token first): CONTROL and UNKNOWN tokens only when `parse_special` is set (keep it off for
// text from untrusted users), USER_DEFINED tokens always, as llama.cpp does.
//
// Decoding: token_to_piece() gives one token's bytes, which may end inside a UTF-8 character (byte tokens,
// byte-level BPE pieces); StreamDecoder turns a token stream into text that never contains a broken
// character (it holds back an incomplete tail; invalid bytes become U+FFFD).
//
// Ownership and threads: from_gguf() copies what it needs, so the GgufFile may be dropped afterwards. A
// Tokenizer is immutable; every const method may be called from many threads at once. A StreamDecoder is
// one stream's state: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/vocab.h"
#include "core/util/result.h"

namespace car::tokenizer {

class Tokenizer {
 public:
  /// Builds the tokenizer from a file's `tokenizer.ggml.*` metadata. Errors (code "tokenizer_*" or the GGUF
  /// reader's type errors) name the key: missing vocabulary, unknown model, unknown pre-tokenizer, arrays
  /// of mismatched length, missing merges for BPE.
  static Result<std::shared_ptr<const Tokenizer>> from_gguf(const gguf::GgufFile& file);

  /// Token ids of `text` (any bytes; malformed UTF-8 is handled as llama.cpp does). `add_special` adds
  /// BOS / EOS (and BERT's CLS / SEP) as the vocabulary asks; `parse_special` lets text such as "<s>" or
  /// "<|im_end|>" become its CONTROL token.
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

  /// One token's bytes. With `special` false, CONTROL and UNKNOWN tokens give "". Unknown ids give "".
  std::string token_to_piece(int32_t id, bool special) const;

  /// The text of a sequence, as llama_detokenize: the SentencePiece space prefix is removed from the first
  /// piece, `remove_special` drops a leading BOS / trailing EOS the vocabulary adds, `unparse_special`
  /// renders CONTROL tokens as their text, and vocabularies with clean-up remove spaces before . , ! ? and
  /// some contractions. The result is raw bytes (may be invalid UTF-8 for arbitrary ids).
  std::string decode(std::span<const int32_t> ids, bool remove_special = false,
                     bool unparse_special = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(vocab_.tokens.size()); }
  VocabType type() const { return vocab_.type; }
  const std::string& model_name() const { return vocab_.model_name; }
  const std::string& pre_name() const { return vocab_.pre_name; }

  int32_t bos() const { return vocab_.bos; }  ///< kNoToken (-1) when unset
  int32_t eos() const { return vocab_.eos; }
  int32_t eot() const { return vocab_.eot; }
  int32_t unk() const { return vocab_.unk; }
  int32_t pad() const { return vocab_.pad; }
  int32_t sep() const { return vocab_.sep; }
  bool add_bos() const { return vocab_.add_bos; }
  bool add_eos() const { return vocab_.add_eos; }
  /// End-of-generation: EOS, EOT, EOM and the tokens llama.cpp recognises by text (<|im_end|>, ...).
  bool is_eog(int32_t id) const;
  bool is_control(int32_t id) const { return (vocab_.attr(id) & kAttrControl) != 0; }
  /// The stored text of a token ("" for an invalid id), its score and its TokenAttr bits.
  std::string_view token_text(int32_t id) const;
  float token_score(int32_t id) const;
  uint32_t token_attr(int32_t id) const { return vocab_.attr(id); }
  /// The id whose stored text is exactly `text`, or kNoToken.
  int32_t find_token(std::string_view text) const { return vocab_.find(text); }

  const Vocab& vocab() const { return vocab_; }

 private:
  explicit Tokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}
  void encode_fragment(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;
  std::string piece(int32_t id, bool special, bool strip_leading_space) const;

  Vocab vocab_;
  std::shared_ptr<const Pretokenizer> pretokenizer_;  // BPE only
};

/// Streams token pieces as text that is always valid UTF-8: bytes of a character split across tokens are
/// held back until it completes; bytes that can never form a character become U+FFFD.
class StreamDecoder {
 public:
  /// `special`: render CONTROL tokens as their text (as token_to_piece(id, true)).
  explicit StreamDecoder(std::shared_ptr<const Tokenizer> tokenizer, bool special = false);

  /// Appends one token; returns the text completed by it (possibly empty).
  std::string push(int32_t id);
  /// Appends raw bytes (e.g. a piece obtained elsewhere); returns the completed text.
  std::string push_bytes(std::string_view bytes);
  /// Ends the stream: whatever is held back, as U+FFFD. The decoder can then start a new stream.
  std::string finish();
  /// Bytes currently held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  std::shared_ptr<const Tokenizer> tokenizer_;
  bool special_;
  std::string pending_;  // an incomplete but so far valid UTF-8 sequence
};

}  // namespace car::tokenizer

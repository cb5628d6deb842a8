// Pretokenizer: splits text into words with the regex sequence of a BPE vocabulary's `tokenizer.ggml.pre`.
//
// Each pre-tokenizer type is an ordered list of regexes (the lists llama.cpp's llm_tokenizer_bpe uses, which
// reproduce the Hugging Face tokenizers' Split(..., Isolated) sequences). Splitting applies them in order:
// the first regex splits the whole text; each later regex splits every piece the previous ones produced,
// matching inside that piece alone (so `$` and lookaheads see the piece's end). Within a piece, each match
// becomes a word and so does each non-empty stretch between matches. Regexes run in PCRE2 with UTF and
// Unicode properties (UCP) and are JIT-compiled when PCRE2 supports it.
//
// Malformed input follows llama.cpp: the text is decoded leniently (utf8.h) and each word is the UTF-8
// re-encoding of its code points, so invalid bytes reach the merger as U+FFFD.
//
// Immutable after create(); split() is const and safe to call from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/result.h"

namespace car::tokenizer {

/// The pre-tokenizer families llama.cpp distinguishes (only those with different regexes or flags).
enum class PreType {
  default_pre,
  llama3,
  deepseek_llm,
  deepseek_coder,
  falcon,
  mpt,
  starcoder,
  gpt2,
  refact,
  command_r,
  qwen2,
  stablelm2,
  olmo,
  dbrx,
  smaug,
  poro,
  bloom,
  gpt3_finnish,
  viking,
  jais,
  smollm,
  codeshell,
  exaone,
  minerva,
  chatglm4,
  tekken,
  chameleon,
  gpt4o,
  trillion,
  granite_docling,
};

/// What a `tokenizer.ggml.pre` name selects: the family and the vocabulary flags it implies.
struct PreTypeInfo {
  PreType type = PreType::default_pre;
  bool clean_spaces = true;  ///< detokenizer removes spaces before punctuation (clean_up_tokenization_spaces)
  bool ignore_merges = false;  ///< a whole word found in the vocabulary is one token without merging
  bool force_add_bos = false;  ///< the family always adds BOS unless the file says otherwise
};

/// Maps a `tokenizer.ggml.pre` value to its family; an empty name is `default`. Error code
/// "tokenizer_unknown_pre" names an unknown value.
Result<PreTypeInfo> pre_type_from_name(std::string_view name);

/// The regexes (PCRE2 syntax) of one family, in application order.
std::vector<std::string> pre_type_regexes(PreType type);

class Pretokenizer {
 public:
  /// Compiles the regexes. Error code "tokenizer_bad_regex" names the pattern and PCRE2's message.
  static Result<std::shared_ptr<const Pretokenizer>> create(const std::vector<std::string>& patterns);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  /// The words of `text` (UTF-8, not yet byte-encoded), in order; their concatenation is the leniently
  /// re-encoded text.
  std::vector<std::string> split(std::string_view text) const;

 private:
  struct Regex;
  Pretokenizer() = default;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace car::tokenizer

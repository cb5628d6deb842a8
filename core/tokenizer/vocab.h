// Vocab: the tokenizer data of a GGUF file, validated, with lookup structures built once.
//
// Read from the `tokenizer.ggml.*` keys: model (llama = SentencePiece, gpt2 = byte-level BPE, bert =
// WordPiece), pre, tokens, scores, token_type, merges, the special-token ids, add_bos_token / add_eos_token /
// add_sep_token, add_space_prefix and normalizer.lowercase / normalizer.strip_accents. Defaults and
// overrides follow llama.cpp's llama_vocab::load so that tokenization matches it: per-model default special
// ids, per-pre-tokenizer flags, ids out of range ignored (0xFFFFFFFF means unset), control-looking tokens
// (<|eot_id|>, <|im_end|>, </s>, ...) given the CONTROL bit and collected as end-of-generation tokens,
// duplicate token texts resolved to the last id.
//
// The file is untrusted: wrong types, length mismatches between arrays and unknown models or pre-tokenizers
// are errors (code "tokenizer_*", naming the key). Immutable after load(); safe to share across threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/string_table.h"
#include "core/util/result.h"

namespace car::tokenizer {

enum class VocabType { spm, bpe, wpm };

/// Per-token attributes (a bit set), as llama.cpp's llama_token_attr.
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrNormalized = 1u << 6,
  kAttrLstrip = 1u << 7,  ///< matching as special text swallows whitespace on the left
  kAttrRstrip = 1u << 8,  ///< ... and on the right
  kAttrSingleWord = 1u << 9,
};

inline constexpr int32_t kNoToken = -1;

struct TokenData {
  std::string text;
  float score = 0.0f;
  uint32_t attr = kAttrNormal;
};

/// WordPiece (BERT) normaliser options: tokenizer.ggml.normalizer.lowercase and .strip_accents, both true
/// when absent; strip_accents follows lowercase when only lowercase is given (as Hugging Face's
/// BertNormalizer and llama.cpp do).
struct WordPieceOptions {
  bool lowercase = true;
  bool strip_accents = true;
};

struct Vocab {
  VocabType type = VocabType::spm;
  std::string model_name;  ///< tokenizer.ggml.model
  std::string pre_name;    ///< tokenizer.ggml.pre ("" when absent)
  PreTypeInfo pre;         ///< meaningful for BPE only

  std::vector<TokenData> tokens;  ///< by id
  StringTable token_to_id;        ///< text -> id (the last id for duplicated texts)
  size_t max_token_len = 0;       ///< longest token text in bytes

  /// BPE merge ranks keyed by "left right" (the merge line itself); the first occurrence wins.
  StringTable merge_rank;

  int32_t bos = kNoToken, eos = kNoToken, eot = kNoToken, eom = kNoToken, unk = kNoToken, sep = kNoToken,
          pad = kNoToken, mask = kNoToken;
  int32_t fim_pre = kNoToken, fim_suf = kNoToken, fim_mid = kNoToken, fim_pad = kNoToken, fim_rep = kNoToken,
          fim_sep = kNoToken;
  bool add_bos = false, add_eos = false, add_sep = false;
  bool add_space_prefix = false;  ///< SPM: prefix raw text with a space (and strip it when decoding)
  bool clean_spaces = false;      ///< detokenizer clean-up of " ." " ," " 's" ...
  bool ignore_merges = false;
  WordPieceOptions wpm;  ///< meaningful for WordPiece only
  /// SPM: no token contains U+2581 right after another character, so text may be merged in pieces cut
  /// before each U+2581 that follows a non-U+2581 character (spm.cpp); an optimisation, same result.
  bool spm_split_at_spaces = false;

  /// Control, user-defined and unknown tokens, longest text first (ties: lower id first): the order in
  /// which special text is matched.
  std::vector<int32_t> special_tokens;
  std::vector<int32_t> eog_ids;  ///< sorted

  /// SPM byte fallback: the id of <0xNN> (or of the single-byte token), kNoToken when the vocabulary has
  /// none.
  int32_t byte_token[256];

  static Result<Vocab> load(const gguf::GgufFile& file);

  int32_t find(std::string_view text) const { return token_to_id.find(text); }
  bool valid(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < tokens.size(); }
  uint32_t attr(int32_t id) const {
    return valid(id) ? tokens[static_cast<size_t>(id)].attr : kAttrUndefined;
  }
};

}  // namespace car::tokenizer

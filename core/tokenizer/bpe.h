// Byte-level BPE encoding of one pre-tokenized word, as llama.cpp's llm_tokenizer_bpe_session.
//
// The word (UTF-8; byte-encoded here through utf8.h's byte_to_unicode) is split into characters; then,
// repeatedly, the adjacent pair with the lowest merge rank is merged (ties: the leftmost pair). Each final
// piece is its token, or (when the vocabulary lacks it) the tokens of its single bytes that exist. With
// `ignore_merges` (llama-bpe, tekken) a word that is itself a token is emitted whole.
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tokenizer/vocab.h"

namespace car::tokenizer {

void bpe_encode_word(const Vocab& vocab, std::string_view word, std::vector<int32_t>& out);

}  // namespace car::tokenizer

// SentencePiece-style encoding of one raw-text fragment, as llama.cpp's llm_tokenizer_spm.
//
// The text (already space-prefixed and with ' ' escaped to U+2581 by the caller) is split into UTF-8
// characters by lead byte; then, repeatedly, the adjacent pair whose concatenation is a vocabulary token
// with the highest score is merged (ties: the leftmost pair). Each final piece is its token or, when it
// is none, one byte-fallback token <0xNN> per byte (the unknown token if the vocabulary lacks that byte).
// Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "core/tokenizer/vocab.h"

namespace car::tokenizer {

void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out);

}  // namespace car::tokenizer

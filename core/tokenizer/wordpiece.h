// WordPiece (BERT) encoding of one raw-text fragment, as llama.cpp's llm_tokenizer_wpm.
//
// Normalisation, as llama.cpp's BERT normaliser (the options come from the vocabulary, WordPieceOptions):
// with strip_accents, each code point is replaced by the first code point of its NFD decomposition and
// combining marks (\p{M}) are dropped, so a precomposed "é" and "e" + U+0301 both become "e"; with
// lowercase, code points are lower-cased; whitespace separates words; NUL, U+FFFD and control characters
// are dropped; punctuation, ASCII symbols and CJK ideographs become single-character words. Each word,
// prefixed with U+2581 (the GGUF converter marks word-initial pieces that way and strips BERT's "##"), is
// covered by greedy longest-match tokens; a word that cannot be fully covered becomes the unknown token.
// Unicode properties come from ICU. Stateless; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/tokenizer/vocab.h"

namespace car::tokenizer {

/// The normalised words of `text` (exposed for tests).
std::vector<std::string> wordpiece_words(std::string_view text, const WordPieceOptions& options = {});

void wordpiece_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out);

}  // namespace car::tokenizer

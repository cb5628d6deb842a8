// Test helper: the vocabulary arrays the tests write into their GGUF files (tokenizer.ggml.tokens / scores /
// token_type), and the SentencePiece layout they share: <unk> <s> </s>, then the 256 byte-fallback tokens
// <0x00>..<0xFF> (ids 3..258), then each test's own pieces.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "core/gguf/gguf_writer.h"

namespace car::testing {

/// llama.cpp's token types (tokenizer.ggml.token_type).
inline constexpr int32_t kTokNormal = 1, kTokUnknown = 2, kTokControl = 3, kTokUserDefined = 4, kTokByte = 6;

struct VocabToken {
  std::string text;
  float score;
  int32_t type;
};

/// <unk> (id 0), <s> (1), </s> (2) and the byte tokens <0x00>..<0xFF> (3..258), all with score 0.
inline std::vector<VocabToken> spm_byte_fallback_tokens() {
  std::vector<VocabToken> t = {{"<unk>", 0, kTokUnknown}, {"<s>", 0, kTokControl}, {"</s>", 0, kTokControl}};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    t.push_back({buf, 0, kTokByte});
  }
  return t;
}

/// Writes `tokens` as the three vocabulary arrays.
inline void set_vocab_tokens(gguf::GgufWriter& w, const std::vector<VocabToken>& tokens) {
  gguf::ArrayValue texts{gguf::ValueType::STRING, {}}, scores{gguf::ValueType::FLOAT32, {}},
      types{gguf::ValueType::INT32, {}};
  for (const VocabToken& t : tokens) {
    texts.items.push_back(gguf::Value{t.text});
    scores.items.push_back(gguf::Value{t.score});
    types.items.push_back(gguf::Value{t.type});
  }
  w.set_array("tokenizer.ggml.tokens", std::move(texts));
  w.set_array("tokenizer.ggml.scores", std::move(scores));
  w.set_array("tokenizer.ggml.token_type", std::move(types));
}

}  // namespace car::testing

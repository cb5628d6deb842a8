// What a GGUF file holds, summarized for people: architecture, parameter count, quantization by name,
// context length, vocabulary, experts, chat template. Read from the header alone (no tensor data).
//
// Used by `car show` and `car gguf inspect`; pure functions over a parsed GgufFile, thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/gguf/gguf_file.h"

namespace car::gguf {

/// llama.cpp's name for a `general.file_type` value (its llama_ftype enum: 15 -> "Q4_K_M", 0 -> "F32"),
/// with " (guessed)" when the guessed flag (1024) is set; nullopt for a value it never assigned.
std::optional<std::string> file_type_name(uint64_t file_type);

/// The name of a `tokenizer.ggml.token_type` value (1 -> "normal", 3 -> "control", ...), or nullopt.
std::optional<std::string_view> token_type_name(int64_t token_type);

struct ModelInfo {
  std::string architecture;                  ///< general.architecture ("" when absent)
  std::string name;                          ///< general.name ("" when absent)
  uint64_t parameters = 0;                   ///< elements of every tensor
  std::optional<uint64_t> file_type;         ///< general.file_type
  std::string quantization;                  ///< file_type_name, else the tensor type holding the most bytes
  std::optional<uint64_t> context_length;    ///< <arch>.context_length
  std::optional<uint64_t> embedding_length;  ///< <arch>.embedding_length
  std::optional<uint64_t> block_count;       ///< <arch>.block_count
  std::optional<uint64_t> vocab_size;        ///< tokenizer.ggml.tokens' length (else <arch>.vocab_size)
  std::string tokenizer_model;               ///< tokenizer.ggml.model
  std::optional<uint64_t> expert_count;      ///< <arch>.expert_count (MoE models)
  std::optional<uint64_t> expert_used_count;
  bool has_chat_template = false;  ///< tokenizer.chat_template present
  uint64_t file_bytes = 0;
  uint64_t tensor_bytes = 0;
  /// Bytes per tensor type, largest first: ("Q4_K", 123), ...
  std::vector<std::pair<std::string, uint64_t>> bytes_by_type;
};

ModelInfo describe_model(const GgufFile& file);

/// "3.81 M", "6.74 B": a count with an SI suffix and three significant figures.
std::string format_count(uint64_t n);

}  // namespace car::gguf

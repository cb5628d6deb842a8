// describe_model and the enum names: facts from llama.cpp's llama_ftype and llama_token_type enums.
#include "core/gguf/model_info.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/gguf/ggml_type.h"

namespace car::gguf {
namespace {

struct FileTypeName {
  uint64_t value;
  std::string_view name;
};

// llama_ftype values (4, 5 and 6 were retired formats; 33-35 were never written by llama-quantize).
constexpr FileTypeName kFileTypes[] = {
    {0, "F32"},     {1, "F16"},     {2, "Q4_0"},       {3, "Q4_1"},    {7, "Q8_0"},     {8, "Q5_0"},
    {9, "Q5_1"},    {10, "Q2_K"},   {11, "Q3_K_S"},    {12, "Q3_K_M"}, {13, "Q3_K_L"},  {14, "Q4_K_S"},
    {15, "Q4_K_M"}, {16, "Q5_K_S"}, {17, "Q5_K_M"},    {18, "Q6_K"},   {19, "IQ2_XXS"}, {20, "IQ2_XS"},
    {21, "Q2_K_S"}, {22, "IQ3_XS"}, {23, "IQ3_XXS"},   {24, "IQ1_S"},  {25, "IQ4_NL"},  {26, "IQ3_S"},
    {27, "IQ3_M"},  {28, "IQ2_S"},  {29, "IQ2_M"},     {30, "IQ4_XS"}, {31, "IQ1_M"},   {32, "BF16"},
    {36, "TQ1_0"},  {37, "TQ2_0"},  {38, "MXFP4_MOE"},
};
constexpr uint64_t kGuessedFlag = 1024;

std::optional<uint64_t> uint_key(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  if (v == nullptr) return std::nullopt;
  const auto i = v->as_int();
  if (!i || *i < 0) return std::nullopt;
  return static_cast<uint64_t>(*i);
}

std::string string_key(const GgufFile& f, const std::string& key) {
  const Value* v = f.find(key);
  if (v == nullptr) return {};
  const auto* s = v->get_if<std::string>();
  return s != nullptr ? *s : std::string();
}

}  // namespace

std::optional<std::string> file_type_name(uint64_t file_type) {
  const bool guessed = (file_type & kGuessedFlag) != 0;
  const uint64_t base = file_type & ~kGuessedFlag;
  for (const auto& ft : kFileTypes) {
    if (ft.value == base) return std::string(ft.name) + (guessed ? " (guessed)" : "");
  }
  return std::nullopt;
}

std::optional<std::string_view> token_type_name(int64_t token_type) {
  switch (token_type) {
    case 0:
      return "undefined";
    case 1:
      return "normal";
    case 2:
      return "unknown";
    case 3:
      return "control";
    case 4:
      return "user_defined";
    case 5:
      return "unused";
    case 6:
      return "byte";
    default:
      return std::nullopt;
  }
}

ModelInfo describe_model(const GgufFile& file) {
  ModelInfo info;
  info.architecture = string_key(file, "general.architecture");
  info.name = string_key(file, "general.name");
  info.file_type = uint_key(file, "general.file_type");
  info.file_bytes = file.file_size();
  const std::string& a = info.architecture;
  if (!a.empty()) {
    info.context_length = uint_key(file, a + ".context_length");
    info.embedding_length = uint_key(file, a + ".embedding_length");
    info.block_count = uint_key(file, a + ".block_count");
    info.expert_count = uint_key(file, a + ".expert_count");
    info.expert_used_count = uint_key(file, a + ".expert_used_count");
  }
  if (const Value* tokens = file.find("tokenizer.ggml.tokens")) {
    if (const auto* arr = tokens->get_if<ArrayValue>()) info.vocab_size = arr->items.size();
  }
  if (!info.vocab_size && !a.empty()) info.vocab_size = uint_key(file, a + ".vocab_size");
  info.tokenizer_model = string_key(file, "tokenizer.ggml.model");
  info.has_chat_template = file.has("tokenizer.chat_template");

  std::map<std::string, uint64_t> by_type;
  for (const auto& t : file.tensors()) {
    info.parameters += t.n_elements;
    info.tensor_bytes += t.n_bytes;
    by_type[std::string(ggml_type_name(t.type))] += t.n_bytes;
  }
  info.bytes_by_type.assign(by_type.begin(), by_type.end());
  std::stable_sort(info.bytes_by_type.begin(), info.bytes_by_type.end(),
                   [](const auto& x, const auto& y) { return x.second > y.second; });
  if (info.file_type) {
    if (auto n = file_type_name(*info.file_type)) info.quantization = *n;
  }
  if (info.quantization.empty() && !info.bytes_by_type.empty())
    info.quantization = info.bytes_by_type.front().first;
  return info;
}

std::string format_count(uint64_t n) {
  static constexpr std::pair<double, const char*> kUnits[] = {
      {1e12, "T"}, {1e9, "B"}, {1e6, "M"}, {1e3, "K"}};
  for (const auto& [scale, suffix] : kUnits) {
    if (static_cast<double>(n) >= scale) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.3g %s", static_cast<double>(n) / scale, suffix);
      return buf;
    }
  }
  return std::to_string(n);
}

}  // namespace car::gguf

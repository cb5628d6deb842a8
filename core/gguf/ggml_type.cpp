#include "core/gguf/ggml_type.h"

#include <cctype>
#include <string>

namespace car {

std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id) {
  for (const auto& t : kGgmlTypes) {
    if (static_cast<uint32_t>(t.type) == id) return t;
  }
  return std::nullopt;
}

std::optional<GgmlType> ggml_type_from_name(std::string_view name) {
  std::string upper(name);
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const auto& t : kGgmlTypes) {
    if (t.name == upper) return t.type;
  }
  return std::nullopt;
}

std::optional<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n) {
  const auto& t = ggml_traits(type);
  if (n % t.block_size != 0) return std::nullopt;
  return n / t.block_size * t.bytes_per_block;
}

}  // namespace car

// ggml tensor type ids as stored in GGUF tensor infos, with each type's block geometry.
//
// The table covers every id ggml has assigned (including ones the kernels cannot compute), so a reader can
// size and inspect any file. Ids that ggml retired (4, 5, 31-33, 36-38) are unknown here.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

namespace car {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22, IQ4_XS = 23,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;      ///< ggml's name: "F32", "Q4_K", ...
  uint32_t block_size;        ///< elements per block
  uint32_t bytes_per_block;   ///< bytes per block on disk
};

/// The one block-geometry table: every type's block size and bytes per block, per ggml's ggml-common.h block
/// structs (QK_K = 256). core/tensor's block structs and QK constants are static_assert'ed against it and its
/// kernels read their geometry from it.
inline constexpr std::array<GgmlTypeTraits, 32> kGgmlTypes{{
    {GgmlType::F32, "F32", 1, 4},          {GgmlType::F16, "F16", 1, 2},
    {GgmlType::Q4_0, "Q4_0", 32, 18},      {GgmlType::Q4_1, "Q4_1", 32, 20},
    {GgmlType::Q5_0, "Q5_0", 32, 22},      {GgmlType::Q5_1, "Q5_1", 32, 24},
    {GgmlType::Q8_0, "Q8_0", 32, 34},      {GgmlType::Q8_1, "Q8_1", 32, 36},
    {GgmlType::Q2_K, "Q2_K", 256, 84},     {GgmlType::Q3_K, "Q3_K", 256, 110},
    {GgmlType::Q4_K, "Q4_K", 256, 144},    {GgmlType::Q5_K, "Q5_K", 256, 176},
    {GgmlType::Q6_K, "Q6_K", 256, 210},    {GgmlType::Q8_K, "Q8_K", 256, 292},
    {GgmlType::IQ2_XXS, "IQ2_XXS", 256, 66}, {GgmlType::IQ2_XS, "IQ2_XS", 256, 74},
    {GgmlType::IQ3_XXS, "IQ3_XXS", 256, 98}, {GgmlType::IQ1_S, "IQ1_S", 256, 50},
    {GgmlType::IQ4_NL, "IQ4_NL", 32, 18},  {GgmlType::IQ3_S, "IQ3_S", 256, 110},
    {GgmlType::IQ2_S, "IQ2_S", 256, 82},   {GgmlType::IQ4_XS, "IQ4_XS", 256, 136},
    {GgmlType::I8, "I8", 1, 1},            {GgmlType::I16, "I16", 1, 2},
    {GgmlType::I32, "I32", 1, 4},          {GgmlType::I64, "I64", 1, 8},
    {GgmlType::F64, "F64", 1, 8},          {GgmlType::IQ1_M, "IQ1_M", 256, 56},
    {GgmlType::BF16, "BF16", 1, 2},        {GgmlType::TQ1_0, "TQ1_0", 256, 54},
    {GgmlType::TQ2_0, "TQ2_0", 256, 66},   {GgmlType::MXFP4, "MXFP4", 32, 17},
}};

/// Traits for a raw id from a file, or nullopt for an id ggml never assigned / retired.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);
/// Traits of a known type (always succeeds; usable in constant expressions).
constexpr const GgmlTypeTraits& ggml_traits(GgmlType type) {
  for (const auto& t : kGgmlTypes) {
    if (t.type == type) return t;
  }
  return kGgmlTypes[0];  // unreachable for valid enumerators
}
inline std::string_view ggml_type_name(GgmlType t) { return ggml_traits(t).name; }
/// Lookup by ggml name ("q4_k" and "Q4_K" both work).
std::optional<GgmlType> ggml_type_from_name(std::string_view name);

/// Bytes of one row of `n` elements; nullopt when n is not a multiple of the block size.
std::optional<uint64_t> ggml_row_bytes(GgmlType t, uint64_t n);

}  // namespace car

// ggml tensor type ids as stored in GGUF tensor infos, with each type's block geometry.
//
// The table covers every id ggml has assigned (including ones the kernels cannot compute), so a reader can
// size and inspect any file. Ids that ggml retired (4, 5, 31-33, 36-38) are unknown here.
#pragma once

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

/// Traits for a raw id from a file, or nullopt for an id ggml never assigned / retired.
std::optional<GgmlTypeTraits> ggml_type_traits(uint32_t id);
/// Traits of a known type (always succeeds).
const GgmlTypeTraits& ggml_traits(GgmlType t);
inline std::string_view ggml_type_name(GgmlType t) { return ggml_traits(t).name; }
/// Lookup by ggml name ("q4_k" and "Q4_K" both work).
std::optional<GgmlType> ggml_type_from_name(std::string_view name);

/// Bytes of one row of `n` elements; nullopt when n is not a multiple of the block size.
std::optional<uint64_t> ggml_row_bytes(GgmlType t, uint64_t n);

}  // namespace car

// Internal to core/tensor: the codebook formats of issue #27's second slice (IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S,
// IQ1_M) decoded one group of 32 elements at a time - the one statement of each block layout (blocks.h) that
// the scalar reference dot products, the dequantizers, the quantizers and the tests read.
//
// Pure functions of the block; no state.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"

namespace car::tensor::detail {

/// Group g (0..7, elements 32g..32g+31) of a codebook block.
struct CodeGroup {
  int8_t v[32];     ///< signed grid values (IQ1_M: -1, 0, 1 without the delta)
  int s[2];         ///< raw scale of each 16-element half (both equal for the 32-element-scale formats)
  int8_t delta[4];  ///< IQ1_M: the delta's sign (+1 / -1) of elements 8l..8l+7; unused otherwise
};

inline int grid_byte(uint64_t point, int j) {
  return static_cast<int>((point >> (8 * j)) & 0xff);
}

inline CodeGroup decode_group(const block_iq3_xxs& b, int g) {
  CodeGroup o{};
  uint32_t aux;
  std::memcpy(&aux, b.qs + QK_K / 4 + 4 * g, 4);
  o.s[0] = o.s[1] = static_cast<int>(aux >> 28);
  for (int k = 0; k < 8; ++k) {
    const uint32_t point = iq3xxs_grid[b.qs[8 * g + k]];
    const uint8_t signs = ksigns_iq2xs(static_cast<int>((aux >> (7 * (k / 2))) & 127));
    for (int j = 0; j < 4; ++j) {
      const int e = 4 * k + j, v = grid_byte(point, j);
      o.v[e] = static_cast<int8_t>((signs >> (e % 8)) & 1 ? -v : v);
    }
  }
  return o;
}

inline CodeGroup decode_group(const block_iq3_s& b, int g) {
  CodeGroup o{};
  o.s[0] = o.s[1] = (b.scales[g / 2] >> (4 * (g % 2))) & 15;
  for (int k = 0; k < 8; ++k) {
    const uint32_t point = iq3s_grid[b.qs[8 * g + k] | (((b.qh[g] >> k) & 1) << 8)];
    for (int j = 0; j < 4; ++j) {
      const int e = 4 * k + j, v = grid_byte(point, j);
      o.v[e] = static_cast<int8_t>((b.signs[4 * g + e / 8] >> (e % 8)) & 1 ? -v : v);
    }
  }
  return o;
}

inline CodeGroup decode_group(const block_iq2_xs& b, int g) {
  CodeGroup o{};
  o.s[0] = b.scales[g] & 15;
  o.s[1] = b.scales[g] >> 4;
  for (int l = 0; l < 4; ++l) {
    const uint16_t q = b.qs[4 * g + l];
    const uint64_t point = iq2xs_grid[q & 511];
    const uint8_t signs = ksigns_iq2xs(q >> 9);
    for (int j = 0; j < 8; ++j) {
      const int v = grid_byte(point, j);
      o.v[8 * l + j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
    }
  }
  return o;
}

inline CodeGroup decode_group(const block_iq2_s& b, int g) {
  CodeGroup o{};
  o.s[0] = b.scales[g] & 15;
  o.s[1] = b.scales[g] >> 4;
  for (int l = 0; l < 4; ++l) {
    const uint64_t point = iq2s_grid[b.qs[4 * g + l] | (((b.qh[g] >> (2 * l)) & 3) << 8)];
    const uint8_t signs = b.qs[QK_K / 8 + 4 * g + l];
    for (int j = 0; j < 8; ++j) {
      const int v = grid_byte(point, j);
      o.v[8 * l + j] = static_cast<int8_t>((signs >> j) & 1 ? -v : v);
    }
  }
  return o;
}

/// IQ1_M's four u16 scale words.
inline void iq1m_scale_words(const block_iq1_m& b, uint16_t sc[4]) {
  std::memcpy(sc, b.scales, 8);
}
/// IQ1_M's super-block scale: the fp16 whose four nibbles are the scale words' top nibbles.
inline ggml_half iq1m_d(const block_iq1_m& b) {
  uint16_t sc[4];
  iq1m_scale_words(b, sc);
  return static_cast<ggml_half>((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) |
                                (sc[3] & 0xf000));
}

inline CodeGroup decode_group(const block_iq1_m& b, int g) {
  CodeGroup o{};
  uint16_t sc[4];
  iq1m_scale_words(b, sc);
  o.s[0] = (sc[g / 2] >> (6 * (g % 2))) & 7;
  o.s[1] = (sc[g / 2] >> (6 * (g % 2) + 3)) & 7;
  for (int l = 0; l < 4; ++l) {
    const int nibble = (b.qh[2 * g + l / 2] >> (4 * (l % 2))) & 15;
    const uint64_t point = iq1s_grid[b.qs[4 * g + l] | ((nibble & 7) << 8)];
    o.delta[l] = static_cast<int8_t>(nibble & 8 ? -1 : 1);
    for (int j = 0; j < 8; ++j) o.v[8 * l + j] = static_cast<int8_t>(grid_byte(point, j));
  }
  return o;
}

}  // namespace car::tensor::detail

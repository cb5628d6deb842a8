// The value tables of the non-linear, microscaling and codebook formats (IQ4_NL, IQ4_XS, MXFP4, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M): the one place their numbers are written (the large grids in
// iq1_grids.cpp, iq2_grids.cpp and iq3_grids.cpp, one file per codebook family). Values per ggml's
// ggml-common.h (kvalues_iq4nl, kvalues_mxfp4, iq2xxs_grid, iq2xs_grid, iq2s_grid, iq3xxs_grid, iq3s_grid,
// ksigns_iq2xs, iq1s_grid) and its E8M0 scale conversion (ggml-impl.h); the kernels (reference and SIMD) and
// the quantizers read them from here.
//
// Plain constant data; no state.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/tensor/blocks.h"

namespace car::tensor {

/// IQ4_NL / IQ4_XS: the 16 levels a nibble selects (a non-uniform grid, denser near zero).
alignas(16) inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                         1,    13,   25,  38,  53,  69,  89,  113};

/// MXFP4: the E2M1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} and their negatives, doubled so they are integers (the
/// block scale is halved to match, e8m0_to_fp32_half). Nibble bit 3 is the sign.
alignas(16) inline constexpr int8_t kvalues_mxfp4[16] = {0, 1,  2,  3,  4,  6,  8,  12,
                                                         0, -1, -2, -3, -4, -6, -8, -12};

/// Q4_0 read as a table format (its nibble q stands for q - 8), so that llama.cpp's repacked order for Q4_0,
/// IQ4_NL and MXFP4 - one template there - is one template here (kernel_table.h repacked()).
alignas(16) inline constexpr int8_t kvalues_q4_0[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

/// 2^(e - 128), the E8M0 exponent e halved, as ggml's GGML_E8M0_TO_FP32_HALF computes it (exact for every e:
/// e 0 and 1 give the subnormals 2^-128 and 2^-127; e 255 gives 2^127, not NaN).
inline float e8m0_to_fp32_half(uint8_t e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

/// IQ2_XXS: 256 points of the E8 lattice's shell, 8 magnitudes each from {8, 25, 43}, one byte per element
/// (element 0 in the low byte). iq2_grids.cpp.
extern const uint64_t iq2xxs_grid[256];

/// IQ1_S / IQ1_M: 2048 ternary points, 8 int8 elements each in {-1, 0, 1} (element 0 in the low byte).
/// iq1_grids.cpp.
extern const uint64_t iq1s_grid[2048];

/// IQ3_XXS: 256 points of 4 elements, magnitudes {4, 12, 20, ..., 52, 62}, one byte per element (element 0 in
/// the low byte). iq3_grids.cpp.
extern const uint32_t iq3xxs_grid[256];

/// IQ3_S: 512 points of 4 elements, odd magnitudes 1..15, one byte per element. iq3_grids.cpp.
extern const uint32_t iq3s_grid[512];

/// IQ2_XS: 512 points of 8 elements, magnitudes {8, 25, 43} (IQ2_XXS's 256 among them). iq2_grids.cpp.
extern const uint64_t iq2xs_grid[512];

/// IQ2_S: 1024 points of 8 elements, magnitudes {8, 25, 43}. iq2_grids.cpp.
extern const uint64_t iq2s_grid[1024];

/// IQ2_XXS / IQ2_XS / IQ3_XXS sign codes: 7 bits give the signs of elements 0..6, the eighth (bit 7) makes the number
/// of negative elements even. Bit j set: element j negated.
inline constexpr uint8_t ksigns_iq2xs(int code) {
  const int parity = __builtin_popcount(static_cast<unsigned>(code) & 127u) & 1;
  return static_cast<uint8_t>((code & 127) | (parity << 7));
}

/// The 128 sign codes as 8 bytes of +1 / -1 each (ksigns_iq2xs expanded, element 0 in the low byte), for the
/// SIMD kernels' psignb.
struct KsignBytes {
  uint64_t v[128];
  constexpr KsignBytes() : v() {
    for (int c = 0; c < 128; ++c) {
      uint64_t r = 0;
      for (int j = 0; j < 8; ++j) r |= static_cast<uint64_t>((ksigns_iq2xs(c) >> j) & 1 ? 0xff : 0x01) << (8 * j);
      v[c] = r;
    }
  }
};
inline constexpr KsignBytes ksign_bytes{};

/// IQ4_XS: the signed 6-bit scale (-32..31) of sub-block ib (0..7) of a super-block.
inline int iq4_xs_scale(const block_iq4_xs& b, int ib) {
  const int lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
  const int hi = (b.scales_h >> (2 * ib)) & 3;
  return (lo | (hi << 4)) - 32;
}

}  // namespace car::tensor

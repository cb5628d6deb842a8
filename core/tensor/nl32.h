// The 32-element table blocks (IQ4_NL, MXFP4; Q4_0 as the table kvalues_q4_0) as the dot kernels of every ISA share them: a block's
// scale, and one block's product in the scalar reference's order (the odd last block of a row, which the
// vector kernels leave to it). Internal linkage, as simd_x86.h: each ISA's file gets its own copy, compiled
// for that ISA.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/tensor/blocks.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/simd_x86.h"

namespace car::tensor::detail {
namespace {

inline float nl32_scale(const block_iq4_nl& b) {
  return h2f(b.d);
}
inline float nl32_scale(const block_q4_0& b) {  // Q4_0 as a table format (kvalues_q4_0)
  return h2f(b.d);
}
inline float nl32_scale(const block_mxfp4& b) {
  return e8m0_to_fp32_half(b.e);
}

/// `sumf` + block x . block y as the reference adds a block: the integer sums of the low and high nibbles'
/// table values, then one fma with the two scales' product.
template <typename Block>
inline float nl32_block(const Block& x, const block_q8_0& y, const int8_t* table, float sumf) {
  const float d = h2f(y.d) * nl32_scale(x);
  int sumi1 = 0, sumi2 = 0;
  for (int j = 0; j < 16; ++j) {
    sumi1 += y.qs[j] * table[x.qs[j] & 0x0f];
    sumi2 += y.qs[j + 16] * table[x.qs[j] >> 4];
  }
  return std::fma(d, static_cast<float>(sumi1 + sumi2), sumf);
}

}  // namespace
}  // namespace car::tensor::detail

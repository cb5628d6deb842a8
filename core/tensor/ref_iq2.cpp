// Scalar reference kernels of the codebook formats IQ2_XXS and IQ1_S: dequantization and the dot products
// against Q8_K (the test oracles of the SIMD kernels). No quantizers: writing them means searching the grid
// against an importance matrix, which is not done here (can_quantize() says no), so these files are read,
// not made.
//
// The dot follows ggml's x86 (AVX2) ggml_vec_dot_iq2_xxs_q8_K: per super-block 8 int32 lanes (lane l:
// elements 4l..4l+3 of each group of 32, each group's sum times its scale 2 * s + 1), converted and
// multiplied by d(x) * d(y) into 8 float lanes by FMA, reduced as hsum_float_8 does, times 0.125.
#include <cassert>
#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

/// Group g (0..7) of a block: its 4 grid indices and the word with the sign codes and the scale.
struct Iq2Group {
  uint32_t grid;   ///< byte l: grid index of elements 8l..8l+7
  uint32_t signs;  ///< bits 7l..7l+6: sign code of elements 8l..; bits 28..31: the group's scale
};
inline Iq2Group iq2_group(const block_iq2_xxs& b, int g) {
  Iq2Group out;
  std::memcpy(&out.grid, b.qs + 4 * g, 4);
  std::memcpy(&out.signs, b.qs + 4 * g + 2, 4);
  return out;
}

/// Element e (0..31) of a group as a signed grid value (magnitude 8, 25 or 43).
inline int iq2_value(const Iq2Group& q, int e) {
  const int l = e / 8, j = e % 8;
  const uint64_t point = iq2xxs_grid[(q.grid >> (8 * l)) & 0xff];
  const int v = static_cast<int>((point >> (8 * j)) & 0xff);
  return (ksigns_iq2xs(static_cast<int>((q.signs >> (7 * l)) & 127)) >> j) & 1 ? -v : v;
}

}  // namespace

bool dequantize_iq2_xxs_ref(const void* src, float* dst, int64_t nb) {
  const auto* x = static_cast<const block_iq2_xxs*>(src);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int g = 0; g < 8; ++g, dst += 32) {
      const Iq2Group q = iq2_group(x[i], g);
      const float db = d * (0.5f + static_cast<float>(q.signs >> 28)) * 0.25f;
      for (int e = 0; e < 32; ++e) dst[e] = db * static_cast<float>(iq2_value(q, e));
    }
  }
  return true;
}

float dot_iq2_xxs_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_iq2_xxs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {};
    for (int g = 0; g < 8; ++g) {
      const Iq2Group q = iq2_group(x[i], g);
      const int ls = 2 * static_cast<int>(q.signs >> 28) + 1;
      const int8_t* q8 = y[i].qs + 32 * g;
      for (int l = 0; l < 8; ++l) {
        int32_t s = 0;
        for (int e = 4 * l; e < 4 * l + 4; ++e) s += iq2_value(q, e) * q8[e];
        lane[l] += ls * s;
      }
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
  }
  const float s0 = acc[4] + acc[0], s1 = acc[5] + acc[1], s2 = acc[6] + acc[2], s3 = acc[7] + acc[3];
  return 0.125f * ((s0 + s2) + (s1 + s3));
}

}  // namespace car::tensor::detail

// ---- IQ1_S ----
//
// The dot follows ggml's x86 (AVX2) ggml_vec_dot_iq1_s_q8_K: per super-block 8 int32 lanes of the grid part
// (lane l: elements 4l..4l+3 of each group, times the group scale 2s + 1), FMA'd by d = d(y) * d(x) into 8
// float lanes; the delta part one int per super-block (sum over groups of (2s + 1) * +-1 * the group's
// activation sum, from bsums) accumulated as acc1 = fma(d, float(that), acc1); the result hsum_float_8(acc)
// + 0.125 * acc1.

namespace car::tensor::detail {
namespace {

/// Grid point of elements 8l..8l+7 of group g.
inline uint64_t iq1s_point(const block_iq1_s& b, int g, int l) {
  return iq1s_grid[b.qs[4 * g + l] | (((b.qh[g] >> (3 * l)) & 7) << 8)];
}
inline int iq1s_elem(uint64_t point, int j) {
  return static_cast<int8_t>((point >> (8 * j)) & 0xff);
}

}  // namespace

bool dequantize_iq1_s_ref(const void* src, float* dst, int64_t nb) {
  const auto* x = static_cast<const block_iq1_s*>(src);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int g = 0; g < 8; ++g) {
      const float dl = d * static_cast<float>(2 * ((x[i].qh[g] >> 12) & 7) + 1);
      const float delta = x[i].qh[g] & 0x8000 ? -IQ1S_DELTA : IQ1S_DELTA;
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint64_t point = iq1s_point(x[i], g, l);
        for (int j = 0; j < 8; ++j) dst[j] = dl * (static_cast<float>(iq1s_elem(point, j)) + delta);
      }
    }
  }
  return true;
}

float dot_iq1_s_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_iq1_s*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  float acc1 = 0.0f;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {};
    int32_t sumi1 = 0;
    for (int g = 0; g < 8; ++g) {
      const int ls = 2 * ((x[i].qh[g] >> 12) & 7) + 1;
      const int8_t* q8 = y[i].qs + 32 * g;
      for (int e = 0; e < 32; ++e) lane[e / 4] += ls * iq1s_elem(iq1s_point(x[i], g, e / 8), e % 8) * q8[e];
      const int sign = x[i].qh[g] & 0x8000 ? -1 : 1;
      sumi1 += (y[i].bsums[2 * g] + y[i].bsums[2 * g + 1]) * sign * ls;
    }
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
    acc1 = std::fma(d, static_cast<float>(sumi1), acc1);
  }
  const float s0 = acc[4] + acc[0], s1 = acc[5] + acc[1], s2 = acc[6] + acc[2], s3 = acc[7] + acc[3];
  return ((s0 + s2) + (s1 + s3)) + IQ1S_DELTA * acc1;
}

}  // namespace car::tensor::detail

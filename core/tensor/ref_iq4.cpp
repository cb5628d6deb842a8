// Scalar reference kernels of the 4-bit table formats - IQ4_NL, IQ4_XS, MXFP4: dequantization, the weight
// quantizers synth writes files with, and the dot products (the test oracle of the SIMD kernels).
//
// The dots follow ggml's x86 (AVX2) kernels' order, which is what llama.cpp runs on the machines we compare
// with (ggml-cpu arch/x86 quants.c ggml_vec_dot_iq4_nl_q8_0 / _mxfp4_q8_0 / _iq4_xs_q8_K): integer sums in 8
// int32 lanes (lane l: elements 4l..4l+3 of each 32-element block), converted and multiplied into 8 float
// lanes by FMA, summed as hsum_float_8 does. IQ4_NL / MXFP4 take the blocks in pairs into two accumulators
// (block 2k into the first, 2k + 1 into the second), add them lane by lane, reduce, and add an odd last
// block by one scalar FMA (ggml's C tail `sumf += d * sumi`, which its x86 builds contract to an FMA; written
// as std::fma here and in the SIMD files so no compiler's contraction choice changes the bits); IQ4_XS keeps
// one accumulator, one FMA per super-block.
#include <cassert>
#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

// Element e (0..31) of a 16-byte nibble block: low nibbles first, then high nibbles.
inline int nibble(const uint8_t* qs, int e) {
  return e < 16 ? qs[e] & 0x0f : qs[e - 16] >> 4;
}

/// hsum_float_8's order: (a[i] + a[i + 4]), then (s0 + s2) + (s1 + s3).
inline float hsum8_ref(const float* a) {
  const float s0 = a[4] + a[0], s1 = a[5] + a[1], s2 = a[6] + a[2], s3 = a[7] + a[3];
  return (s0 + s2) + (s1 + s3);
}

// ---- the 32-element table formats (IQ4_NL, MXFP4) ----

struct Iq4nl {
  using Block = block_iq4_nl;
  static constexpr const int8_t* values = kvalues_iq4nl;
  static float scale(const Block& b) { return fp16_to_fp32(b.d); }
};
struct Q40 {
  using Block = block_q4_0;
  static constexpr const int8_t* values = kvalues_q4_0;
  static float scale(const Block& b) { return fp16_to_fp32(b.d); }
};
struct Mxfp4 {
  using Block = block_mxfp4;
  static constexpr const int8_t* values = kvalues_mxfp4;
  static float scale(const Block& b) { return e8m0_to_fp32_half(b.e); }
};

template <typename F>
void deq_nl32(const typename F::Block* x, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += 32) {
    const float d = F::scale(x[i]);
    for (int e = 0; e < 32; ++e) y[e] = d * static_cast<float>(F::values[nibble(x[i].qs, e)]);
  }
}

template <typename F>
float dot_nl32_q8_0(const void* w, const void* a, int64_t n) {
  assert(n % 32 == 0);
  const auto* x = static_cast<const typename F::Block*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const int64_t nb = n / 32;
  float acc[2][8] = {};
  int64_t ib = 0;
  for (; ib + 1 < nb; ib += 2) {
    for (int k = 0; k < 2; ++k) {
      const auto& xb = x[ib + k];
      const auto& yb = y[ib + k];
      int32_t lane[8] = {};
      for (int e = 0; e < 32; ++e) lane[e / 4] += F::values[nibble(xb.qs, e)] * yb.qs[e];
      const float d = fp16_to_fp32(yb.d) * F::scale(xb);
      for (int l = 0; l < 8; ++l) acc[k][l] = std::fma(d, static_cast<float>(lane[l]), acc[k][l]);
    }
  }
  float sum[8];
  for (int l = 0; l < 8; ++l) sum[l] = acc[0][l] + acc[1][l];
  float sumf = hsum8_ref(sum);
  for (; ib < nb; ++ib) {
    const float d = fp16_to_fp32(y[ib].d) * F::scale(x[ib]);
    int sumi1 = 0, sumi2 = 0;
    for (int j = 0; j < 16; ++j) {
      sumi1 += y[ib].qs[j] * F::values[x[ib].qs[j] & 0x0f];
      sumi2 += y[ib].qs[j + 16] * F::values[x[ib].qs[j] >> 4];
    }
    sumf = std::fma(d, static_cast<float>(sumi1 + sumi2), sumf);
  }
  return sumf;
}

/// llama.cpp's repacked order (kernel_table.h repacked(): ggml's gemv / gemm for block_q4_0x8, block_iq4_nlx8
/// and block_mxfp4x8, one template for all three and one order for both): per block, one exact integer, times
/// the product of the two scales by FMA, in block order.
template <typename F>
float dot_nl32_q8_0_repacked(const void* w, const void* a, int64_t n) {
  assert(n % 32 == 0);
  const auto* x = static_cast<const typename F::Block*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  float acc = 0;
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    int32_t sumi = 0;
    for (int e = 0; e < 32; ++e) sumi += F::values[nibble(x[ib].qs, e)] * y[ib].qs[e];
    acc = std::fma(static_cast<float>(sumi), F::scale(x[ib]) * fp16_to_fp32(y[ib].d), acc);
  }
  return acc;
}

/// llamafile's tinyBLAS_Q0_AVX order (the sgemm order, kernels.h ProductOrder::sgemm): one 8-lane accumulator
/// over the blocks in order, each lane's exact integer times the scales' product by FMA, hsum_float_8's
/// reduction at the end. ggml's mul_mat runs it on a non-repacked product of a batch of 2 or more vectors.
template <typename F>
float dot_nl32_q8_0_sgemm(const void* w, const void* a, int64_t n) {
  assert(n % 32 == 0);
  const auto* x = static_cast<const typename F::Block*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  float acc[8] = {};
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    int32_t lane[8] = {};
    for (int e = 0; e < 32; ++e) lane[e / 4] += F::values[nibble(x[ib].qs, e)] * y[ib].qs[e];
    const float d = F::scale(x[ib]) * fp16_to_fp32(y[ib].d);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
  }
  return hsum8_ref(acc);
}

// ---- quantizers ----

/// Index of the IQ4_NL value nearest to v (the lower of two equally near ones): a binary search of the
/// ascending table, as the quantizer calls it 15 times per weight.
int nearest_index(const int8_t* values, float v) {
  if (v <= values[0]) return 0;
  if (v >= values[15]) return 15;
  int lo = 0, hi = 15;  // values[lo] < v < values[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (v < static_cast<float>(values[mid])) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return v - static_cast<float>(values[lo]) <= static_cast<float>(values[hi]) - v ? lo : hi;
}

/// The scale d of one group of 32 values on the IQ4_NL grid that minimises sum w (x - d v[L])^2 over a few
/// trial inverse scales around -127 / max (weights w = x^2, as ggml's quantizers use without an importance
/// matrix), with the indices L of the best one. 0 for an all-zero group.
float fit_iq4_group(const float* x, uint8_t* L) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  if (amax < 1e-15f) {
    std::memset(L, 8, 32);  // value 1 times scale 0
    return 0.0f;
  }
  float best_d = max / kvalues_iq4nl[0];
  float best_score = -1.0f;
  for (int itry = -7; itry <= 7; ++itry) {
    const float id = (static_cast<float>(itry) + kvalues_iq4nl[0]) / max;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float q = kvalues_iq4nl[nearest_index(kvalues_iq4nl, id * x[j])];
      const float w = x[j] * x[j];
      sumqx += w * q * x[j];
      sumq2 += w * q * q;
    }
    if (sumq2 > 0.0f && sumqx * sumqx > best_score * sumq2) {
      best_d = sumqx / sumq2;
      best_score = best_d * sumqx;
    }
  }
  const float id = best_d != 0.0f ? 1.0f / best_d : 0.0f;
  for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(nearest_index(kvalues_iq4nl, id * x[j]));
  return best_d;
}

/// Indices of x on the IQ4_NL grid at the (stored) scale d.
void index_iq4_group(const float* x, float d, uint8_t* L) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(nearest_index(kvalues_iq4nl, id * x[j]));
}

void pack_nibbles(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(L[j] | (L[j + 16] << 4));
}

void quantize_iq4_nl(const float* x, block_iq4_nl* y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    const float d = fit_iq4_group(x, L);
    y[i].d = fp32_to_fp16(d);
    index_iq4_group(x, fp16_to_fp32(y[i].d), L);  // at the scale the file holds
    pack_nibbles(L, y[i].qs);
  }
}

void quantize_iq4_xs(const float* x, block_iq4_xs* y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[8];
    float max_scale = 0.0f, amax_scale = 0.0f;
    for (int ib = 0; ib < 8; ++ib) {
      scales[ib] = fit_iq4_group(x + 32 * ib, L);
      if (std::fabs(scales[ib]) > amax_scale) {
        amax_scale = std::fabs(scales[ib]);
        max_scale = scales[ib];
      }
    }
    y[i] = block_iq4_xs{};
    if (amax_scale == 0.0f) {
      std::memset(y[i].qs, 0x88, sizeof y[i].qs);
      for (int ib = 0; ib < 8; ++ib) {  // sub-block scale 0 (stored 32): every value 0
        y[i].scales_h = static_cast<uint16_t>(y[i].scales_h | (2u << (2 * ib)));
      }
      continue;
    }
    // The largest sub-block scale becomes -32 (the 6-bit range is [-32, 31]).
    y[i].d = fp32_to_fp16(-max_scale / 32.0f);
    const float d = fp16_to_fp32(y[i].d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int ib = 0; ib < 8; ++ib) {
      int l = static_cast<int>(std::nearbyint(id * scales[ib]));
      l = l < -32 ? -32 : (l > 31 ? 31 : l);
      const int ls = l + 32;
      y[i].scales_l[ib / 2] = static_cast<uint8_t>(y[i].scales_l[ib / 2] | ((ls & 0x0f) << (4 * (ib % 2))));
      y[i].scales_h = static_cast<uint16_t>(y[i].scales_h | ((ls >> 4) << (2 * ib)));
      index_iq4_group(x + 32 * ib, d * static_cast<float>(l), L);
      pack_nibbles(L, y[i].qs + 16 * ib);
    }
  }
}

void quantize_mxfp4(const float* x, block_mxfp4* y, int64_t nb) {
  uint8_t L[32];
  for (int64_t i = 0; i < nb; ++i, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    // The shared exponent puts amax in the top binade of E2M1 (ggml: floor(log2(amax)) - 2 + 127).
    int e = 0;
    if (amax > 0.0f) {
      e = static_cast<int>(std::floor(std::log2(amax))) - 2 + 127;
      e = e < 0 ? 0 : (e > 254 ? 254 : e);
    }
    y[i].e = static_cast<uint8_t>(e);
    const float d = e8m0_to_fp32_half(y[i].e);
    for (int j = 0; j < 32; ++j) {
      int best = 0;
      float best_err = std::fabs(kvalues_mxfp4[0] * d - x[j]);
      for (int k = 1; k < 16; ++k) {
        const float err = std::fabs(kvalues_mxfp4[k] * d - x[j]);
        if (err < best_err) {
          best = k;
          best_err = err;
        }
      }
      L[j] = static_cast<uint8_t>(best);
    }
    pack_nibbles(L, y[i].qs);
  }
}

}  // namespace

bool dequantize_iq4_ref(GgmlType t, const void* src, float* dst, int64_t nb) {
  switch (t) {
    case GgmlType::IQ4_NL:
      deq_nl32<Iq4nl>(static_cast<const block_iq4_nl*>(src), dst, nb);
      return true;
    case GgmlType::MXFP4:
      deq_nl32<Mxfp4>(static_cast<const block_mxfp4*>(src), dst, nb);
      return true;
    case GgmlType::IQ4_XS: {
      const auto* x = static_cast<const block_iq4_xs*>(src);
      for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        for (int ib = 0; ib < 8; ++ib, dst += 32) {
          const float dl = d * static_cast<float>(iq4_xs_scale(x[i], ib));
          for (int e = 0; e < 32; ++e)
            dst[e] = dl * static_cast<float>(kvalues_iq4nl[nibble(x[i].qs + 16 * ib, e)]);
        }
      }
      return true;
    }
    default:
      return false;
  }
}

bool quantize_iq4_ref(GgmlType t, const float* x, void* dst, int64_t nb) {
  switch (t) {
    case GgmlType::IQ4_NL:
      quantize_iq4_nl(x, static_cast<block_iq4_nl*>(dst), nb);
      return true;
    case GgmlType::IQ4_XS:
      quantize_iq4_xs(x, static_cast<block_iq4_xs*>(dst), nb);
      return true;
    case GgmlType::MXFP4:
      quantize_mxfp4(x, static_cast<block_mxfp4*>(dst), nb);
      return true;
    default:
      return false;
  }
}

float dot_iq4_nl_q8_0_ref(const void* w, const void* a, int64_t n) {
  return dot_nl32_q8_0<Iq4nl>(w, a, n);
}

float dot_mxfp4_q8_0_ref(const void* w, const void* a, int64_t n) {
  return dot_nl32_q8_0<Mxfp4>(w, a, n);
}

float dot_q4_0_q8_0_repacked_ref(const void* w, const void* a, int64_t n) {
  return dot_nl32_q8_0_repacked<Q40>(w, a, n);
}
float dot_iq4_nl_q8_0_repacked_ref(const void* w, const void* a, int64_t n) {
  return dot_nl32_q8_0_repacked<Iq4nl>(w, a, n);
}
float dot_iq4_nl_q8_0_sgemm_ref(const void* w, const void* a, int64_t n) {
  return dot_nl32_q8_0_sgemm<Iq4nl>(w, a, n);
}
float dot_mxfp4_q8_0_repacked_ref(const void* w, const void* a, int64_t n) {
  return dot_nl32_q8_0_repacked<Mxfp4>(w, a, n);
}

float dot_iq4_xs_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_iq4_xs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {};
    for (int ib = 0; ib < 8; ++ib) {
      const int ls = iq4_xs_scale(x[i], ib);
      const uint8_t* qs = x[i].qs + 16 * ib;
      const int8_t* q8 = y[i].qs + 32 * ib;
      for (int l = 0; l < 8; ++l) {
        int32_t s = 0;
        for (int e = 4 * l; e < 4 * l + 4; ++e) s += kvalues_iq4nl[nibble(qs, e)] * q8[e];
        lane[l] += ls * s;
      }
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
  }
  return hsum8_ref(acc);
}

}  // namespace car::tensor::detail

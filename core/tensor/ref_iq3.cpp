// Scalar reference kernels of issue #27's second slice of codebook formats - IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S,
// IQ1_M: dequantization (ggml's dequantize_row_* float expressions) and the dot products against Q8_K in the
// order of ggml's x86 (AVX2) ggml_vec_dot_*_q8_K, which the AVX2 kernels (dot_iq3_avx2.cpp) reproduce bit for
// bit and the tests hold against llama.cpp's own results (tests/data/reference/iq27/kernel_goldens.json).
//
// The x86 order, for all five: per super-block 8 int32 lanes, lane l holding elements 4l..4l+3 of every group
// of 32, each group's integer sum times its half's multiplier 2s + 1 (the integer sums are exact); then
// acc[l] = fma(d(x) * d(y), float(lane l), acc[l]) over the super-blocks, and the 8 accumulators summed as
// hsum_float_8 does, times the format's constant (IQ3_XXS 1/4, IQ2_XS / IQ2_S 1/8, IQ3_S 1). IQ1_M keeps a
// second set of lanes and accumulators for its delta term (the activations summed per 8 elements under the
// delta's sign, times the multiplier) and returns hsum(acc) + 1/8 * hsum(acc_delta).
#include <cassert>
#include <cmath>

#include "core/tensor/codebook.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

float hsum8_ref(const float* acc) {
  const float s0 = acc[4] + acc[0], s1 = acc[5] + acc[1], s2 = acc[6] + acc[2], s3 = acc[7] + acc[3];
  return (s0 + s2) + (s1 + s3);
}

/// What the formats differ in: the block's fp16 scale, each half's float scale as ggml's dequantizer computes
/// it, and the constant the dot product's sum is multiplied by.
struct Iq3Xxs {
  using Block = block_iq3_xxs;
  static float db(float d, int s) { return d * (0.5f + static_cast<float>(s)) * 0.5f; }
  static constexpr float kDotScale = 0.25f;
};
struct Iq3S {
  using Block = block_iq3_s;
  static float db(float d, int s) { return d * static_cast<float>(1 + 2 * s); }
  static constexpr float kDotScale = 1.0f;
};
struct Iq2Xs {
  using Block = block_iq2_xs;
  static float db(float d, int s) { return d * (0.5f + static_cast<float>(s)) * 0.25f; }
  static constexpr float kDotScale = 0.125f;
};
struct Iq2S {
  using Block = block_iq2_s;
  static float db(float d, int s) { return d * (0.5f + static_cast<float>(s)) * 0.25f; }
  static constexpr float kDotScale = 0.125f;
};

template <class F>
void dequantize_signed(const void* src, float* dst, int64_t nb) {
  const auto* x = static_cast<const typename F::Block*>(src);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int g = 0; g < 8; ++g, dst += 32) {
      const CodeGroup q = decode_group(x[i], g);
      const float db[2] = {F::db(d, q.s[0]), F::db(d, q.s[1])};
      for (int e = 0; e < 32; ++e) dst[e] = db[e / 16] * static_cast<float>(q.v[e]);
    }
  }
}

template <class F>
float dot_signed(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const typename F::Block*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {};
    for (int g = 0; g < 8; ++g) {
      const CodeGroup q = decode_group(x[i], g);
      const int8_t* q8 = y[i].qs + 32 * g;
      for (int l = 0; l < 8; ++l) {
        int32_t s = 0;
        for (int e = 4 * l; e < 4 * l + 4; ++e) s += q.v[e] * q8[e];
        lane[l] += (2 * q.s[l / 4] + 1) * s;
      }
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
  }
  return F::kDotScale * hsum8_ref(acc);
}

}  // namespace

bool dequantize_codebook_ref(GgmlType t, const void* src, float* dst, int64_t nb) {
  switch (t) {
    case GgmlType::IQ3_XXS: dequantize_signed<Iq3Xxs>(src, dst, nb); return true;
    case GgmlType::IQ3_S: dequantize_signed<Iq3S>(src, dst, nb); return true;
    case GgmlType::IQ2_XS: dequantize_signed<Iq2Xs>(src, dst, nb); return true;
    case GgmlType::IQ2_S: dequantize_signed<Iq2S>(src, dst, nb); return true;
    case GgmlType::IQ1_M: {
      const auto* x = static_cast<const block_iq1_m*>(src);
      for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(iq1m_d(x[i]));
        for (int g = 0; g < 8; ++g, dst += 32) {
          const CodeGroup q = decode_group(x[i], g);
          const float dl[2] = {d * static_cast<float>(2 * q.s[0] + 1), d * static_cast<float>(2 * q.s[1] + 1)};
          for (int e = 0; e < 32; ++e) {
            const float delta = q.delta[e / 8] < 0 ? -IQ1M_DELTA : IQ1M_DELTA;
            dst[e] = dl[e / 16] * (static_cast<float>(q.v[e]) + delta);
          }
        }
      }
      return true;
    }
    default: return false;
  }
}

float dot_iq3_xxs_q8_K_ref(const void* w, const void* a, int64_t n) { return dot_signed<Iq3Xxs>(w, a, n); }
float dot_iq3_s_q8_K_ref(const void* w, const void* a, int64_t n) { return dot_signed<Iq3S>(w, a, n); }
float dot_iq2_xs_q8_K_ref(const void* w, const void* a, int64_t n) { return dot_signed<Iq2Xs>(w, a, n); }
float dot_iq2_s_q8_K_ref(const void* w, const void* a, int64_t n) { return dot_signed<Iq2S>(w, a, n); }

float dot_iq1_m_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_iq1_m*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {}, acc_delta[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {}, lane_delta[8] = {};
    for (int g = 0; g < 8; ++g) {
      const CodeGroup q = decode_group(x[i], g);
      const int8_t* q8 = y[i].qs + 32 * g;
      for (int l = 0; l < 8; ++l) {
        int32_t s = 0, sd = 0;
        for (int e = 4 * l; e < 4 * l + 4; ++e) {
          s += q.v[e] * q8[e];
          sd += q.delta[e / 8] * q8[e];
        }
        const int ls = 2 * q.s[l / 4] + 1;
        lane[l] += ls * s;
        lane_delta[l] += ls * sd;
      }
    }
    const float d = y[i].d * fp16_to_fp32(iq1m_d(x[i]));
    for (int l = 0; l < 8; ++l) {
      acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
      acc_delta[l] = std::fma(d, static_cast<float>(lane_delta[l]), acc_delta[l]);
    }
  }
  return hsum8_ref(acc) + IQ1M_DELTA * hsum8_ref(acc_delta);
}

}  // namespace car::tensor::detail

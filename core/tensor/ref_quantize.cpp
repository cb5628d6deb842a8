// Scalar quantizers: activation rounding (the products' input side) and round-to-nearest weight quantizers.
//
// Activation rounding reproduces what llama.cpp's x86 CPU backend does (its AVX2 quantize_row_q8_0/q8_1 and
// the reference quantize_row_q8_K_ref): round half to even, Q8_0/Q8_1 scale amax/127 stored as fp16 with the
// multiplier 127/amax, Q8_K multiplier -127/m (m the signed value of largest magnitude) and scale 1/multiplier.
//
// Weight quantizers: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 are ggml's *_ref quantizers (same formulas, same truncating
// casts). The K-quants use plain round-to-nearest per sub-block (min/max or abs-max scales, quantized to the
// format's scale width, values requantized with the stored scales); ggml's reference additionally searches
// scales iteratively, so files written here are valid but not bit-identical to llama-quantize output.
#include <algorithm>
#include <cassert>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {

// ------------------------------------------------------------------------------------------------
// Activations

void quantize_act_q8_0(const float* x, void* dst, int64_t n) {
  assert(n % QK8_0 == 0);
  auto* y = static_cast<block_q8_0*>(dst);
  for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(nearest_int(x[j] * id));
  }
}

void quantize_act_q8_1(const float* x, void* dst, int64_t n) {
  assert(n % QK8_1 == 0);
  auto* y = static_cast<block_q8_1*>(dst);
  for (int64_t i = 0; i < n / QK8_1; ++i, x += QK8_1) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_1; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    y[i].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) {
      const int q = nearest_int(x[j] * id);
      y[i].qs[j] = static_cast<int8_t>(q);
      sum += q;
    }
    y[i].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

void quantize_act_q8_K(const float* x, void* dst, int64_t n) {
  assert(n % QK_K == 0);
  auto* y = static_cast<block_q8_K*>(dst);
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    float max = 0.0f;
    float amax = 0.0f;
    for (int j = 0; j < QK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int j = 0; j < QK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[j * 16 + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

void convert_act_f16(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void convert_act_bf16(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_bf16(x[i]);
}

namespace {

// ------------------------------------------------------------------------------------------------
// 32-element block formats (ggml's *_ref quantizers)

void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const uint8_t q1 =
          std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>(x[QK4_0 / 2 + j] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK4_1) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK4_1; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      const uint8_t q0 = std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const uint8_t q1 =
          std::min<uint8_t>(15, static_cast<uint8_t>(static_cast<int8_t>((x[QK4_1 / 2 + j] - min) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_0) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK5_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const uint8_t q0 = std::min<uint8_t>(31, static_cast<uint8_t>(static_cast<int8_t>(x[j] * id + 16.5f)));
      const uint8_t q1 =
          std::min<uint8_t>(31, static_cast<uint8_t>(static_cast<int8_t>(x[QK5_0 / 2 + j] * id + 16.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + QK5_0 / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK5_1) {
    float min = FLT_MAX, max = -FLT_MAX;
    for (int j = 0; j < QK5_1; ++j) {
      min = std::min(min, x[j]);
      max = std::max(max, x[j]);
    }
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    y[i].m = fp32_to_fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const auto q0 = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
      const auto q1 = static_cast<uint8_t>((x[QK5_1 / 2 + j] - min) * id + 0.5f);
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + QK5_1 / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

// ------------------------------------------------------------------------------------------------
// K-quants: round to nearest per sub-block.

/// Asymmetric sub-block fit: scale and (non-negative) min such that x ~ scale * q - min, q in [0, nmax].
void fit_min_max(const float* x, int n, int nmax, float* scale, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);  // like ggml: the min term only ever subtracts
  *scale = hi > lo ? (hi - lo) / static_cast<float>(nmax) : 0.0f;
  *min_out = -lo;
}

/// q = clamp(round((x + m) / s), 0, nmax), or 0 when s == 0.
uint8_t quant_asym(float x, float s, float m, int nmax) {
  if (s == 0.0f) return 0;
  return static_cast<uint8_t>(std::clamp(nearest_int((x + m) / s), 0, nmax));
}

/// The signed value of largest magnitude (0 for an all-zero span).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max;
}

/// Pack 8 six-bit scales and mins into Q4_K/Q5_K's 12-byte layout (inverse of get_scale_min_k4).
void pack_scale_min_k4(const uint8_t* ls, const uint8_t* lm, uint8_t* q) {
  std::memset(q, 0, K_SCALE_SIZE);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      q[j] = ls[j];
      q[j + 4] = lm[j];
    } else {
      q[j + 4] = static_cast<uint8_t>((ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4));
      q[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      q[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
}

/// Shared Q4_K / Q5_K fit: fills d, dmin, packed scales and the per-element levels L in [0, nmax].
template <typename Block>
void fit_k4(const float* x, Block* b, int nmax, uint8_t* L) {
  float scales[8], mins[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    fit_min_max(x + 32 * j, 32, nmax, &scales[j], &mins[j]);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.0f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.0f;
  uint8_t ls[8], lm[8];
  for (int j = 0; j < 8; ++j) {
    ls[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_scale * scales[j])));
    lm[j] = static_cast<uint8_t>(std::min(63, nearest_int(inv_min * mins[j])));
  }
  pack_scale_min_k4(ls, lm, b->scales);
  b->d = fp32_to_fp16(max_scale / 63.f);
  b->dmin = fp32_to_fp16(max_min / 63.f);
  const float d = fp16_to_fp32(b->d), dmin = fp16_to_fp32(b->dmin);
  for (int j = 0; j < 8; ++j) {
    const float s = d * ls[j], m = dmin * lm[j];
    for (int l = 0; l < 32; ++l) L[32 * j + l] = quant_asym(x[32 * j + l], s, m, nmax);
  }
}

void quantize_q4_K(const float* x, block_q4_K* y, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    fit_k4(x, &y[i], 15, L);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void quantize_q5_K(const float* x, block_q5_K* y, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    fit_k4(x, &y[i], 31, L);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    uint8_t* ql = y[i].qs;
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[n + j], l2 = L[n + j + 32];
        if (l1 > 15) {
          l1 -= 16;
          y[i].qh[j] |= m1;
        }
        if (l2 > 15) {
          l2 -= 16;
          y[i].qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

void quantize_q6_K(const float* x, block_q6_K* y, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[16];
    float max_scale = 0.0f, amax_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = signed_absmax(x + 16 * j, 16) / -32.f;  // the extreme maps to -32, the format's widest level
      if (std::fabs(scales[j]) > amax_scale) {
        amax_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (amax_scale == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = fp32_to_fp16(1 / iscale);
    const float d = fp16_to_fp32(y[i].d);
    for (int j = 0; j < 16; ++j) {
      const int sc = std::min(127, nearest_int(iscale * scales[j]));
      y[i].scales[j] = static_cast<int8_t>(sc);
      const float s = d * static_cast<float>(sc);
      for (int l = 0; l < 16; ++l) {
        const int q = s != 0.0f ? std::clamp(nearest_int(x[16 * j + l] / s), -32, 31) : 0;
        L[16 * j + l] = static_cast<uint8_t>(q + 32);
      }
    }
    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const uint8_t q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0x0f) | ((q3 & 0x0f) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0x0f) | ((q4 & 0x0f) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
      }
    }
  }
}

/// Q2_K and Q3_K pack four 2-bit fields of elements p, p+32, p+64, p+96 into one byte.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < QK_K; j += 128) {
    for (int l = 0; l < 32; ++l) {
      qs[j / 4 + l] = static_cast<uint8_t>((L[j + l] & 3) | ((L[j + l + 32] & 3) << 2) |
                                           ((L[j + l + 64] & 3) << 4) | ((L[j + l + 96] & 3) << 6));
    }
  }
}

void quantize_q2_K(const float* x, block_q2_K* y, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float scales[16], mins[16];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 16; ++j) {
      fit_min_max(x + 16 * j, 16, 3, &scales[j], &mins[j]);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 15.f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 15.f / max_min : 0.0f;
    y[i].d = fp32_to_fp16(max_scale / 15.f);
    y[i].dmin = fp32_to_fp16(max_min / 15.f);
    const float d = fp16_to_fp32(y[i].d), dmin = fp16_to_fp32(y[i].dmin);
    for (int j = 0; j < 16; ++j) {
      const int ls = std::min(15, nearest_int(inv_scale * scales[j]));
      const int lm = std::min(15, nearest_int(inv_min * mins[j]));
      y[i].scales[j] = static_cast<uint8_t>(ls | (lm << 4));
      for (int l = 0; l < 16; ++l) L[16 * j + l] = quant_asym(x[16 * j + l], d * ls, dmin * lm, 3);
    }
    pack_2bit(L, y[i].qs);
  }
}

void quantize_q3_K(const float* x, block_q3_K* y, int64_t nb) {
  uint8_t L[QK_K];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    std::memset(&y[i], 0, sizeof y[i]);
    float scales[16];
    float max_scale = 0.0f, amax_scale = 0.0f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = signed_absmax(x + 16 * j, 16) / -4.f;  // levels -4..3: the extreme maps to -4
      if (std::fabs(scales[j]) > amax_scale) {
        amax_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    float d = 0.0f;
    int ls[16] = {};
    if (amax_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) ls[j] = std::clamp(nearest_int(iscale * scales[j]), -32, 31);
      y[i].d = fp32_to_fp16(1 / iscale);
      d = fp16_to_fp32(y[i].d);
    }
    for (int j = 0; j < 16; ++j) {
      const int l = ls[j] + 32;
      if (j < 8) {
        y[i].scales[j] = static_cast<uint8_t>(l & 0x0f);
      } else {
        y[i].scales[j - 8] |= static_cast<uint8_t>((l & 0x0f) << 4);
      }
      y[i].scales[j % 4 + 8] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
      const float s = d * static_cast<float>(ls[j]);
      for (int k = 0; k < 16; ++k) {
        const int q = s != 0.0f ? std::clamp(nearest_int(x[16 * j + k] / s), -4, 3) : 0;
        L[16 * j + k] = static_cast<uint8_t>(q + 4);
      }
    }
    // Third bit: set in hmask when the level is in the upper half (then the stored 2 bits are level - 4).
    for (int p = 0; p < QK_K; ++p) {
      if (L[p] > 3) {
        y[i].hmask[p % 32] |= static_cast<uint8_t>(1u << (p / 32));
        L[p] = static_cast<uint8_t>(L[p] - 4);
      }
    }
    pack_2bit(L, y[i].qs);
  }
}

}  // namespace

bool quantize_weights_ref(GgmlType t, const float* x, void* dst, int64_t n) {
  const int64_t bs = geometry(t).block_size;
  if (bs == 0) return false;
  assert(n % bs == 0);
  const int64_t nb = n / bs;
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float)); return true;
    case GgmlType::F16: convert_act_f16(x, dst, n); return true;
    case GgmlType::BF16: convert_act_bf16(x, dst, n); return true;
    case GgmlType::Q4_0: quantize_q4_0(x, static_cast<block_q4_0*>(dst), nb); return true;
    case GgmlType::Q4_1: quantize_q4_1(x, static_cast<block_q4_1*>(dst), nb); return true;
    case GgmlType::Q5_0: quantize_q5_0(x, static_cast<block_q5_0*>(dst), nb); return true;
    case GgmlType::Q5_1: quantize_q5_1(x, static_cast<block_q5_1*>(dst), nb); return true;
    case GgmlType::Q8_0: quantize_q8_0(x, static_cast<block_q8_0*>(dst), nb); return true;
    case GgmlType::Q8_1: quantize_act_q8_1(x, dst, n); return true;
    case GgmlType::Q2_K: quantize_q2_K(x, static_cast<block_q2_K*>(dst), nb); return true;
    case GgmlType::Q3_K: quantize_q3_K(x, static_cast<block_q3_K*>(dst), nb); return true;
    case GgmlType::Q4_K: quantize_q4_K(x, static_cast<block_q4_K*>(dst), nb); return true;
    case GgmlType::Q5_K: quantize_q5_K(x, static_cast<block_q5_K*>(dst), nb); return true;
    case GgmlType::Q6_K: quantize_q6_K(x, static_cast<block_q6_K*>(dst), nb); return true;
    case GgmlType::Q8_K: quantize_act_q8_K(x, dst, n); return true;
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
    case GgmlType::MXFP4: return quantize_iq4_ref(t, x, dst, nb);
    case GgmlType::IQ2_XXS: quantize_iq2_xxs_ref(x, dst, nb); return true;
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ1_M:
    case GgmlType::IQ1_S: return quantize_codebook_ref(t, x, dst, nb);
    case GgmlType::TQ1_0:
    case GgmlType::TQ2_0: return quantize_tq_ref(t, x, dst, nb);
    default: return false;
  }
}

}  // namespace car::tensor::detail

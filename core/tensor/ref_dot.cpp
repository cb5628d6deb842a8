// Scalar dot products of a weight row with a rounded activation row: the test oracle for the SIMD kernels.
//
// Each follows ggml's generic C kernel (ggml-cpu quants.c *_generic, vec.c ggml_vec_dot_f16 ...) operation
// for operation: integer sums per block (per 8-lane group for the K-quants), scaled by the product of the
// two scales in the same order, accumulated in float; the 16/32-bit float formats accumulate float products
// in double.
#include <cassert>
#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {

float dot_f32_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * y[i]);
  return static_cast<float>(sum);
}

float dot_f16_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(fp16_to_fp32(x[i]) * fp16_to_fp32(y[i]));
  return static_cast<float>(sum);
}

float dot_bf16_ref(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(bf16_to_fp32(x[i]) * bf16_to_fp32(y[i]));
  return static_cast<float>(sum);
}

float dot_q4_0_q8_0_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK8_0 == 0);
  const auto* x = static_cast<const block_q4_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  float sumf = 0;
  for (int64_t ib = 0; ib < n / QK8_0; ++ib) {
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < QK8_0 / 2; ++j) {
      sumi0 += ((x[ib].qs[j] & 0x0f) - 8) * y[ib].qs[j];
      sumi1 += ((x[ib].qs[j] >> 4) - 8) * y[ib].qs[j + QK8_0 / 2];
    }
    const int sumi = sumi0 + sumi1;
    sumf += static_cast<float>(sumi) * fp16_to_fp32(x[ib].d) * fp16_to_fp32(y[ib].d);
  }
  return sumf;
}

float dot_q4_1_q8_1_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK8_1 == 0);
  const auto* x = static_cast<const block_q4_1*>(w);
  const auto* y = static_cast<const block_q8_1*>(a);
  float sumf = 0;
  for (int64_t ib = 0; ib < n / QK8_1; ++ib) {
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < QK8_1 / 2; ++j) {
      sumi0 += (x[ib].qs[j] & 0x0f) * y[ib].qs[j];
      sumi1 += (x[ib].qs[j] >> 4) * y[ib].qs[j + QK8_1 / 2];
    }
    const int sumi = sumi0 + sumi1;
    sumf += (fp16_to_fp32(x[ib].d) * fp16_to_fp32(y[ib].d)) * static_cast<float>(sumi) +
            fp16_to_fp32(x[ib].m) * fp16_to_fp32(y[ib].s);
  }
  return sumf;
}

float dot_q5_0_q8_0_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK8_0 == 0);
  const auto* x = static_cast<const block_q5_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  float sumf = 0;
  for (int64_t ib = 0; ib < n / QK8_0; ++ib) {
    uint32_t qh;
    std::memcpy(&qh, x[ib].qh, sizeof qh);
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < QK8_0 / 2; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      sumi0 += (((x[ib].qs[j] & 0x0f) | h0) - 16) * y[ib].qs[j];
      sumi1 += (((x[ib].qs[j] >> 4) | h1) - 16) * y[ib].qs[j + QK8_0 / 2];
    }
    const int sumi = sumi0 + sumi1;
    sumf += (fp16_to_fp32(x[ib].d) * fp16_to_fp32(y[ib].d)) * static_cast<float>(sumi);
  }
  return sumf;
}

float dot_q5_1_q8_1_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK8_1 == 0);
  const auto* x = static_cast<const block_q5_1*>(w);
  const auto* y = static_cast<const block_q8_1*>(a);
  float sumf = 0;
  for (int64_t ib = 0; ib < n / QK8_1; ++ib) {
    uint32_t qh;
    std::memcpy(&qh, x[ib].qh, sizeof qh);
    int sumi0 = 0, sumi1 = 0;
    for (int j = 0; j < QK8_1 / 2; ++j) {
      const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
      const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
      sumi0 += ((x[ib].qs[j] & 0x0f) | h0) * y[ib].qs[j];
      sumi1 += ((x[ib].qs[j] >> 4) | h1) * y[ib].qs[j + QK8_1 / 2];
    }
    const int sumi = sumi0 + sumi1;
    sumf += (fp16_to_fp32(x[ib].d) * fp16_to_fp32(y[ib].d)) * static_cast<float>(sumi) +
            fp16_to_fp32(x[ib].m) * fp16_to_fp32(y[ib].s);
  }
  return sumf;
}

float dot_q8_0_q8_0_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK8_0 == 0);
  const auto* x = static_cast<const block_q8_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  float sumf = 0;
  for (int64_t ib = 0; ib < n / QK8_0; ++ib) {
    int sumi = 0;
    for (int j = 0; j < QK8_0; ++j) sumi += x[ib].qs[j] * y[ib].qs[j];
    sumf += static_cast<float>(sumi) * (fp16_to_fp32(x[ib].d) * fp16_to_fp32(y[ib].d));
  }
  return sumf;
}

float dot_q2_K_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_q2_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float sumf = 0;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const uint8_t* q2 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    const uint8_t* sc = x[i].scales;
    int summs = 0;
    for (int j = 0; j < 16; ++j) summs += y[i].bsums[j] * (sc[j] >> 4);
    const float dall = y[i].d * fp16_to_fp32(x[i].d);
    const float dmin = y[i].d * fp16_to_fp32(x[i].dmin);
    int isum = 0;
    int is = 0;
    for (int k = 0; k < QK_K / 128; ++k, q2 += 32) {
      for (int shift = 0; shift < 8; shift += 2, q8 += 32) {
        int d = sc[is++] & 0x0f;
        int isuml = 0;
        for (int l = 0; l < 16; ++l) isuml += q8[l] * ((q2[l] >> shift) & 3);
        isum += d * isuml;
        d = sc[is++] & 0x0f;
        isuml = 0;
        for (int l = 16; l < 32; ++l) isuml += q8[l] * ((q2[l] >> shift) & 3);
        isum += d * isuml;
      }
    }
    sumf += dall * static_cast<float>(isum) - dmin * static_cast<float>(summs);
  }
  return sumf;
}

float dot_q3_K_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_q3_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  int8_t aux8[QK_K];
  float sums[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const uint8_t* q3 = x[i].qs;
    const uint8_t* hm = x[i].hmask;
    const int8_t* q8 = y[i].qs;
    int32_t aux32[8] = {};
    int8_t* p = aux8;
    uint8_t m = 1;
    for (int j = 0; j < QK_K; j += 128, q3 += 32) {
      for (int shift = 0; shift < 8; shift += 2, p += 32, m = static_cast<uint8_t>(m << 1)) {
        for (int l = 0; l < 32; ++l) p[l] = static_cast<int8_t>(((q3[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4));
      }
    }
    int8_t scales[16];
    unpack_q3_K_scales(x[i].scales, scales);
    p = aux8;
    for (int j = 0; j < QK_K / 16; ++j) {
      for (int half = 0; half < 2; ++half, q8 += 8, p += 8) {
        for (int l = 0; l < 8; ++l) aux32[l] += (scales[j] - 32) * (q8[l] * p[l]);
      }
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) sums[l] += d * static_cast<float>(aux32[l]);
  }
  float sumf = 0;
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

namespace {

/// Shared tail of Q4_K / Q5_K: levels aux8 (0..31), scales/mins unpacked from the 12 bytes.
void k4_block(const uint8_t* packed_scales, const int8_t* aux8, const block_q8_K& y, float d_w, float dmin_w,
              float* sums, float* sumf) {
  uint8_t sm[16];
  unpack_scale_min_k4(packed_scales, sm);
  int sumi = 0;
  for (int j = 0; j < QK_K / 16; ++j) sumi += y.bsums[j] * sm[8 + j / 2];
  int32_t aux32[8] = {};
  const int8_t* q8 = y.qs;
  const int8_t* p = aux8;
  for (int j = 0; j < QK_K / 32; ++j) {
    const int32_t scale = sm[j];
    for (int part = 0; part < 4; ++part, q8 += 8, p += 8) {
      for (int l = 0; l < 8; ++l) aux32[l] += scale * (q8[l] * p[l]);
    }
  }
  const float d = d_w * y.d;
  for (int l = 0; l < 8; ++l) sums[l] += d * static_cast<float>(aux32[l]);
  const float dmin = dmin_w * y.d;
  *sumf -= dmin * static_cast<float>(sumi);
}

}  // namespace

float dot_q4_K_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_q4_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  int8_t aux8[QK_K];
  float sums[8] = {};
  float sumf = 0;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const uint8_t* q4 = x[i].qs;
    int8_t* p = aux8;
    for (int j = 0; j < QK_K / 64; ++j, q4 += 32) {
      for (int l = 0; l < 32; ++l) *p++ = static_cast<int8_t>(q4[l] & 0x0f);
      for (int l = 0; l < 32; ++l) *p++ = static_cast<int8_t>(q4[l] >> 4);
    }
    k4_block(x[i].scales, aux8, y[i], fp16_to_fp32(x[i].d), fp16_to_fp32(x[i].dmin), sums, &sumf);
  }
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

namespace {

/// One Q4_K block's exact integer sums over its 64-element groups g (sub-blocks 2g, 2g+1):
/// isum[g] = sum of scale * level * q8, imin[g] = sum of min * bsum.
void q4_K_group_sums(const block_q4_K& x, const block_q8_K& y, int32_t* isum, int32_t* imin) {
  uint8_t sm[16];
  unpack_scale_min_k4(x.scales, sm);
  for (int g = 0; g < QK_K / 64; ++g) {
    const uint8_t* q4 = x.qs + 32 * g;
    const int8_t* q8 = y.qs + 64 * g;
    int32_t lo = 0, hi = 0;
    for (int l = 0; l < 32; ++l) {
      lo += (q4[l] & 0x0f) * q8[l];
      hi += (q4[l] >> 4) * q8[l + 32];
    }
    isum[g] = sm[2 * g] * lo + sm[2 * g + 1] * hi;
    imin[g] = sm[8 + 2 * g] * (y.bsums[4 * g] + y.bsums[4 * g + 1]) +
              sm[8 + 2 * g + 1] * (y.bsums[4 * g + 2] + y.bsums[4 * g + 3]);
  }
}

/// One Q2_K block's exact integer sums over its two 128-element halves h (sub-blocks 8h..8h+7):
/// isum[h] = sum of scale * level * q8, imin[h] = sum of min * bsum.
void q2_K_half_sums(const block_q2_K& x, const block_q8_K& y, int32_t* isum, int32_t* imin) {
  for (int h = 0; h < QK_K / 128; ++h) {
    int32_t s = 0, m = 0;
    for (int j = 8 * h; j < 8 * h + 8; ++j) {
      // Sub-block j: elements 16j..16j+15, 2 bits of qs[32h + (16j) % 32 + l] at shift 2 * ((j / 2) % 4).
      const uint8_t* q2 = x.qs + 32 * h + 16 * (j % 2);
      const int8_t* q8 = y.qs + 16 * j;
      const int shift = 2 * ((j / 2) % 4);
      int32_t dot = 0;
      for (int l = 0; l < 16; ++l) dot += ((q2[l] >> shift) & 3) * q8[l];
      s += (x.scales[j] & 0x0f) * dot;
      m += (x.scales[j] >> 4) * y.bsums[j];
    }
    isum[h] = s;
    imin[h] = m;
  }
}

/// The repacked orders of a K-quant whose blocks give exact integer sums per group (Q4_K: four groups of 64,
/// Q2_K: two halves of 128) and carry fp16 d and dmin: the gemv order adds each block's whole integer with one
/// FMA per chain (scales, mins), the gemm order one FMA per group; the chains are subtracted at the end.
template <class Block, int kGroups, void (*kSums)(const Block&, const block_q8_K&, int32_t*, int32_t*)>
float repacked_ref(const void* w, const void* a, int64_t n, bool per_group) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc = 0.0f, acc_m = 0.0f;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t isum[kGroups], imin[kGroups];
    kSums(x[i], y[i], isum, imin);
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    const float dmin = fp16_to_fp32(x[i].dmin) * y[i].d;
    if (per_group) {
      for (int g = 0; g < kGroups; ++g) {
        acc = std::fma(static_cast<float>(isum[g]), d, acc);
        acc_m = std::fma(static_cast<float>(imin[g]), dmin, acc_m);
      }
    } else {
      int32_t s = 0, m = 0;
      for (int g = 0; g < kGroups; ++g) {
        s += isum[g];
        m += imin[g];
      }
      acc = std::fma(static_cast<float>(s), d, acc);
      acc_m = std::fma(static_cast<float>(m), dmin, acc_m);
    }
  }
  return acc - acc_m;
}

}  // namespace

float dot_q4_K_q8_K_gemv_ref(const void* w, const void* a, int64_t n) {
  return repacked_ref<block_q4_K, QK_K / 64, q4_K_group_sums>(w, a, n, false);
}

float dot_q4_K_q8_K_gemm_ref(const void* w, const void* a, int64_t n) {
  return repacked_ref<block_q4_K, QK_K / 64, q4_K_group_sums>(w, a, n, true);
}

float dot_q2_K_q8_K_gemv_ref(const void* w, const void* a, int64_t n) {
  return repacked_ref<block_q2_K, QK_K / 128, q2_K_half_sums>(w, a, n, false);
}

float dot_q2_K_q8_K_gemm_ref(const void* w, const void* a, int64_t n) {
  return repacked_ref<block_q2_K, QK_K / 128, q2_K_half_sums>(w, a, n, true);
}

float dot_q5_K_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_q5_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  int8_t aux8[QK_K];
  float sums[8] = {};
  float sumf = 0;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const uint8_t* q4 = x[i].qs;
    const uint8_t* hm = x[i].qh;
    int8_t* p = aux8;
    uint8_t m = 1;
    for (int j = 0; j < QK_K / 64; ++j, q4 += 32) {
      for (int l = 0; l < 32; ++l) *p++ = static_cast<int8_t>((q4[l] & 0x0f) + ((hm[l] & m) ? 16 : 0));
      m = static_cast<uint8_t>(m << 1);
      for (int l = 0; l < 32; ++l) *p++ = static_cast<int8_t>((q4[l] >> 4) + ((hm[l] & m) ? 16 : 0));
      m = static_cast<uint8_t>(m << 1);
    }
    k4_block(x[i].scales, aux8, y[i], fp16_to_fp32(x[i].d), fp16_to_fp32(x[i].dmin), sums, &sumf);
  }
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

float dot_q6_K_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_q6_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  int8_t aux8[QK_K];
  float sums[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const uint8_t* q4 = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* q8 = y[i].qs;
    int8_t* p = aux8;
    for (int j = 0; j < QK_K; j += 128, p += 128, q4 += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        p[l + 0] = static_cast<int8_t>(((q4[l + 0] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32);
        p[l + 32] = static_cast<int8_t>(((q4[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32);
        p[l + 64] = static_cast<int8_t>(((q4[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
        p[l + 96] = static_cast<int8_t>(((q4[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
      }
    }
    int32_t aux32[8] = {};
    p = aux8;
    for (int j = 0; j < QK_K / 16; ++j) {
      const int scale = x[i].scales[j];
      for (int half = 0; half < 2; ++half, q8 += 8, p += 8) {
        for (int l = 0; l < 8; ++l) aux32[l] += scale * (q8[l] * p[l]);
      }
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) sums[l] += d * static_cast<float>(aux32[l]);
  }
  float sumf = 0;
  for (int l = 0; l < 8; ++l) sumf += sums[l];
  return sumf;
}

float dot_q6_K_q8_K_x86_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_q6_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {};
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = x[i].ql + 64 * half;
      const uint8_t* qh = x[i].qh + 32 * half;
      for (int c = 0; c < 4; ++c) {  // 32-element chunk c of the half: ql nibble c / 2, qh bits 2c..2c+1
        for (int e = 0; e < 32; ++e) {
          const int lo = (c % 2 == 0 ? ql[e] : ql[32 + e]) >> (4 * (c / 2)) & 0x0f;
          const int level = lo | (((qh[e] >> (2 * c)) & 3) << 4);
          const int el = 128 * half + 32 * c + e;
          lane[e / 4] += x[i].scales[el / 16] * level * y[i].qs[el];
        }
      }
    }
    for (int l = 0; l < 8; ++l) {
      lane[l] -=
          32 * (y[i].bsums[2 * l] * x[i].scales[2 * l] + y[i].bsums[2 * l + 1] * x[i].scales[2 * l + 1]);
    }
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
  }
  // hsum of 8 lanes as _mm256 -> _mm_add_ps(high, low), movehl, movehdup
  const float s0 = acc[0] + acc[4], s1 = acc[1] + acc[5], s2 = acc[2] + acc[6], s3 = acc[3] + acc[7];
  return (s0 + s2) + (s1 + s3);
}

}  // namespace car::tensor::detail

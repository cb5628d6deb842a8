// Scalar reference kernels of the ternary formats TQ1_0 and TQ2_0 (issue #27): dequantization, the dot
// product against Q8_K in the order of ggml's x86 (AVX2) ggml_vec_dot_tq*_q8_K, and the quantizer (llama-
// quantize's: d = max|x|, each weight rounded to -1, 0 or +1 times d).
//
// The x86 order: the stored levels t (0, 1, 2 - or 3 in a TQ2_0 byte no quantizer writes) multiply the
// activations unsigned, and the -1 is taken off as the activations' sums: per super-block 8 int32 lanes, lane l
// holding levels x activations of the elements with e % 32 in 4l..4l+3 minus bsums[2l] + bsums[2l + 1]; then
// acc[l] = fma(float(lane l), d(y) * d(x), acc[l]) (ggml writes a multiply and an add of intrinsics, which its
// build contracts to one FMA: the kernel goldens hold the FMA's bits), and the 8 accumulators summed as
// hsum_float_8 does.
#include <cassert>
#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

/// Trit n (0..4) of a byte of 5 trits.
inline int trit(uint8_t byte, int n) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const auto q = static_cast<uint8_t>(byte * kPow3[n]);
  return (q * 3) >> 8;
}

/// The stored levels (0..2, or 3) of a block's 256 elements.
void levels(const block_tq1_0& b, uint8_t* t) {
  for (int n = 0; n < 5; ++n) {
    for (int m = 0; m < 32; ++m) t[32 * n + m] = static_cast<uint8_t>(trit(b.qs[m], n));
    for (int m = 0; m < 16; ++m) t[160 + 16 * n + m] = static_cast<uint8_t>(trit(b.qs[32 + m], n));
  }
  for (int n = 0; n < 4; ++n) {
    for (int j = 0; j < 4; ++j) t[240 + 4 * n + j] = static_cast<uint8_t>(trit(b.qh[j], n));
  }
}
void levels(const block_tq2_0& b, uint8_t* t) {
  for (int j = 0; j < 64; j += 32) {
    for (int l = 0; l < 4; ++l) {
      for (int k = 0; k < 32; ++k) t[4 * j + 32 * l + k] = static_cast<uint8_t>((b.qs[j + k] >> (2 * l)) & 3);
    }
  }
}

template <class Block>
void dequantize_tq(const void* src, float* dst, int64_t nb) {
  const auto* x = static_cast<const Block*>(src);
  uint8_t t[QK_K];
  for (int64_t i = 0; i < nb; ++i, dst += QK_K) {
    const float d = fp16_to_fp32(x[i].d);
    levels(x[i], t);
    for (int e = 0; e < QK_K; ++e) dst[e] = static_cast<float>(t[e] - 1) * d;
  }
}

template <class Block>
float dot_tq(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  uint8_t t[QK_K];
  for (int64_t i = 0; i < n / QK_K; ++i) {
    levels(x[i], t);
    int32_t lane[8];
    for (int l = 0; l < 8; ++l) lane[l] = -(y[i].bsums[2 * l] + y[i].bsums[2 * l + 1]);
    for (int e = 0; e < QK_K; ++e) lane[(e % 32) / 4] += t[e] * y[i].qs[e];
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(static_cast<float>(lane[l]), d, acc[l]);
  }
  const float s0 = acc[4] + acc[0], s1 = acc[5] + acc[1], s2 = acc[6] + acc[2], s3 = acc[7] + acc[3];
  return (s0 + s2) + (s1 + s3);
}

/// Ternary levels of a block (d = max|x|, t = round(x / d) + 1) and the fp16 scale.
ggml_half ternary(const float* x, uint8_t* t) {
  float amax = 0.0f;
  for (int e = 0; e < QK_K; ++e) amax = std::fmax(amax, std::fabs(x[e]));
  const float id = amax > 0.0f ? 1.0f / amax : 0.0f;
  for (int e = 0; e < QK_K; ++e) t[e] = static_cast<uint8_t>(std::lround(x[e] * id) + 1);
  return fp32_to_fp16(amax);
}

}  // namespace

bool dequantize_tq_ref(GgmlType t, const void* src, float* dst, int64_t nb) {
  switch (t) {
    case GgmlType::TQ1_0: dequantize_tq<block_tq1_0>(src, dst, nb); return true;
    case GgmlType::TQ2_0: dequantize_tq<block_tq2_0>(src, dst, nb); return true;
    default: return false;
  }
}

float dot_tq1_0_q8_K_ref(const void* w, const void* a, int64_t n) { return dot_tq<block_tq1_0>(w, a, n); }
float dot_tq2_0_q8_K_ref(const void* w, const void* a, int64_t n) { return dot_tq<block_tq2_0>(w, a, n); }

bool quantize_tq_ref(GgmlType type, const float* x, void* dst, int64_t nb) {
  uint8_t t[QK_K];
  if (type == GgmlType::TQ2_0) {
    auto* y = static_cast<block_tq2_0*>(dst);
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
      y[i].d = ternary(x, t);
      for (int j = 0; j < 64; j += 32) {
        for (int k = 0; k < 32; ++k) {
          uint8_t q = 0;
          for (int l = 0; l < 4; ++l) q = static_cast<uint8_t>(q | (t[4 * j + 32 * l + k] << (2 * l)));
          y[i].qs[j + k] = q;
        }
      }
    }
    return true;
  }
  if (type != GgmlType::TQ1_0) return false;
  auto* y = static_cast<block_tq1_0*>(dst);
  // A byte of trits t0..t(k-1) (t0 the most significant base-3 digit) stores ceil(value * 256 / 243), so that
  // multiplying by 3^n moves trit n to the top, where (q * 3) >> 8 reads it.
  auto pack = [](const uint8_t* trits, int k, int stride) {
    int v = 0;
    for (int n = 0; n < k; ++n) v = v * 3 + trits[n * stride];
    for (int n = k; n < 5; ++n) v *= 3;
    return static_cast<uint8_t>((v * 256 + 242) / 243);
  };
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    y[i].d = ternary(x, t);
    for (int m = 0; m < 32; ++m) y[i].qs[m] = pack(t + m, 5, 32);
    for (int m = 0; m < 16; ++m) y[i].qs[32 + m] = pack(t + 160 + m, 5, 16);
    for (int j = 0; j < 4; ++j) y[i].qh[j] = pack(t + 240 + j, 4, 4);
  }
  return true;
}

}  // namespace car::tensor::detail

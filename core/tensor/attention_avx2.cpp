// AVX2 + FMA + F16C version of attend_head (kernels.h; the AVX2 and AVX-512 tables' kernel): the same
// arithmetic as attend_head_scalar, eight lanes at a time. fp16 <-> fp32 use the F16C conversions (round to nearest even, as fp32_to_fp16 does); the
// V accumulator update is one fused multiply-add per element, then rounded to fp16, exactly as the scalar
// std::fma path. Q.K follows dot_f16_ggml's order (16-lane accumulators emulated as two 8-lane halves), so the
// result is bit-identical to the scalar version.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/online_softmax.h"

namespace car::tensor::detail {

void attend_head_avx2(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk, int64_t dv,
                      float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink) {
  for (int64_t d = 0; d < dk; ++d) q16[d] = fp32_to_fp16(q[d]);
  std::memset(acc16, 0, static_cast<size_t>(dv) * sizeof(uint16_t));
  const int64_t dk64 = dk & ~int64_t{63};
  const int64_t dv8 = dv & ~int64_t{7};
  float sum = 0.0f;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t ic = 0; ic < n_kv; ++ic) {
    const uint16_t* kr = k + ic * dk;
    double dot = 0.0;
    if (dk64 > 0) {
      // Four 16-lane accumulators, each two 8-lane halves (lo = lanes 0-7, hi = lanes 8-15).
      __m256 acc[4][2];
      for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
      for (int64_t i = 0; i < dk64; i += 64) {
        for (int j = 0; j < 4; ++j) {
          for (int h = 0; h < 2; ++h) {
            const int64_t e = i + j * 16 + h * 8;
            const __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + e)));
            const __m256 qf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q16 + e)));
            acc[j][h] = _mm256_fmadd_ps(kf, qf, acc[j][h]);
          }
        }
      }
      const __m256 v_lo = _mm256_add_ps(_mm256_add_ps(acc[0][0], acc[2][0]), _mm256_add_ps(acc[1][0], acc[3][0]));
      const __m256 v_hi = _mm256_add_ps(_mm256_add_ps(acc[0][1], acc[2][1]), _mm256_add_ps(acc[1][1], acc[3][1]));
      const __m256 h8 = _mm256_add_ps(v_hi, v_lo);                                  // h[l] = v[l + 8] + v[l]
      const __m128 q4 = _mm_add_ps(_mm256_extractf128_ps(h8, 1), _mm256_castps256_ps128(h8));  // r[l] = h[l + 4] + h[l]
      alignas(16) float r[4];
      _mm_store_ps(r, q4);
      dot = static_cast<double>((r[0] + r[2]) + (r[1] + r[3]));
    }
    for (int64_t d = dk64; d < dk; ++d) {
      dot += static_cast<double>(fp16_to_fp32(kr[d]) * fp16_to_fp32(q16[d]));
    }
    const float s = static_cast<float>(dot) * scale;
    float ms, vs;
    if (online_softmax_step(s, mx, ms, vs)) {
      const __m256 vms = _mm256_set1_ps(ms);
      for (int64_t d = 0; d < dv8; d += 8) {
        __m128i* p = reinterpret_cast<__m128i*>(acc16 + d);
        const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(p));
        _mm_storeu_si128(p, _mm256_cvtps_ph(_mm256_mul_ps(a, vms), _MM_FROUND_TO_NEAREST_INT));
      }
      for (int64_t d = dv8; d < dv; ++d) acc16[d] = fp32_to_fp16(fp16_to_fp32(acc16[d]) * ms);
    }
    const uint16_t* vr = v + ic * dv;
    const __m256 vvs = _mm256_set1_ps(vs);
    for (int64_t d = 0; d < dv8; d += 8) {
      __m128i* p = reinterpret_cast<__m128i*>(acc16 + d);
      const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(p));
      const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(vr + d)));
      _mm_storeu_si128(p, _mm256_cvtps_ph(_mm256_fmadd_ps(x, vvs, a), _MM_FROUND_TO_NEAREST_INT));
    }
    for (int64_t d = dv8; d < dv; ++d) {
      acc16[d] = fp32_to_fp16(std::fma(fp16_to_fp32(vr[d]), vs, fp16_to_fp32(acc16[d])));
    }
    sum = sum * ms + vs;
  }
  if (sink == kNoSink) {
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int64_t d = 0; d < dv; ++d) out[d] = fp16_to_fp32(acc16[d]) * inv;
    return;
  }
  // The attention sink, as attend_head_scalar applies it (a float scale of the converted accumulator).
  const float ms = online_sink_step(sink, mx, sum);
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  for (int64_t d = 0; d < dv; ++d) out[d] = (fp16_to_fp32(acc16[d]) * ms) * inv;
}

}  // namespace car::tensor::detail

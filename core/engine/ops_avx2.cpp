// AVX2 + FMA + F16C version of attend_head (see ops.h): the same arithmetic as attend_head_scalar, eight
// lanes at a time. fp16 <-> fp32 use the F16C conversions (round to nearest even, as fp32_to_fp16 does); the
// V accumulator update is one fused multiply-add per element, then rounded to fp16, exactly as the scalar
// std::fma path. Q.K products are formed in float and summed in double like the scalar version.
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/tensor/fp16.h"

namespace car::engine {

namespace {

inline double hsum_pd(__m256d v) {
  const __m128d lo = _mm256_castpd256_pd128(v);
  const __m128d hi = _mm256_extractf128_pd(v, 1);
  const __m128d s = _mm_add_pd(lo, hi);
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

}  // namespace

void attend_head_avx2(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk, int64_t dv,
                      float scale, float* out, uint16_t* q16, uint16_t* acc16) {
  for (int64_t d = 0; d < dk; ++d) q16[d] = tensor::fp32_to_fp16(q[d]);
  std::memset(acc16, 0, static_cast<size_t>(dv) * sizeof(uint16_t));
  const int64_t dk8 = dk & ~int64_t{7};
  const int64_t dv8 = dv & ~int64_t{7};
  float sum = 0.0f;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t ic = 0; ic < n_kv; ++ic) {
    const uint16_t* kr = k + ic * dk;
    __m256d acc_lo = _mm256_setzero_pd();
    __m256d acc_hi = _mm256_setzero_pd();
    for (int64_t d = 0; d < dk8; d += 8) {
      const __m256 kf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kr + d)));
      const __m256 qf = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q16 + d)));
      const __m256 p = _mm256_mul_ps(kf, qf);
      acc_lo = _mm256_add_pd(acc_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
      acc_hi = _mm256_add_pd(acc_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    double dot = hsum_pd(_mm256_add_pd(acc_lo, acc_hi));
    for (int64_t d = dk8; d < dk; ++d) {
      dot += static_cast<double>(tensor::fp16_to_fp32(kr[d]) * tensor::fp16_to_fp32(q16[d]));
    }
    const float s = static_cast<float>(dot) * scale;
    float ms = 1.0f;
    float vs = 1.0f;
    if (s > mx) {
      const float old = mx;
      mx = s;
      ms = std::exp(old - mx);
      const __m256 vms = _mm256_set1_ps(ms);
      for (int64_t d = 0; d < dv8; d += 8) {
        __m128i* p = reinterpret_cast<__m128i*>(acc16 + d);
        const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(p));
        _mm_storeu_si128(p, _mm256_cvtps_ph(_mm256_mul_ps(a, vms), _MM_FROUND_TO_NEAREST_INT));
      }
      for (int64_t d = dv8; d < dv; ++d) acc16[d] = tensor::fp32_to_fp16(tensor::fp16_to_fp32(acc16[d]) * ms);
    } else {
      vs = std::exp(s - mx);
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
      acc16[d] = tensor::fp32_to_fp16(std::fma(tensor::fp16_to_fp32(vr[d]), vs, tensor::fp16_to_fp32(acc16[d])));
    }
    sum = sum * ms + vs;
  }
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  for (int64_t d = 0; d < dv; ++d) out[d] = tensor::fp16_to_fp32(acc16[d]) * inv;
}

}  // namespace car::engine

// swiglu_avx2: silu.h's exp_ggml / silu_ggml 8 lanes at a time, the same operations in the same order (so the
// same bits). AVX2 has no vscalefps: 2^n is applied in two exact halves, 2^h then 2^(n - h) with h = n / 2
// (|n| <= 192, so each half is a normal power of two built in the exponent field), the second multiply being
// the one rounding, as scalef's single rounding is.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "core/tensor/silu.h"

namespace car::tensor::detail {
namespace {

inline __m256 pow2i(__m256i e) {  // 2^e for integer e in [-126, 127]
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
}

inline __m256 exp_ggml8(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 n = _mm256_sub_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r), r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_fmadd_ps(_mm256_set1_ps(0x1.ffffecp-1f), b, _mm256_set1_ps(1.0f)));
  // |n| > 192: clamp the integer so the exponent field cannot wrap; those lanes are replaced below. A NaN n
  // clamps to -192 and its j is NaN, so its lane stays NaN, as the scalar's does.
  const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
  const __m256 big = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192.0f), _CMP_GT_OQ);
  const __m256i ni = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-192.0f)),
                                                       _mm256_set1_ps(192.0f)));
  const __m256i h = _mm256_srai_epi32(ni, 1);  // floor(n / 2); n - h = ceil(n / 2)
  const __m256 res = _mm256_mul_ps(_mm256_mul_ps(j, pow2i(h)), pow2i(_mm256_sub_epi32(ni, h)));
  const __m256 alt = _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_setzero_ps(),
                                      _mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ));
  return _mm256_blendv_ps(res, alt, big);
}

}  // namespace

void swiglu_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = exp_ggml8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = silu_ggml(gate[i]) * up[i];
}

}  // namespace car::tensor::detail

// The quantizers' grid searches: the index a strict-< scan over a list of errors settles on (the first of the
// least values; NaNs never win), scalar and with AVX2 (the minimum itself is exact whichever order it is
// taken in, so both give the same index). first_min_best picks the AVX2 one where the CPU has it.
#pragma once

#include <immintrin.h>

#include <cmath>

namespace car::tensor::detail {

/// The first index of the least value of err[0..n) below INFINITY, or -1 when there is none.
inline int first_min(const float* err, int n) {
  int best = -1;
  float best_err = INFINITY;
  for (int p = 0; p < n; ++p) {
    if (err[p] < best_err) {
      best_err = err[p];
      best = p;
    }
  }
  return best;
}

/// first_min for n % 8 == 0 with AVX2: the minimum by vminps (a NaN lane keeps the running minimum), then
/// the first lane equal to it.
__attribute__((target("avx2"))) inline int first_min_avx2(const float* err, int n) {
  __m256 m = _mm256_set1_ps(INFINITY);
  for (int p = 0; p < n; p += 8) m = _mm256_min_ps(_mm256_loadu_ps(err + p), m);
  m = _mm256_min_ps(m, _mm256_permute2f128_ps(m, m, 1));
  m = _mm256_min_ps(m, _mm256_permute_ps(m, 0x4e));
  m = _mm256_min_ps(m, _mm256_permute_ps(m, 0xb1));
  const float least = _mm256_cvtss_f32(m);
  if (!(least < INFINITY)) return -1;
  for (int p = 0; p < n; p += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(err + p), m, _CMP_EQ_OQ));
    if (hit != 0) return p + __builtin_ctz(static_cast<unsigned>(hit));
  }
  return -1;
}

/// Whether the quantizers' AVX2 search paths may run on this CPU (checked once).
inline bool search_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

/// first_min by AVX2 where the CPU has it and n % 8 == 0, else the scalar scan: the same index either way.
inline int first_min_best(const float* err, int n) {
  return search_has_avx2() && n % 8 == 0 ? first_min_avx2(err, n) : first_min(err, n);
}

}  // namespace car::tensor::detail

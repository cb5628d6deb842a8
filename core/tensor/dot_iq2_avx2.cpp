// AVX2 dot kernels of the codebook formats IQ2_XXS and IQ1_S against Q8_K (compiled with
// car_simd_source(... AVX2); the AVX-512 table inherits them). Each equals its reference in ref_iq2.cpp bit
// for bit: per group the grid points are gathered from the grid, signs moved onto the activations (psignb),
// maddubs (|grid| <= 43, so the int16 pairs are exact) and madd by the group scale give the reference's
// int32 lanes; the float steps are the reference's.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_avx2.h"

namespace car::tensor::detail {
namespace {

/// 32 elements of one group: grid points (4 x 8 bytes) and the signs of the activations.
inline __m256i group_points(uint32_t grid) {
  return _mm256_set_epi64x(static_cast<long long>(iq2xxs_grid[(grid >> 24) & 0xff]),
                           static_cast<long long>(iq2xxs_grid[(grid >> 16) & 0xff]),
                           static_cast<long long>(iq2xxs_grid[(grid >> 8) & 0xff]),
                           static_cast<long long>(iq2xxs_grid[grid & 0xff]));
}
inline __m256i group_signs(uint32_t signs) {
  return _mm256_set_epi64x(static_cast<long long>(ksign_bytes.v[(signs >> 21) & 127]),
                           static_cast<long long>(ksign_bytes.v[(signs >> 14) & 127]),
                           static_cast<long long>(ksign_bytes.v[(signs >> 7) & 127]),
                           static_cast<long long>(ksign_bytes.v[signs & 127]));
}

float dot_iq2_xxs(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq2_xxs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      uint32_t aux[2];
      std::memcpy(aux, x[i].qs + 4 * g, 8);
      const __m256i q8 = _mm256_sign_epi8(load32(y[i].qs + 32 * g), group_signs(aux[1]));
      const __m256i p16 = _mm256_maddubs_epi16(group_points(aux[0]), q8);
      const __m256i ls = _mm256_set1_epi16(static_cast<int16_t>(2 * (aux[1] >> 28) + 1));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return 0.125f * hsum8(acc);
}

float dot_iq1_s(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq1_s*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  float acc1 = 0.0f;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    int32_t sumi1 = 0;
    for (int g = 0; g < 8; ++g) {
      const uint8_t* qs = x[i].qs + 4 * g;
      const uint32_t qh = x[i].qh[g];
      const __m256i points =
          _mm256_set_epi64x(static_cast<long long>(iq1s_grid[qs[3] | ((qh >> 1) & 0x700)]),
                            static_cast<long long>(iq1s_grid[qs[2] | ((qh << 2) & 0x700)]),
                            static_cast<long long>(iq1s_grid[qs[1] | ((qh << 5) & 0x700)]),
                            static_cast<long long>(iq1s_grid[qs[0] | ((qh << 8) & 0x700)]));
      const __m256i q8 = load32(y[i].qs + 32 * g);
      const __m256i p16 =
          _mm256_maddubs_epi16(_mm256_sign_epi8(points, points), _mm256_sign_epi8(q8, points));
      const int ls = 2 * static_cast<int>((qh >> 12) & 7) + 1;
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16(static_cast<int16_t>(ls))));
      sumi1 += (y[i].bsums[2 * g] + y[i].bsums[2 * g + 1]) * (qh & 0x8000 ? -1 : 1) * ls;
    }
    const float d = y[i].d * h2f(x[i].d);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    acc1 = std::fma(d, static_cast<float>(sumi1), acc1);
  }
  return hsum8(acc) + IQ1S_DELTA * acc1;
}

}  // namespace

namespace avx2 {
void add_iq2_kernels(DotKernels& k) {
  k.dot[slot(GgmlType::IQ2_XXS)] = dot_iq2_xxs;
  k.dot[slot(GgmlType::IQ1_S)] = dot_iq1_s;
}
}  // namespace avx2

}  // namespace car::tensor::detail

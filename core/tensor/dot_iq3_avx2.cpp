// AVX2 dot kernels of issue #27's second slice of codebook formats (IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_M)
// against Q8_K (compiled with car_simd_source(... AVX2); the AVX-512 table inherits them). Each equals its
// reference in ref_iq3.cpp bit for bit: per group of 32 the grid points are gathered from the grid (4 x 8 or
// 8 x 4 bytes), the signs moved onto the activations (psignb, or xor and subtract for the formats with free
// sign bits), maddubs (|grid| <= 62 and |q8| <= 127, so the int16 pairs are exact) and madd by the halves'
// multipliers give the reference's int32 lanes; the float steps are the reference's.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/codebook.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_avx2.h"

namespace car::tensor::detail {
namespace {

inline long long ll(uint64_t v) {
  return static_cast<long long>(v);
}

/// 32 activations with the sign bits of 4 bytes (bit e % 8 of byte e / 8) applied: (q ^ m) - m.
inline __m256i apply_sign_bits(__m256i q8, const uint8_t* signs) {
  const __m256i m = bits32(signs);
  return _mm256_sub_epi8(_mm256_xor_si256(q8, m), m);
}

/// Four IQ2_XXS-style 7-bit sign codes (bits 7l..7l+6 of `codes`) as +1 / -1 bytes.
inline __m256i sign_codes(uint32_t codes) {
  return _mm256_set_epi64x(ll(ksign_bytes.v[(codes >> 21) & 127]), ll(ksign_bytes.v[(codes >> 14) & 127]),
                           ll(ksign_bytes.v[(codes >> 7) & 127]), ll(ksign_bytes.v[codes & 127]));
}

/// int16 multipliers 2 s0 + 1 in the low 8 lanes (elements 0..15), 2 s1 + 1 in the high 8.
inline __m256i half_multipliers(int s0, int s1) {
  return _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(2 * s0 + 1)),
                           _mm_set1_epi16(static_cast<int16_t>(2 * s1 + 1)));
}

float dot_iq3_xxs(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq3_xxs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    const uint8_t* q3 = x[i].qs;
    for (int g = 0; g < 8; ++g, q3 += 8) {
      uint32_t aux;
      std::memcpy(&aux, x[i].qs + QK_K / 4 + 4 * g, 4);
      const __m256i points = _mm256_set_epi32(
          static_cast<int>(iq3xxs_grid[q3[7]]), static_cast<int>(iq3xxs_grid[q3[6]]),
          static_cast<int>(iq3xxs_grid[q3[5]]), static_cast<int>(iq3xxs_grid[q3[4]]),
          static_cast<int>(iq3xxs_grid[q3[3]]), static_cast<int>(iq3xxs_grid[q3[2]]),
          static_cast<int>(iq3xxs_grid[q3[1]]), static_cast<int>(iq3xxs_grid[q3[0]]));
      const __m256i q8 = _mm256_sign_epi8(load32(y[i].qs + 32 * g), sign_codes(aux));
      const __m256i ls = _mm256_set1_epi16(static_cast<int16_t>(2 * (aux >> 28) + 1));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(points, q8), ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return 0.25f * hsum8(acc);
}

float dot_iq3_s(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq3_s*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      // Eight 9-bit grid indices as 16-bit words: the qs bytes and, above them, one qh bit each (pdep).
      uint32_t lo, hi;
      std::memcpy(&lo, x[i].qs + 8 * g, 4);
      std::memcpy(&hi, x[i].qs + 8 * g + 4, 4);
      const uint32_t qh = x[i].qh[g];
      const uint64_t idx0 = _pdep_u64(lo, 0x00ff00ff00ff00ffull) | _pdep_u64(qh & 15, 0x0100010001000100ull);
      const uint64_t idx1 = _pdep_u64(hi, 0x00ff00ff00ff00ffull) | _pdep_u64(qh >> 4, 0x0100010001000100ull);
      auto point = [](uint64_t idx, int k) { return static_cast<int>(iq3s_grid[(idx >> (16 * k)) & 0xffff]); };
      const __m256i points = _mm256_set_epi32(point(idx1, 3), point(idx1, 2), point(idx1, 1), point(idx1, 0),
                                              point(idx0, 3), point(idx0, 2), point(idx0, 1), point(idx0, 0));
      const __m256i q8 = apply_sign_bits(load32(y[i].qs + 32 * g), x[i].signs + 4 * g);
      const int s = (x[i].scales[g / 2] >> (4 * (g % 2))) & 15;
      const __m256i ls = _mm256_set1_epi16(static_cast<int16_t>(2 * s + 1));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(points, q8), ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

float dot_iq2_xs(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq2_xs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      const uint16_t* q = x[i].qs + 4 * g;
      const __m256i points = _mm256_set_epi64x(ll(iq2xs_grid[q[3] & 511]), ll(iq2xs_grid[q[2] & 511]),
                                               ll(iq2xs_grid[q[1] & 511]), ll(iq2xs_grid[q[0] & 511]));
      const __m256i signs = _mm256_set_epi64x(ll(ksign_bytes.v[q[3] >> 9]), ll(ksign_bytes.v[q[2] >> 9]),
                                              ll(ksign_bytes.v[q[1] >> 9]), ll(ksign_bytes.v[q[0] >> 9]));
      const __m256i q8 = _mm256_sign_epi8(load32(y[i].qs + 32 * g), signs);
      const __m256i ls = half_multipliers(x[i].scales[g] & 15, x[i].scales[g] >> 4);
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(points, q8), ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return 0.125f * hsum8(acc);
}

float dot_iq2_s(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq2_s*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      uint32_t lo;
      std::memcpy(&lo, x[i].qs + 4 * g, 4);
      const uint64_t idx = _pdep_u64(lo, 0x00ff00ff00ff00ffull) | _pdep_u64(x[i].qh[g], 0x0300030003000300ull);
      auto point = [idx](int l) { return ll(iq2s_grid[(idx >> (16 * l)) & 0xffff]); };
      const __m256i points = _mm256_set_epi64x(point(3), point(2), point(1), point(0));
      const __m256i q8 = apply_sign_bits(load32(y[i].qs + 32 * g), x[i].qs + QK_K / 8 + 4 * g);
      const __m256i ls = half_multipliers(x[i].scales[g] & 15, x[i].scales[g] >> 4);
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(points, q8), ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return 0.125f * hsum8(acc);
}

/// IQ1_M: byte patterns that pick group g's two 16-bit multipliers out of the per-block vector built in
/// dot_iq1_m (64-bit lane k of it holds, in 16-bit word w, the scale at bit {0, 6, 3, 9}[k] of scale word w:
/// lanes 0 / 1 the first halves of groups 2w / 2w + 1, lanes 2 / 3 their second halves).
struct Iq1mScalePick {
  uint8_t v[8][32];
  constexpr Iq1mScalePick() : v() {
    for (int g = 0; g < 8; ++g) {
      const int word = (g % 2) * 4 + g / 2;  // within each 128-bit half
      for (int b = 0; b < 32; ++b) v[g][b] = static_cast<uint8_t>(2 * word + b % 2);
    }
  }
};
constexpr Iq1mScalePick kIq1mScalePick{};

float dot_iq1_m(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq1_m*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const __m256i ones = _mm256_set1_epi8(1);
  const __m256i shifts = _mm256_setr_epi64x(0, 6, 3, 9);
  __m256 acc = _mm256_setzero_ps(), acc_delta = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    uint64_t sc;
    std::memcpy(&sc, x[i].scales, 8);
    // 2s + 1 for every 16-element half, arranged for kIq1mScalePick.
    __m256i scales = _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<long long>(sc)), shifts),
                                      _mm256_set1_epi16(7));
    scales = _mm256_add_epi16(_mm256_slli_epi16(scales, 1), _mm256_set1_epi16(1));
    __m256i sumi = _mm256_setzero_si256(), sumi_delta = _mm256_setzero_si256();
    for (int g = 0; g < 8; ++g) {
      uint32_t qs;
      uint16_t qh;
      std::memcpy(&qs, x[i].qs + 4 * g, 4);
      std::memcpy(&qh, x[i].qh + 2 * g, 2);
      // Four 11-bit grid indices as 16-bit words: the low bytes from qs, bits 8..10 from the qh nibbles.
      const uint64_t idx = _pdep_u64(qs, 0x00ff00ff00ff00ffull) | _pdep_u64(qh & 0x7777u, 0x0f000f000f000f00ull);
      const __m256i points = _mm256_set_epi64x(
          ll(iq1s_grid[(idx >> 48) & 0xffff]), ll(iq1s_grid[(idx >> 32) & 0xffff]),
          ll(iq1s_grid[(idx >> 16) & 0xffff]), ll(iq1s_grid[idx & 0xffff]));
      // The nibbles' bit 3 (delta negative) as 0x80 in byte l, widened to 8 bytes each and or'ed with 1: -127 or 1.
      const auto dsign = static_cast<uint32_t>(_pdep_u64(qh & 0x8888u, 0xf0f0f0f0ull));
      const __m256i deltas = _mm256_or_si256(_mm256_cvtepi8_epi64(_mm_cvtsi32_si128(static_cast<int>(dsign))), ones);
      const __m256i q8 = load32(y[i].qs + 32 * g);
      const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(points, points), _mm256_sign_epi8(q8, points));
      const __m256i d16 = _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q8, deltas));
      const __m256i ls =
          _mm256_shuffle_epi8(scales, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(kIq1mScalePick.v[g])));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, ls));
      sumi_delta = _mm256_add_epi32(sumi_delta, _mm256_madd_epi16(d16, ls));
    }
    const __m256 d = _mm256_set1_ps(y[i].d * h2f(iq1m_d(x[i])));
    acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi), acc);
    acc_delta = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi_delta), acc_delta);
  }
  return hsum8(acc) + IQ1M_DELTA * hsum8(acc_delta);
}

}  // namespace

namespace avx2 {
void add_iq3_kernels(DotKernels& k) {
  k.dot[slot(GgmlType::IQ3_XXS)] = dot_iq3_xxs;
  k.dot[slot(GgmlType::IQ3_S)] = dot_iq3_s;
  k.dot[slot(GgmlType::IQ2_XS)] = dot_iq2_xs;
  k.dot[slot(GgmlType::IQ2_S)] = dot_iq2_s;
  k.dot[slot(GgmlType::IQ1_M)] = dot_iq1_m;
}
}  // namespace avx2

}  // namespace car::tensor::detail

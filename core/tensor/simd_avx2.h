// Internal to core/tensor's AVX2 kernel files - dot_avx2.cpp (32-element block and float dot kernels, the
// table), dot_k_avx2.cpp (K-quant dot kernels) and quantize_avx2.cpp (activation rounding) - each compiled with
// car_simd_source(... AVX2) and only called when CPUID reports AVX2 / FMA / F16C: the helpers only the AVX2
// kernels use (internal linkage, for the reason simd_x86.h gives) and where the files meet. Include it from
// those files only: its inline functions are AVX2 code.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_x86.h"

namespace car::tensor::detail {
namespace {

/// 32 bits -> 32 bytes, 0xff where the bit is set (byte i <- bit i).
inline __m256i bits32(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask);
}

/// Sum of pairs of u8 * s8 products into 8 int32 lanes.
inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/// Same for s8 * s8 (sign moved onto the second operand).
inline __m256i dot_s8s8(__m256i x, __m256i y) {
  return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/// 16 int16 lanes: s[0] in lanes 0..7 and s[1] in lanes 8..15.
inline __m256i scale_pair(const int16_t* s) {
  int32_t pair;
  std::memcpy(&pair, s, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1,  //
                                        2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  return _mm256_shuffle_epi8(_mm256_set1_epi32(pair), shuf);
}

/// Byte-shuffle patterns that spread int16 lane pair (2k, 2k+1) of a 128-bit vector: kSpread2[k] puts
/// lane 2k in the low 8 int16 lanes and lane 2k+1 in the high 8 (for the 16-element sub-blocks), and
/// kSpread1[k] repeats lane k across all 16 lanes (for the 32-element sub-blocks).
alignas(32) constexpr uint8_t kSpread2[4][32] = {
    {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3},
    {4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7, 6, 7},
    {8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 8, 9, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11, 10, 11},
    {12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13, 12, 13,
     14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15, 14, 15}};

/// `s16` holds 8 int16 scales in both 128-bit halves; lanes of result: scale 2k (low half), 2k+1 (high half).
inline __m256i spread2(__m256i s16, int k) {
  return _mm256_shuffle_epi8(s16, _mm256_load_si256(reinterpret_cast<const __m256i*>(kSpread2[k])));
}
/// Scale k repeated over all 16 lanes.
inline __m256i spread1(__m256i s16, int k) {
  const int b = 2 * k;
  return _mm256_shuffle_epi8(s16, _mm256_set1_epi16(static_cast<int16_t>(b | ((b + 1) << 8))));
}

/// 8 int8/uint8 scales (as 8 bytes) widened to int16 and duplicated into both 128-bit halves.
inline __m256i scales8_to_16(__m128i s8, bool is_signed) {
  const __m128i s16 = is_signed ? _mm_cvtepi8_epi16(s8) : _mm_cvtepu8_epi16(s8);
  return _mm256_broadcastsi128_si256(s16);
}

inline int hsum_i32x8(__m256i v) {
  return hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

}  // namespace

namespace avx2 {

/// Set the K-quant dot kernels (dot_k_avx2.cpp) / the activation rounding kernels (quantize_avx2.cpp) in `k`.
void add_k_quant_kernels(DotKernels& k);
void add_activation_kernels(DotKernels& k);
/// Set the IQ4_NL / IQ4_XS / MXFP4 dot kernels and the repacked-order Q4_0 / IQ4_NL / MXFP4 ones
/// (dot_iq4_avx2.cpp) in `k`.
void add_iq4_kernels(DotKernels& k);
/// Set the IQ2_XXS / IQ1_S dot kernels (dot_iq2_avx2.cpp) in `k`.
void add_iq2_kernels(DotKernels& k);
/// Set the IQ3_XXS / IQ3_S / IQ2_XS / IQ2_S / IQ1_M dot kernels (dot_iq3_avx2.cpp) in `k`.
void add_iq3_kernels(DotKernels& k);
/// Set the TQ1_0 / TQ2_0 dot kernels (dot_tq_avx2.cpp) in `k`.
void add_tq_kernels(DotKernels& k);

}  // namespace avx2
}  // namespace car::tensor::detail

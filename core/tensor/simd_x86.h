// Internal to core/tensor's x86 kernel files (the AVX2 files through simd_avx2.h, the AVX-512 files through
// simd_avx512.h): the AVX2-level load, unpack and reduction helpers both tables use.
//
// Every kernel file is compiled with its own instruction-set flags (car_simd_source), so these helpers have
// internal linkage (an unnamed namespace): each file gets its own copy compiled for its ISA, and the linker
// can never hand an AVX2-only caller a body compiled for AVX-512. Include it from those files only.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "core/tensor/blocks.h"

namespace car::tensor::detail {
namespace {

inline float h2f(ggml_half h) {
  return _cvtsh_ss(h);
}

/// Sum of 8 floats in ggml's hsum_float_8 order: (high half + low half), then pairs, then the last two.
inline float hsum8(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline float hsum4(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  v = _mm_add_ss(v, _mm_movehdup_ps(v));
  return _mm_cvtss_f32(v);
}

inline int hsum_i32x4(__m128i v) {
  v = _mm_add_epi32(v, _mm_unpackhi_epi64(v, v));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 1));
  return _mm_cvtsi128_si32(v);
}

inline __m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

/// 16 bytes of nibbles -> 32 bytes: low nibbles in bytes 0..15, high nibbles in bytes 16..31.
inline __m256i nibbles32(const uint8_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/// Q3_K's 16 six-bit scales minus 32, as int16 lanes (k_scales.h unpack_q3_K_scales in registers): words 0-1
/// take the low nibbles of packed words 0-1, words 2-3 their high nibbles, each byte's bits 4-5 from packed
/// word 2 shifted by 0, 2, 4, 6. Reads exactly the 12 packed bytes and stores nothing: the scalar
/// unpacking's 16-byte reload of four 4-byte stores stalled on store forwarding (the AVX-512 dot kernel ran
/// at 5.4 GiB/s with it, 14.4 without).
inline __m256i q3_K_scales16(const uint8_t* packed) {
  uint32_t w2;
  std::memcpy(&w2, packed + 8, 4);
  const __m128i w01 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(packed));
  const __m128i lo = _mm_srlv_epi32(_mm_shuffle_epi32(w01, 0x44), _mm_setr_epi32(0, 0, 4, 4));
  const __m128i hi = _mm_srlv_epi32(_mm_set1_epi32(static_cast<int32_t>(w2)), _mm_setr_epi32(0, 2, 4, 6));
  const __m128i raw = _mm_or_si128(_mm_and_si128(lo, _mm_set1_epi8(0x0f)),
                                   _mm_slli_epi32(_mm_and_si128(hi, _mm_set1_epi8(0x03)), 4));
  return _mm256_sub_epi16(_mm256_cvtepi8_epi16(raw), _mm256_set1_epi16(32));
}

/// The mins term of Q4_K / Q5_K as ggml's AVX2 kernels form it: bsums summed in pairs (int16 hadd), times
/// the 8 mins, into 4 int32 lanes (lane k: mins 2k and 2k+1).
inline __m128i mins_dot_bsums(const uint32_t* mins_words, const int16_t* bsums) {
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mins_words)));
  const __m256i b = load32(bsums);
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  return _mm_madd_epi16(m16, pairs);
}

}  // namespace
}  // namespace car::tensor::detail

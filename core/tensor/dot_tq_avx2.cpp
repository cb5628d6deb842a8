// AVX2 dot kernels of the ternary formats TQ1_0 and TQ2_0 against Q8_K (compiled with car_simd_source(...
// AVX2); the AVX-512 table inherits them). Each equals its reference in ref_tq.cpp bit for bit: the levels of
// 32 elements at a time (TQ2_0: 2-bit fields; TQ1_0: the byte times 3^n, then (q * 3) >> 8 as two rounding
// averages of q - 1) go through maddubs against the activations into 16-bit sums, the activation sums
// (bsums) are subtracted lane by lane, and madd by 1 gives the reference's int32 lanes; the float steps are
// the reference's.
#include <immintrin.h>

#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_avx2.h"

namespace car::tensor::detail {
namespace {

/// (q * 3) >> 8 per byte: the top base-3 digit of a byte of trits.
inline __m256i top_trit(__m256i q) {
  const __m256i q1 = _mm256_subs_epu8(q, _mm256_set1_epi8(1));
  const __m256i r = _mm256_avg_epu8(q1, _mm256_avg_epu8(q1, _mm256_setzero_si256()));
  return _mm256_and_si256(_mm256_srli_epi16(r, 6), _mm256_set1_epi8(3));
}
/// Bytes times 3 and times 9, modulo 256.
inline __m256i times3(__m256i q) {
  return _mm256_add_epi8(q, _mm256_add_epi8(q, q));
}
inline __m256i times9(__m256i q) {
  return _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(q, 3), _mm256_set1_epi8(-8)), q);
}

/// The float step shared by both: int16 sums minus the activation sums, pairs to int32, times d.
inline __m256 finish(__m256i sum16, const block_q8_K& y, float dx, __m256 acc) {
  const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.bsums));
  const __m256i lanes = _mm256_madd_epi16(_mm256_sub_epi16(sum16, bsums), _mm256_set1_epi16(1));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(y.d * dx), acc);
}

float dot_tq2_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_tq2_0*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const __m256i m3 = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sum16 = _mm256_setzero_si256();
    for (int j = 0; j < 64; j += 32) {
      const __m256i q = load32(x[i].qs + j);
      for (int l = 0; l < 4; ++l) {
        const __m256i lv = _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), m3);
        sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(lv, load32(y[i].qs + 4 * j + 32 * l)));
      }
    }
    acc = finish(sum16, y[i], h2f(x[i].d), acc);
  }
  return hsum8(acc);
}

float dot_tq1_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_tq1_0*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const int8_t* q8 = y[i].qs;
    // qs[0..31]: trit n of each byte for elements 32n..32n+31.
    const __m256i q0 = load32(x[i].qs);
    const __m256i q1 = times3(q0), q2 = times9(q0), q3 = times9(q1), q4 = times9(q2);
    __m256i sum16 = _mm256_maddubs_epi16(top_trit(q0), load32(q8));
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(top_trit(q1), load32(q8 + 32)));
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(top_trit(q2), load32(q8 + 64)));
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(top_trit(q3), load32(q8 + 96)));
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(top_trit(q4), load32(q8 + 128)));
    // qs[32..47] (16 elements a trit) and qh (4 elements a trit): elements 160..255 in pairs of 16.
    __m128i t;
    std::memcpy(&t, x[i].qs + 32, 16);
    const __m256i h0 = _mm256_broadcastsi128_si256(t);
    const __m256i h1 = times3(h0), h2 = times9(h0), h3 = times9(h1), h4 = times9(h2);
    // qh[j] * 3^m (mod 256) at byte 4m + j: the 4 bytes widened to 16 bits 4 times, multiplied, packed back.
    uint32_t qh;
    std::memcpy(&qh, x[i].qh, 4);
    const __m256i pow3 = _mm256_setr_epi16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27);
    const __m256i qh16 = _mm256_and_si256(
        _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm_set1_epi32(static_cast<int>(qh))), pow3), _mm256_set1_epi16(0xff));
    const __m128i qh8 = _mm_packus_epi16(_mm256_castsi256_si128(qh16), _mm256_extracti128_si256(qh16, 1));
    const __m256i r5 = _mm256_blend_epi32(h0, h1, 0xf0);
    const __m256i r6 = _mm256_blend_epi32(h2, h3, 0xf0);
    const __m256i r7 = _mm256_inserti128_si256(h4, qh8, 1);
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(top_trit(r5), load32(q8 + 160)));
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(top_trit(r6), load32(q8 + 192)));
    sum16 = _mm256_add_epi16(sum16, _mm256_maddubs_epi16(top_trit(r7), load32(q8 + 224)));
    acc = finish(sum16, y[i], h2f(x[i].d), acc);
  }
  return hsum8(acc);
}

}  // namespace

namespace avx2 {
void add_tq_kernels(DotKernels& k) {
  k.dot[slot(GgmlType::TQ1_0)] = dot_tq1_0;
  k.dot[slot(GgmlType::TQ2_0)] = dot_tq2_0;
}
}  // namespace avx2

}  // namespace car::tensor::detail

// AVX-512 (VNNI) dot kernels of the 4-bit table formats (IQ4_NL, MXFP4 against Q8_0; IQ4_XS against Q8_K),
// compiled with car_simd_source(... AVX512). Each equals its scalar reference in ref_iq4.cpp (and so the AVX2
// kernel) bit for bit. One 64-byte register holds two 32-element blocks (IQ4_NL / MXFP4: blocks 2k, 2k + 1,
// whose float lanes are the reference's two accumulators side by side; IQ4_XS: sub-blocks 2j, 2j + 1). The
// table values are looked up offset by +128, so they are unsigned for vpdpbusd, and 128 * (sum of the 4
// activations of each lane) is subtracted again: the int32 lanes are the reference's exact sums.
#include <immintrin.h>

#include <cmath>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

/// The table in every 128-bit lane, each value + 128 (as u8).
inline __m512i offset_table(const int8_t* table) {
  const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(table));
  return _mm512_broadcast_i32x4(_mm_xor_si128(v, _mm_set1_epi8(static_cast<char>(0x80))));
}

/// 32 bytes of nibbles (two 16-byte blocks a, b) -> the 64 offset values [a low, a high, b low, b high].
inline __m512i offset_values64(__m256i bits, __m512i table_u) {
  const __m512i v = _mm512_shuffle_i64x2(_mm512_castsi256_si512(bits), _mm512_castsi256_si512(bits), 0x50);
  const __m512i shifts = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
  const __m512i idx = _mm512_and_si512(_mm512_srlv_epi64(v, shifts), _mm512_set1_epi8(0x0f));
  return _mm512_shuffle_epi8(table_u, idx);
}

/// int32 lane k = sum over bytes 4k..4k+3 of value * y, from the offset values u = value + 128.
inline __m512i lane_sums(__m512i u, __m512i y) {
  const __m512i with_offset = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, y);
  const __m512i ysum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), y);
  return _mm512_sub_epi32(with_offset, _mm512_slli_epi32(ysum, 7));
}

inline float scale_of(const block_iq4_nl& b) {
  return h2f(b.d);
}
inline float scale_of(const block_mxfp4& b) {
  return e8m0_to_fp32_half(b.e);
}

template <typename Block>
float dot_nl32(const void* w, const void* a, int64_t n, const int8_t* table) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const int64_t nb = n / 32;
  const __m512i table_u = offset_table(table);
  __m512 acc = _mm512_setzero_ps();  // lanes 0..7: the even blocks' accumulator, 8..15: the odd blocks'
  int64_t ib = 0;
  for (; ib + 1 < nb; ib += 2) {
    const __m256i bits = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(x[ib + 1].qs),
                                             reinterpret_cast<const __m128i*>(x[ib].qs));
    const __m512i p = lane_sums(offset_values64(bits, table_u), load32x2(y[ib].qs, y[ib + 1].qs));
    const __m512 d = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(h2f(y[ib].d) * scale_of(x[ib]))),
                                        _mm256_set1_ps(h2f(y[ib + 1].d) * scale_of(x[ib + 1])), 1);
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
  }
  float sumf = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)));
  for (; ib < nb; ++ib) {  // an odd last block, as the reference
    const float d = h2f(y[ib].d) * scale_of(x[ib]);
    int sumi1 = 0, sumi2 = 0;
    for (int j = 0; j < 16; ++j) {
      sumi1 += y[ib].qs[j] * table[x[ib].qs[j] & 0x0f];
      sumi2 += y[ib].qs[j + 16] * table[x[ib].qs[j] >> 4];
    }
    sumf = std::fma(d, static_cast<float>(sumi1 + sumi2), sumf);
  }
  return sumf;
}

float dot_iq4_nl(const void* w, const void* a, int64_t n) {
  return dot_nl32<block_iq4_nl>(w, a, n, kvalues_iq4nl);
}

float dot_mxfp4(const void* w, const void* a, int64_t n) {
  return dot_nl32<block_mxfp4>(w, a, n, kvalues_mxfp4);
}

float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq4_xs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const __m512i table_u = offset_table(kvalues_iq4nl);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m512i sumi = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {  // sub-blocks 2j (lanes 0..7) and 2j + 1 (lanes 8..15)
      const __m512i u = offset_values64(load32(x[i].qs + 32 * j), table_u);
      const __m512i p = lane_sums(u, load64(y[i].qs + 64 * j));
      const __m512i ls = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi32(iq4_xs_scale(x[i], 2 * j))),
                                            _mm256_set1_epi32(iq4_xs_scale(x[i], 2 * j + 1)), 1);
      sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(p, ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(fold16(sumi)), acc);
  }
  return hsum8(acc);
}

}  // namespace

void add_iq4_kernels(DotKernels& k) {
  k.dot[slot(GgmlType::IQ4_NL)] = dot_iq4_nl;
  k.dot[slot(GgmlType::IQ4_XS)] = dot_iq4_xs;
  k.dot[slot(GgmlType::MXFP4)] = dot_mxfp4;
}

}  // namespace car::tensor::detail::avx512

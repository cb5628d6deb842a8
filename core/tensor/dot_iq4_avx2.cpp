// AVX2 dot kernels of the 4-bit table formats (IQ4_NL, MXFP4 against Q8_0; IQ4_XS against Q8_K), compiled
// with car_simd_source(... AVX2). Each equals its scalar reference in ref_iq4.cpp bit for bit: the nibbles
// become table values by pshufb, the integer lanes are exact (|value| <= 127 times |activation| <= 127: a
// maddubs pair stays below 2^15), and the float steps are the reference's (ggml's x86 order).
#include <immintrin.h>

#include <cmath>
#include <utility>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/nl32.h"
#include "core/tensor/simd_avx2.h"

namespace car::tensor::detail {
namespace {

/// 16 bytes of nibbles -> their 32 table values (low nibbles in bytes 0..15, high nibbles in 16..31).
inline __m256i table_values32(const uint8_t* qs, __m128i values) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_shuffle_epi8(values, _mm_and_si128(bits, m4));
  const __m128i hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));
  return _mm256_set_m128i(hi, lo);
}


template <typename Block>
float dot_nl32(const void* w, const void* a, int64_t n, const int8_t* table) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const int64_t nb = n / 32;
  const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(table));
  __m256 acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps();
  int64_t ib = 0;
  for (; ib + 1 < nb; ib += 2) {
    const __m256i p1 = dot_s8s8(table_values32(x[ib].qs, values), load32(y[ib].qs));
    const __m256i p2 = dot_s8s8(table_values32(x[ib + 1].qs, values), load32(y[ib + 1].qs));
    acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(y[ib].d) * nl32_scale(x[ib])), _mm256_cvtepi32_ps(p1), acc1);
    acc2 =
        _mm256_fmadd_ps(_mm256_set1_ps(h2f(y[ib + 1].d) * nl32_scale(x[ib + 1])), _mm256_cvtepi32_ps(p2), acc2);
  }
  float sumf = hsum8(_mm256_add_ps(acc1, acc2));
  for (; ib < nb; ++ib) sumf = nl32_block(x[ib], y[ib], table, sumf);  // an odd last block, as the reference
  return sumf;
}

/// llama.cpp's repacked order (kernel_table.h repacked(); dot_*_repacked_ref): each block's exact integer
/// (dot_s8s8's lanes, then their sum), times the scales' product by FMA, in block order.
template <typename Block>
float dot_nl32_repacked(const void* w, const void* a, int64_t n, const int8_t* table) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const int64_t nb = n / 32;
  const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(table));
  float acc = 0;
  for (int64_t ib = 0; ib < nb; ++ib) {
    const int sumi = hsum_i32x8(dot_s8s8(table_values32(x[ib].qs, values), load32(y[ib].qs)));
    acc = std::fma(static_cast<float>(sumi), nl32_scale(x[ib]) * h2f(y[ib].d), acc);
  }
  return acc;
}

/// llamafile's tinyBLAS_Q0_AVX order (dot_iq4_nl_q8_0_sgemm_ref): one accumulator over the blocks in order.
template <typename Block>
float dot_nl32_sgemm(const void* w, const void* a, int64_t n, const int8_t* table) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(table));
  __m256 acc = _mm256_setzero_ps();
  for (int64_t ib = 0; ib < n / 32; ++ib) {
    const __m256i p = dot_s8s8(table_values32(x[ib].qs, values), load32(y[ib].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(nl32_scale(x[ib]) * h2f(y[ib].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum8(acc);
}

float dot_iq4_nl_sgemm(const void* w, const void* a, int64_t n) {
  return dot_nl32_sgemm<block_iq4_nl>(w, a, n, kvalues_iq4nl);
}

float dot_q4_0_repacked(const void* w, const void* a, int64_t n) {
  return dot_nl32_repacked<block_q4_0>(w, a, n, kvalues_q4_0);
}
float dot_iq4_nl_repacked(const void* w, const void* a, int64_t n) {
  return dot_nl32_repacked<block_iq4_nl>(w, a, n, kvalues_iq4nl);
}
float dot_mxfp4_repacked(const void* w, const void* a, int64_t n) {
  return dot_nl32_repacked<block_mxfp4>(w, a, n, kvalues_mxfp4);
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
  const __m128i values = _mm_load_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl));
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    __m256i sumi = _mm256_setzero_si256();
    for (int ib = 0; ib < 8; ++ib) {
      const __m256i q = table_values32(x[i].qs + 16 * ib, values);
      const __m256i y8 = load32(y[i].qs + 32 * ib);
      // |value * activation| pairs < 2^15, times the scale (|ls| <= 32) in madd: exact int32.
      const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(y8, q));
      const __m256i ls = _mm256_set1_epi16(static_cast<int16_t>(iq4_xs_scale(x[i], ib)));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

}  // namespace

namespace avx2 {
void add_iq4_kernels(DotKernels& k) {
  k.dot[slot(GgmlType::IQ4_NL)] = dot_iq4_nl;
  k.dot_sgemm[slot(GgmlType::IQ4_NL)] = dot_iq4_nl_sgemm;
  k.dot[slot(GgmlType::IQ4_XS)] = dot_iq4_xs;
  k.dot[slot(GgmlType::MXFP4)] = dot_mxfp4;
  for (auto [t, fn] : {std::pair{GgmlType::Q4_0, &dot_q4_0_repacked}, std::pair{GgmlType::IQ4_NL, &dot_iq4_nl_repacked},
                       std::pair{GgmlType::MXFP4, &dot_mxfp4_repacked}}) {
    k.dot_gemv[slot(t)] = fn;  // one order for both (kernel_table.h repacked())
    k.dot_gemm[slot(t)] = fn;
  }
}
}  // namespace avx2

}  // namespace car::tensor::detail

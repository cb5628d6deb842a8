// AVX2 + FMA + F16C dot kernels (compiled with car_simd_source(... AVX2); only called when the CPU has them).
//
// Also the activation quantizers (Q8_0, Q8_1, Q8_K, F16), bit-identical to the scalar ones.
//
// Integer parts are computed exactly as the scalar references do (u8 x s8 pair products with maddubs, which
// cannot saturate for these formats: |level| <= 63 and |activation| <= 127, then madd into int32), so only
// the float accumulation differs: per block (or per 8 lanes) the integer sum is converted and multiplied by
// the block's scale product into 8-lane float accumulators, summed horizontally at the end.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

inline float h2f(ggml_half h) { return _cvtsh_ss(h); }

inline float hsum8(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

/// 16 bytes of nibbles -> 32 bytes: low nibbles in bytes 0..15, high nibbles in bytes 16..31.
inline __m256i nibbles32(const uint8_t* p) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

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

// ---------------------------------------------------------------------------------------------------------
// 32-element blocks

// Q8_0 / Q4_0 / Q5_0: one 8-lane accumulator over the blocks in order, as ggml's AVX2 ggml_vec_dot_q*_q8_0
// and llamafile's tinyBLAS_Q0_AVX (llama.cpp's two paths for these types) do, so results match them bit for
// bit.
float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q8_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(load32(x[i].qs), load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc);
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256i q = _mm256_sub_epi8(nibbles32(x[i].qs), eight);
    const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q, load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc);
}

float dot_q4_1(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_1*>(w);
  const auto* y = static_cast<const block_q8_1*>(a);
  const int64_t nb = n / QK8_1;
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t i = 0; i < nb; ++i) {
    summs += h2f(x[i].m) * h2f(y[i].s);
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(nibbles32(x[i].qs), load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc) + summs;
}

float dot_q5_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q5_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const int64_t nb = n / QK8_0;
  const __m256i hi_off = _mm256_set1_epi8(static_cast<char>(0xf0));
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    // level - 16 = nibble | (bit ? 0 : 0xf0) read as int8.
    const __m256i q = _mm256_or_si256(nibbles32(x[i].qs), _mm256_andnot_si256(bits32(x[i].qh), hi_off));
    const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q, load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc);
}

float dot_q5_1(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q5_1*>(w);
  const auto* y = static_cast<const block_q8_1*>(a);
  const int64_t nb = n / QK8_1;
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t i = 0; i < nb; ++i) {
    summs += h2f(x[i].m) * h2f(y[i].s);
    const __m256i q = _mm256_or_si256(nibbles32(x[i].qs), _mm256_and_si256(bits32(x[i].qh), bit4));
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(q, load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc) + summs;
}

// ---------------------------------------------------------------------------------------------------------
// K-quants (256-element super-blocks, Q8_K activations)

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

/// The mins term of Q4_K / Q5_K as ggml's AVX2 kernels form it: bsums summed in pairs (int16 hadd), times
/// the 8 mins, into 4 int32 lanes (lane k: mins 2k and 2k+1).
inline __m128i mins_dot_bsums(const uint32_t* mins_words, const int16_t* bsums) {
  const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mins_words)));
  const __m256i b = load32(bsums);
  const __m128i pairs = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
  return _mm_madd_epi16(m16, pairs);
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

inline int hsum_i32x8(__m256i v) {
  return hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)));
}

// Q4_K / Q5_K / Q6_K follow ggml's AVX2 kernels' arithmetic exactly (the same 8 int32 lanes per super-block,
// the same scale products, the same mins accumulation and final reductions); llama.cpp uses those kernels on
// AVX-512 machines too, so these results equal its results bit for bit.
float dot_q4_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t sm[4];
    unpack_scale_min_k4_words(x[i].scales, sm);
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot_bsums(sm + 2, y[i].bsums)), acc_m);
    const __m256i sc16 = scales8_to_16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm)), false);
    const uint8_t* q4 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j, q4 += 32, q8 += 64) {
      const __m256i bits = load32(q4);
      const __m256i lo = _mm256_and_si256(bits, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
      const __m256i pl = _mm256_maddubs_epi16(lo, load32(q8));
      const __m256i ph = _mm256_maddubs_epi16(hi, load32(q8 + 32));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pl, spread1(sc16, 2 * j)));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(ph, spread1(sc16, 2 * j + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc) + hsum4(acc_m);
}

/// Q4_K in llama.cpp's repacked orders (kernel_table.h repacked(); dot_q4_K_q8_K_gemv_ref / _gemm_ref): the
/// integer sums of dot_q4_K, reduced exactly to one int per super-block (kGemm false) or per 64 elements
/// (true), then the same FMA chains as the references.
template <bool kGemm>
float dot_q4_K_repacked(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  float acc = 0.0f, acc_m = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t sm[4];
    unpack_scale_min_k4_words(x[i].scales, sm);
    const float d = h2f(x[i].d) * y[i].d;
    const float dmin = h2f(x[i].dmin) * y[i].d;
    const __m128i mins = mins_dot_bsums(sm + 2, y[i].bsums);  // lane g: the mins term of elements 64g..64g+63
    const __m256i sc16 = scales8_to_16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm)), false);
    const uint8_t* q4 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j, q4 += 32, q8 += 64) {
      const __m256i bits = load32(q4);
      const __m256i lo = _mm256_and_si256(bits, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
      const __m256i pl = _mm256_maddubs_epi16(lo, load32(q8));
      const __m256i ph = _mm256_maddubs_epi16(hi, load32(q8 + 32));
      const __m256i s = _mm256_add_epi32(_mm256_madd_epi16(pl, spread1(sc16, 2 * j)),
                                         _mm256_madd_epi16(ph, spread1(sc16, 2 * j + 1)));
      if constexpr (kGemm) {
        acc = std::fma(static_cast<float>(hsum_i32x8(s)), d, acc);
      } else {
        sumi = _mm256_add_epi32(sumi, s);
      }
    }
    if constexpr (kGemm) {
      alignas(16) int32_t m[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(m), mins);
      for (int g = 0; g < 4; ++g) acc_m = std::fma(static_cast<float>(m[g]), dmin, acc_m);
    } else {
      acc = std::fma(static_cast<float>(hsum_i32x8(sumi)), d, acc);
      acc_m = std::fma(static_cast<float>(hsum_i32x4(mins)), dmin, acc_m);
    }
  }
  return acc - acc_m;
}

float dot_q5_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q5_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t sm[4];
    unpack_scale_min_k4_words(x[i].scales, sm);
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    summs += dmin * static_cast<float>(hsum_i32x4(mins_dot_bsums(sm + 2, y[i].bsums)));
    const __m256i sc16 = scales8_to_16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm)), false);
    const uint8_t* q4 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    const __m256i hbits = load32(x[i].qh);
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j, q4 += 32, q8 += 64) {
      const __m256i bits = load32(q4);
      const __m256i h_lo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j), one), 4);
      const __m256i h_hi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * j + 1), one), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), h_lo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), h_hi);
      const __m256i pl = _mm256_maddubs_epi16(lo, load32(q8));
      const __m256i ph = _mm256_maddubs_epi16(hi, load32(q8 + 32));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(pl, spread1(sc16, 2 * j)));
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(ph, spread1(sc16, 2 * j + 1)));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc) + summs;
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q6_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i m2 = _mm256_set1_epi8(0x03);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    const __m256i sc16[2] = {scales8_to_16(sc8, true), scales8_to_16(_mm_srli_si128(sc8, 8), true)};
    // The -32 offset of the levels, as ggml forms it: lane l loses 32 * (bsums[2l] sc[2l] + bsums[2l+1]
    // sc[2l+1]) once per block (the lanes' split of the exact sum decides the float rounding).
    const __m256i offset =
        _mm256_slli_epi32(_mm256_madd_epi16(load32(y[i].bsums), _mm256_cvtepi8_epi16(sc8)), 5);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* q8 = y[i].qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32) {
      const __m256i l1 = load32(ql), l2 = load32(ql + 32), hb = load32(qh);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(l2, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
      for (int k = 0; k < 4; ++k, q8 += 32) {
        // level (0..63) * y: each pair fits int16.
        const __m256i p = _mm256_maddubs_epi16(q[k], load32(q8));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, spread2(sc16[h], k)));
      }
    }
    sumi = _mm256_sub_epi32(sumi, offset);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

float dot_q2_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q2_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  __m256 acc = _mm256_setzero_ps(), acc_m = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const float dall = y[i].d * h2f(x[i].d);
    const float dmin = y[i].d * h2f(x[i].dmin);
    const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales));
    const __m256i mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4));
    acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, load32(y[i].bsums))),
                            acc_m);
    int16_t sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int16_t>(x[i].scales[j] & 0x0f);
    const int8_t* q8 = y[i].qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load32(x[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k, q8 += 32) {
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        const __m256i p = _mm256_maddubs_epi16(q, load32(q8));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc + 8 * h + 2 * k)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(dall), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc) - hsum8(acc_m);
}

float dot_q3_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q3_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    int8_t raw[16];
    unpack_q3_K_scales(x[i].scales, raw);
    int16_t sc[16];
    for (int j = 0; j < 16; ++j) sc[j] = static_cast<int16_t>(raw[j] - 32);
    const __m256i hbits = load32(x[i].hmask);
    const int8_t* q8 = y[i].qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i bits = load32(x[i].qs + 32 * h);
      for (int k = 0; k < 4; ++k, q8 += 32) {
        const int b = 4 * h + k;
        const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
        // 4 where the high bit is clear: level = q - that.
        const __m256i clear = _mm256_andnot_si256(_mm256_srli_epi16(hbits, b), one);
        const __m256i q_hi = _mm256_slli_epi16(_mm256_and_si256(clear, one), 2);
        const __m256i y8 = load32(q8);
        const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(q, y8), _mm256_maddubs_epi16(q_hi, y8));
        sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc + 2 * b)));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc);
}

// ---------------------------------------------------------------------------------------------------------
// Float formats (any length; scalar tail)

float dot_f32(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    }
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc[0]);
  float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += x[i] * y[i];
  return sum;
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

float dot_f16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm256_fmadd_ps(load_f16x8(x + i + 8 * k), load_f16x8(y + i + 8 * k), acc[k]);
    }
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_f16x8(x + i), load_f16x8(y + i), acc[0]);
  float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += _cvtsh_ss(x[i]) * _cvtsh_ss(y[i]);
  return sum;
}

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm256_fmadd_ps(load_bf16x8(x + i + 8 * k), load_bf16x8(y + i + 8 * k), acc[k]);
    }
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load_bf16x8(x + i), load_bf16x8(y + i), acc[0]);
  float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  uint32_t ux, uy;
  for (; i < n; ++i) {
    ux = static_cast<uint32_t>(x[i]) << 16;
    uy = static_cast<uint32_t>(y[i]) << 16;
    float fx, fy;
    std::memcpy(&fx, &ux, 4);
    std::memcpy(&fy, &uy, 4);
    sum += fx * fy;
  }
  return sum;
}

// ---------------------------------------------------------------------------------------------------------
// Activation rounding, bit-identical to the scalar versions (same multiplier, round-half-even conversion
// under the default MXCSR rounding mode, same first-maximum rule for Q8_K's signed extreme).

inline float hmax8(__m256 v) {
  __m128 r = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/// 32 int32 (four registers) -> 32 int8 in order (values already within int8 range).
inline __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i a = _mm256_packs_epi32(i0, i1);  // 0-3 8-11 4-7 12-15 (per-lane interleave)
  const __m256i b = _mm256_packs_epi32(i2, i3);
  const __m256i c = _mm256_packs_epi16(a, b);
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/// Round 32 floats times `mul` to int32 (half to even).
inline void round32(const float* x, __m256 mul, __m256i* out) {
  for (int k = 0; k < 4; ++k) out[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), mul));
}

template <bool kWithSum>
void quantize_q8_0_like(const float* x, void* dst, int64_t n) {
  const size_t stride = kWithSum ? sizeof(block_q8_1) : sizeof(block_q8_0);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32, out += stride) {
    __m256 m = abs8(_mm256_loadu_ps(x));
    for (int k = 1; k < 4; ++k) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + 8 * k)));
    const float amax = hmax8(m);
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    const uint16_t dh = static_cast<uint16_t>(_cvtss_sh(d, 0));
    std::memcpy(out, &dh, 2);
    __m256i q[4];
    round32(x, _mm256_set1_ps(id), q);
    if constexpr (kWithSum) {
      const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
      const uint16_t sh = static_cast<uint16_t>(_cvtss_sh(d * static_cast<float>(_mm_cvtsi128_si32(t)), 0));
      std::memcpy(out + 2, &sh, 2);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (kWithSum ? 4 : 2)), pack32(q[0], q[1], q[2], q[3]));
  }
}

void quantize_act_q8_0_avx2(const float* x, void* dst, int64_t n) { quantize_q8_0_like<false>(x, dst, n); }
void quantize_act_q8_1_avx2(const float* x, void* dst, int64_t n) { quantize_q8_0_like<true>(x, dst, n); }

void quantize_act_q8_K_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_K*>(dst);
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < QK_K; k += 8) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + k)));
    const float amax = hmax8(m);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    // The first element whose magnitude is amax gives the sign (the scalar loop's strict '>').
    int first = 0;
    const __m256 va = _mm256_set1_ps(amax);
    for (int k = 0; k < QK_K; k += 8) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(x + k)), va, _CMP_EQ_OQ));
      if (mask != 0) {
        first = k + __builtin_ctz(static_cast<unsigned>(mask));
        break;
      }
    }
    const float iscale = -127.f / x[first];
    const __m256 mul = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    for (int k = 0; k < QK_K; k += 32) {
      __m256i q[4];
      round32(x + k, mul, q);
      for (auto& v : q) v = _mm256_min_epi32(v, cap);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + k), pack32(q[0], q[1], q[2], q[3]));
      // bsums of the two 16-element groups: horizontal sums of q[0]+q[1] and q[2]+q[3].
      const __m256i s01 = _mm256_add_epi32(q[0], q[1]), s23 = _mm256_add_epi32(q[2], q[3]);
      const __m256i h = _mm256_hadd_epi32(s01, s23);  // lane-wise pairs
      const __m256i h2 = _mm256_hadd_epi32(h, h);
      const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h2), _mm256_extracti128_si256(h2, 1));
      y[i].bsums[k / 16] = static_cast<int16_t>(_mm_extract_epi32(t, 0));
      y[i].bsums[k / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(t, 1));
    }
    y[i].d = 1 / iscale;
  }
}

void convert_act_f16_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) y[i] = static_cast<uint16_t>(_cvtss_sh(x[i], 0));
}

DotKernels make_table() {
  DotKernels k = scalar_kernels();
  k.quantize_act[slot(GgmlType::Q8_0)] = quantize_act_q8_0_avx2;
  k.quantize_act[slot(GgmlType::Q8_1)] = quantize_act_q8_1_avx2;
  k.quantize_act[slot(GgmlType::Q8_K)] = quantize_act_q8_K_avx2;
  k.quantize_act[slot(GgmlType::F16)] = convert_act_f16_avx2;
  k.dot[slot(GgmlType::F32)] = dot_f32;
  k.dot[slot(GgmlType::F16)] = dot_f16;
  k.dot[slot(GgmlType::BF16)] = dot_bf16;
  k.dot[slot(GgmlType::Q4_0)] = dot_q4_0;
  k.dot[slot(GgmlType::Q4_1)] = dot_q4_1;
  k.dot[slot(GgmlType::Q5_0)] = dot_q5_0;
  k.dot[slot(GgmlType::Q5_1)] = dot_q5_1;
  k.dot[slot(GgmlType::Q8_0)] = dot_q8_0;
  k.dot[slot(GgmlType::Q2_K)] = dot_q2_K;
  k.dot[slot(GgmlType::Q3_K)] = dot_q3_K;
  k.dot[slot(GgmlType::Q4_K)] = dot_q4_K;
  k.dot[slot(GgmlType::Q5_K)] = dot_q5_K;
  k.dot[slot(GgmlType::Q6_K)] = dot_q6_K;
  for (int t = 0; t < kTypeSlots; ++t) k.dot_id[t] = k.dot[t];  // one order for every AVX2 kernel
  k.dot_gemv[slot(GgmlType::Q4_K)] = dot_q4_K_repacked<false>;
  k.dot_gemm[slot(GgmlType::Q4_K)] = dot_q4_K_repacked<true>;
  return k;
}

}  // namespace

const DotKernels* avx2_kernels() {
  static const DotKernels table = make_table();
  return &table;
}

}  // namespace car::tensor::detail

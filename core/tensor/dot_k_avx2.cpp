// AVX2 + FMA + F16C dot kernels of the K-quants (256-element super-blocks, Q8_K activations), including Q4_K
// in llama.cpp's repacked gemv / gemm orders (compiled with car_simd_source(... AVX2); only called when the
// CPU has them). Integer parts exact, as in dot_avx2.cpp.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_avx2.h"

namespace car::tensor::detail {
namespace {

// The pieces Q4_K (plain and repacked) and Q5_K share. Integer only, so exact whichever kernel adds them up.

// A super-block's eight 6-bit sub-block scales (the mins go to sm[2..3]), widened to int16 for spread1().
__m256i k4_scales16(const uint8_t* scales, uint32_t sm[4]) {
  unpack_scale_min_k4_words(scales, sm);
  return scales8_to_16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm)), false);
}

// One 64-element group j of a super-block: levels `lo` (elements 0-31) and `hi` (32-63) times the Q8_K
// values at q8, each 16-bit pair sum times its sub-block's scale (2j and 2j + 1) as int32x8.
struct GroupProducts {
  __m256i lo;
  __m256i hi;
};
GroupProducts k4_group_products(__m256i lo, __m256i hi, const int8_t* q8, __m256i sc16, int j) {
  const __m256i pl = _mm256_maddubs_epi16(lo, load32(q8));
  const __m256i ph = _mm256_maddubs_epi16(hi, load32(q8 + 32));
  return {_mm256_madd_epi16(pl, spread1(sc16, 2 * j)), _mm256_madd_epi16(ph, spread1(sc16, 2 * j + 1))};
}

// Q4_K's group j: the low and the high nibbles of the 32 bytes at q4 are its two halves.
GroupProducts q4_group_products(const uint8_t* q4, const int8_t* q8, __m256i sc16, int j) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  const __m256i bits = load32(q4);
  return k4_group_products(_mm256_and_si256(bits, m4), _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), q8,
                           sc16, j);
}

// Q4_K / Q5_K / Q6_K follow ggml's AVX2 kernels' arithmetic exactly (the same 8 int32 lanes per super-block,
// the same scale products, the same mins accumulation and final reductions); llama.cpp uses those kernels on
// AVX-512 machines too, so these results equal its results bit for bit.
float dot_q4_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t sm[4];
    const __m256i sc16 = k4_scales16(x[i].scales, sm);
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins_dot_bsums(sm + 2, y[i].bsums)), acc_m);
    const uint8_t* q4 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j, q4 += 32, q8 += 64) {
      const GroupProducts p = q4_group_products(q4, q8, sc16, j);
      sumi = _mm256_add_epi32(sumi, p.lo);
      sumi = _mm256_add_epi32(sumi, p.hi);
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
  }
  return hsum8(acc) + hsum4(acc_m);
}

/// Q4_K in llama.cpp's repacked gemm order (kernel_table.h repacked(); dot_q4_K_q8_K_gemm_ref): the integer
/// sums of dot_q4_K, reduced exactly to one int per 64 elements, then the same FMA chains as the reference.
float dot_q4_K_gemm(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  float acc = 0.0f, acc_m = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t sm[4];
    const __m256i sc16 = k4_scales16(x[i].scales, sm);
    const float d = h2f(x[i].d) * y[i].d;
    const float dmin = h2f(x[i].dmin) * y[i].d;
    const __m128i mins = mins_dot_bsums(sm + 2, y[i].bsums);  // lane g: the mins term of elements 64g..64g+63
    const uint8_t* q4 = x[i].qs;
    const int8_t* q8 = y[i].qs;
    for (int j = 0; j < 4; ++j, q4 += 32, q8 += 64) {
      const GroupProducts p = q4_group_products(q4, q8, sc16, j);
      acc = std::fma(static_cast<float>(hsum_i32x8(_mm256_add_epi32(p.lo, p.hi))), d, acc);
    }
    alignas(16) int32_t m[4];
    _mm_store_si128(reinterpret_cast<__m128i*>(m), mins);
    for (int g = 0; g < 4; ++g) acc_m = std::fma(static_cast<float>(m[g]), dmin, acc_m);
  }
  return acc - acc_m;
}

/// One super-block in the gemv order: its scale products as int32x8 (their total is the block's scale
/// integer) and its mins term in 4 lanes (their total the min integer), both exact.
struct GemvBlock {
  __m256i s;
  __m128i m;
};
GemvBlock q4_K_gemv_block(const block_q4_K& x, const block_q8_K& y) {
  uint32_t sm[4];
  const __m256i sc16 = k4_scales16(x.scales, sm);
  const uint8_t* q4 = x.qs;
  const int8_t* q8 = y.qs;
  __m256i sumi = _mm256_setzero_si256();
  for (int j = 0; j < 4; ++j, q4 += 32, q8 += 64) {
    const GroupProducts p = q4_group_products(q4, q8, sc16, j);
    sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p.lo, p.hi));
  }
  return {sumi, mins_dot_bsums(sm + 2, y.bsums)};
}

/// [h2f(x.d) * y.d, h2f(x.dmin) * y.d, 0, 0]: the block's two scale products (x.d and x.dmin are adjacent).
__m128 gemv_scales(const block_q4_K& x, const block_q8_K& y) {
  uint32_t dm;
  std::memcpy(&dm, &x.d, sizeof(dm));
  return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm))), _mm_set1_ps(y.d));
}

/// Q4_K in llama.cpp's repacked gemv order (dot_q4_K_q8_K_gemv_ref): the two FMA chains (scales, mins) run as
/// lanes 0 and 1 of one FMA, block after block as the reference runs them, and the blocks' exact integers
/// are reduced four blocks at a time (two rounds of hadd for the four blocks instead of a horizontal sum,
/// a conversion and a scalar FMA per block and chain - issue #29). Equal to the reference bit for bit.
float dot_q4_K_gemv(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  __m128 acc = _mm_setzero_ps();  // lane 0: the scales' chain, lane 1: the mins'; lanes 2, 3 stay 0
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const GemvBlock b0 = q4_K_gemv_block(x[i], y[i]), b1 = q4_K_gemv_block(x[i + 1], y[i + 1]);
    const GemvBlock b2 = q4_K_gemv_block(x[i + 2], y[i + 2]), b3 = q4_K_gemv_block(x[i + 3], y[i + 3]);
    // Lane k: block i + k's integer.
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(b0.s, b1.s), _mm256_hadd_epi32(b2.s, b3.s));
    const __m128 s =
        _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    const __m128 m = _mm_cvtepi32_ps(_mm_hadd_epi32(_mm_hadd_epi32(b0.m, b1.m), _mm_hadd_epi32(b2.m, b3.m)));
    const __m128 lo = _mm_unpacklo_ps(s, m);  // [s0, m0, s1, m1]
    const __m128 hi = _mm_unpackhi_ps(s, m);  // [s2, m2, s3, m3]
    acc = _mm_fmadd_ps(lo, gemv_scales(x[i], y[i]), acc);
    acc = _mm_fmadd_ps(_mm_movehl_ps(lo, lo), gemv_scales(x[i + 1], y[i + 1]), acc);
    acc = _mm_fmadd_ps(hi, gemv_scales(x[i + 2], y[i + 2]), acc);
    acc = _mm_fmadd_ps(_mm_movehl_ps(hi, hi), gemv_scales(x[i + 3], y[i + 3]), acc);
  }
  for (; i < nb; ++i) {
    const GemvBlock b = q4_K_gemv_block(x[i], y[i]);
    const __m128 sm =
        _mm_setr_ps(static_cast<float>(hsum_i32x8(b.s)), static_cast<float>(hsum_i32x4(b.m)), 0, 0);
    acc = _mm_fmadd_ps(sm, gemv_scales(x[i], y[i]), acc);
  }
  return _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc));
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
    const __m256i sc16 = k4_scales16(x[i].scales, sm);
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    // An explicit FMA, as dot_avx512.cpp's dot_k4 (GCC contracts it at -O2, not at the sanitizers' -O1).
    summs = std::fma(dmin, static_cast<float>(hsum_i32x4(mins_dot_bsums(sm + 2, y[i].bsums))), summs);
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
      const GroupProducts p = k4_group_products(lo, hi, q8, sc16, j);
      sumi = _mm256_add_epi32(sumi, p.lo);
      sumi = _mm256_add_epi32(sumi, p.hi);
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
    acc_m = _mm256_fmadd_ps(_mm256_set1_ps(dmin),
                            _mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, load32(y[i].bsums))), acc_m);
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

/// One Q2_K block's exact integers, as dot_q2_K_q8_K_gemv_ref / _gemm_ref form them, split over int32 lanes:
/// s[h] sums to the scale integer of 128-element half h (sub-blocks 8h..8h+7: scale * level * q8), m's lanes
/// 0-3 / 4-7 to the min integer of half 0 / 1 (min * bsum).
struct Q2Block {
  __m256i s[2];
  __m256i m;
};
Q2Block q2_K_block(const block_q2_K& x, const block_q8_K& y) {
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m128i m4 = _mm_set1_epi8(0x0f);
  const __m128i sm = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
  Q2Block r;
  r.m = _mm256_madd_epi16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), m4)), load32(y.bsums));
  alignas(32) int16_t sc[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(sc), _mm256_cvtepu8_epi16(_mm_and_si128(sm, m4)));
  const int8_t* q8 = y.qs;
  for (int h = 0; h < 2; ++h) {
    const __m256i bits = load32(x.qs + 32 * h);
    __m256i sumi = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k, q8 += 32) {
      const __m256i q = _mm256_and_si256(_mm256_srli_epi16(bits, 2 * k), m3);
      const __m256i p = _mm256_maddubs_epi16(q, load32(q8));  // level 0..3 * q8: no saturation
      sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_pair(sc + 8 * h + 2 * k)));
    }
    r.s[h] = sumi;
  }
  return r;
}

/// [h2f(x.d) * y.d, h2f(x.dmin) * y.d, 0, 0] (x.d and x.dmin are adjacent).
__m128 q2_K_gemv_scales(const block_q2_K& x, const block_q8_K& y) {
  uint32_t dm;
  std::memcpy(&dm, &x.d, sizeof(dm));
  return _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dm))), _mm_set1_ps(y.d));
}

/// Q2_K in llama.cpp's repacked gemv order (kernel_table.h repacked(); dot_q2_K_q8_K_gemv_ref): one exact
/// integer per super-block for each of the two FMA chains, which run as lanes 0 and 1 of one FMA, the
/// blocks' integers reduced four blocks at a time as dot_q4_K_gemv does. Equal to the reference bit for bit.
float dot_q2_K_gemv(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q2_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  auto block = [&](int64_t i, __m256i& s, __m128i& m) {
    const Q2Block b = q2_K_block(x[i], y[i]);
    s = _mm256_add_epi32(b.s[0], b.s[1]);
    m = _mm_add_epi32(_mm256_castsi256_si128(b.m), _mm256_extracti128_si256(b.m, 1));
  };
  __m128 acc = _mm_setzero_ps();  // lane 0: the scales' chain, lane 1: the mins'; lanes 2, 3 stay 0
  int64_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    __m256i s0, s1, s2, s3;
    __m128i m0, m1, m2, m3;
    block(i, s0, m0);
    block(i + 1, s1, m1);
    block(i + 2, s2, m2);
    block(i + 3, s3, m3);
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
    const __m128 s =
        _mm_cvtepi32_ps(_mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
    const __m128 m = _mm_cvtepi32_ps(_mm_hadd_epi32(_mm_hadd_epi32(m0, m1), _mm_hadd_epi32(m2, m3)));
    const __m128 lo = _mm_unpacklo_ps(s, m);  // [s0, m0, s1, m1]
    const __m128 hi = _mm_unpackhi_ps(s, m);  // [s2, m2, s3, m3]
    acc = _mm_fmadd_ps(lo, q2_K_gemv_scales(x[i], y[i]), acc);
    acc = _mm_fmadd_ps(_mm_movehl_ps(lo, lo), q2_K_gemv_scales(x[i + 1], y[i + 1]), acc);
    acc = _mm_fmadd_ps(hi, q2_K_gemv_scales(x[i + 2], y[i + 2]), acc);
    acc = _mm_fmadd_ps(_mm_movehl_ps(hi, hi), q2_K_gemv_scales(x[i + 3], y[i + 3]), acc);
  }
  for (; i < nb; ++i) {
    __m256i s;
    __m128i m;
    block(i, s, m);
    const __m128 sm = _mm_setr_ps(static_cast<float>(hsum_i32x8(s)), static_cast<float>(hsum_i32x4(m)), 0, 0);
    acc = _mm_fmadd_ps(sm, q2_K_gemv_scales(x[i], y[i]), acc);
  }
  return _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc));
}

/// Q2_K in llama.cpp's repacked gemm order (dot_q2_K_q8_K_gemm_ref): one exact integer per 128-element half
/// for each chain, the two chains as lanes 0 and 1 of one FMA. Equal to the reference bit for bit.
float dot_q2_K_gemm(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q2_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  __m128 acc = _mm_setzero_ps();  // lane 0: the scales' chain, lane 1: the mins'
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const Q2Block b = q2_K_block(x[i], y[i]);
    // Lane h: half h's scale integer; lane 2 + h: its min integer.
    const __m256i sh = _mm256_hadd_epi32(b.s[0], b.s[1]);
    const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sh), _mm256_extracti128_si256(sh, 1));
    const __m128i s2 = _mm_hadd_epi32(s4, s4);  // [s_0, s_1, s_0, s_1]
    const __m128i m4 = _mm_hadd_epi32(_mm256_castsi256_si128(b.m), _mm256_extracti128_si256(b.m, 1));
    const __m128i m2 = _mm_hadd_epi32(m4, m4);                     // [m_0, m_1, m_0, m_1]
    const __m128 v = _mm_cvtepi32_ps(_mm_unpacklo_epi32(s2, m2));  // [s_0, m_0, s_1, m_1]
    const __m128 dm = q2_K_gemv_scales(x[i], y[i]);
    acc = _mm_fmadd_ps(v, dm, acc);
    acc = _mm_fmadd_ps(_mm_movehl_ps(v, v), dm, acc);
  }
  return _mm_cvtss_f32(acc) - _mm_cvtss_f32(_mm_movehdup_ps(acc));
}

float dot_q3_K(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q3_K*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m256i m3 = _mm256_set1_epi8(3);
  const __m256i one = _mm256_set1_epi8(1);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    // One 32-byte store; scale_pair's 4-byte loads inside it forward from it.
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc), q3_K_scales16(x[i].scales));
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

}  // namespace

void avx2::add_k_quant_kernels(DotKernels& k) {
  k.dot[slot(GgmlType::Q2_K)] = dot_q2_K;
  k.dot[slot(GgmlType::Q3_K)] = dot_q3_K;
  k.dot[slot(GgmlType::Q4_K)] = dot_q4_K;
  k.dot[slot(GgmlType::Q5_K)] = dot_q5_K;
  k.dot[slot(GgmlType::Q6_K)] = dot_q6_K;
  k.dot_gemv[slot(GgmlType::Q4_K)] = dot_q4_K_gemv;
  k.dot_gemm[slot(GgmlType::Q4_K)] = dot_q4_K_gemm;
  k.dot_gemv[slot(GgmlType::Q2_K)] = dot_q2_K_gemv;
  k.dot_gemm[slot(GgmlType::Q2_K)] = dot_q2_K_gemm;
}

}  // namespace car::tensor::detail

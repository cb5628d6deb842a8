// AVX-512 (VNNI) dot kernels of the 4-bit table formats (IQ4_NL, MXFP4 against Q8_0; IQ4_XS against Q8_K),
// compiled with car_simd_source(... AVX512). Each equals its scalar reference in ref_iq4.cpp (and so the AVX2
// kernel) bit for bit. One 64-byte register holds two 32-element blocks (IQ4_NL / MXFP4: blocks 2k, 2k + 1,
// whose float lanes are the reference's two accumulators side by side; IQ4_XS: sub-blocks 2j, 2j + 1).
// IQ4_NL / MXFP4 look their values up offset by +128, so they are unsigned for vpdpbusd, and subtract
// 128 * (sum of the 4 activations of each lane) again; IQ4_XS keeps them signed, moves their signs onto the
// activations for maddubs and multiplies the pairs by the sub-block scale in vpdpwssd. Either way the int32
// lanes are the reference's exact sums.
//
// The matvec kernels (DotKernels::rows) take rows in pairs: two independent FMA chains in flight, the
// activation side (the pairs of activation blocks, their -128 * sum corrections and scales) prepared once per
// call and shared by every row, the next pair of rows prefetched in software (side-by-side rows defeat the
// hardware prefetcher) as one sweep through its contiguous 2 * row_bytes (two sweeps, one per next row, left
// the 1 GiB matvec at ~0.48 of the read where Q4_0's kernel, which sweeps, was at ~0.70). Each row's float
// operations are its dot kernel's, in its order, so each result equals the dot kernel's bit for bit
// (rows_kernel_test).
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/tensor/blocks.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/nl32.h"
#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

/// The table in every 128-bit lane, each value + 128 (as u8).
inline __m512i offset_table(const int8_t* table) {
  const __m128i v = _mm_load_si128(reinterpret_cast<const __m128i*>(table));
  return _mm512_broadcast_i32x4(_mm_xor_si128(v, _mm_set1_epi8(static_cast<char>(0x80))));
}

/// 32 bytes of nibbles (two 16-byte blocks a, b) -> their 64 table values [a low, a high, b low, b high]
/// (the table as offset_table or signed_table gives it).
inline __m512i table_values64(__m256i bits, __m512i table_u) {
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
    const __m512i p = lane_sums(table_values64(bits, table_u), load32x2(y[ib].qs, y[ib + 1].qs));
    const __m512 d =
        _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(h2f(y[ib].d) * nl32_scale(x[ib]))),
                           _mm256_set1_ps(h2f(y[ib + 1].d) * nl32_scale(x[ib + 1])), 1);
    acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
  }
  float sumf = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)));
  for (; ib < nb; ++ib) sumf = nl32_block(x[ib], y[ib], table, sumf);  // an odd last block, as the reference
  return sumf;
}

float dot_iq4_nl(const void* w, const void* a, int64_t n) {
  return dot_nl32<block_iq4_nl>(w, a, n, kvalues_iq4nl);
}

float dot_mxfp4(const void* w, const void* a, int64_t n) {
  return dot_nl32<block_mxfp4>(w, a, n, kvalues_mxfp4);
}

/// The 8 sub-block scales (-32..31) of an IQ4_XS block as int16 lanes 0..7: the low nibbles and high bit
/// pairs deposited into one byte each (pdep), less 32.
inline __m512i xs_scales16(const block_iq4_xs& b) {
  uint32_t lo;
  std::memcpy(&lo, b.scales_l, 4);
  const uint64_t stored = _pdep_u64(lo, 0x0f0f0f0f0f0f0f0full) | _pdep_u64(b.scales_h, 0x3030303030303030ull);
  const __m128i s8 = _mm_sub_epi8(_mm_cvtsi64_si128(static_cast<long long>(stored)), _mm_set1_epi8(32));
  return _mm512_castsi128_si512(_mm_cvtepi8_epi16(s8));
}

/// vpermw indices: lanes [0, 16) <- scale 2j, [16, 32) <- scale 2j + 1 (int16 lanes of xs_scales16).
inline __m512i xs_pick16(int j) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(2 * j))),
                            _mm256_set1_epi16(static_cast<int16_t>(2 * j + 1)), 1);
}

/// sumi += ls * (value * y) over two sub-blocks: the table values (signed) times y with the sign moved onto y
/// (|value| <= 127, |y| <= 127: a maddubs pair stays below 2^15), the int16 pairs times the scale by
/// vpdpwssd. The int32 lanes are the reference's exact sums.
inline __m512i xs_accumulate(__m512i sumi, __m512i q, __m512i y, __m512i ls) {
  const __m512i ys = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(q), _mm512_setzero_si512(), y);
  return _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(_mm512_abs_epi8(q), ys), ls);
}

/// The signed table in every 128-bit lane.
inline __m512i signed_table(const int8_t* table) {
  return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(table)));
}

float dot_iq4_xs(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_iq4_xs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const __m512i table = signed_table(kvalues_iq4nl);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK_K; ++i) {
    const __m512i ls = xs_scales16(x[i]);
    __m512i sumi = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {  // sub-blocks 2j (lanes 0..7) and 2j + 1 (lanes 8..15)
      const __m512i q = table_values64(load32(x[i].qs + 32 * j), table);
      sumi = xs_accumulate(sumi, q, load64(y[i].qs + 64 * j), _mm512_permutexvar_epi16(xs_pick16(j), ls));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[i].d), _mm256_cvtepi32_ps(fold16(sumi)), acc);
  }
  return hsum8(acc);
}

// ---- matvec: rows in pairs ----

/// The activation side of a call, per 64 activation bytes k (two Q8_0 blocks, or one IQ4_XS sub-block pair):
/// the -128 * (lane sums of y) each lane starts from, and (Q8_0) both blocks' scales in the lanes of their
/// block. Thread-local, grow-only.
struct alignas(64) Vec512i {
  __m512i v;
};
struct alignas(64) Vec512 {
  __m512 v;
};
struct ActPrep {
  std::vector<Vec512i> corr;
  std::vector<Vec512> dy;
};
ActPrep& act_prep() {
  thread_local ActPrep p;
  return p;
}

inline __m512i neg_offset_sums(__m512i y) {
  const __m512i ysum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), y);
  return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(ysum, 7));
}

inline __m512 pair_scales(const block_iq4_nl& b0, const block_iq4_nl& b1) {
  return _mm512_cvtph_ps(
      _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(b0.d))),
                              _mm_set1_epi16(static_cast<int16_t>(b1.d)), 1));
}
inline __m512 pair_scales(const block_mxfp4& b0, const block_mxfp4& b1) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(e8m0_to_fp32_half(b0.e))),
                            _mm256_set1_ps(e8m0_to_fp32_half(b1.e)), 1);
}

template <typename Block>
void rows_nl32(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out,
               const int8_t* table) {
  const auto* y = static_cast<const block_q8_0*>(act);
  const int64_t nb = n / 32, npairs = nb / 2;
  ActPrep& prep = act_prep();
  if (prep.corr.size() < static_cast<size_t>(npairs)) {
    prep.corr.resize(static_cast<size_t>(npairs));
    prep.dy.resize(static_cast<size_t>(npairs));
  }
  for (int64_t k = 0; k < npairs; ++k) {
    prep.corr[k].v = neg_offset_sums(load32x2(y[2 * k].qs, y[2 * k + 1].qs));
    prep.dy[k].v = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(h2f(y[2 * k].d))),
                                      _mm256_set1_ps(h2f(y[2 * k + 1].d)), 1);
  }
  const __m512i table_u = offset_table(table);
  int64_t r = 0;
  for (; r + 2 <= nrows; r += 2) {
    const auto* x0 = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * row_bytes);
    const auto* x1 = reinterpret_cast<const Block*>(w + static_cast<size_t>(r + 1) * row_bytes);
    const char* ahead = reinterpret_cast<const char*>(w) + static_cast<size_t>(r + 2) * row_bytes;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t k = 0; k < npairs; ++k) {
      const int64_t ib = 2 * k;
      // the next pair's bytes (contiguous, 2 * row_bytes) in one sweep, 4 blocks' worth a step
      _mm_prefetch(ahead + 2 * ib * static_cast<int64_t>(sizeof(Block)), kWeightStreamHint);
      _mm_prefetch(ahead + 2 * ib * static_cast<int64_t>(sizeof(Block)) + 64, kWeightStreamHint);
      const __m512i yv = load32x2(y[ib].qs, y[ib + 1].qs);
      const __m512i u0 = table_values64(_mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(x0[ib + 1].qs),
                                                            reinterpret_cast<const __m128i*>(x0[ib].qs)),
                                        table_u);
      const __m512i u1 = table_values64(_mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(x1[ib + 1].qs),
                                                            reinterpret_cast<const __m128i*>(x1[ib].qs)),
                                        table_u);
      const __m512i p0 = _mm512_dpbusd_epi32(prep.corr[k].v, u0, yv);
      const __m512i p1 = _mm512_dpbusd_epi32(prep.corr[k].v, u1, yv);
      // lane for lane h2f(y.d) * scale(x), as the dot kernel's scalar product
      acc0 = _mm512_fmadd_ps(_mm512_mul_ps(prep.dy[k].v, pair_scales(x0[ib], x0[ib + 1])),
                             _mm512_cvtepi32_ps(p0), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_mul_ps(prep.dy[k].v, pair_scales(x1[ib], x1[ib + 1])),
                             _mm512_cvtepi32_ps(p1), acc1);
    }
    out[r] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc0), _mm512_extractf32x8_ps(acc0, 1)));
    out[r + 1] = hsum8(_mm256_add_ps(_mm512_castps512_ps256(acc1), _mm512_extractf32x8_ps(acc1, 1)));
    if (nb % 2 != 0) {  // the odd last block, as the dot kernel
      for (int q = 0; q < 2; ++q) {
        const Block& xb = (q == 0 ? x0 : x1)[nb - 1];
        const block_q8_0& yb = y[nb - 1];
        int sumi1 = 0, sumi2 = 0;
        for (int j = 0; j < 16; ++j) {
          sumi1 += yb.qs[j] * table[xb.qs[j] & 0x0f];
          sumi2 += yb.qs[j + 16] * table[xb.qs[j] >> 4];
        }
        out[r + q] = std::fma(h2f(yb.d) * nl32_scale(xb), static_cast<float>(sumi1 + sumi2), out[r + q]);
      }
    }
  }
  if (r < nrows) out[r] = dot_nl32<Block>(w + static_cast<size_t>(r) * row_bytes, act, n, table);
}

void rows_iq4_nl(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* y) {
  rows_nl32<block_iq4_nl>(w, row_bytes, nrows, act, n, y, kvalues_iq4nl);
}

void rows_mxfp4(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* y) {
  rows_nl32<block_mxfp4>(w, row_bytes, nrows, act, n, y, kvalues_mxfp4);
}

void rows_iq4_xs(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out) {
  const auto* y = static_cast<const block_q8_K*>(act);
  const int64_t nb = n / QK_K;
  const __m512i table = signed_table(kvalues_iq4nl);
  const __m512i pick[4] = {xs_pick16(0), xs_pick16(1), xs_pick16(2), xs_pick16(3)};
  int64_t r = 0;
  for (; r + 2 <= nrows; r += 2) {
    const auto* x0 = reinterpret_cast<const block_iq4_xs*>(w + static_cast<size_t>(r) * row_bytes);
    const auto* x1 = reinterpret_cast<const block_iq4_xs*>(w + static_cast<size_t>(r + 1) * row_bytes);
    const char* ahead = reinterpret_cast<const char*>(w) + static_cast<size_t>(r + 2) * row_bytes;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      // the next pair's bytes (contiguous, 2 * row_bytes) in one sweep, 2 blocks' worth (272 bytes) a step
      for (int line = 0; line < 5; ++line) _mm_prefetch(ahead + 2 * i * 136 + 64 * line, kWeightStreamHint);
      const __m512i ls0 = xs_scales16(x0[i]), ls1 = xs_scales16(x1[i]);
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int j = 0; j < 4; ++j) {
        const __m512i yv = load64(y[i].qs + 64 * j);
        s0 = xs_accumulate(s0, table_values64(load32(x0[i].qs + 32 * j), table), yv,
                           _mm512_permutexvar_epi16(pick[j], ls0));
        s1 = xs_accumulate(s1, table_values64(load32(x1[i].qs + 32 * j), table), yv,
                           _mm512_permutexvar_epi16(pick[j], ls1));
      }
      acc0 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x0[i].d) * y[i].d), _mm256_cvtepi32_ps(fold16(s0)), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x1[i].d) * y[i].d), _mm256_cvtepi32_ps(fold16(s1)), acc1);
    }
    out[r] = hsum8(acc0);
    out[r + 1] = hsum8(acc1);
  }
  if (r < nrows) out[r] = dot_iq4_xs(w + static_cast<size_t>(r) * row_bytes, act, n);
}

}  // namespace

void add_iq4_kernels(DotKernels& k) {
  k.dot[slot(GgmlType::IQ4_NL)] = dot_iq4_nl;
  k.dot[slot(GgmlType::IQ4_XS)] = dot_iq4_xs;
  k.dot[slot(GgmlType::MXFP4)] = dot_mxfp4;
  k.rows[slot(GgmlType::IQ4_NL)] = rows_iq4_nl;
  k.rows[slot(GgmlType::IQ4_XS)] = rows_iq4_xs;
  k.rows[slot(GgmlType::MXFP4)] = rows_mxfp4;
}

}  // namespace car::tensor::detail::avx512

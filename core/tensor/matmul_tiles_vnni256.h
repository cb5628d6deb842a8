// Internal to core/tensor: the prompt tiles of Q5_K, Q3_K, Q6_K (vpdpwssd), Q4_1, Q5_0, Q5_1, Q8_0 and
// repacked Q2_K (vpdpbusd) in 256-bit registers (issue #26), for AVX2 machines with AVX-VNNI. The designs of
// matmul_k_vnni.cpp, matmul_legacy_vnni.cpp, matmul_q8_vnni.cpp and matmul_q2k_vnni.cpp with eight weight
// rows per register instead of sixteen: lane r of every int32 / float register is row r, the vector's int16
// pair (K-quants) or 4 quants (legacy) of the same elements are broadcast, and the float steps are lane-wise
// copies of the AVX2 table's dot kernels (dot_k_avx2.cpp dot_q5_K / dot_q3_K / dot_q6_K, dot_avx2.cpp
// dot_q4_1 / dot_q5_0 / dot_q5_1 / dot_q8_0; for Q2_K the references of its repacked orders,
// dot_q2_K_q8_K_gemm_ref / _gemv_ref), so each result equals them bit for bit. See those files for the orders
// and why the K-quant levels are pre-multiplied by their scales.
//
// VEX code has 16 vector registers: a (row group, vector) pair's 8 lane accumulators, two integer chains and
// the weights fill most of them, so the tiles run one vector at a time over the packed rows.
//
// Built twice from this header: matmul_tiles_avxvnni.cpp (-mavxvnni: the VEX instructions; the AVX-VNNI
// table's) and matmul_tiles_vnni256_evex.cpp (AVX-512 VL + VNNI: the EVEX encodings of the same 256-bit
// instructions, whose semantics are identical), which the tests run on CPUs without AVX-VNNI. Include it only
// from those files.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/blocks.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/nl32.h"
#include "core/tensor/simd_x86.h"

namespace car::tensor::detail::vnni256 {
namespace {

constexpr int kRows8 = 8;  // weight rows per packed group: one int32 / float lane each

/// acc + the 4-byte dot products of unsigned u and signed s per int32 lane (vpdpbusd, 256-bit).
inline __m256i dpbusd8(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
/// acc + the int16 pair products of a and b per int32 lane (vpdpwssd, 256-bit).
inline __m256i dpwssd8(__m256i acc, __m256i a, __m256i b) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, a, b);
#else
  return _mm256_dpwssd_avx_epi32(acc, a, b);
#endif
}

inline __m256i bcast_dword(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/// 8x8 transpose of dwords: lane r of out[k] = dword k of z[r].
inline void transpose8x8(const __m256i* z, __m256i* out) {
  __m256i t[8], u[8];
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_epi32(z[2 * p], z[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_epi32(z[2 * p], z[2 * p + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    __m256i* uh = u + 4 * h;
    const __m256i* th = t + 4 * h;
    uh[0] = _mm256_unpacklo_epi64(th[0], th[2]);
    uh[1] = _mm256_unpackhi_epi64(th[0], th[2]);
    uh[2] = _mm256_unpacklo_epi64(th[1], th[3]);
    uh[3] = _mm256_unpackhi_epi64(th[1], th[3]);
  }
  for (int q = 0; q < 4; ++q) {
    out[q] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x20);
    out[q + 4] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x31);
  }
}

/// hsum8's tree per lane over 8 accumulators: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)).
inline __m256 hsum8_lanes(const __m256* a) {
  const __m256 r0 = _mm256_add_ps(a[4], a[0]), r1 = _mm256_add_ps(a[5], a[1]);
  const __m256 r2 = _mm256_add_ps(a[6], a[2]), r3 = _mm256_add_ps(a[7], a[3]);
  return _mm256_add_ps(_mm256_add_ps(r0, r2), _mm256_add_ps(r1, r3));
}

// ---------------------------------------------------------------------------------------------------------
// Q5_K, Q3_K: levels times scales as int16, vpdpwssd (matmul_k_vnni.cpp)

struct PackedK8 {
  alignas(32) int16_t w[128][2 * kRows8];  ///< [k] lane r = row r's (level * scale) of elements 2k, 2k + 1
  int32_t mn[4][kRows8];                   ///< Q5_K: [g] lane r = row r's mins 2g (low int16), 2g + 1 (high)
  int32_t off[8][kRows8];  ///< Q6_K: [l] lane r = row r's -32 * scales 2l (low int16), 2l + 1 (high)
  float d[kRows8];
  float dmin[kRows8];  ///< Q5_K
};

/// 32 levels (bytes, unsigned or signed) times one int16 scale per 16 elements, stored as 32 int16.
template <bool kSigned>
inline void scale_store(__m256i lv, int16_t s0, int16_t s1, int16_t* out) {
  const __m128i lo = _mm256_castsi256_si128(lv), hi = _mm256_extracti128_si256(lv, 1);
  const __m256i a = kSigned ? _mm256_cvtepi8_epi16(lo) : _mm256_cvtepu8_epi16(lo);
  const __m256i b = kSigned ? _mm256_cvtepi8_epi16(hi) : _mm256_cvtepu8_epi16(hi);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), _mm256_mullo_epi16(a, _mm256_set1_epi16(s0)));
  _mm256_store_si256(reinterpret_cast<__m256i*>(out + 16), _mm256_mullo_epi16(b, _mm256_set1_epi16(s1)));
}

struct Q5K8 {
  using Block = block_q5_K;
  static constexpr bool kMins = true, kOffset = false;
  static void levels(const Block& x, int16_t* out, int16_t* mins) {
    uint32_t sm[4];
    unpack_scale_min_k4_words(x.scales, sm);
    const auto* sc = reinterpret_cast<const uint8_t*>(sm);
    for (int c = 0; c < 8; ++c) mins[c] = sc[8 + c];
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const __m256i hb = load32(x.qh);
    for (int g = 0; g < 4; ++g) {
      const __m256i bits = load32(x.qs + 32 * g);
      const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), one), 4);
      const __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g + 1), one), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), hlo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), hhi);
      scale_store<false>(lo, sc[2 * g], sc[2 * g], out + 64 * g);
      scale_store<false>(hi, sc[2 * g + 1], sc[2 * g + 1], out + 64 * g + 32);
    }
  }
  static float dmin(const Block& x) { return h2f(x.dmin); }
};

struct Q3K8 {
  using Block = block_q3_K;
  static constexpr bool kMins = false, kOffset = false;
  static void levels(const Block& x, int16_t* out, int16_t* /*mins*/) {
    int8_t raw[16];
    unpack_q3_K_scales(x.scales, raw);
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    const __m256i hb = load32(x.hmask);
    for (int b = 0; b < 8; ++b) {
      const __m256i q = _mm256_and_si256(_mm256_srli_epi16(load32(x.qs + 32 * (b / 4)), 2 * (b % 4)), m3);
      const __m256i h = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, b), one), 2);
      const __m256i lv = _mm256_sub_epi8(_mm256_or_si256(q, h), four);
      scale_store<true>(lv, static_cast<int16_t>(raw[2 * b] - 32), static_cast<int16_t>(raw[2 * b + 1] - 32),
                        out + 32 * b);
    }
  }
  static float dmin(const Block&) { return 0.0f; }
};

/// Q6_K as dot_k_avx2.cpp dot_q6_K forms it: the unsigned levels (0..63) times the scales, and the -32 offset
/// apart, per lane l of the dot kernel from the activations' sums of sub-blocks 2l and 2l + 1 (`mins` here:
/// the 16 scales times -32, which fit int16), so each lane's integer is the dot kernel's.
struct Q6K8 {
  using Block = block_q6_K;
  static constexpr bool kMins = false, kOffset = true;
  static void levels(const Block& x, int16_t* out, int16_t* off) {
    for (int s = 0; s < 16; ++s) off[s] = static_cast<int16_t>(-32 * x.scales[s]);
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const __m256i l1 = load32(x.ql + 64 * h), l2 = load32(x.ql + 64 * h + 32), hb = load32(x.qh + 32 * h);
      __m256i q[4];
      q[0] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
      q[1] = _mm256_or_si256(_mm256_and_si256(l2, m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
      q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
      q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
      for (int k = 0; k < 4; ++k) {  // elements 128h + 32k ..: scales 8h + 2k, 8h + 2k + 1
        const int s = 8 * h + 2 * k;
        scale_store<false>(q[k], x.scales[s], x.scales[s + 1], out + 128 * h + 32 * k);
      }
    }
  }
  static float dmin(const Block&) { return 0.0f; }
};

template <class K>
void pack_k8(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedK8* pb) {
  alignas(32) int16_t lv[kRows8][256];
  for (int r = nrows; r < kRows8; ++r) std::fill(lv[r], lv[r] + 256, int16_t{0});
  for (int64_t i = 0; i < nb; ++i) {
    PackedK8& b = pb[i];
    for (int r = 0; r < kRows8; ++r) {
      int16_t mins[16] = {};  // Q5_K: the 8 mins; Q6_K: the 16 offsets
      float d = 0.0f, dmin = 0.0f;
      if (r < nrows) {
        const auto& x = reinterpret_cast<const typename K::Block*>(w + static_cast<size_t>(r) * row_bytes)[i];
        K::levels(x, lv[r], mins);
        d = h2f(x.d);
        dmin = K::dmin(x);
      }
      auto pair = [&](int j) {
        return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(mins[2 * j])) |
                                    (static_cast<uint32_t>(static_cast<uint16_t>(mins[2 * j + 1])) << 16));
      };
      if constexpr (K::kMins) {
        for (int g = 0; g < 4; ++g) b.mn[g][r] = pair(g);
      }
      if constexpr (K::kOffset) {
        for (int l = 0; l < 8; ++l) b.off[l][r] = pair(l);
      }
      b.d[r] = d;
      b.dmin[r] = dmin;
    }
    for (int s = 0; s < 16; ++s) {  // dwords 8s .. 8s + 7 of the 8 rows
      __m256i z[8], out[8];
      for (int r = 0; r < 8; ++r) z[r] = load32(lv[r] + 16 * s);
      transpose8x8(z, out);
      for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(b.w[8 * s + k]), out[k]);
    }
  }
}

/// Per vector and block: the 256 activations as int16, the sub-block sums as 4 int16 pairs (sums of 32), y.d,
/// the 16 sub-block sums (Q6_K's offsets).
struct VecK {
  alignas(64) int16_t q[256];
  int32_t pairs[4];
  float d;
  int16_t bsums[16];
  int32_t pad[3];
};

inline void prepare_k(const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t nb, VecK* out) {
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* y = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      VecK& o = out[v * nb + i];
      for (int m = 0; m < 16; ++m) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(y[i].qs + 16 * m));
        _mm256_store_si256(reinterpret_cast<__m256i*>(o.q + 16 * m), _mm256_cvtepi8_epi16(q));
      }
      const __m256i bs = load32(y[i].bsums);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o.pairs),
                       _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
      o.d = y[i].d;
      std::memcpy(o.bsums, y[i].bsums, sizeof o.bsums);
    }
  }
}

/// 8 packed rows x 1 vector over nb super-blocks: out[r] for the rows in `rows` (lanes -1).
template <class K>
void rows8_k(const PackedK8* pb, int64_t nb, const VecK* y, float* out, __m256i rows) {
  __m256 acc[8], summs = _mm256_setzero_ps();
  for (int l = 0; l < 8; ++l) acc[l] = _mm256_setzero_ps();
  const __m256 neg = _mm256_set1_ps(-0.0f);
  for (int64_t i = 0; i < nb; ++i) {
    const PackedK8& b = pb[i];
    const VecK& yv = y[i];
    const __m256 yd = _mm256_set1_ps(yv.d);
    const __m256 d = _mm256_mul_ps(yd, _mm256_load_ps(b.d));  // y.d * x.d, as the dot kernels form it
    if constexpr (K::kMins) {
      __m256i im = _mm256_setzero_si256();
      for (int g = 0; g < 4; ++g) {
        im = dpwssd8(im, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.mn[g])),
                     _mm256_set1_epi32(yv.pairs[g]));
      }
      const __m256 dmin = _mm256_mul_ps(_mm256_xor_ps(yd, neg), _mm256_load_ps(b.dmin));
      summs = _mm256_fmadd_ps(dmin, _mm256_cvtepi32_ps(im), summs);
    }
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      __m256i t0 = _mm256_setzero_si256(), t1 = _mm256_setzero_si256();
      if constexpr (K::kOffset) {  // lane l's share of the offset: sub-blocks 2l and 2l + 1
        t0 = dpwssd8(t0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.off[l])),
                     bcast_dword(yv.bsums + 2 * l));
      }
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const int k = 16 * c + 2 * l;
        t0 = dpwssd8(t0, _mm256_load_si256(reinterpret_cast<const __m256i*>(b.w[k])),
                     bcast_dword(yv.q + 2 * k));
        t1 = dpwssd8(t1, _mm256_load_si256(reinterpret_cast<const __m256i*>(b.w[k + 1])),
                     bcast_dword(yv.q + 2 * k + 2));
      }
      acc[l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_add_epi32(t0, t1)), acc[l]);
    }
  }
  const __m256 h = hsum8_lanes(acc);
  _mm256_maskstore_ps(out, rows, K::kMins ? _mm256_add_ps(h, summs) : h);
}

template <class K>
void tile_k8(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
             int64_t nvec, int64_t n, float* y, int64_t ldy) {
  assert(n % QK_K == 0);
  thread_local AlignedScratch pack_buf, vec_buf;
  const int64_t nb = n / QK_K;
  auto* pb = static_cast<PackedK8*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedK8)));
  auto* vb = static_cast<VecK*>(vec_buf.get(static_cast<size_t>(nvec * nb) * sizeof(VecK)));
  prepare_k(acts, act_bytes, nvec, nb, vb);
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows8) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows8, nrows - r0));
    pack_k8<K>(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    const __m256i rows = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t v = 0; v < nvec; ++v) rows8_k<K>(pb, nb, vb + v * nb, y + v * ldy + r0, rows);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Q4_1, Q5_0, Q5_1, Q8_0: unsigned levels, vpdpbusd (matmul_legacy_vnni.cpp, matmul_q8_vnni.cpp)

struct PackedL8 {
  alignas(32) uint8_t qs[8][32];  ///< [k] lane r = row r's levels of elements 4k .. 4k + 3
  float d[kRows8];
  float m[kRows8];
};

/// 0x10 in byte j where bit j of the 4 bytes at qh is set (the fifth bit of element j).
inline __m256i fifth_bits8(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                        2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), shuf);
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, mask), mask), _mm256_set1_epi8(0x10));
}

struct Q4_1_8 {
  using Block = block_q4_1;
  using ActBlock = block_q8_1;
  static constexpr bool kMin = true, kOffset = false;
  static constexpr int kBias = 0;
  static __m256i levels(const Block& x) { return nibbles32(x.qs); }
  static float min(const Block& x) { return h2f(x.m); }
};
struct Q5_1_8 {
  using Block = block_q5_1;
  using ActBlock = block_q8_1;
  static constexpr bool kMin = true, kOffset = false;
  static constexpr int kBias = 0;
  static __m256i levels(const Block& x) { return _mm256_or_si256(nibbles32(x.qs), fifth_bits8(x.qh)); }
  static float min(const Block& x) { return h2f(x.m); }
};
struct Q5_0_8 {
  using Block = block_q5_0;
  using ActBlock = block_q8_0;
  static constexpr bool kMin = false, kOffset = true;
  static constexpr int kBias = 16;  ///< the levels are quants + 16: each dword's sum starts at -16 * y's
  static __m256i levels(const Block& x) { return _mm256_or_si256(nibbles32(x.qs), fifth_bits8(x.qh)); }
  static float min(const Block&) { return 0.0f; }
};
/// Q8_0 (dot_avx2.cpp dot_q8_0): signed quants made unsigned by adding 128 (the bytes' top bit flipped); the
/// sums start at -128 * y's, so each lane's integer is the exact s8 x s8 sum the dot kernel forms.
struct Q8_0_8 {
  using Block = block_q8_0;
  using ActBlock = block_q8_0;
  static constexpr bool kMin = false, kOffset = true;
  static constexpr int kBias = 128;
  static __m256i levels(const Block& x) {
    return _mm256_xor_si256(load32(x.qs), _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static float min(const Block&) { return 0.0f; }
};

template <class F>
void pack_l8(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedL8* pb) {
  using Block = typename F::Block;
  for (int64_t i = 0; i < nb; ++i) {
    PackedL8& b = pb[i];
    __m256i z[8], out[8];
    for (int r = 0; r < kRows8; ++r) {
      if (r < nrows) {
        const Block& x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * row_bytes)[i];
        z[r] = F::levels(x);
        b.d[r] = h2f(x.d);
        b.m[r] = F::min(x);
      } else {
        z[r] = _mm256_setzero_si256();
        b.d[r] = 0.0f;
        b.m[r] = 0.0f;
      }
    }
    transpose8x8(z, out);
    for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(b.qs[k]), out[k]);
  }
}

/// 8 packed rows x 1 vector over nb blocks: out[r] for the rows in `rows`. off: Q5_0's / Q8_0's per-lane
/// starts.
template <class F>
void rows8_l(const PackedL8* pb, int64_t nb, const typename F::ActBlock* y, const int32_t* off, float* out,
             __m256i rows) {
  __m256 acc[8], summs = _mm256_setzero_ps();
  for (int k = 0; k < 8; ++k) acc[k] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedL8& b = pb[i];
    const __m256 d = _mm256_mul_ps(_mm256_load_ps(b.d), _mm256_set1_ps(h2f(y[i].d)));  // x.d * y.d
    if constexpr (F::kMin) summs = _mm256_fmadd_ps(_mm256_load_ps(b.m), _mm256_set1_ps(h2f(y[i].s)), summs);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i start = F::kOffset ? _mm256_set1_epi32(off[8 * i + k]) : _mm256_setzero_si256();
      const __m256i p = dpbusd8(start, _mm256_load_si256(reinterpret_cast<const __m256i*>(b.qs[k])),
                                bcast_dword(y[i].qs + 4 * k));
      acc[k] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[k]);
    }
  }
  const __m256 h = hsum8_lanes(acc);
  _mm256_maskstore_ps(out, rows, F::kMin ? _mm256_add_ps(h, summs) : h);
}

template <class F>
void tile_l8(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
             int64_t nvec, int64_t n, float* y, int64_t ldy) {
  assert(n % 32 == 0);
  using ActBlock = typename F::ActBlock;
  thread_local AlignedScratch pack_buf, off_buf;
  const int64_t nb = n / 32;
  auto* pb = static_cast<PackedL8*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedL8)));
  int32_t* off = nullptr;
  if constexpr (F::kOffset) {
    off = static_cast<int32_t*>(off_buf.get(static_cast<size_t>(nvec * nb) * 8 * sizeof(int32_t)));
    const __m256i bias = _mm256_set1_epi8(static_cast<char>(F::kBias));
    for (int64_t v = 0; v < nvec; ++v) {
      const auto* yb = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(v) * act_bytes);
      for (int64_t i = 0; i < nb; ++i) {
        const __m256i s = dpbusd8(_mm256_setzero_si256(), bias, load32(yb[i].qs));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(off + 8 * (v * nb + i)),
                            _mm256_sub_epi32(_mm256_setzero_si256(), s));
      }
    }
  }
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows8) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows8, nrows - r0));
    pack_l8<F>(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    const __m256i rows = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t v = 0; v < nvec; ++v) {
      const auto* yv = reinterpret_cast<const ActBlock*>(acts + static_cast<size_t>(v) * act_bytes);
      rows8_l<F>(pb, nb, yv, off == nullptr ? nullptr : off + 8 * v * nb, y + v * ldy + r0, rows);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Repacked Q2_K: scale * level bytes, vpdpbusd, llama.cpp's gemm / gemv orders (matmul_q2k_vnni.cpp)

struct PackedQ2x8 {
  alignas(32) uint8_t q[64][32];  ///< [k] lane r = row r's scale * level of elements 4k .. 4k + 3
  int32_t mn[8][kRows8];          ///< [p] lane r = row r's mins 2p (low int16) and 2p + 1 (high)
  float d[kRows8];
  float dmin[kRows8];
};

inline void pack_q2_8(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedQ2x8* pb) {
  alignas(32) uint8_t lv[kRows8][256];
  for (int r = nrows; r < kRows8; ++r) std::memset(lv[r], 0, sizeof lv[r]);
  const __m256i m3 = _mm256_set1_epi8(3);
  auto table = [](int sc) { return static_cast<int32_t>((sc << 8) | (2 * sc << 16) | (3u * sc << 24)); };
  for (int64_t i = 0; i < nb; ++i) {
    PackedQ2x8& b = pb[i];
    for (int r = 0; r < kRows8; ++r) {
      if (r < nrows) {
        const auto& x = reinterpret_cast<const block_q2_K*>(w + static_cast<size_t>(r) * row_bytes)[i];
        for (int c = 0; c < 8; ++c) {  // elements 32c .. 32c + 31: sub-blocks 2c, 2c + 1
          const __m256i q = _mm256_and_si256(_mm256_srli_epi16(load32(x.qs + 32 * (c / 4)), 2 * (c % 4)), m3);
          const __m256i t = _mm256_setr_epi32(table(x.scales[2 * c] & 0x0f), 0, 0, 0,
                                              table(x.scales[2 * c + 1] & 0x0f), 0, 0, 0);
          _mm256_store_si256(reinterpret_cast<__m256i*>(lv[r] + 32 * c), _mm256_shuffle_epi8(t, q));
        }
        for (int p = 0; p < 8; ++p) {
          b.mn[p][r] = static_cast<int32_t>(static_cast<uint32_t>(x.scales[2 * p] >> 4) |
                                            (static_cast<uint32_t>(x.scales[2 * p + 1] >> 4) << 16));
        }
        b.d[r] = h2f(x.d);
        b.dmin[r] = h2f(x.dmin);
      } else {
        for (int p = 0; p < 8; ++p) b.mn[p][r] = 0;
        b.d[r] = b.dmin[r] = 0.0f;
      }
    }
    for (int s = 0; s < 8; ++s) {
      __m256i z[8], out[8];
      for (int r = 0; r < 8; ++r) z[r] = load32(lv[r] + 32 * s);
      transpose8x8(z, out);
      for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(b.q[8 * s + k]), out[k]);
    }
  }
}

/// 8 packed rows x kV vectors over nb super-blocks in one order; out[v * ldy + r] for the rows in `rows`.
template <int kV, bool kGemm>
void rows8_q2(const PackedQ2x8* pb, int64_t nb, const block_q8_K* const* y, float* out, int64_t ldy,
              __m256i rows) {
  __m256 acc[kV], acc_m[kV];
  for (int v = 0; v < kV; ++v) acc[v] = acc_m[v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedQ2x8& b = pb[i];
    const __m256 xd = _mm256_load_ps(b.d), xdmin = _mm256_load_ps(b.dmin);
    // integer chains: the half's sums (gemm) or the block's (gemv: not reset between the halves)
    __m256i s0[kV], s1[kV], m[kV];
    for (int v = 0; v < kV; ++v) s0[v] = s1[v] = m[v] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      if (kGemm && h == 1) {
        for (int v = 0; v < kV; ++v) s0[v] = s1[v] = m[v] = _mm256_setzero_si256();
      }
#pragma GCC unroll 16
      for (int k = 0; k < 32; k += 2) {
        const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b.q[32 * h + k]));
        const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b.q[32 * h + k + 1]));
        for (int v = 0; v < kV; ++v) {
          s0[v] = dpbusd8(s0[v], w0, bcast_dword(y[v][i].qs + 128 * h + 4 * k));
          s1[v] = dpbusd8(s1[v], w1, bcast_dword(y[v][i].qs + 128 * h + 4 * k + 4));
        }
      }
      for (int p = 4 * h; p < 4 * h + 4; ++p) {
        const __m256i mn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.mn[p]));
        for (int v = 0; v < kV; ++v) m[v] = dpwssd8(m[v], mn, bcast_dword(y[v][i].bsums + 2 * p));
      }
      if (kGemm || h == 1) {
        for (int v = 0; v < kV; ++v) {
          const __m256 yd = _mm256_set1_ps(y[v][i].d);
          const __m256i sum = _mm256_add_epi32(s0[v], s1[v]);
          acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(xd, yd), acc[v]);
          acc_m[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m[v]), _mm256_mul_ps(xdmin, yd), acc_m[v]);
        }
      }
    }
  }
  for (int v = 0; v < kV; ++v) _mm256_maskstore_ps(out + v * ldy, rows, _mm256_sub_ps(acc[v], acc_m[v]));
}

/// RepackedTileFn (kernel_table.h) for Q2_K.
inline void tile_q2_K_repacked8(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                const uint8_t* gemm) {
  assert(n % QK_K == 0);
  thread_local AlignedScratch pack_buf;
  const int64_t nb = n / QK_K;
  auto* pb = static_cast<PackedQ2x8*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedQ2x8)));
  auto gemm_at = [&](int64_t v) { return gemm != nullptr && gemm[v] != 0; };
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows8) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows8, nrows - r0));
    pack_q2_8(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    const __m256i rows = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t v = 0; v < nvec;) {
      const bool g = gemm_at(v);
      const int kN = v + 1 < nvec && gemm_at(v + 1) == g ? 2 : 1;  // VEX code has 16 registers: 2 at a time
      const block_q8_K* yv[2];
      for (int j = 0; j < kN; ++j) {
        yv[j] = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v + j) * act_bytes);
      }
      float* out = y + v * ldy + r0;
      if (kN == 2) {
        g ? rows8_q2<2, true>(pb, nb, yv, out, ldy, rows) : rows8_q2<2, false>(pb, nb, yv, out, ldy, rows);
      } else {
        g ? rows8_q2<1, true>(pb, nb, yv, out, ldy, rows) : rows8_q2<1, false>(pb, nb, yv, out, ldy, rows);
      }
      v += kN;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Repacked Q4_0, IQ4_NL, MXFP4: table value + 128, vpdpbusd, llama.cpp's repacked order
// (matmul_nl32_vnni.cpp)
//
// One exact integer per (row, vector, block) - sum(table value * y) = sum((value + 128) * y) - 128 * sum(y),
// |sum| <= 32 * 255 * 127 - and one fma(float(integer), x.d * y.d, acc) per block in block order
// (dot_*_q8_0_repacked_ref; the gemv and gemm orders are the same). The nibbles become table values + 128 at
// packing, so a vector's block costs eight vpdpbusd.

struct PackedNl8 {
  alignas(32) uint8_t q[8][32];  ///< [k] lane r = row r's value + 128 of elements 4k .. 4k + 3
  float d[kRows8];               ///< row r's block scale (0 past the group's end)
};

struct Q4_0Nl8 {
  using Block = block_q4_0;
  static constexpr const int8_t* values = kvalues_q4_0;
};
struct Iq4NlNl8 {
  using Block = block_iq4_nl;
  static constexpr const int8_t* values = kvalues_iq4nl;
};
struct Mxfp4Nl8 {
  using Block = block_mxfp4;
  static constexpr const int8_t* values = kvalues_mxfp4;
};

template <class F>
void pack_nl8(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedNl8* pb) {
  using Block = typename F::Block;
  const __m128i lut = _mm_add_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(F::values)),
                                   _mm_set1_epi8(static_cast<char>(0x80)));
  const __m128i m4 = _mm_set1_epi8(0x0f);
  for (int64_t i = 0; i < nb; ++i) {
    PackedNl8& b = pb[i];
    __m256i z[8], out[8];
    for (int r = 0; r < kRows8; ++r) {
      if (r < nrows) {
        const Block& x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * row_bytes)[i];
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs));
        const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(bits, m4));  // elements 0..15
        const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(bits, 4), m4));  // 16..31
        z[r] = _mm256_set_m128i(hi, lo);
        b.d[r] = nl32_scale(x);
      } else {
        z[r] = _mm256_setzero_si256();
        b.d[r] = 0.0f;
      }
    }
    transpose8x8(z, out);
    for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(b.q[k]), out[k]);
  }
}

/// 8 packed rows x kV vectors over nb blocks. y[v]: vector v's Q8_0 blocks; off[v]: per block, 128 x the sum
/// of its quants; out[v * ldy + r] for the rows in `rows`.
template <int kV>
void rows8_nl(const PackedNl8* pb, int64_t nb, const block_q8_0* const* y, const int32_t* const* off,
              float* out, int64_t ldy, __m256i rows) {
  __m256 acc[kV];
  for (int v = 0; v < kV; ++v) acc[v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedNl8& b = pb[i];
    __m256i s[kV];
    for (int v = 0; v < kV; ++v) s[v] = _mm256_set1_epi32(-off[v][i]);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m256i wk = _mm256_load_si256(reinterpret_cast<const __m256i*>(b.q[k]));
      for (int v = 0; v < kV; ++v) s[v] = dpbusd8(s[v], wk, bcast_dword(y[v][i].qs + 4 * k));
    }
    const __m256 xd = _mm256_load_ps(b.d);
    for (int v = 0; v < kV; ++v) {
      const __m256 d = _mm256_mul_ps(xd, _mm256_set1_ps(h2f(y[v][i].d)));  // x.d * y.d, as the reference
      acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[v]), d, acc[v]);
    }
  }
  for (int v = 0; v < kV; ++v) _mm256_maskstore_ps(out + v * ldy, rows, acc[v]);
}

/// RepackedTileFn (kernel_table.h) for Q4_0, IQ4_NL and MXFP4: one order, so `gemm` does not matter.
template <class F>
void tile_nl8_repacked(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                       size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                       const uint8_t* /*gemm*/) {
  assert(n % 32 == 0);
  thread_local AlignedScratch pack_buf, off_buf;
  const int64_t nb = n / 32;
  auto* pb = static_cast<PackedNl8*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedNl8)));
  auto* off = static_cast<int32_t*>(off_buf.get(static_cast<size_t>(nvec * nb) * sizeof(int32_t)));
  const __m256i k128 = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* yb = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i s = dpbusd8(_mm256_setzero_si256(), k128, load32(yb[i].qs));  // 128 x each dword's sum
      off[v * nb + i] = hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1)));
    }
  }
  constexpr int kV = 4;  // VEX code has 16 registers: 4 vectors' integer and float chains, weights, broadcast
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows8) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows8, nrows - r0));
    pack_nl8<F>(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    const __m256i rows = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    auto run = [&]<int kN>(int64_t first) {
      const block_q8_0* yv[kN];
      const int32_t* ov[kN];
      for (int v = 0; v < kN; ++v) {
        yv[v] = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(first + v) * act_bytes);
        ov[v] = off + (first + v) * nb;
      }
      rows8_nl<kN>(pb, nb, yv, ov, y + first * ldy + r0, ldy, rows);
    };
    int64_t v = 0;
    for (; v + kV <= nvec; v += kV) run.template operator()<kV>(v);
    switch (nvec - v) {
      case 3:
        run.template operator()<3>(v);
        break;
      case 2:
        run.template operator()<2>(v);
        break;
      case 1:
        run.template operator()<1>(v);
        break;
      default:
        break;
    }
  }
}

}  // namespace
}  // namespace car::tensor::detail::vnni256

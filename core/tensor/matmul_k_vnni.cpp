// The AVX-512 VNNI matmul tiles for Q5_K and Q3_K (DotKernels::tile; issue #26): sixteen weight rows per
// register, each result bit-equal to the table's dot kernel (dot_q5_K in dot_avx512.cpp, dot_q3_K in
// dot_k_avx2.cpp: ggml's AVX2 ggml_vec_dot_q5_K_q8_K / _q3_K_q8_K orders).
//
// The order they must keep: per super-block, 8 exact int32 lanes (lane l: elements 4l..4l+3 of each of the 8
// 32-element chunks, each element's level times its sub-block's scale), acc[l] = fma(d, float(lane l),
// acc[l]) with d = y.d * x.d; the result hsum8(acc). Q5_K adds its mins: one exact integer per super-block
// (sum of min_c * the sub-block's activation sum), summs = fma(-y.d * x.dmin, float(that), summs) (the
// compiler contracts dot_q5_K's `summs += dmin * ...`), the result hsum8(acc) + summs.
//
// Why not vpdpbusd: a lane's integer mixes 8 sub-blocks of different scales at a 4-element grain, so each
// 4-byte vpdpbusd would need a multiply of its own by the scale before the lanes could be added - two
// instructions per 4 products of a row. Instead the pack multiplies each level by its sub-block's scale once
// per call (Q5_K: q * sc <= 31 * 63, Q3_K: |q * sc| <= 4 * 32: int16) and the products are int16 pairs by
// vpdpwssd: one instruction per 2 products of 16 rows with no multiply after it, the same rate, and no
// correction for the mins or signs (the activations are widened to int16 once per call). Register k of a
// packed block holds dword k (elements 2k, 2k + 1) of 16 rows, so lane l of the dot kernel is dwords
// 16c + 2l and 16c + 2l + 1 over the chunks c; each (row, vector) pair's float steps are lane-wise copies of
// the dot kernel's with its 8 accumulators in 8 registers, and hsum8's tree becomes vertical adds.
//
// Cost per 256 elements x 16 rows x 1 vector: 128 vpdpwssd, 8 conversions and FMAs (Q5_K: 4 vpdpwssd more
// for the mins); the pack (the rows' scaled levels, transposed) is shared by all the call's vectors.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/simd_avx512.h"
#include "core/tensor/vnni_pack_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

constexpr int kRows = 16;  // weight rows per packed group: one int32 / float lane each

/// One super-block of a group of 16 rows, interleaved so that lane r of every register is row r.
/// Invariant: rows past the group's end (the chunk's last, short group) are all zero.
struct PackedKBlock {
  alignas(64) int16_t w[128][2 * kRows];  ///< [k] lane r = row r's (q * sc) of elements 2k, 2k + 1
  int32_t mn[8][kRows];                   ///< [p] lane r = row r's mins 2p (low int16), 2p + 1 (high)
  float d[kRows];                         ///< row r's super-block scale
  float dmin[kRows];                      ///< row r's min scale
};
static_assert(sizeof(PackedKBlock) == 128 * 64 + 8 * 64 + 2 * 64);

/// How a type's dot kernel adds its mins: not at all (Q3_K); one exact integer per super-block into a scalar
/// `summs` (Q5_K); 8 integer lanes per super-block into 8 float accumulators, subtracted at the end (Q2_K).
enum class Mins { none, summs, lanes };

/// acc + vpdpwssd(w, the int16 pair at p broadcast to every lane).
inline __m512i dpwssd_bcast(__m512i acc, __m512i w, const int16_t* p) {
  using dword = int32_t __attribute__((may_alias, aligned(2)));
  __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const dword*>(p)));
  return acc;
}

/// Q5_K: row x's block as 256 int16 levels times their sub-block scales, in element order; its mins.
struct Q5K {
  using Block = block_q5_K;
  static constexpr Mins kMins = Mins::summs;
  static void levels(const Block& x, int16_t* out, uint16_t* mins) {
    uint32_t sm[4];
    unpack_scale_min_k4_words(x.scales, sm);
    const auto* sc = reinterpret_cast<const uint8_t*>(sm);
    for (int c = 0; c < 8; ++c) mins[c] = sc[8 + c];
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const __m256i hb = load32(x.qh);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const __m256i bits = load32(x.qs + 32 * g);
      const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), one), 4);
      const __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g + 1), one), 4);
      const __m256i lo = _mm256_or_si256(_mm256_and_si256(bits, m4), hlo);
      const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(bits, 4), m4), hhi);
      _mm512_store_si512(out + 64 * g,
                         _mm512_mullo_epi16(_mm512_cvtepu8_epi16(lo), _mm512_set1_epi16(sc[2 * g])));
      _mm512_store_si512(out + 64 * g + 32,
                         _mm512_mullo_epi16(_mm512_cvtepu8_epi16(hi), _mm512_set1_epi16(sc[2 * g + 1])));
    }
  }
  static float dmin(const Block& x) {
    return h2f(x.dmin);
  }
};

/// Q3_K: levels (q - 4 where the hmask bit is clear, -4..3) times the 16-element sub-blocks' signed scales.
struct Q3K {
  using Block = block_q3_K;
  static constexpr Mins kMins = Mins::none;
  static void levels(const Block& x, int16_t* out, uint16_t* /*mins*/) {
    int8_t raw[16];
    unpack_q3_K_scales(x.scales, raw);
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1), four = _mm256_set1_epi8(4);
    const __m256i hb = load32(x.hmask);
#pragma GCC unroll 8
    for (int b = 0; b < 8; ++b) {  // elements 32b .. 32b + 31: qs bits 2(b % 4) of bytes 32(b / 4) ..
      const __m256i q = _mm256_and_si256(_mm256_srli_epi16(load32(x.qs + 32 * (b / 4)), 2 * (b % 4)), m3);
      const __m256i h = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, b), one), 2);
      const __m256i lv = _mm256_sub_epi8(_mm256_or_si256(q, h), four);
      const __m512i sc = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(raw[2 * b] - 32)),
                                            _mm256_set1_epi16(static_cast<int16_t>(raw[2 * b + 1] - 32)), 1);
      _mm512_store_si512(out + 32 * b, _mm512_mullo_epi16(_mm512_cvtepi8_epi16(lv), sc));
    }
  }
  static float dmin(const Block&) {
    return 0.0f;
  }
};

/// Q2_K (a matrix llama.cpp does not repack: rows not a multiple of 8): levels (0..3) times the 16-element
/// sub-blocks' 4-bit scales; its 16 mins.
struct Q2K {
  using Block = block_q2_K;
  static constexpr Mins kMins = Mins::lanes;
  static void levels(const Block& x, int16_t* out, uint16_t* mins) {
    for (int j = 0; j < 16; ++j) mins[j] = static_cast<uint16_t>(x.scales[j] >> 4);
    const __m256i m3 = _mm256_set1_epi8(3);
#pragma GCC unroll 8
    for (int b = 0; b < 8; ++b) {  // elements 32b .. 32b + 31: qs bits 2(b % 4) of bytes 32(b / 4) ..
      const __m256i q = _mm256_and_si256(_mm256_srli_epi16(load32(x.qs + 32 * (b / 4)), 2 * (b % 4)), m3);
      const __m512i sc =
          _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(x.scales[2 * b] & 0x0f)),
                             _mm256_set1_epi16(static_cast<int16_t>(x.scales[2 * b + 1] & 0x0f)), 1);
      _mm512_store_si512(out + 32 * b, _mm512_mullo_epi16(_mm512_cvtepu8_epi16(q), sc));
    }
  }
  static float dmin(const Block& x) {
    return h2f(x.dmin);
  }
};

/// Pack rows [0, nrows) (nrows <= 16) of nb super-blocks into pb[0, nb).
template <class K>
void pack_rows(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedKBlock* pb) {
  alignas(64) int16_t lv[kRows][256];
  for (int r = nrows; r < kRows; ++r) std::fill(lv[r], lv[r] + 256, int16_t{0});
  for (int64_t i = 0; i < nb; ++i) {
    PackedKBlock& b = pb[i];
    for (int r = 0; r < kRows; ++r) {
      uint16_t mins[16] = {};
      float d = 0.0f, dmin = 0.0f;
      if (r < nrows) {
        const auto& x = reinterpret_cast<const typename K::Block*>(w + static_cast<size_t>(r) * row_bytes)[i];
        K::levels(x, lv[r], mins);
        d = h2f(x.d);
        dmin = K::dmin(x);
      }
      for (int p = 0; p < 8; ++p) {
        b.mn[p][r] = static_cast<int32_t>(static_cast<uint32_t>(mins[2 * p]) |
                                          (static_cast<uint32_t>(mins[2 * p + 1]) << 16));
      }
      b.d[r] = d;
      b.dmin[r] = dmin;
    }
    for (int s = 0; s < 16; ++s) {  // dwords 8s .. 8s + 7 of the 16 rows
      __m512i z[8], out[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) z[r] = load32x2(lv[r] + 16 * s, lv[r + 8] + 16 * s);
      transpose16x8_dwords(z, out);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) _mm512_store_si512(b.w[8 * s + k], out[k]);
    }
  }
}

/// The vector side, once per call: per vector and block the 256 activations as int16, then the sub-block
/// sums as 4 int16 pairs (bsums 4g + 4g+1, 4g+2 + 4g+3; Q5_K's mins), the 16 bsums as 8 pairs (Q2_K's).
struct VecBlock {
  alignas(64) int16_t q[256];
  int32_t pairs[4];
  int32_t bs[8];
  float d;
  int32_t pad[3];
};
static_assert(sizeof(VecBlock) == 9 * 64);

void prepare(const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t nb, VecBlock* out) {
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* y = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      VecBlock& o = out[v * nb + i];
#pragma GCC unroll 4
      for (int m = 0; m < 4; ++m) {
        _mm512_store_si512(
            o.q + 64 * m,
            _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].qs + 64 * m))));
        _mm512_store_si512(o.q + 64 * m + 32, _mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                                  reinterpret_cast<const __m256i*>(y[i].qs + 64 * m + 32))));
      }
      const __m256i bs = load32(y[i].bsums);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o.pairs),
                       _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
      std::memcpy(o.bs, y[i].bsums, sizeof o.bs);
      o.d = y[i].d;
    }
  }
}

/// 16 packed rows x kV vectors over nb super-blocks: out[v * ldy + r] for the rows in `mask`.
template <class K, int kV>
void rows16(const PackedKBlock* pb, int64_t nb, const VecBlock* const* yv, float* out, int64_t ldy,
            __mmask16 mask, const NextGroup& ahead) {
  __m512 acc[kV][8], summs[kV];
  alignas(64) float acc_m[K::kMins == Mins::lanes ? kV : 1][8][kRows];  // Q2_K's min lanes (kept in memory)
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    summs[v] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) acc[v][l] = _mm512_setzero_ps();
  }
  if constexpr (K::kMins == Mins::lanes) {
    for (int v = 0; v < kV; ++v) {
      for (int j = 0; j < 8; ++j) _mm512_store_ps(acc_m[v][j], _mm512_setzero_ps());
    }
  }
  const __m512 neg = _mm512_set1_ps(-0.0f);
  for (int64_t i = 0; i < nb; ++i) {
    const PackedKBlock& b = pb[i];
    ahead.at();
    const __m512 xd = _mm512_load_ps(b.d), xdmin = _mm512_load_ps(b.dmin);
    __m512 d[kV];  // y.d * x.d per (row, vector), as the dot kernels form it
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      const VecBlock& y = yv[v][i];
      const __m512 yd = _mm512_set1_ps(y.d);
      d[v] = _mm512_mul_ps(yd, xd);
      if constexpr (K::kMins == Mins::summs) {
        __m512i im = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          im = _mm512_dpwssd_epi32(im, _mm512_load_si512(b.mn[g]), _mm512_set1_epi32(y.pairs[g]));
        }
        const __m512 dmin = _mm512_mul_ps(_mm512_xor_ps(yd, neg), xdmin);  // -y.d * x.dmin
        summs[v] = _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(im), summs[v]);
      } else if constexpr (K::kMins == Mins::lanes) {
        const __m512 dmin = _mm512_mul_ps(yd, xdmin);  // y.d * x.dmin
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const __m512i m = _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_load_si512(b.mn[j]),
                                                _mm512_set1_epi32(y.bs[j]));
          _mm512_store_ps(acc_m[v][j],
                          _mm512_fmadd_ps(dmin, _mm512_cvtepi32_ps(m), _mm512_load_ps(acc_m[v][j])));
        }
      }
    }
#pragma GCC unroll 8
    for (int l = 0; l < 8; ++l) {
      __m512i t0[kV], t1[kV];
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) t0[v] = t1[v] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const int k = 16 * c + 2 * l;
        const __m512i w0 = _mm512_load_si512(b.w[k]), w1 = _mm512_load_si512(b.w[k + 1]);
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) {
          t0[v] = dpwssd_bcast(t0[v], w0, yv[v][i].q + 2 * k);
          t1[v] = dpwssd_bcast(t1[v], w1, yv[v][i].q + 2 * k + 2);
        }
      }
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        acc[v][l] = _mm512_fmadd_ps(d[v], _mm512_cvtepi32_ps(_mm512_add_epi32(t0[v], t1[v])), acc[v][l]);
      }
    }
  }
  // hsum8's tree per lane: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)); then + summs (Q5_K) or minus
  // the same tree of the min lanes (Q2_K)
  auto tree = [](const __m512* a) {
    const __m512 r0 = _mm512_add_ps(a[4], a[0]), r1 = _mm512_add_ps(a[5], a[1]);
    const __m512 r2 = _mm512_add_ps(a[6], a[2]), r3 = _mm512_add_ps(a[7], a[3]);
    return _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3));
  };
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    __m512 h = tree(acc[v]);
    if constexpr (K::kMins == Mins::summs) h = _mm512_add_ps(h, summs[v]);
    if constexpr (K::kMins == Mins::lanes) {
      __m512 m[8];
      for (int j = 0; j < 8; ++j) m[j] = _mm512_load_ps(acc_m[v][j]);
      h = _mm512_sub_ps(h, tree(m));
    }
    _mm512_mask_storeu_ps(out + v * ldy, mask, h);
  }
}

template <class K>
void tile_k(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
            int64_t nvec, int64_t n, float* y, int64_t ldy) {
  assert(n % QK_K == 0);
  thread_local AlignedScratch pack_buf, vec_buf;
  const int64_t nb = n / QK_K;
  auto* pb = static_cast<PackedKBlock*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedKBlock)));
  auto* vb = static_cast<VecBlock*>(vec_buf.get(static_cast<size_t>(nvec * nb) * sizeof(VecBlock)));
  prepare(acts, act_bytes, nvec, nb, vb);
  constexpr int kV = 2;  // 2 x 8 accumulators, 2 x 2 integer chains, 2 weights; measured at ~1 vpdpwssd/cycle
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_rows<K>(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    NextGroup ahead(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nb, nvec, kV);
    const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
    auto run = [&]<int kN>(int64_t first) {
      const VecBlock* yv[kN];
      for (int v = 0; v < kN; ++v) yv[v] = vb + (first + v) * nb;
      rows16<K, kN>(pb, nb, yv, y + first * ldy + r0, ldy, mask, ahead);
    };
    int64_t v = 0;
    for (; v + kV <= nvec; v += kV) run.template operator()<kV>(v);
    if (nvec - v == 1) run.template operator()<1>(v);
  }
}

}  // namespace

void tile_q5_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy) {
  tile_k<Q5K>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

void tile_q3_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy) {
  tile_k<Q3K>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

void tile_q2_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy) {
  tile_k<Q2K>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

}  // namespace car::tensor::detail::avx512

// Internal to core/tensor: the repacked Q4_K matmul tile on AMX (issue #26), written once against the tile
// layer of amx_tiles.h and instantiated twice - with the instructions (matmul_q4k_amx.cpp, -mamx-int8) and
// with their emulation (matmul_q4k_amx_emulated.cpp, which the tests run on any AVX-512 CPU). Include it
// only from those two files: its helpers are AVX-512 code with internal linkage.
//
// The orders (kernel_table.h repacked(); dot_q4_K_q8_K_gemm_ref / _gemv_ref) fix one exact integer per (row,
// vector) and 32-element sub-block - sum of nibble x q8 - which the scales combine per 64-element group;
// then float FMAs per group (gemm) or per super-block (gemv). A tdpbusd over K = 32 bytes forms exactly those
// integers for 16 rows x 16 vectors at once: A = 16 weight rows' nibbles of sub-block j, one byte each
// (unsigned, 0..15), B = the sub-block's activation quants of 16 vectors, dword-interleaved (B[k][4n + t] =
// vector n's quant 4k + t; signed), C[m][n] = row m . vector n. Everything after is AVX-512 on C's rows (lane
// n = vector n): the scale products and mins in int32, the reference's FMAs lane-wise, each vector's order by
// a lane mask (one call serves a mixed batch). So each result equals the reference bit for bit, the same
// contract as the VNNI tile (matmul_q4k_vnni.cpp).
//
// Tiles: 0, 1 = A of sub-blocks 2g, 2g + 1 (16 x 32 bytes); 2, 3 = their B (8 x 64); 4, 5 = C (16 x 64).
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/amx_tiles.h"
#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::amx {
namespace {

constexpr int kRows = 16, kVecs = 16;

/// A group of 16 weight rows, one super-block: the A tiles and the per-row data.
/// Invariant: rows past the group's end are zero (nibbles, scales, mins, d, dmin).
struct AmxWeights {
  alignas(64) uint8_t a[8][kRows][32];  ///< [sub-block j][row m]: row m's 32 nibbles of sub-block j
  int32_t sc[kRows][8];                 ///< 6-bit scales
  int32_t mn[kRows][8];                 ///< 6-bit mins
  float d[kRows], dmin[kRows];
};

/// A group of 16 vectors, one super-block: the B tiles and the per-vector data, lane n = vector n.
/// Invariant: vectors past the group's end are zero.
struct AmxActs {
  alignas(64) int8_t b[8][8][64];  ///< [sub-block j][k][4n + t] = vector n's quant 32j + 4k + t
  int32_t pair[4][2][kVecs];       ///< [group g][h] vector n's bsums[4g + 2h] + bsums[4g + 2h + 1]
  float d[kVecs];                  ///< vector n's y.d
};

void pack_weights(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, AmxWeights* out) {
  for (int64_t i = 0; i < nb; ++i) {
    AmxWeights& p = out[i];
    for (int m = 0; m < kRows; ++m) {
      if (m >= nrows) {
        for (int j = 0; j < 8; ++j) std::memset(p.a[j][m], 0, 32);
        for (int j = 0; j < 8; ++j) p.sc[m][j] = p.mn[m][j] = 0;
        p.d[m] = p.dmin[m] = 0.0f;
        continue;
      }
      const block_q4_K& x = reinterpret_cast<const block_q4_K*>(w + static_cast<size_t>(m) * row_bytes)[i];
      for (int g = 0; g < 4; ++g) {
        const __m256i q = load32(x.qs + 32 * g);
        const __m256i m4 = _mm256_set1_epi8(0x0f);
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.a[2 * g][m]), _mm256_and_si256(q, m4));
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.a[2 * g + 1][m]),
                           _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
      }
      uint8_t sm[16];
      unpack_scale_min_k4(x.scales, sm);
      for (int j = 0; j < 8; ++j) {
        p.sc[m][j] = sm[j];
        p.mn[m][j] = sm[8 + j];
      }
      p.d[m] = h2f(x.d);
      p.dmin[m] = h2f(x.dmin);
    }
  }
}

void pack_acts(const uint8_t* acts, size_t act_bytes, int64_t v0, int nv, int64_t nb, AmxActs* out) {
  for (int64_t i = 0; i < nb; ++i) {
    AmxActs& p = out[i];
    for (int n = 0; n < kVecs; ++n) {
      if (n >= nv) {
        for (int j = 0; j < 8; ++j) {
          for (int k = 0; k < 8; ++k) std::memset(&p.b[j][k][4 * n], 0, 4);
        }
        for (int g = 0; g < 4; ++g) p.pair[g][0][n] = p.pair[g][1][n] = 0;
        p.d[n] = 0.0f;
        continue;
      }
      const block_q8_K& y =
          reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v0 + n) * act_bytes)[i];
      for (int j = 0; j < 8; ++j) {
        for (int k = 0; k < 8; ++k) std::memcpy(&p.b[j][k][4 * n], y.qs + 32 * j + 4 * k, 4);
      }
      for (int g = 0; g < 4; ++g) {
        p.pair[g][0][n] = y.bsums[4 * g] + y.bsums[4 * g + 1];
        p.pair[g][1][n] = y.bsums[4 * g + 2] + y.bsums[4 * g + 3];
      }
      p.d[n] = y.d;
    }
  }
}

inline TileConfig q4k_config() {
  TileConfig c;
  for (int t : {0, 1}) {
    c.rows[t] = kRows;
    c.colsb[t] = 32;
  }
  for (int t : {2, 3}) {
    c.rows[t] = 8;
    c.colsb[t] = 64;
  }
  for (int t : {4, 5}) {
    c.rows[t] = kRows;
    c.colsb[t] = 64;
  }
  return c;
}

/// 16 rows x 16 vectors over nb super-blocks. `gemm`: lanes (vectors) in the gemm order, the rest gemv.
/// out[n * ldy + m] for m < nr, n < nv.
template <class Tiles>
void rows16x16(Tiles& tiles, const AmxWeights* pw, const AmxActs* pa, int64_t nb, __mmask16 gemm, float* out,
               int64_t ldy, int nr, int nv) {
  alignas(64) float acc[kRows][kVecs] = {}, acc_m[kRows][kVecs] = {};
  alignas(64) int32_t c[2][kRows][kVecs];
  for (int64_t i = 0; i < nb; ++i) {
    const AmxWeights& w = pw[i];
    const AmxActs& a = pa[i];
    const __m512 yd = _mm512_load_ps(a.d);
    __m512i bsum[kRows], bmin[kRows];  // gemv: the super-block's totals
#pragma GCC unroll 16
    for (int m = 0; m < kRows; ++m) bsum[m] = bmin[m] = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      tiles.template load<0>(w.a[2 * g], 32);
      tiles.template load<1>(w.a[2 * g + 1], 32);
      tiles.template load<2>(a.b[2 * g], 64);
      tiles.template load<3>(a.b[2 * g + 1], 64);
      tiles.template zero<4>();
      tiles.template zero<5>();
      tiles.template dpbusd<4, 0, 2>();
      tiles.template dpbusd<5, 1, 3>();
      tiles.template store<4>(c[0], 64);
      tiles.template store<5>(c[1], 64);
      const __m512i plo = _mm512_load_si512(a.pair[g][0]), phi = _mm512_load_si512(a.pair[g][1]);
      for (int m = 0; m < nr; ++m) {
        // isum = sc[2g] lo + sc[2g+1] hi, imin = min[2g] pair_lo + min[2g+1] pair_hi (exact int32)
        const __m512i is = _mm512_add_epi32(
            _mm512_mullo_epi32(_mm512_load_si512(c[0][m]), _mm512_set1_epi32(w.sc[m][2 * g])),
            _mm512_mullo_epi32(_mm512_load_si512(c[1][m]), _mm512_set1_epi32(w.sc[m][2 * g + 1])));
        const __m512i im = _mm512_add_epi32(_mm512_mullo_epi32(plo, _mm512_set1_epi32(w.mn[m][2 * g])),
                                            _mm512_mullo_epi32(phi, _mm512_set1_epi32(w.mn[m][2 * g + 1])));
        // gemm lanes: acc = fma(float(isum), x.d * y.d, acc), acc_m likewise, per group
        const __m512 d = _mm512_mul_ps(_mm512_set1_ps(w.d[m]), yd);
        const __m512 dmin = _mm512_mul_ps(_mm512_set1_ps(w.dmin[m]), yd);
        _mm512_store_ps(acc[m],
                        _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(is), d, _mm512_load_ps(acc[m]), gemm));
        _mm512_store_ps(acc_m[m],
                        _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(im), dmin, _mm512_load_ps(acc_m[m]), gemm));
        bsum[m] = _mm512_add_epi32(bsum[m], is);
        bmin[m] = _mm512_add_epi32(bmin[m], im);
      }
    }
    // gemv lanes: one FMA per super-block
    const __mmask16 gemv = static_cast<__mmask16>(~gemm);
    for (int m = 0; m < nr; ++m) {
      const __m512 d = _mm512_mul_ps(_mm512_set1_ps(w.d[m]), yd);
      const __m512 dmin = _mm512_mul_ps(_mm512_set1_ps(w.dmin[m]), yd);
      _mm512_store_ps(acc[m],
                      _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(bsum[m]), d, _mm512_load_ps(acc[m]), gemv));
      _mm512_store_ps(
          acc_m[m], _mm512_mask3_fmadd_ps(_mm512_cvtepi32_ps(bmin[m]), dmin, _mm512_load_ps(acc_m[m]), gemv));
    }
  }
  for (int m = 0; m < nr; ++m) {
    alignas(64) float r[kVecs];
    _mm512_store_ps(r, _mm512_sub_ps(_mm512_load_ps(acc[m]), _mm512_load_ps(acc_m[m])));
    for (int n = 0; n < nv; ++n) out[n * ldy + m] = r[n];
  }
}

/// RepackedTileFn over a tile layer (see the top).
template <class Tiles>
void tile_q4_K_repacked(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                        const uint8_t* gemm) {
  assert(n % QK_K == 0);
  thread_local AlignedScratch wbuf, abuf;
  const int64_t nb = n / QK_K;
  const int64_t ngroups = (nvec + kVecs - 1) / kVecs;
  auto* pw = static_cast<AmxWeights*>(wbuf.get(static_cast<size_t>(nb) * sizeof(AmxWeights)));
  auto* pa = static_cast<AmxActs*>(abuf.get(static_cast<size_t>(ngroups * nb) * sizeof(AmxActs)));
  for (int64_t gi = 0; gi < ngroups; ++gi) {
    const int nv = static_cast<int>(std::min<int64_t>(kVecs, nvec - gi * kVecs));
    pack_acts(acts, act_bytes, gi * kVecs, nv, nb, pa + gi * nb);
  }
  Tiles tiles;
  tiles.configure(q4k_config());
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_weights(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pw);
    for (int64_t gi = 0; gi < ngroups; ++gi) {
      const int64_t v0 = gi * kVecs;
      const int nv = static_cast<int>(std::min<int64_t>(kVecs, nvec - v0));
      __mmask16 mask = 0;
      for (int v = 0; v < nv; ++v) {
        if (gemm != nullptr && gemm[v0 + v] != 0) mask = static_cast<__mmask16>(mask | (1u << v));
      }
      rows16x16(tiles, pw, pa + gi * nb, nb, mask, y + v0 * ldy + r0, ldy, nr, nv);
    }
  }
  tiles.release();
}

}  // namespace
}  // namespace car::tensor::detail::amx

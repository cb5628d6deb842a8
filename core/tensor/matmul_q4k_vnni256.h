// Internal to core/tensor: the repacked Q4_K matmul tile in 256-bit registers (issue #26), for AVX2 machines
// with AVX-VNNI (Alder Lake and later cores without AVX-512). The design of matmul_q4k_vnni.cpp with eight
// weight rows per register instead of sixteen: lane r of every int32 / float register is row r, the
// vector's 4 quants of the same elements are broadcast into vpdpbusd, and the float steps are lane-wise
// copies of dot_q4_K_q8_K_gemm_ref / _gemv_ref, so each result equals them bit for bit.
//
// Built twice from this header: matmul_q4k_avxvnni.cpp (-mavxvnni: the VEX vpdpbusd; the table's) and
// matmul_q4k_vnni256_evex.cpp (AVX-512 VL + VNNI: the EVEX encoding of the same 256-bit instruction, whose
// semantics are identical), which the tests run on CPUs without AVX-VNNI. Include it only from those files.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstdint>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/blocks.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/simd_x86.h"

namespace car::tensor::detail::vnni256 {
namespace {

constexpr int kRows = 8;  // weight rows per packed group: one int32 / float lane each

/// acc + the 4-byte dot products of unsigned u and signed s per int32 lane (vpdpbusd, 256-bit).
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}

/// One super-block of a group of 8 rows, lane r of every register = row r.
/// Invariant: rows past the group's end are all zero (scales, mins, d).
struct PackedBlock8 {
  alignas(32) uint8_t qs[4][8][32];  ///< [group g][k]: lane r = row r's qs[32g + 4k .. +3]
  int32_t sc[8][kRows];              ///< [sub-block] row r's 6-bit scale
  int32_t mn[4][kRows];              ///< [group g] row r's mins 2g (low int16) and 2g + 1 (high int16)
  float d[kRows], dmin[kRows];
};

/// 8x8 transpose of dwords: lane r of out[k] = dword k of z[r].
inline void transpose8x8_dwords(const __m256i* z, __m256i* out) {
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

void pack_rows(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedBlock8* pb) {
  alignas(64) static constexpr block_q4_K kZero{};
  auto block = [&](int r, int64_t i) -> const block_q4_K& {
    return r < nrows ? reinterpret_cast<const block_q4_K*>(w + static_cast<size_t>(r) * row_bytes)[i] : kZero;
  };
  for (int64_t i = 0; i < nb; ++i) {
    PackedBlock8& b = pb[i];
    for (int g = 0; g < 4; ++g) {
      __m256i z[8], out[8];
      for (int r = 0; r < 8; ++r) z[r] = load32(block(r, i).qs + 32 * g);
      transpose8x8_dwords(z, out);
      for (int k = 0; k < 8; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(b.qs[g][k]), out[k]);
    }
    for (int r = 0; r < kRows; ++r) {
      const block_q4_K& x = block(r, i);
      uint8_t sm[16];
      unpack_scale_min_k4(x.scales, sm);
      for (int j = 0; j < 8; ++j) b.sc[j][r] = sm[j];
      for (int g = 0; g < 4; ++g)
        b.mn[g][r] = static_cast<int32_t>(sm[8 + 2 * g] | (sm[8 + 2 * g + 1] << 16));
      b.d[r] = r < nrows ? h2f(x.d) : 0.0f;
      b.dmin[r] = r < nrows ? h2f(x.dmin) : 0.0f;
    }
  }
}

inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

/// 8 packed rows x kV vectors over nb super-blocks; out[v * ldy + r] for the rows in `rows` (lanes -1).
template <int kV, bool kGemm>
void rows8(const PackedBlock8* pb, int64_t nb, const block_q8_K* const* y, const int32_t* const* pairs,
           float* out, int64_t ldy, __m256i rows) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc[kV], acc_m[kV];
  for (int v = 0; v < kV; ++v) acc[v] = acc_m[v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedBlock8& b = pb[i];
    const __m256 xd = _mm256_load_ps(b.d), xdmin = _mm256_load_ps(b.dmin);
    __m256i isum[kV], imin[kV];
    for (int v = 0; v < kV; ++v) isum[v] = imin[v] = _mm256_setzero_si256();
    for (int g = 0; g < 4; ++g) {
      __m256i s0[kV], s1[kV];
      for (int v = 0; v < kV; ++v) s0[v] = s1[v] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m256i raw = _mm256_load_si256(reinterpret_cast<const __m256i*>(b.qs[g][k]));
        const __m256i w0 = _mm256_and_si256(raw, m4);
        const __m256i w1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
        for (int v = 0; v < kV; ++v) {
          s0[v] = dpbusd(s0[v], w0, bcast4(y[v][i].qs + 64 * g + 4 * k));
          s1[v] = dpbusd(s1[v], w1, bcast4(y[v][i].qs + 64 * g + 32 + 4 * k));
        }
      }
      const __m256i sc0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.sc[2 * g]));
      const __m256i sc1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.sc[2 * g + 1]));
      const __m256i mn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.mn[g]));
      for (int v = 0; v < kV; ++v) {
        const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(s0[v], sc0), _mm256_mullo_epi32(s1[v], sc1));
        const __m256i im = _mm256_madd_epi16(mn, _mm256_set1_epi32(pairs[v][4 * i + g]));
        if constexpr (kGemm) {
          const __m256 yd = _mm256_set1_ps(y[v][i].d);
          acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(xd, yd), acc[v]);
          acc_m[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(im), _mm256_mul_ps(xdmin, yd), acc_m[v]);
        } else {
          isum[v] = _mm256_add_epi32(isum[v], is);
          imin[v] = _mm256_add_epi32(imin[v], im);
        }
      }
    }
    if constexpr (!kGemm) {
      for (int v = 0; v < kV; ++v) {
        const __m256 yd = _mm256_set1_ps(y[v][i].d);
        acc[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[v]), _mm256_mul_ps(xd, yd), acc[v]);
        acc_m[v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin[v]), _mm256_mul_ps(xdmin, yd), acc_m[v]);
      }
    }
  }
  for (int v = 0; v < kV; ++v) _mm256_maskstore_ps(out + v * ldy, rows, _mm256_sub_ps(acc[v], acc_m[v]));
}

template <bool kGemm>
void run_vectors(const PackedBlock8* pb, int64_t nb, const uint8_t* acts, size_t act_bytes,
                 const int32_t* pairs, int64_t v0, int64_t v1, float* y, int64_t ldy, __m256i rows) {
  constexpr int kV = 2;  // VEX code has 16 registers
  auto run = [&]<int kN>(int64_t first) {
    const block_q8_K* yv[kN];
    const int32_t* pv[kN];
    for (int v = 0; v < kN; ++v) {
      yv[v] = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(first + v) * act_bytes);
      pv[v] = pairs + 4 * (first + v) * nb;
    }
    rows8<kN, kGemm>(pb, nb, yv, pv, y + first * ldy, ldy, rows);
  };
  int64_t v = v0;
  for (; v + kV <= v1; v += kV) run.template operator()<kV>(v);
  if (v < v1) run.template operator()<1>(v);
}

/// RepackedTileFn (kernel_table.h).
void tile_q4_K_repacked(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                        const uint8_t* gemm) {
  assert(n % QK_K == 0);
  thread_local AlignedScratch pack_buf, pair_buf;
  const int64_t nb = n / QK_K;
  auto* pb = static_cast<PackedBlock8*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedBlock8)));
  auto* pairs = static_cast<int32_t*>(pair_buf.get(static_cast<size_t>(nvec * nb) * 4 * sizeof(int32_t)));
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* yb = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i bs = load32(yb[i].bsums);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + 4 * (v * nb + i)),
                       _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
    }
  }
  auto gemm_at = [&](int64_t v) { return gemm != nullptr && gemm[v] != 0; };
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_rows(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    const __m256i rows = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int64_t v0 = 0; v0 < nvec;) {
      const bool g = gemm_at(v0);
      int64_t v1 = v0 + 1;
      while (v1 < nvec && gemm_at(v1) == g) ++v1;
      if (g) {
        run_vectors<true>(pb, nb, acts, act_bytes, pairs, v0, v1, y + r0, ldy, rows);
      } else {
        run_vectors<false>(pb, nb, acts, act_bytes, pairs, v0, v1, y + r0, ldy, rows);
      }
      v0 = v1;
    }
  }
}

}  // namespace
}  // namespace car::tensor::detail::vnni256

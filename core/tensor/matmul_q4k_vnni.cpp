// The AVX-512 VNNI matmul tile for repacked Q4_K (kernel_table.h repacked(); issue #26): llama.cpp's gemm and
// gemv orders from exact integer sums formed by vpdpbusd, sixteen weight rows per register.
//
// Why the shape: the orders define one exact integer per (row, vector) and 64-element group (gemm) or
// super-block (gemv), then float FMAs in block order. An integer sum may be formed any way, so the tile puts
// one weight row in each int32 lane and broadcasts the vector's 4 quants of the same elements: one vpdpbusd
// adds 4 products to 16 (row, vector) sums with no horizontal reduction anywhere, and every float step is a
// lane-wise copy of the reference's (dot_q4_K_q8_K_gemm_ref / _gemv_ref), so each result equals it bit for
// bit. The lane-per-row layout needs the rows interleaved: each call transposes its chunk's rows, 16 at a
// time, into a per-thread buffer (PackedBlock) that all the call's vectors then share - the file's bytes
// stay as they are, so decode's gemv reads them unchanged and memory does not grow.
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <new>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/simd_avx512.h"
#include "core/tensor/vnni_pack_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

constexpr int kRows = 16;  // weight rows per packed group: one int32 / float lane each
constexpr int kVectorsPerRun = 4;  // rows16's vectors: 6 and 8 spill on AVX-512's 32 registers, measured slower
constexpr int kGemvVectorsPerRun = 8;  // rows16_gemv's

/// One super-block of a group of 16 rows, interleaved so that lane r of every register is row r.
/// Invariant: rows past the group's end (the chunk's last, short group) are all zero (scales, mins, d).
struct PackedBlock {
  /// [group g][chunk k]: lane r = row r's qs[32g + 4k .. 32g + 4k + 3]; the low nibbles are elements
  /// 64g + 4k .. +3 (sub-block 2g), the high nibbles the same positions of sub-block 2g + 1.
  alignas(64) uint8_t qs[4][8][64];
  int32_t sc[8][kRows];   ///< [sub-block] row r's 6-bit scale
  int32_t mn[4][kRows];   ///< [group g] row r's mins 2g (low int16) and 2g + 1 (high int16)
  float d[kRows];         ///< row r's super-block scale
  float dmin[kRows];      ///< row r's super-block min scale
};
static_assert(sizeof(PackedBlock) == 4 * 8 * 64 + 8 * 64 + 4 * 64 + 2 * 64);

using Scratch = AlignedScratch;

/// Lane r of h[j] = dword j of row r's block header (d and dmin, then the 12 scale bytes), for the 16 rows'
/// blocks `hdr(r)`: a 128-bit load per row and a 4 x 4 dword transposition per 128-bit lane, cheaper than
/// four 16-lane gathers (bench_kernels Q4KTile/gemv, 8 vectors: 183 -> 192 GMAC/s).
template <class Header>
inline void load_headers(Header hdr, __m512i* h) {
  __m512i z[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {  // 128-bit lane l of z[q]: row q + 4l
    __m512i t = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(hdr(q))));
    t = _mm512_inserti32x4(t, _mm_loadu_si128(reinterpret_cast<const __m128i*>(hdr(q + 4))), 1);
    t = _mm512_inserti32x4(t, _mm_loadu_si128(reinterpret_cast<const __m128i*>(hdr(q + 8))), 2);
    z[q] = _mm512_inserti32x4(t, _mm_loadu_si128(reinterpret_cast<const __m128i*>(hdr(q + 12))), 3);
  }
  transpose4x4_dwords_per_lane(z, h);
}

/// Pack rows [0, nrows) (nrows <= 16) of nb super-blocks into pb[0, nb); missing rows read as a zero block.
/// kFull: nrows == 16 (every group but a chunk's last, short one), without the per-row bound checks.
template <bool kFull>
void pack_rows_impl(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedBlock* pb) {
  alignas(64) static constexpr block_q4_K kZero{};
  auto block = [&](int r, int64_t i) -> const block_q4_K& {
    return kFull || r < nrows ? reinterpret_cast<const block_q4_K*>(w + static_cast<size_t>(r) * row_bytes)[i]
                              : kZero;
  };
  for (int64_t i = 0; i < nb; ++i) {
    PackedBlock& b = pb[i];
    for (int g = 0; g < 4; ++g) {
      __m512i z[8], out[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) z[r] = load32x2(block(r, i).qs + 32 * g, block(r + 8, i).qs + 32 * g);
      transpose16x8_dwords(z, out);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) _mm512_store_si512(b.qs[g][k], out[k]);
    }
    // The rows' headers (d, dmin, the 12 scale bytes: 4 dwords) a dword per lane, then ggml's utmp unpacking
    // (unpack_scale_min_k4_words) lane-wise.
    __m512i h[4];
    load_headers([&](int r) { return &block(r, i); }, h);
    _mm512_store_ps(b.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0])));
    _mm512_store_ps(b.dmin, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16))));
    const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f),
                  k3 = _mm512_set1_epi32(0x03030303), byte = _mm512_set1_epi32(0xff);
    const __m512i u0 = h[1], u1 = h[2], u2 = h[3];
    const __m512i sc03 = _mm512_and_si512(u0, k1);
    const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(u2, k2),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
    const __m512i mn03 = _mm512_and_si512(u1, k1);
    const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      _mm512_store_si512(b.sc[j], _mm512_and_si512(_mm512_srli_epi32(sc03, 8 * j), byte));
      _mm512_store_si512(b.sc[j + 4], _mm512_and_si512(_mm512_srli_epi32(sc47, 8 * j), byte));
    }
    // (min 2g, min 2g + 1) as int16 pairs: from bytes [m0 m1 m2 m3], words (m0, m1) and (m2, m3)
    const __m512i word_hi = _mm512_set1_epi32(0xff0000);
#pragma GCC unroll 2
    for (int hh = 0; hh < 2; ++hh) {
      const __m512i m = hh == 0 ? mn03 : mn47;
      _mm512_store_si512(b.mn[2 * hh], _mm512_or_si512(_mm512_and_si512(m, byte),
                                                       _mm512_and_si512(_mm512_slli_epi32(m, 8), word_hi)));
      _mm512_store_si512(b.mn[2 * hh + 1],
                         _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(m, 16), byte),
                                         _mm512_and_si512(_mm512_srli_epi32(m, 8), word_hi)));
    }
  }
}

void pack_rows(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedBlock* pb) {
  assert(nrows <= kRows);
  if (nrows == kRows) {
    pack_rows_impl<true>(w, row_bytes, nrows, nb, pb);
  } else {
    pack_rows_impl<false>(w, row_bytes, nrows, nb, pb);
  }
}

/// Group g (64 elements) of packed block b against kV vectors (q8[v]: vector v's block quants): s0[v] /
/// s1[v], lane r = row r's integer sum of levels x quants over sub-block 2g (the low nibbles) / 2g + 1 (the
/// high).
template <int kV>
inline void group_sums(const PackedBlock& b, int g, const int8_t* const* q8, __m512i m4, __m512i* s0,
                       __m512i* s1) {
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) s0[v] = s1[v] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m512i raw = _mm512_load_si512(b.qs[g][k]);
    const __m512i w0 = _mm512_and_si512(raw, m4);
    const __m512i w1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4);
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      s0[v] = dpbusd_bcast(s0[v], w0, q8[v] + 64 * g + 4 * k);
      s1[v] = dpbusd_bcast(s1[v], w1, q8[v] + 64 * g + 32 + 4 * k);
    }
  }
}

/// 16 packed rows x kV vectors over nb super-blocks in the gemm order. y[v]: vector v's Q8_K blocks; pairs:
/// per vector and block, 4 int32 (int16 pairs (bsums 4g + 4g+1, 4g+2 + 4g+3) of group g); out[v * ldy + r]
/// for the rows in `mask`. (The gemv order: rows16_gemv.)
template <int kV>
void rows16(const PackedBlock* pb, int64_t nb, const block_q8_K* const* y, const int32_t* const* pairs,
            float* out, int64_t ldy, __mmask16 mask, const NextGroup& ahead) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 acc[kV], acc_m[kV];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) acc[v] = acc_m[v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedBlock& b = pb[i];
    ahead.at(i, nb);
    const int8_t* q8[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) q8[v] = y[v][i].qs;
    // d = x.d * y.d and dmin = x.dmin * y.d per (row, vector), as the references form them
    alignas(64) float dv[kV][kRows], dmv[kV][kRows];
    const __m512 xd = _mm512_load_ps(b.d), xdmin = _mm512_load_ps(b.dmin);
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      const __m512 yd = _mm512_set1_ps(y[v][i].d);
      _mm512_store_ps(dv[v], _mm512_mul_ps(xd, yd));
      _mm512_store_ps(dmv[v], _mm512_mul_ps(xdmin, yd));
    }
    for (int g = 0; g < 4; ++g) {
      __m512i s0[kV], s1[kV];
      group_sums<kV>(b, g, q8, m4, s0, s1);
      const __m512i sc0 = _mm512_load_si512(b.sc[2 * g]), sc1 = _mm512_load_si512(b.sc[2 * g + 1]);
      const __m512i mn = _mm512_load_si512(b.mn[g]);
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        const __m512i is = _mm512_add_epi32(_mm512_mullo_epi32(s0[v], sc0), _mm512_mullo_epi32(s1[v], sc1));
        const __m512i im =
            _mm512_dpwssd_epi32(_mm512_setzero_si512(), mn, _mm512_set1_epi32(pairs[v][4 * i + g]));
        acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_load_ps(dv[v]), acc[v]);
        acc_m[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_load_ps(dmv[v]), acc_m[v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) _mm512_mask_storeu_ps(out + v * ldy, mask, _mm512_sub_ps(acc[v], acc_m[v]));
}

/// rows16 in the gemv order (dot_q4_K_q8_K_gemv_ref: each block's integers, then its two FMAs) for up to
/// kGemvVectorsPerRun vectors: the gemv order needs a block's integers only at the block's end, so the float
/// accumulators live in memory (one load and store per vector and block) and the min sums are formed after
/// the block's groups from the packed mins; the registers that leaves take eight vectors a run, each packed
/// weight register unpacked once for them (batched decode's steps, issue #25; runs of four, as the gemm
/// order's, unpacked it twice).
template <int kV>
void rows16_gemv(const PackedBlock* pb, int64_t nb, const block_q8_K* const* y, const int32_t* const* pairs,
                 float* out, int64_t ldy, __mmask16 mask, const NextGroup& ahead) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  alignas(64) float acc[kV][kRows], acc_m[kV][kRows];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    _mm512_store_ps(acc[v], _mm512_setzero_ps());
    _mm512_store_ps(acc_m[v], _mm512_setzero_ps());
  }
  for (int64_t i = 0; i < nb; ++i) {
    const PackedBlock& b = pb[i];
    ahead.at(i, nb);
    const int8_t* q8[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) q8[v] = y[v][i].qs;
    __m512i isum[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) isum[v] = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      __m512i s0[kV], s1[kV];
      group_sums<kV>(b, g, q8, m4, s0, s1);
      const __m512i sc0 = _mm512_load_si512(b.sc[2 * g]), sc1 = _mm512_load_si512(b.sc[2 * g + 1]);
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        isum[v] = _mm512_add_epi32(
            isum[v], _mm512_add_epi32(_mm512_mullo_epi32(s0[v], sc0), _mm512_mullo_epi32(s1[v], sc1)));
      }
    }
    const __m512 xd = _mm512_load_ps(b.d), xdmin = _mm512_load_ps(b.dmin);
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      __m512i imin = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        imin = _mm512_dpwssd_epi32(imin, _mm512_load_si512(b.mn[g]), _mm512_set1_epi32(pairs[v][4 * i + g]));
      }
      const __m512 yd = _mm512_set1_ps(y[v][i].d);
      _mm512_store_ps(acc[v], _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[v]), _mm512_mul_ps(xd, yd),
                                              _mm512_load_ps(acc[v])));
      _mm512_store_ps(acc_m[v], _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin), _mm512_mul_ps(xdmin, yd),
                                                _mm512_load_ps(acc_m[v])));
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    _mm512_mask_storeu_ps(out + v * ldy, mask,
                          _mm512_sub_ps(_mm512_load_ps(acc[v]), _mm512_load_ps(acc_m[v])));
  }
}

/// Vectors [v0, v1) in one order against one packed group of rows: the gemm order four at a time (rows16),
/// the gemv order eight at a time (rows16_gemv).
template <bool kGemm>
void run_vectors(const PackedBlock* pb, int64_t nb, const uint8_t* acts, size_t act_bytes,
                 const int32_t* pairs, int64_t v0, int64_t v1, float* y, int64_t ldy, __mmask16 mask,
                 NextGroup& ahead) {
  constexpr int kV = kGemm ? kVectorsPerRun : kGemvVectorsPerRun;
  auto run = [&]<int kN>(int64_t first) {
    const block_q8_K* yv[kN];
    const int32_t* pv[kN];
    for (int v = 0; v < kN; ++v) {
      yv[v] = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(first + v) * act_bytes);
      pv[v] = pairs + 4 * (first + v) * nb;
    }
    if constexpr (kGemm) {
      rows16<kN>(pb, nb, yv, pv, y + first * ldy, ldy, mask, ahead);
    } else {
      rows16_gemv<kN>(pb, nb, yv, pv, y + first * ldy, ldy, mask, ahead);
    }
    ahead.next_run();
  };
  int64_t v = v0;
  for (; v + kV <= v1; v += kV) run.template operator()<kV>(v);
  switch (v1 - v) {
    case 7: if constexpr (kV > 7) run.template operator()<7>(v); break;
    case 6: if constexpr (kV > 6) run.template operator()<6>(v); break;
    case 5: if constexpr (kV > 5) run.template operator()<5>(v); break;
    case 4: if constexpr (kV > 4) run.template operator()<4>(v); break;
    case 3: run.template operator()<3>(v); break;
    case 2: run.template operator()<2>(v); break;
    case 1: run.template operator()<1>(v); break;
    default: break;
  }
}

/// fn(v0, v1, gemm) for each maximal range [v0, v1) of vectors in one order (gemm: null = all gemv).
template <class Fn>
void for_each_order_range(int64_t nvec, const uint8_t* gemm, Fn&& fn) {
  auto gemm_at = [&](int64_t v) { return gemm != nullptr && gemm[v] != 0; };
  for (int64_t v0 = 0; v0 < nvec;) {
    const bool g = gemm_at(v0);
    int64_t v1 = v0 + 1;
    while (v1 < nvec && gemm_at(v1) == g) ++v1;
    fn(v0, v1, g);
    v0 = v1;
  }
}

/// The runs of vectors (rows16 / rows16_gemv calls) run_vectors makes over each group of rows.
int64_t count_runs(int64_t nvec, const uint8_t* gemm) {
  int64_t runs = 0;
  for_each_order_range(nvec, gemm, [&](int64_t v0, int64_t v1, bool g) {
    const int64_t per_run = g ? kVectorsPerRun : kGemvVectorsPerRun;
    runs += (v1 - v0 + per_run - 1) / per_run;
  });
  return runs;
}

}  // namespace

void tile_q4_K_repacked_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                             size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                             const uint8_t* gemm) {
  assert(n % QK_K == 0);
  thread_local Scratch pack_buf, pair_buf;
  const int64_t nb = n / QK_K;
  auto* pb = static_cast<PackedBlock*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedBlock)));
  auto* pairs = static_cast<int32_t*>(pair_buf.get(static_cast<size_t>(nvec * nb) * 4 * sizeof(int32_t)));
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* yb = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i bs = load32(yb[i].bsums);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + 4 * (v * nb + i)),
                       _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
    }
  }
  const int64_t runs = count_runs(nvec, gemm);
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_rows(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
    NextGroup ahead(w + static_cast<size_t>(r0) * row_bytes, row_bytes, runs, 1);
    // one transpose of the rows serves every run of vectors in the same order
    for_each_order_range(nvec, gemm, [&](int64_t v0, int64_t v1, bool g) {
      if (g) {
        run_vectors<true>(pb, nb, acts, act_bytes, pairs, v0, v1, y + r0, ldy, mask, ahead);
      } else {
        run_vectors<false>(pb, nb, acts, act_bytes, pairs, v0, v1, y + r0, ldy, mask, ahead);
      }
    });
  }
}

}  // namespace car::tensor::detail::avx512

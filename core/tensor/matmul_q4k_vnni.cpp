// The AVX-512 VNNI products of repacked Q4_K (kernel_table.h repacked(); issues #26, #29): llama.cpp's gemm
// and gemv orders from exact integer sums formed by vpdpbusd, sixteen weight rows per register - the matmul
// tile over the file's layout, and the tile, the one- and few-vector gemv kernels over the interleaved layout.
//
// Why the shape: the orders define one exact integer per (row, vector) and 64-element group (gemm) or
// super-block (gemv), then float FMAs in block order. An integer sum may be formed any way, so the tile puts
// one weight row in each int32 lane and broadcasts the vector's 4 quants of the same elements: one vpdpbusd
// adds 4 products to 16 (row, vector) sums with no horizontal reduction anywhere, and every float step is a
// lane-wise copy of the reference's (dot_q4_K_q8_K_gemm_ref / _gemv_ref), so each result equals it bit for
// bit. The lane-per-row layout needs the rows interleaved. Over the file's layout each call transposes its
// chunk's rows, 16 at a time, into a per-thread buffer (PackedQs, PackedHeader) that all the call's vectors
// then share. A matrix held interleaved (MatrixView::interleaved: the same transposition done once at load,
// the headers kept packed, InterleavedBlock) is read in place: only the scales are unpacked per call, and
// decode's one-vector kernel takes the layout too (gemv_interleaved_group), at about half the instructions per
// weight of the file layout's (matvec_avx512.cpp rows_q4_K_gemv).
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

/// The quants of one super-block of a group of 16 rows, interleaved so that lane r of every register is row r:
/// [group g][chunk k]: lane r = row r's qs[32g + 4k .. 32g + 4k + 3]; the low nibbles are elements
/// 64g + 4k .. +3 (sub-block 2g), the high nibbles the same positions of sub-block 2g + 1. The per-call pack
/// (file layout) and the interleaved layout at rest (InterleavedBlock) share it.
struct PackedQs {
  alignas(64) uint8_t qs[4][8][64];
};
static_assert(sizeof(PackedQs) == 2048);

/// The 16 rows' scales of one super-block, unpacked a row per lane for the products.
/// Invariant: rows past the group's end (a chunk's last, short group) are all zero (scales, mins, d).
struct alignas(64) PackedHeader {
  int32_t sc[8][kRows];   ///< [sub-block] row r's 6-bit scale, 16 times it for even sub-blocks (group_sums)
  int32_t mn[4][kRows];   ///< [group g] row r's mins 2g (low int16) and 2g + 1 (high int16)
  float d[kRows];         ///< row r's super-block scale
  float dmin[kRows];      ///< row r's super-block min scale
};
static_assert(sizeof(PackedHeader) == 8 * 64 + 4 * 64 + 2 * 64);

/// One super-block of 16 rows in the interleaved layout at rest (MatrixView::interleaved, kernels.h): the
/// quants as PackedQs, then the rows' 16-byte block headers (d and dmin, the 12 scale bytes) transposed a
/// dword per lane: lane r of h[j] = dword j of row r's header. 2304 bytes, the 16 rows' file bytes exactly, so
/// a group of 16 rows takes 16 * row_bytes wherever it sits.
struct InterleavedBlock {
  PackedQs q;
  alignas(64) uint32_t h[4][kRows];
};
static_assert(sizeof(InterleavedBlock) == 16 * sizeof(block_q4_K));

/// Where rows16 / rows16_gemv find a group's super-blocks: block i's quants at qs + i * qs_stride (the pack's
/// scratch, or the interleaved matrix itself), its unpacked scales at hdr[i].
struct PackedRows {
  const uint8_t* qs;
  size_t qs_stride;
  const PackedHeader* hdr;
  const PackedQs& q(int64_t i) const { return *reinterpret_cast<const PackedQs*>(qs + static_cast<size_t>(i) * qs_stride); }
};

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

/// The 16 rows' scales and mins a byte each, lane r = row r: ggml's utmp unpacking (unpack_scale_min_k4_words)
/// lane-wise, from the three scale dwords of their block headers (lane r of u[j]: dword j of row r's 12 scale
/// bytes, the transposed headers' h[1..3]).
struct ScaleMinBytes {
  __m512i sc03, sc47;  ///< byte j: scale j / j + 4
  __m512i mn03, mn47;  ///< byte j: min j / j + 4
};
inline ScaleMinBytes unpack_scale_min_bytes(__m512i u0, __m512i u1, __m512i u2) {
  const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f),
                k3 = _mm512_set1_epi32(0x03030303);
  ScaleMinBytes s;
  s.sc03 = _mm512_and_si512(u0, k1);
  s.sc47 = _mm512_or_si512(_mm512_and_si512(u2, k2),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
  s.mn03 = _mm512_and_si512(u1, k1);
  s.mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                           _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
  return s;
}

/// Lane r: row r's (min 2g, min 2g + 1) as int16 pairs (from the bytes [m0 m1 m2 m3] of mn03 or mn47, the
/// words (m0, m1) or (m2, m3)), vpdpwssd's operand against the bsum pairs of 64-element group g.
inline __m512i min_pair(const ScaleMinBytes& s, int g) {
  const __m512i byte = _mm512_set1_epi32(0xff), word_hi = _mm512_set1_epi32(0xff0000);
  const __m512i m = g < 2 ? s.mn03 : s.mn47;
  return (g & 1) == 0 ? _mm512_or_si512(_mm512_and_si512(m, byte), _mm512_and_si512(_mm512_slli_epi32(m, 8), word_hi))
                      : _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(m, 16), byte),
                                        _mm512_and_si512(_mm512_srli_epi32(m, 8), word_hi));
}

/// The scales of sub-blocks 2h and 2h + 1 (h = 0, 1) from the bytes [s0 s1 s2 s3] of sc03 or sc47, a dword
/// per lane: the even one 16 times larger (group_sums and the one-vector kernel multiply the high nibbles in
/// place, 16 times their level), the odd one as it is.
inline void scale_pair(__m512i sc, int h, __m512i* even16, __m512i* odd) {
  const __m512i byte = _mm512_set1_epi32(0xff), byte16 = _mm512_set1_epi32(0xff0);
  *even16 = h == 0 ? _mm512_and_si512(_mm512_slli_epi32(sc, 4), byte16)
                   : _mm512_and_si512(_mm512_srli_epi32(sc, 12), byte16);
  *odd = _mm512_and_si512(_mm512_srli_epi32(sc, 16 * h + 8), byte);
}

/// Unpack the 16 rows' transposed headers h (lane r of h[j]: dword j of row r's block header) into b.
inline void unpack_headers(const __m512i* h, PackedHeader& b) {
  _mm512_store_ps(b.d, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0])));
  _mm512_store_ps(b.dmin, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16))));
  const ScaleMinBytes s = unpack_scale_min_bytes(h[1], h[2], h[3]);
#pragma GCC unroll 4
  for (int j = 0; j < 4;
       ++j) {  // sub-blocks 2j and 2j + 1: bytes 2(j % 2), 2(j % 2) + 1 of sc03 (j < 2) or sc47
    __m512i even16, odd;
    scale_pair(j < 2 ? s.sc03 : s.sc47, j & 1, &even16, &odd);
    _mm512_store_si512(b.sc[2 * j], even16);
    _mm512_store_si512(b.sc[2 * j + 1], odd);
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) _mm512_store_si512(b.mn[g], min_pair(s, g));
}

/// Rows [0, nrows) (nrows <= 16) of nb super-blocks: block i's quants interleaved into qs[i] and, when `hdr`
/// is set, its unpacked scales into hdr[i]; when `raw` is set, its transposed headers into raw[i] (the layout
/// at rest). Missing rows read as a zero block. kFull: nrows == 16, without the per-row bound checks.
template <bool kFull>
void pack_rows_impl(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, uint8_t* qs, size_t qs_stride,
                    PackedHeader* hdr, uint32_t (*raw)[kRows], size_t raw_stride) {
  alignas(64) static constexpr block_q4_K kZero{};
  auto block = [&](int r, int64_t i) -> const block_q4_K& {
    return kFull || r < nrows ? reinterpret_cast<const block_q4_K*>(w + static_cast<size_t>(r) * row_bytes)[i]
                              : kZero;
  };
  for (int64_t i = 0; i < nb; ++i) {
    auto* q = reinterpret_cast<PackedQs*>(qs + static_cast<size_t>(i) * qs_stride);
    for (int g = 0; g < 4; ++g) {
      __m512i z[8], out[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) z[r] = load32x2(block(r, i).qs + 32 * g, block(r + 8, i).qs + 32 * g);
      transpose16x8_dwords(z, out);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) _mm512_store_si512(q->qs[g][k], out[k]);
    }
    __m512i h[4];
    load_headers([&](int r) { return &block(r, i); }, h);
    if (hdr != nullptr) unpack_headers(h, hdr[i]);
    if (raw != nullptr) {
      auto* dst = reinterpret_cast<uint32_t(*)[kRows]>(reinterpret_cast<uint8_t*>(raw) + static_cast<size_t>(i) * raw_stride);
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) _mm512_store_si512(dst[j], h[j]);
    }
  }
}

/// Pack a chunk's group of nrows (<= 16) rows for the products: quants into pb_qs (2048 bytes a block), scales
/// into hdr.
void pack_rows(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedQs* pb_qs, PackedHeader* hdr) {
  assert(nrows <= kRows);
  auto* qs = reinterpret_cast<uint8_t*>(pb_qs);
  if (nrows == kRows) {
    pack_rows_impl<true>(w, row_bytes, nrows, nb, qs, sizeof(PackedQs), hdr, nullptr, 0);
  } else {
    pack_rows_impl<false>(w, row_bytes, nrows, nb, qs, sizeof(PackedQs), hdr, nullptr, 0);
  }
}

/// The scales of an interleaved group's nb super-blocks, unpacked into hdr.
void unpack_interleaved_headers(const InterleavedBlock* x, int64_t nb, PackedHeader* hdr) {
  for (int64_t i = 0; i < nb; ++i) {
    __m512i h[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) h[j] = _mm512_load_si512(x[i].h[j]);
    unpack_headers(h, hdr[i]);
  }
}

/// Group g (64 elements) of packed block b against kV vectors (q8[v]: vector v's block quants): s0[v] /
/// s1[v], lane r = row r's integer sum of levels x quants over sub-block 2g (the low nibbles) / 16 times that
/// of 2g + 1 (the high): the high nibbles are multiplied in place (quant & 0xf0 = 16 x level), one AND where
/// a shift and an AND took two ops of the ports vpdpbusd runs on; PackedHeader::sc holds the even sub-blocks'
/// scales 16 times larger to match, so s0 x sc[2g] + s1 x sc[2g + 1] is 16 times the exact integer (|sum| <=
/// 8 x 63 x 32 x 15 x 128 x 16 < 2^31 over a whole super-block) and one arithmetic shift gives it back.
template <int kV>
inline void group_sums(const PackedQs& b, int g, const int8_t* const* q8, __m512i m4, __m512i* s0,
                       __m512i* s1) {
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) s0[v] = s1[v] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m512i raw = _mm512_load_si512(b.qs[g][k]);
    const __m512i w0 = _mm512_and_si512(raw, m4);
    const __m512i w1 = _mm512_andnot_si512(m4, raw);  // 16 x the high nibble
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
void rows16(const PackedRows& pb, int64_t nb, const block_q8_K* const* y, const int32_t* const* pairs,
            float* out, int64_t ldy, __mmask16 mask, const NextGroup& ahead) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 acc[kV], acc_m[kV];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) acc[v] = acc_m[v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedQs& b = pb.q(i);
    const PackedHeader& h = pb.hdr[i];
    ahead.at();
    const int8_t* q8[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) q8[v] = y[v][i].qs;
    // d = x.d * y.d and dmin = x.dmin * y.d per (row, vector), as the references form them
    alignas(64) float dv[kV][kRows], dmv[kV][kRows];
    const __m512 xd = _mm512_load_ps(h.d), xdmin = _mm512_load_ps(h.dmin);
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      const __m512 yd = _mm512_set1_ps(y[v][i].d);
      _mm512_store_ps(dv[v], _mm512_mul_ps(xd, yd));
      _mm512_store_ps(dmv[v], _mm512_mul_ps(xdmin, yd));
    }
    for (int g = 0; g < 4; ++g) {
      __m512i s0[kV], s1[kV];
      group_sums<kV>(b, g, q8, m4, s0, s1);
      const __m512i sc0 = _mm512_load_si512(h.sc[2 * g]), sc1 = _mm512_load_si512(h.sc[2 * g + 1]);
      const __m512i mn = _mm512_load_si512(h.mn[g]);
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        const __m512i is = _mm512_srai_epi32(
            _mm512_add_epi32(_mm512_mullo_epi32(s0[v], sc0), _mm512_mullo_epi32(s1[v], sc1)), 4);
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
void rows16_gemv(const PackedRows& pb, int64_t nb, const block_q8_K* const* y, const int32_t* const* pairs,
                 float* out, int64_t ldy, __mmask16 mask, const NextGroup& ahead) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  alignas(64) float acc[kV][kRows], acc_m[kV][kRows];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    _mm512_store_ps(acc[v], _mm512_setzero_ps());
    _mm512_store_ps(acc_m[v], _mm512_setzero_ps());
  }
  for (int64_t i = 0; i < nb; ++i) {
    const PackedQs& b = pb.q(i);
    const PackedHeader& h = pb.hdr[i];
    ahead.at();
    const int8_t* q8[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) q8[v] = y[v][i].qs;
    __m512i isum[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) isum[v] = _mm512_setzero_si512();
    for (int g = 0; g < 4; ++g) {
      __m512i s0[kV], s1[kV];
      group_sums<kV>(b, g, q8, m4, s0, s1);
      const __m512i sc0 = _mm512_load_si512(h.sc[2 * g]), sc1 = _mm512_load_si512(h.sc[2 * g + 1]);
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        isum[v] = _mm512_add_epi32(
            isum[v], _mm512_add_epi32(_mm512_mullo_epi32(s0[v], sc0), _mm512_mullo_epi32(s1[v], sc1)));
      }
    }
    const __m512 xd = _mm512_load_ps(h.d), xdmin = _mm512_load_ps(h.dmin);
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      __m512i imin = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        imin = _mm512_dpwssd_epi32(imin, _mm512_load_si512(h.mn[g]), _mm512_set1_epi32(pairs[v][4 * i + g]));
      }
      const __m512 yd = _mm512_set1_ps(y[v][i].d);
      _mm512_store_ps(acc[v], _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(isum[v], 4)),
                                              _mm512_mul_ps(xd, yd), _mm512_load_ps(acc[v])));
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
void run_vectors(const PackedRows& pb, int64_t nb, const uint8_t* acts, size_t act_bytes,
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


/// The bsum pairs of nvec vectors' nb Q8_K blocks (rows16's `pairs`) into the calling thread's scratch.
const int32_t* bsum_pairs(const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t nb) {
  thread_local Scratch pair_buf;
  auto* pairs = static_cast<int32_t*>(pair_buf.get(static_cast<size_t>(nvec * nb) * 4 * sizeof(int32_t)));
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* yb = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i bs = load32(yb[i].bsums);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(pairs + 4 * (v * nb + i)),
                       _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
    }
  }
  return pairs;
}

/// The tile over either layout: kInterleaved, the rows are interleaved at rest (each group's quants read in
/// place, only its scales unpacked per call; nrows a multiple of 16); else each group of 16 is packed first.
template <bool kInterleaved>
void tile_q4_K(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy, const uint8_t* gemm) {
  assert(n % QK_K == 0);
  thread_local Scratch qs_buf, hdr_buf;
  const int64_t nb = n / QK_K;
  auto* hdr = static_cast<PackedHeader*>(hdr_buf.get(static_cast<size_t>(nb) * sizeof(PackedHeader)));
  PackedQs* qs = kInterleaved ? nullptr : static_cast<PackedQs*>(qs_buf.get(static_cast<size_t>(nb) * sizeof(PackedQs)));
  const int32_t* pairs = bsum_pairs(acts, act_bytes, nvec, nb);
  const int64_t runs = count_runs(nvec, gemm);
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    const uint8_t* group = w + static_cast<size_t>(r0) * row_bytes;
    PackedRows pb{};
    if constexpr (kInterleaved) {
      assert(nr == kRows);
      unpack_interleaved_headers(reinterpret_cast<const InterleavedBlock*>(group), nb, hdr);
      pb = PackedRows{group, sizeof(InterleavedBlock), hdr};
    } else {
      pack_rows(group, row_bytes, nr, nb, qs, hdr);
      pb = PackedRows{reinterpret_cast<const uint8_t*>(qs), sizeof(PackedQs), hdr};
    }
    const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
    NextGroup ahead(group, row_bytes, nb, runs, 1);
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

/// How far ahead the interleaved gemv prefetches: its groups are one contiguous stream.
constexpr int64_t kInterleavedAhead = 8192;

/// kV (1-3) vectors in the gemv order against one interleaved group of 16 rows, everything in registers: the
/// scales unpacked from the transposed headers, per 64-element group two exact sums per (row, vector) by
/// vpdpbusd with the vector's quants broadcast, times their scales by vpmulld, the mins' sum by vpdpwssd, then
/// per super-block the reference's two FMAs lane-wise - rows16_gemv's operations, without its pack or its
/// accumulators in memory (~17 instructions per row and super-block where the file layout's one-row kernel
/// takes ~36: issue #29). The high nibbles are multiplied in place (quant & 0xf0 = 16 x level), so each is one
/// AND instead of a shift and an AND; the low nibbles' scales are taken 16 times larger to match, and the
/// block's sum, 16 x the exact integer, is shifted back once: |integer| <= 8 x 63 x 32 x 15 x 128 < 2^31 / 16,
/// so every step is exact and the result is the same integer.
template <int kV>
inline void gemv_interleaved_group(const InterleavedBlock* x, int64_t nb, const block_q8_K* const* y,
                                   const int32_t* const* pairs, float* out, int64_t ldy) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 acc[kV], acc_m[kV];
  for (int v = 0; v < kV; ++v) acc[v] = acc_m[v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const InterleavedBlock& b = x[i];
    const char* ahead = reinterpret_cast<const char*>(&b) + kInterleavedAhead;
    if constexpr (kV == 1) {
#pragma GCC unroll 36
      for (int l = 0; l < static_cast<int>(sizeof(InterleavedBlock) / 64); ++l) {
        _mm_prefetch(ahead + 64 * l, kWeightStreamHint);
      }
    }
    const __m512i h0 = _mm512_load_si512(b.h[0]);
    const ScaleMinBytes smb =
        unpack_scale_min_bytes(_mm512_load_si512(b.h[1]), _mm512_load_si512(b.h[2]), _mm512_load_si512(b.h[3]));
    __m512i isum[kV], imin[kV];
    for (int v = 0; v < kV; ++v) isum[v] = imin[v] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      // 2-3 vectors: a quarter of the block kInterleavedAhead on per group. All 36 lines at the block's start
      // held them at 0.74-0.80 (2) and 0.59-0.70 (3) of the read (MatvecVsStream Q4_K_interleaved 256 MiB t2,
      // three rounds alternated, 2026-12-07), spread at 0.92-0.96 and 0.75-0.83; one vector (decode, issue
      // #29) measured no clear difference in five rounds (t2 0.82-0.90 against 0.89-0.95, t1 0.82-0.99
      // against 0.79-1.02) and keeps the bunched prefetch it was tuned with.
      if constexpr (kV > 1) {
#pragma GCC unroll 9
        for (int l = 0; l < 9; ++l) _mm_prefetch(ahead + 64 * (9 * g + l), kWeightStreamHint);
      }
      __m512i s0[kV], s1[kV];
      for (int v = 0; v < kV; ++v) s0[v] = s1[v] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        const __m512i raw = _mm512_load_si512(b.q.qs[g][k]);
        const __m512i w0 = _mm512_and_si512(raw, m4);
        const __m512i w1 = _mm512_andnot_si512(m4, raw);  // 16 x the high nibble
        for (int v = 0; v < kV; ++v) {
          s0[v] = dpbusd_bcast(s0[v], w0, y[v][i].qs + 64 * g + 4 * k);
          s1[v] = dpbusd_bcast(s1[v], w1, y[v][i].qs + 64 * g + 32 + 4 * k);
        }
      }
      // sub-blocks 2g, 2g + 1; sub-block 2g's scale 16 times larger (s1 is 16 times its sum)
      __m512i sc0, sc1;
      scale_pair(g < 2 ? smb.sc03 : smb.sc47, g & 1, &sc0, &sc1);
      const __m512i mn = min_pair(smb, g);
      for (int v = 0; v < kV; ++v) {
        isum[v] = _mm512_add_epi32(
            isum[v], _mm512_add_epi32(_mm512_mullo_epi32(s0[v], sc0), _mm512_mullo_epi32(s1[v], sc1)));
        imin[v] = _mm512_dpwssd_epi32(imin[v], mn, _mm512_set1_epi32(pairs[v][4 * i + g]));
      }
    }
    const __m512 xd = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
    const __m512 xdmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h0, 16)));
    for (int v = 0; v < kV; ++v) {
      const __m512 yd = _mm512_set1_ps(y[v][i].d);
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(isum[v], 4)), _mm512_mul_ps(xd, yd), acc[v]);
      acc_m[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(imin[v]), _mm512_mul_ps(xdmin, yd), acc_m[v]);
    }
  }
  for (int v = 0; v < kV; ++v) _mm512_storeu_ps(out + v * ldy, _mm512_sub_ps(acc[v], acc_m[v]));
}

/// kV vectors (acts + v * act_bytes) in the gemv order over interleaved rows [0, nrows) (whole groups).
template <int kV>
void gemv_interleaved(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                      int64_t n, float* y, int64_t ldy, const int32_t* pairs_all) {
  const int64_t nb = n / QK_K;
  const block_q8_K* yv[kV];
  const int32_t* pv[kV];
  for (int v = 0; v < kV; ++v) {
    yv[v] = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    pv[v] = pairs_all + 4 * v * nb;
  }
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    gemv_interleaved_group<kV>(reinterpret_cast<const InterleavedBlock*>(w + static_cast<size_t>(r0) * row_bytes),
                               nb, yv, pv, y + r0, ldy);
  }
}

}  // namespace

void tile_q4_K_repacked_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                             size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                             const uint8_t* gemm) {
  tile_q4_K<false>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}

void tile_q4_K_interleaved_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                const uint8_t* gemm) {
  assert(nrows % kRows == 0);
  tile_q4_K<true>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy, gemm);
}

void rows_q4_K_interleaved_gemv(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n,
                                float* y) {
  assert(nrows % kRows == 0 && n % QK_K == 0);
  const auto* a = static_cast<const uint8_t*>(act);
  gemv_interleaved<1>(w, row_bytes, nrows, a, 0, n, y, 0, bsum_pairs(a, 0, 1, n / QK_K));
}

void rows_q4_K_interleaved_gemv_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                    size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  assert(nrows % kRows == 0 && n % QK_K == 0);
  const int32_t* pairs = bsum_pairs(acts, act_bytes, nvec, n / QK_K);
  const int64_t nb = n / QK_K;
  vector_passes(nvec, [&](auto kv, int64_t i) [[gnu::always_inline]] {
    gemv_interleaved<decltype(kv)::value>(w, row_bytes, nrows, acts + static_cast<size_t>(i) * act_bytes,
                                          act_bytes, n, y + i * ldy, ldy, pairs + 4 * i * nb);
  });
}

void interleave_q4_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, int64_t n, uint8_t* dst) {
  assert(nrows % kRows == 0 && n % QK_K == 0 && row_bytes == static_cast<size_t>(n / QK_K) * sizeof(block_q4_K));
  const int64_t nb = n / QK_K;
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    auto* out = reinterpret_cast<InterleavedBlock*>(dst + static_cast<size_t>(r0) * row_bytes);
    pack_rows_impl<true>(w + static_cast<size_t>(r0) * row_bytes, row_bytes, kRows, nb,
                         reinterpret_cast<uint8_t*>(&out->q), sizeof(InterleavedBlock), nullptr, out->h,
                         sizeof(InterleavedBlock));
  }
}

}  // namespace car::tensor::detail::avx512

// The AVX-512 VNNI kernels for Q4_0, IQ4_NL and MXFP4 in llama.cpp's repacked order (kernel_table.h
// repacked(); dot_*_repacked_ref): the matmul tile (prompts, batched decode) and the multi-row gemv (decode).
//
// The order defines one exact integer per (row, vector, 32-element block) and then one float FMA per block in
// block order, so a row's FMAs form a chain as long as the row has blocks. As in matmul_q4k_vnni.cpp, each
// int32 lane holds one weight row and the vector's 4 activations of the same elements are broadcast into
// vpdpbusd: 16 rows advance their chains side by side, no horizontal sum is needed, and every float step is
// the reference's, lane-wise. The rows are transposed per call, 16 at a time, into a per-thread buffer
// (PackedBlock) by gathers; the file's bytes stay as they are.
//
// vpdpbusd multiplies unsigned by signed bytes: the weights enter as their table value + 128 (a byte in
// 1..255 for all three tables) and 128 x the activation block's sum comes off the integer afterwards, which
// keeps it exact (|sum| <= 32 x 255 x 127 < 2^31).
#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/simd_avx512.h"
#include "core/tensor/vnni_pack_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

constexpr int kRows = static_cast<int>(kRepackedRowGroup);  // weight rows per group: one int32 / float lane each

/// One 32-element block of a group of 16 rows, lane r = row r. Rows past the group's end are zero (d too).
struct PackedBlock {
  /// [dword k]: lane r = row r's qs[4k .. 4k + 3]: low nibbles elements 4k .. 4k + 3, high nibbles 16 + 4k ..
  alignas(64) uint8_t qs[4][64];
  float d[kRows];  ///< row r's block scale
};
static_assert(sizeof(PackedBlock) == 5 * 64);

/// The three formats: where the nibbles sit, the table, and the block scale from the block's first dword
/// (lane-wise, as each reference reads it).
struct Q40 {
  using Block = block_q4_0;
  static constexpr const int8_t* values = kvalues_q4_0;
  static __m512 scales(__m512i first) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(first)); }
};
struct Iq4nl {
  using Block = block_iq4_nl;
  static constexpr const int8_t* values = kvalues_iq4nl;
  static __m512 scales(__m512i first) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(first)); }
};
struct Mxfp4 {
  using Block = block_mxfp4;
  static constexpr const int8_t* values = kvalues_mxfp4;
  /// e8m0_to_fp32_half lane-wise: (e - 1) << 23, and the subnormals 0x00200000 << e for e 0 and 1.
  static __m512 scales(__m512i first) {
    const __m512i e = _mm512_and_si512(first, _mm512_set1_epi32(0xff));
    const __mmask16 sub = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __m512i subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(sub, normal, subnormal));
  }
};

// Lane p of a group's registers holds row 4 (p % 4) + p / 4 (kLaneRow below): the 4x4 dword transposes leave
// the rows in that order, which the scales follow and the final store undoes.

/// A group of up to 16 rows, one block at a time: row r at rows[r] (a zero block, advanced by 0, for the rows
/// past the group's end).
template <typename F>
struct RowGroup {
  using Block = typename F::Block;
  const uint8_t* rows[kRows];
  size_t step[kRows];
  __m512i offsets;  ///< lane p: byte offset of row 4 (p % 4) + p / 4 from rows[0] (the scales' gather)
  __mmask16 lanes;  ///< the lanes of real rows

  RowGroup(const uint8_t* w, size_t row_bytes, int nrows) {
    alignas(64) static constexpr Block kZero{};
    assert(nrows <= kRows && row_bytes <= static_cast<size_t>(INT32_MAX / kRows));
    alignas(64) int32_t off[kRows];
    lanes = 0;
    for (int p = 0; p < kRows; ++p) {
      const int r = 4 * (p % 4) + p / 4;
      rows[r] = r < nrows ? w + static_cast<size_t>(r) * row_bytes : reinterpret_cast<const uint8_t*>(&kZero);
      step[r] = r < nrows ? sizeof(Block) : 0;
      off[p] = r < nrows ? static_cast<int32_t>(static_cast<size_t>(r) * row_bytes) : 0;
      if (r < nrows) lanes = static_cast<__mmask16>(lanes | (1u << p));
    }
    offsets = _mm512_load_si512(off);
  }

  /// Block i of the group: qs[k] lane p = row 4 (p % 4) + p / 4's qs dword k; the scales lane-wise (0 past the end).
  void load(int64_t i, __m512i* qs, __m512* d) const {
    __m512i z[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {  // z[j]'s 128-bit lane q: row 4j + q's 16 bytes of nibbles
      auto at = [&](int r) {
        return reinterpret_cast<const __m128i*>(rows[r] + static_cast<size_t>(i) * step[r] + offsetof(Block, qs));
      };
      __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(at(4 * j)));
      v = _mm512_inserti32x4(v, _mm_loadu_si128(at(4 * j + 1)), 1);
      v = _mm512_inserti32x4(v, _mm_loadu_si128(at(4 * j + 2)), 2);
      z[j] = _mm512_inserti32x4(v, _mm_loadu_si128(at(4 * j + 3)), 3);
    }
    transpose4x4_dwords_per_lane(z, qs);
    // the rows past the end read kZero through rows[] but the gather's base is row 0: mask them off
    const __m512i first = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), lanes, offsets,
                                                      rows[0] + static_cast<size_t>(i) * sizeof(Block), 1);
    *d = _mm512_maskz_mov_ps(lanes, F::scales(first));
  }
};

/// Pack the group's nb blocks into pb[0, nb).
template <typename F>
void pack_rows(const RowGroup<F>& g, int64_t nb, PackedBlock* pb) {
  for (int64_t i = 0; i < nb; ++i) {
    __m512i qs[4];
    __m512 d;
    g.load(i, qs, &d);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) _mm512_store_si512(pb[i].qs[k], qs[k]);
    _mm512_store_ps(pb[i].d, d);
  }
}

/// Lane p's result to row 4 (p % 4) + p / 4 of out, for the rows in `rows` (a row mask).
inline void store_rows(float* out, __m512 acc, __mmask16 rows) {
  // row r's lane is 4 (r % 4) + r / 4: the order is its own inverse (a 4 x 4 transpose)
  const __m512i to_lane = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_mask_storeu_ps(out, rows, _mm512_permutexvar_ps(to_lane, acc));
}

/// 16 packed rows x kV vectors over nb blocks. y[v]: vector v's Q8_0 blocks; off[v]: per block, 128 x the sum
/// of its quants; out[v * ldy + r] for the rows in `mask`.
template <int kV>
void rows16(const PackedBlock* pb, int64_t nb, __m512i lut, const block_q8_0* const* y, const int32_t* const* off,
            float* out, int64_t ldy, __mmask16 mask, const NextGroup& ahead) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 acc[kV];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) acc[v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedBlock& b = pb[i];
    ahead.at();
    __m512i s[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) s[v] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i raw = _mm512_load_si512(b.qs[k]);
      const __m512i wl = _mm512_shuffle_epi8(lut, _mm512_and_si512(raw, m4));
      const __m512i wh = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(raw, 4), m4));
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        s[v] = dpbusd_bcast(s[v], wl, y[v][i].qs + 4 * k);
        s[v] = dpbusd_bcast(s[v], wh, y[v][i].qs + 16 + 4 * k);
      }
    }
    const __m512 xd = _mm512_load_ps(b.d);
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      const __m512i isum = _mm512_sub_epi32(s[v], _mm512_set1_epi32(off[v][i]));
      const __m512 d = _mm512_mul_ps(xd, _mm512_set1_ps(h2f(y[v][i].d)));
      acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), d, acc[v]);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) store_rows(out + v * ldy, acc[v], mask);
}

/// The table + 128 as unsigned bytes, in every 128-bit lane (vpshufb's table).
__m512i offset_table(const int8_t* values) {
  const __m128i t = _mm_add_epi8(_mm_load_si128(reinterpret_cast<const __m128i*>(values)), _mm_set1_epi8(-128));
  return _mm512_broadcast_i32x4(t);
}

/// Per block of each of `nvec` Q8_0 rows: 128 x the sum of its 32 quants (vpdpbusd's +128 comes off it).
void block_offsets(const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t nb, int32_t* off) {
  const __m256i ones = _mm256_set1_epi8(1);
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* yb = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i s16 = _mm256_maddubs_epi16(ones, load32(yb[i].qs));  // int8 pairs -> int16
      const __m256i s32 = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
      off[v * nb + i] =
          128 * hsum_i32x4(_mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1)));
    }
  }
}

template <typename F>
void tile(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes, int64_t nvec,
          int64_t n, float* y, int64_t ldy) {
  assert(n % 32 == 0);
  thread_local AlignedScratch pack_buf, off_buf;
  const int64_t nb = n / 32;
  auto* pb = static_cast<PackedBlock*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedBlock)));
  auto* off = static_cast<int32_t*>(off_buf.get(static_cast<size_t>(nvec * nb) * sizeof(int32_t)));
  block_offsets(acts, act_bytes, nvec, nb, off);
  const __m512i lut = offset_table(F::values);
  constexpr int kV = 4;
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_rows<F>(RowGroup<F>(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr), nb, pb);
    NextGroup ahead(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nb, nvec, kV);
    const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
    auto run = [&]<int kN>(int64_t first) {
      const block_q8_0* yv[kN];
      const int32_t* ov[kN];
      for (int v = 0; v < kN; ++v) {
        yv[v] = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(first + v) * act_bytes);
        ov[v] = off + (first + v) * nb;
      }
      rows16<kN>(pb, nb, lut, yv, ov, y + first * ldy + r0, ldy, mask, ahead);
    };
    int64_t v = 0;
    for (; v + kV <= nvec; v += kV) run.template operator()<kV>(v);
    switch (nvec - v) {
      case 3: run.template operator()<3>(v); break;
      case 2: run.template operator()<2>(v); break;
      case 1: run.template operator()<1>(v); break;
      default: break;
    }
  }
}

/// DotKernels::tile_repacked: the gemv and gemm orders are one order here, so `gemm` does not matter.
template <typename F>
void tile_repacked(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                   int64_t nvec, int64_t n, float* y, int64_t ldy, const uint8_t* /*gemm*/) {
  tile<F>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

/// DotKernels::rows_gemv (decode): the tile's arithmetic for one vector, each block's rows transposed in
/// registers and used at once rather than packed.
template <typename F>
void rows_gemv(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n, float* out) {
  assert(n % 32 == 0);
  thread_local AlignedScratch off_buf;
  const int64_t nb = n / 32;
  auto* off = static_cast<int32_t*>(off_buf.get(static_cast<size_t>(nb) * sizeof(int32_t)));
  block_offsets(static_cast<const uint8_t*>(act), 0, 1, nb, off);
  const auto* y = static_cast<const block_q8_0*>(act);
  const __m512i lut = offset_table(F::values);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    const RowGroup<F> g(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr);
    // decode of a Q4_0 model from memory with the next group fetched a share per block (into L1 then; now
    // kWeightStreamHint): 1.55 -> 1.16 s of CPU for 64 tokens (two groups ahead measured slower)
    const NextGroup ahead(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nb, 1, 1);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; ++i) {
      ahead.at();
      __m512i qs[4];
      __m512 d;
      g.load(i, qs, &d);
      __m512i s = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        s = dpbusd_bcast(s, _mm512_shuffle_epi8(lut, _mm512_and_si512(qs[k], m4)), y[i].qs + 4 * k);
        s = dpbusd_bcast(s, _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(qs[k], 4), m4)),
                         y[i].qs + 16 + 4 * k);
      }
      const __m512i isum = _mm512_sub_epi32(s, _mm512_set1_epi32(off[i]));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(d, _mm512_set1_ps(h2f(y[i].d))), acc);
    }
    store_rows(out + r0, acc, static_cast<__mmask16>((1u << nr) - 1));
  }
}

}  // namespace

void add_nl32_repacked_kernels(DotKernels& k) {
  k.tile_repacked[slot(GgmlType::Q4_0)] = tile_repacked<Q40>;
  k.tile_repacked[slot(GgmlType::IQ4_NL)] = tile_repacked<Iq4nl>;
  k.tile_repacked[slot(GgmlType::MXFP4)] = tile_repacked<Mxfp4>;
  k.rows_gemv[slot(GgmlType::Q4_0)] = rows_gemv<Q40>;
  k.rows_gemv[slot(GgmlType::IQ4_NL)] = rows_gemv<Iq4nl>;
  k.rows_gemv[slot(GgmlType::MXFP4)] = rows_gemv<Mxfp4>;
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::MXFP4}) k.gemv_group[slot(t)] = kRepackedRowGroup;
}

}  // namespace car::tensor::detail::avx512

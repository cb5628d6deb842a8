// The AVX-512 VNNI matmul tiles for Q4_1, Q5_0 and Q5_1 (DotKernels::tile; issue #26): sixteen weight rows
// per register, one vpdpbusd per 4 elements of 16 (row, vector) pairs, each result bit-equal to the table's
// dot kernel (dot_avx2.cpp: ggml's AVX2 ggml_vec_dot_q4_1_q8_1 / _q5_0_q8_0 / _q5_1_q8_1 orders).
//
// The order they must keep: per 32-element block, eight exact int32 lanes (lane l: elements 4l..4l+3, level
// times activation), acc[l] = fma(x.d * y.d, float(lane l), acc[l]); Q4_1 and Q5_1 also summs = fma(x.m,
// y.s, summs) per block (the compiler contracts the kernels' `summs += m * s`); the result hsum8(acc)
// (+ summs). As in matmul_q8_vnni.cpp each int32 lane of a register is one weight row and the vector's 4
// bytes of lane l are broadcast into vpdpbusd: register k of a packed block holds dword k (elements 4k..4k+3)
// of 16 rows, and one instruction yields lane k's integer for 16 (row, vector) pairs. The float steps are
// lane-wise copies of the dot kernel's, with a pair's 8 accumulators in 8 registers; hsum8's tree becomes
// vertical adds.
//
// The levels are unsigned (Q4_1 0..15, Q5_1 0..31) as vpdpbusd wants them; Q5_0's are q - 16 with q 0..31:
// the packed bytes are q and each lane starts from -16 * (the vector's sum of its 4 bytes), computed once per
// call for every vector and block, so the integer is exactly sum((q - 16) * y).
#include <algorithm>
#include <cassert>
#include <cstdint>
#include <cstring>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/simd_avx512.h"
#include "core/tensor/vnni_pack_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

constexpr int kRows = 16;  // weight rows per packed group: one int32 / float lane each

/// One block of a group of 16 rows, interleaved so that lane r of every register is row r.
/// Invariant: rows past the group's end (the chunk's last, short group) have d == m == 0 and levels 0.
struct PackedLegacyBlock {
  alignas(64) uint8_t qs[8][64];  ///< [k] lane r = row r's levels of elements 4k .. 4k + 3 (unsigned)
  float d[kRows];                 ///< row r's block scale
  float m[kRows];                 ///< row r's block min (Q4_1, Q5_1)
};
static_assert(sizeof(PackedLegacyBlock) == 10 * 64);

/// The 32 levels of a block in element order: low nibbles (elements 0..15), then high nibbles (16..31).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0f));
}
/// 0x10 in byte j where bit j of the 4 bytes at qh is set (the fifth bit of element j).
inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  const __mmask32 m = _cvtu32_mask32(bits);
  return _mm256_maskz_mov_epi8(m, _mm256_set1_epi8(0x10));
}

struct Q4_1 {
  using Block = block_q4_1;
  using ActBlock = block_q8_1;
  static constexpr bool kMin = true, kOffset = false;
  static __m256i levels(const Block& x) { return nibbles(x.qs); }
};
struct Q5_1 {
  using Block = block_q5_1;
  using ActBlock = block_q8_1;
  static constexpr bool kMin = true, kOffset = false;
  static __m256i levels(const Block& x) { return _mm256_or_si256(nibbles(x.qs), fifth_bits(x.qh)); }
};
struct Q5_0 {
  using Block = block_q5_0;
  using ActBlock = block_q8_0;
  static constexpr bool kMin = false, kOffset = true;
  static __m256i levels(const Block& x) { return _mm256_or_si256(nibbles(x.qs), fifth_bits(x.qh)); }
};

template <class T>
float block_min(const T& x) {
  if constexpr (requires { x.m; }) {
    return h2f(x.m);
  } else {
    return 0.0f;
  }
}

/// Pack rows [0, nrows) (nrows <= 16) of nb blocks into pb[0, nb).
template <class F>
void pack_rows(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedLegacyBlock* pb) {
  using Block = typename F::Block;
  for (int64_t i = 0; i < nb; ++i) {
    PackedLegacyBlock& b = pb[i];
    alignas(64) uint8_t lv[kRows][32];
    for (int r = 0; r < kRows; ++r) {
      if (r < nrows) {
        const Block& x = reinterpret_cast<const Block*>(w + static_cast<size_t>(r) * row_bytes)[i];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lv[r]), F::levels(x));
        b.d[r] = h2f(x.d);
        b.m[r] = block_min(x);
      } else {
        _mm256_store_si256(reinterpret_cast<__m256i*>(lv[r]), _mm256_setzero_si256());
        b.d[r] = 0.0f;
        b.m[r] = 0.0f;
      }
    }
    __m512i z[8], out[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) z[r] = load32x2(lv[r], lv[r + 8]);
    transpose16x8_dwords(z, out);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) _mm512_store_si512(b.qs[k], out[k]);
  }
}

/// Q5_0: per vector and block, the 8 lanes' starting values -16 * (sum of the vector's 4 bytes of that lane).
void offsets(const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t nb, int32_t* out) {
  const __m256i k16 = _mm256_set1_epi8(16);
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* y = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), k16, load32(y[i].qs));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 8 * (v * nb + i)),
                         _mm256_sub_epi32(_mm256_setzero_si256(), s));
    }
  }
}

/// 16 packed rows x kV vectors over nb blocks: out[v * ldy + r] for the rows in `mask`.
template <class F, int kV>
void rows16(const PackedLegacyBlock* pb, int64_t nb, const typename F::ActBlock* const* y,
            const int32_t* const* off, float* out, int64_t ldy, __mmask16 mask, const NextGroup& ahead) {
  __m512 acc[kV][8], summs[kV];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    summs[v] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) acc[v][k] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) {
    const PackedLegacyBlock& b = pb[i];
    ahead.at();
    const __m512 xd = _mm512_load_ps(b.d);
    __m512 d[kV];  // x.d * y.d per (row, vector), as the dot kernels form it
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) {
      d[v] = _mm512_mul_ps(xd, _mm512_set1_ps(h2f(y[v][i].d)));
      if constexpr (F::kMin) {
        summs[v] = _mm512_fmadd_ps(_mm512_load_ps(b.m), _mm512_set1_ps(h2f(y[v][i].s)), summs[v]);
      }
    }
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i wk = _mm512_load_si512(b.qs[k]);
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        const __m512i start = F::kOffset ? _mm512_set1_epi32(off[v][8 * i + k]) : _mm512_setzero_si512();
        const __m512i p = dpbusd_bcast(start, wk, y[v][i].qs + 4 * k);
        acc[v][k] = _mm512_fmadd_ps(d[v], _mm512_cvtepi32_ps(p), acc[v][k]);
      }
    }
  }
  // hsum8's tree per lane: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3)), then + summs
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    const __m512 r0 = _mm512_add_ps(acc[v][4], acc[v][0]), r1 = _mm512_add_ps(acc[v][5], acc[v][1]);
    const __m512 r2 = _mm512_add_ps(acc[v][6], acc[v][2]), r3 = _mm512_add_ps(acc[v][7], acc[v][3]);
    const __m512 h = _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3));
    _mm512_mask_storeu_ps(out + v * ldy, mask, F::kMin ? _mm512_add_ps(h, summs[v]) : h);
  }
}

template <class F>
void tile_legacy(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                 int64_t nvec, int64_t n, float* y, int64_t ldy) {
  assert(n % 32 == 0);
  using ActBlock = typename F::ActBlock;
  thread_local AlignedScratch pack_buf, off_buf;
  const int64_t nb = n / 32;
  auto* pb =
      static_cast<PackedLegacyBlock*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedLegacyBlock)));
  int32_t* off = nullptr;
  if constexpr (F::kOffset) {
    off = static_cast<int32_t*>(off_buf.get(static_cast<size_t>(nvec * nb) * 8 * sizeof(int32_t)));
    offsets(acts, act_bytes, nvec, nb, off);
  }
  constexpr int kV = 3;  // 3 x 8 accumulators + 3 scales + the weights (+ 3 summs)
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_rows<F>(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    NextGroup ahead(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nb, nvec, kV);
    const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
    auto run = [&]<int kN>(int64_t first) {
      const ActBlock* yv[kN];
      const int32_t* ov[kN];
      for (int v = 0; v < kN; ++v) {
        yv[v] = reinterpret_cast<const ActBlock*>(acts + static_cast<size_t>(first + v) * act_bytes);
        ov[v] = off == nullptr ? nullptr : off + 8 * (first + v) * nb;
      }
      rows16<F, kN>(pb, nb, yv, ov, y + first * ldy + r0, ldy, mask, ahead);
    };
    int64_t v = 0;
    for (; v + kV <= nvec; v += kV) run.template operator()<kV>(v);
    if (nvec - v == 2) run.template operator()<2>(v);
    if (nvec - v == 1) run.template operator()<1>(v);
  }
}

}  // namespace

void tile_q4_1_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy) {
  tile_legacy<Q4_1>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}
void tile_q5_0_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy) {
  tile_legacy<Q5_0>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}
void tile_q5_1_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy) {
  tile_legacy<Q5_1>(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

}  // namespace car::tensor::detail::avx512

// The AVX-512 VNNI matmul tile for repacked Q2_K (kernel_table.h repacked(); issue #26): llama.cpp's gemm and
// gemv orders (ggml_gemm / ggml_gemv_q2_K_8x8_q8_K, dot_q2_K_q8_K_gemm_ref / _gemv_ref) from exact integer
// sums formed by vpdpbusd, sixteen weight rows per register.
//
// The orders define one exact integer per (row, vector) and 128-element half (gemm) or super-block (gemv) -
// sum of scale * level * q8 - and one for the mins (sum of min * bsum), then FMAs by x.d * y.d and
// x.dmin * y.d in block order, the mins' chain subtracted at the end. As in matmul_q4k_vnni.cpp each int32
// lane of a register is one weight row and the vector's 4 quants of the same elements are broadcast into
// vpdpbusd, so no horizontal reduction is needed and every float step is a lane-wise copy of the
// reference's. Q2_K's levels (0..3) times their 4-bit scales fit a byte (<= 45), so the pack stores the
// products and each vpdpbusd adds 4 finished terms to 16 (row, vector) sums: no multiply after it. The mins
// are int16 pairs by vpdpwssd against the vector's bsums pairs. Each call transposes its chunk's rows, 16 at
// a time, into a per-thread buffer that all the call's vectors share; the file's bytes stay as they are.
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
constexpr int kVectorsPerRun = 4;  // rows16: 4 x 3 integer chains, 4 x 2 float accumulators, 2 weights

/// One super-block of a group of 16 rows, interleaved so that lane r of every register is row r.
/// Invariant: rows past the group's end (the chunk's last, short group) are all zero.
struct PackedQ2Block {
  alignas(64) uint8_t q[64][64];  ///< [k] lane r = row r's scale * level of elements 4k .. 4k + 3
  int32_t mn[8][kRows];           ///< [p] lane r = row r's mins 2p (low int16) and 2p + 1 (high)
  float d[kRows];                 ///< row r's super-block scale
  float dmin[kRows];              ///< row r's min scale
};
static_assert(sizeof(PackedQ2Block) == 64 * 64 + 8 * 64 + 2 * 64);

/// Row x's 256 scale * level products as bytes in element order. Element 128h + 32s + e (chunk b = 4h + s)
/// is bits 2s of qs[32h + e], in sub-block 2b + (e >= 16); a pshufb per 128-bit lane looks the product up.
inline void scaled_levels(const block_q2_K& x, uint8_t* out) {
  const __m256i m3 = _mm256_set1_epi8(3);
  auto table = [](uint8_t sc) { return static_cast<int32_t>((sc << 8) | (2 * sc << 16) | (3u * sc << 24)); };
#pragma GCC unroll 8
  for (int b = 0; b < 8; ++b) {
    const __m256i lv = _mm256_and_si256(_mm256_srli_epi16(load32(x.qs + 32 * (b / 4)), 2 * (b % 4)), m3);
    const __m256i t =
        _mm256_setr_epi32(table(x.scales[2 * b] & 0x0f), 0, 0, 0, table(x.scales[2 * b + 1] & 0x0f), 0, 0, 0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out + 32 * b), _mm256_shuffle_epi8(t, lv));
  }
}

/// Pack rows [0, nrows) (nrows <= 16) of nb super-blocks into pb[0, nb).
void pack_rows(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedQ2Block* pb) {
  alignas(64) uint8_t lv[kRows][256];
  for (int r = nrows; r < kRows; ++r) std::memset(lv[r], 0, sizeof lv[r]);
  for (int64_t i = 0; i < nb; ++i) {
    PackedQ2Block& b = pb[i];
    for (int r = 0; r < kRows; ++r) {
      if (r < nrows) {
        const auto& x = reinterpret_cast<const block_q2_K*>(w + static_cast<size_t>(r) * row_bytes)[i];
        scaled_levels(x, lv[r]);
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
    for (int s = 0; s < 8; ++s) {  // dwords 8s .. 8s + 7 of the 16 rows
      __m512i z[8], out[8];
#pragma GCC unroll 8
      for (int r = 0; r < 8; ++r) z[r] = load32x2(lv[r] + 32 * s, lv[r + 8] + 32 * s);
      transpose16x8_dwords(z, out);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) _mm512_store_si512(b.q[8 * s + k], out[k]);
    }
  }
}

/// acc + vpdpwssd(w, the int16 pair at p broadcast to every lane).
inline __m512i dpwssd_bcast(__m512i acc, __m512i w, const int16_t* p) {
  using dword = int32_t __attribute__((may_alias, aligned(2)));
  __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const dword*>(p)));
  return acc;
}

/// 16 packed rows x kV vectors over nb super-blocks; out[v * ldy + r] for the rows in `mask`.
template <int kV, bool kGemm>
void rows16(const PackedQ2Block* pb, int64_t nb, const block_q8_K* const* y, float* out, int64_t ldy,
            __mmask16 mask, const NextGroup& ahead) {
  __m512 acc[kV], acc_m[kV];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) acc[v] = acc_m[v] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PackedQ2Block& b = pb[i];
    ahead.at();
    const __m512 xd = _mm512_load_ps(b.d), xdmin = _mm512_load_ps(b.dmin);
    // integer chains: the half's sums (gemm) or the block's (gemv: not reset between the halves)
    __m512i s0[kV], s1[kV], m[kV];
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) s0[v] = s1[v] = m[v] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      if (kGemm && h == 1) {
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) s0[v] = s1[v] = m[v] = _mm512_setzero_si512();
      }
#pragma GCC unroll 16
      for (int k = 0; k < 32; k += 2) {
        const __m512i w0 = _mm512_load_si512(b.q[32 * h + k]), w1 = _mm512_load_si512(b.q[32 * h + k + 1]);
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) {
          s0[v] = dpbusd_bcast(s0[v], w0, y[v][i].qs + 128 * h + 4 * k);
          s1[v] = dpbusd_bcast(s1[v], w1, y[v][i].qs + 128 * h + 4 * k + 4);
        }
      }
#pragma GCC unroll 4
      for (int p = 4 * h; p < 4 * h + 4; ++p) {
        const __m512i mn = _mm512_load_si512(b.mn[p]);
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) m[v] = dpwssd_bcast(m[v], mn, y[v][i].bsums + 2 * p);
      }
      if (kGemm || h == 1) {
#pragma GCC unroll 8
        for (int v = 0; v < kV; ++v) {
          const __m512 yd = _mm512_set1_ps(y[v][i].d);
          const __m512i sum = _mm512_add_epi32(s0[v], s1[v]);
          acc[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(xd, yd), acc[v]);
          acc_m[v] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m[v]), _mm512_mul_ps(xdmin, yd), acc_m[v]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) _mm512_mask_storeu_ps(out + v * ldy, mask, _mm512_sub_ps(acc[v], acc_m[v]));
}

/// Vectors [v0, v1) in one order against one packed group of rows, four at a time.
template <bool kGemm>
void run_vectors(const PackedQ2Block* pb, int64_t nb, const uint8_t* acts, size_t act_bytes, int64_t v0,
                 int64_t v1, float* y, int64_t ldy, __mmask16 mask, NextGroup& ahead) {
  constexpr int kV = kVectorsPerRun;
  auto run = [&]<int kN>(int64_t first) {
    const block_q8_K* yv[kN];
    for (int v = 0; v < kN; ++v) {
      yv[v] = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(first + v) * act_bytes);
    }
    rows16<kN, kGemm>(pb, nb, yv, y + first * ldy, ldy, mask, ahead);
  };
  int64_t v = v0;
  for (; v + kV <= v1; v += kV) run.template operator()<kV>(v);
  switch (v1 - v) {
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

}  // namespace

void tile_q2_K_repacked_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                             size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                             const uint8_t* gemm) {
  assert(n % QK_K == 0);
  thread_local AlignedScratch pack_buf;
  const int64_t nb = n / QK_K;
  auto* pb = static_cast<PackedQ2Block*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedQ2Block)));
  auto gemm_at = [&](int64_t v) { return gemm != nullptr && gemm[v] != 0; };
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_rows(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    NextGroup ahead(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nb, nvec, kVectorsPerRun);
    const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
    // one transpose of the rows serves every run of vectors in the same order
    for (int64_t v0 = 0; v0 < nvec;) {
      const bool g = gemm_at(v0);
      int64_t v1 = v0 + 1;
      while (v1 < nvec && gemm_at(v1) == g) ++v1;
      if (g) {
        run_vectors<true>(pb, nb, acts, act_bytes, v0, v1, y + r0, ldy, mask, ahead);
      } else {
        run_vectors<false>(pb, nb, acts, act_bytes, v0, v1, y + r0, ldy, mask, ahead);
      }
      v0 = v1;
    }
  }
}

}  // namespace car::tensor::detail::avx512

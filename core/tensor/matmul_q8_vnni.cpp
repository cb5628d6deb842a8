// The AVX-512 VNNI matmul tile for Q8_0 (DotKernels::tile; issue #26): sixteen weight rows per register, one
// vpdpbusd per 4 elements of 16 (row, vector) pairs, each result bit-equal to dot_q8_0 (dot_avx512.cpp).
//
// The order it must keep (ggml's ggml_vec_dot_q8_0_q8_0 / llamafile's tinyBLAS_Q0_AVX, which dot_q8_0
// mirrors): per block of 32, eight exact int32 lanes (lane l: elements 4l..4l+3), acc[l] = fma(x.d * y.d,
// float(lane l), acc[l]), and at the end hsum8's tree over the 8 accumulators. The per-lane integers may be
// formed any way, so as in matmul_q4k_vnni.cpp each int32 lane of a register is one weight row and the
// vector's 4 bytes of lane l are broadcast into vpdpbusd: register k of a packed block holds dword k of 16
// rows, and one instruction yields lane k's integer for 16 (row, vector) pairs. The float steps are then
// lane-wise copies of dot_q8_0's, with the 8 accumulators of a pair in 8 registers (same lane) instead of 8
// lanes of one; hsum8's tree becomes vertical adds in the same pairing.
//
// vpdpbusd multiplies unsigned by signed bytes and Q8_0 weights are signed: the packed weights are w + 128
// (bytes XOR 0x80) and each lane starts from -128 * (the vector's sum of those 4 bytes), so the integer is
// exactly sum(w * y) (|sum| <= 4 * 255 * 128: no overflow anywhere). The starting values are computed once
// per call for every vector and block (8 dwords per block).
//
// Cost model: per 4 elements x 16 rows x 1 vector, one vpdpbusd, one conversion and one FMA (the broadcasts
// are loads). The existing tile (matmul_avx512.cpp q8_0_tile) spent a sign fix-up and a permute more per
// product and horizontal sums per row (~2x slower at 128 vectors, equal at 4); it serves calls of 1-3
// vectors.
#include <algorithm>
#include <cassert>
#include <cstdint>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/simd_avx512.h"
#include "core/tensor/vnni_pack_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

constexpr int kRows = 16;           // weight rows per packed group: one int32 / float lane each
constexpr int64_t kMinVectors = 4;  // fewer (only direct calls: matmul tiles 4 and more): the per-vector tile

/// One Q8_0 block of a group of 16 rows, interleaved so that lane r of every register is row r.
/// Invariant: rows past the group's end (the chunk's last, short group) have d == 0 and qs 0 (+128).
struct PackedQ8Block {
  alignas(64) uint8_t qs[8][64];  ///< [k] lane r = row r's qs[4k .. 4k + 3] + 128 (unsigned)
  float d[kRows];                 ///< row r's block scale
};
static_assert(sizeof(PackedQ8Block) == 9 * 64);

/// Pack rows [0, nrows) (nrows <= 16) of nb blocks into pb[0, nb).
void pack_rows(const uint8_t* w, size_t row_bytes, int nrows, int64_t nb, PackedQ8Block* pb) {
  alignas(64) static constexpr block_q8_0 kZero{};
  auto block = [&](int r, int64_t i) -> const block_q8_0& {
    return r < nrows ? reinterpret_cast<const block_q8_0*>(w + static_cast<size_t>(r) * row_bytes)[i] : kZero;
  };
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t i = 0; i < nb; ++i) {
    PackedQ8Block& b = pb[i];
    __m512i z[8], out[8];
#pragma GCC unroll 8
    for (int r = 0; r < 8; ++r) z[r] = load32x2(block(r, i).qs, block(r + 8, i).qs);
    transpose16x8_dwords(z, out);
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) _mm512_store_si512(b.qs[k], _mm512_xor_si512(out[k], bias));
    for (int r = 0; r < kRows; ++r) b.d[r] = h2f(block(r, i).d);
  }
}

/// Per vector and block, the 8 lanes' starting values -128 * (sum of the vector's 4 bytes of that lane).
void offsets(const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t nb, int32_t* out) {
  const __m256i k128 = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* y = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      const __m256i s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), k128, load32(y[i].qs));
      _mm256_store_si256(reinterpret_cast<__m256i*>(out + 8 * (v * nb + i)),
                         _mm256_sub_epi32(_mm256_setzero_si256(), s));
    }
  }
}

/// 16 packed rows x kV vectors over nb blocks: out[v * ldy + r] for the rows in `mask`.
template <int kV>
void rows16(const PackedQ8Block* pb, int64_t nb, const block_q8_0* const* y, const int32_t* const* off,
            float* out, int64_t ldy, __mmask16 mask, const NextGroup& ahead) {
  __m512 acc[kV][8];
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) acc[v][k] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < nb; ++i) {
    const PackedQ8Block& b = pb[i];
    ahead.at();
    const __m512 xd = _mm512_load_ps(b.d);
    __m512 d[kV];  // x.d * y.d per (row, vector), as dot_q8_0 forms it
#pragma GCC unroll 8
    for (int v = 0; v < kV; ++v) d[v] = _mm512_mul_ps(xd, _mm512_set1_ps(h2f(y[v][i].d)));
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i wk = _mm512_load_si512(b.qs[k]);
#pragma GCC unroll 8
      for (int v = 0; v < kV; ++v) {
        const __m512i p = dpbusd_bcast(_mm512_set1_epi32(off[v][8 * i + k]), wk, y[v][i].qs + 4 * k);
        acc[v][k] = _mm512_fmadd_ps(d[v], _mm512_cvtepi32_ps(p), acc[v][k]);
      }
    }
  }
  // hsum8's tree per lane: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))
#pragma GCC unroll 8
  for (int v = 0; v < kV; ++v) {
    const __m512 r0 = _mm512_add_ps(acc[v][4], acc[v][0]), r1 = _mm512_add_ps(acc[v][5], acc[v][1]);
    const __m512 r2 = _mm512_add_ps(acc[v][6], acc[v][2]), r3 = _mm512_add_ps(acc[v][7], acc[v][3]);
    _mm512_mask_storeu_ps(out + v * ldy, mask, _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3)));
  }
}

}  // namespace

void tile_q8_0_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy) {
  assert(n % QK8_0 == 0);
  if (nvec < kMinVectors) {
    tile_q8_0(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
    return;
  }
  thread_local AlignedScratch pack_buf, off_buf;
  const int64_t nb = n / QK8_0;
  auto* pb = static_cast<PackedQ8Block*>(pack_buf.get(static_cast<size_t>(nb) * sizeof(PackedQ8Block)));
  auto* off = static_cast<int32_t*>(off_buf.get(static_cast<size_t>(nvec * nb) * 8 * sizeof(int32_t)));
  offsets(acts, act_bytes, nvec, nb, off);
  constexpr int kV = 3;  // 3 x 8 accumulators + 3 scales + the weights: 29 of the 32 registers
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kRows, nrows - r0));
    pack_rows(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nr, nb, pb);
    NextGroup ahead(w + static_cast<size_t>(r0) * row_bytes, row_bytes, nb, nvec, kV);
    const __mmask16 mask = static_cast<__mmask16>((1u << nr) - 1);
    auto run = [&]<int kN>(int64_t first) {
      const block_q8_0* yv[kN];
      const int32_t* ov[kN];
      for (int v = 0; v < kN; ++v) {
        yv[v] = reinterpret_cast<const block_q8_0*>(acts + static_cast<size_t>(first + v) * act_bytes);
        ov[v] = off + 8 * (first + v) * nb;
      }
      rows16<kN>(pb, nb, yv, ov, y + first * ldy + r0, ldy, mask, ahead);
    };
    int64_t v = 0;
    for (; v + kV <= nvec; v += kV) run.template operator()<kV>(v);
    if (nvec - v == 2) run.template operator()<2>(v);
    if (nvec - v == 1) run.template operator()<1>(v);
  }
}

}  // namespace car::tensor::detail::avx512

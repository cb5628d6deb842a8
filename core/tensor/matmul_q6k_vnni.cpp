// The AVX-512 products of Q6_K matrices held interleaved (MatrixView::interleaved; the layout and its
// rationale: q6k_interleaved.h; issue #25): the layout's writer, and the one-vector, few-vector and tile
// kernels, each result bit-equal to dot_q6_K (dot_q6_K_q8_K_x86_ref's order).
//
// Per group of 16 rows, super-block and vector: lane l's exact integer of all 16 rows starts as the -32
// offset (32 x scale pairs (2l, 2l + 1) by vpdpwssd against the vector's negated bsum pairs) and gains, per
// chunk c, vpdpwssd(vpmaddubsw(levels of (c, l), the vector's 4 quants broadcast), scale 2c + l / 4 paired):
// the same integer as the dot kernel's lane l (every step is exact: a level pair times quants is at most 2 x
// 63 x 128 in magnitude, no vpmaddubsw saturation; the lane stays far inside int32). Then acc[l] = fma(y.d *
// d, float(lane), acc[l]) lane-wise and hsum8's tree across the 8 accumulators: the dot kernel's float steps
// per row.
//
// Cost per 16 rows x 256 elements: ~190 instructions of unpacking (levels, scales) shared by the call's
// vectors, then per vector 64 vpmaddubsw + 72 vpdpwssd and ~20 more; the file layout's one-row kernel spends
// ~46 per row and vector there (~740 for 16 rows).
#include <algorithm>
#include <cassert>
#include <cstdint>

#include "core/tensor/aligned_scratch.h"
#include "core/tensor/q6k_interleaved.h"
#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

using q6k::kBlockBytes;
using q6k::kDOffset;
using q6k::kRows;
using q6k::kScaleOffset;
using q6k::level_offset;

/// vpshufb indices that copy the low (kHi false) or high int16 of every dword into both its halves.
struct DupWords {
  alignas(64) uint8_t idx[64];
};
constexpr DupWords make_dup(bool hi) {
  DupWords d{};
  for (int i = 0; i < 64; ++i) {
    const int dword = (i % 16) / 4;  // within the 128-bit lane
    d.idx[i] = static_cast<uint8_t>(4 * dword + (hi ? 2 : 0) + (i % 2));
  }
  return d;
}
constexpr DupWords kDupLo = make_dup(false), kDupHi = make_dup(true);

/// Per vector and super-block, the bsum pairs (-bsums[2l], -bsums[2l + 1]) as int16 pairs, l = 0..7 (|bsum|
/// <= 16 x 128: every negation fits), for this thread's call.
const int32_t* neg_bsum_pairs(const uint8_t* acts, size_t act_bytes, int64_t nvec, int64_t nb) {
  thread_local AlignedScratch buf;
  auto* out = static_cast<int32_t*>(buf.get(static_cast<size_t>(nvec * nb) * 8 * sizeof(int32_t)));
  for (int64_t v = 0; v < nvec; ++v) {
    const auto* y = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    for (int64_t i = 0; i < nb; ++i) {
      int32_t* o = out + (v * nb + i) * 8;
      for (int l = 0; l < 8; ++l) {
        const auto lo = static_cast<uint16_t>(static_cast<int16_t>(-y[i].bsums[2 * l]));
        const auto hi = static_cast<uint16_t>(static_cast<int16_t>(-y[i].bsums[2 * l + 1]));
        o[l] = static_cast<int32_t>(static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16));
      }
    }
  }
  return out;
}

/// How far ahead the kernels prefetch their group's stream, a seventh of a super-block's lines per lane
/// (MatvecVsStream Q6_K_interleaved, 256 MiB, 2 threads, 2026-12-07: all 53 lines at once at the
/// super-block's start held one vector at 0.84 of the read and 2-3 at 0.57-0.68, below the hardware
/// prefetcher alone). One vector: 4096 bytes (t1 and t2 1.00 of the read; 8192: 0.84-0.88; 16384: 0.73).
/// More: 12288 (2-3 vectors at 0.89-0.99, 8192 and 16384 alike; 4096: 0.81-0.85).
template <int kV>
constexpr int64_t kAhead = kV == 1 ? 4096 : 12288;

/// kV vectors against one interleaved group of 16 rows (x: its first super-block) over nb super-blocks:
/// out[v * ldy + r] for the 16 rows. np[v]: vector v's negated bsum pairs (8 per super-block).
template <int kV>
inline void group_q6_K(const uint8_t* x, int64_t nb, const block_q8_K* const* y, const int32_t* const* np,
                       float* out, int64_t ldy) {
  const __m512i m3f = _mm512_set1_epi8(0x3f), m03 = _mm512_set1_epi8(0x03), m0f = _mm512_set1_epi8(0x0f),
                m30 = _mm512_set1_epi8(0x30);
  const __m512i dup[2] = {_mm512_load_si512(kDupLo.idx), _mm512_load_si512(kDupHi.idx)};
  alignas(64) float acc[kV][8][kRows];
  for (int v = 0; v < kV; ++v) {
    for (int l = 0; l < 8; ++l) _mm512_store_ps(acc[v][l], _mm512_setzero_ps());
  }
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = x + static_cast<size_t>(i) * kBlockBytes;
    const __m512 xd = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kDOffset)));
    __m512 d[kV];  // y.d * x.d per (row, vector), as the dot kernel forms it
    for (int v = 0; v < kV; ++v) d[v] = _mm512_mul_ps(_mm512_set1_ps(y[v][i].d), xd);
#pragma GCC unroll 1
    for (int par = 0; par < 2; ++par) {
      // the scales of lanes 4par .. 4par + 3: sub-block 2c + par for chunk c, paired in every dword
      __m512i s[8];
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        s[c] = _mm512_shuffle_epi8(_mm512_cvtepi8_epi16(_mm256_loadu_si256(
                                       reinterpret_cast<const __m256i*>(b + kScaleOffset + 32 * c))),
                                   dup[par]);
      }
#pragma GCC unroll 1
      for (int l = 4 * par; l < 4 * par + 4; ++l) {
        {  // the block kAhead bytes on, a seventh of its lines per lane
          const char* ahead = reinterpret_cast<const char*>(b) + kAhead<kV> + 7 * 64 * l;
#pragma GCC unroll 7
          for (int k = 0; k < 7; ++k) _mm_prefetch(ahead + 64 * k, kWeightStreamHint);
        }
        __m512i q[8];  // (chunk c, lane l): 16 rows x 4 levels
#pragma GCC unroll 2
        for (int u = 0; u < 2; ++u) {
          const __m512i r0 = _mm512_loadu_si512(b + level_offset(l, u, 0));
          const __m512i r1 = _mm512_loadu_si512(b + level_offset(l, u, 1));
          const __m512i r2 = _mm512_loadu_si512(b + level_offset(l, u, 2));
          q[4 * u] = _mm512_and_si512(r0, m3f);
          q[4 * u + 1] = _mm512_and_si512(r1, m3f);
          q[4 * u + 2] = _mm512_and_si512(r2, m3f);
          // chunk 4u + 3: bits 6, 7 of r0, r1, r2 to bits 0-1, 2-3, 4-5 (16-bit shifts: each wanted bit pair
          // stays in its byte; the masks drop what crosses)
          const __m512i t = _mm512_ternarylogic_epi32(_mm512_srli_epi16(r0, 6), _mm512_srli_epi16(r1, 4), m03,
                                                      0xe4);  // c ? a : b
          q[4 * u + 3] = _mm512_ternarylogic_epi32(t, _mm512_and_si512(_mm512_srli_epi16(r2, 2), m30), m0f,
                                                   0xec);  // (a & c) | b
        }
        // 32 x the scale pairs (2l, 2l + 1): the offset's operand (|32 x scale| <= 4096)
        const __m512i off = _mm512_slli_epi16(
            _mm512_cvtepi8_epi16(
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + kScaleOffset + 32 * l))),
            5);
#pragma GCC unroll 4
        for (int v = 0; v < kV; ++v) {
          const int8_t* q8 = y[v][i].qs + 4 * l;
          // two chains (even and odd chunks) so one vector's sums do not wait on each other's latency
          __m512i sum[2] = {
              _mm512_dpwssd_epi32(_mm512_setzero_si512(), off, _mm512_set1_epi32(np[v][8 * i + l])),
              _mm512_setzero_si512()};
#pragma GCC unroll 8
          for (int c = 0; c < 8; ++c) {
            int32_t y4;
            __builtin_memcpy(&y4, q8 + 32 * c, 4);
            sum[c & 1] =
                _mm512_dpwssd_epi32(sum[c & 1], _mm512_maddubs_epi16(q[c], _mm512_set1_epi32(y4)), s[c]);
          }
          const __m512 lane = _mm512_cvtepi32_ps(_mm512_add_epi32(sum[0], sum[1]));
          _mm512_store_ps(acc[v][l], _mm512_fmadd_ps(d[v], lane, _mm512_load_ps(acc[v][l])));
        }
      }
    }
  }
  // hsum8's tree per lane: ((a4 + a0) + (a6 + a2)) + ((a5 + a1) + (a7 + a3))
  for (int v = 0; v < kV; ++v) {
    const auto a = [&](int l) { return _mm512_load_ps(acc[v][l]); };
    const __m512 r0 = _mm512_add_ps(a(4), a(0)), r1 = _mm512_add_ps(a(5), a(1));
    const __m512 r2 = _mm512_add_ps(a(6), a(2)), r3 = _mm512_add_ps(a(7), a(3));
    _mm512_storeu_ps(out + v * ldy, _mm512_add_ps(_mm512_add_ps(r0, r2), _mm512_add_ps(r1, r3)));
  }
}

/// kV vectors (acts + v * act_bytes) over interleaved rows [0, nrows) (whole groups).
template <int kV>
void rows_interleaved(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                      size_t act_bytes, int64_t n, float* y, int64_t ldy, const int32_t* np_all) {
  const int64_t nb = n / QK_K;
  const block_q8_K* yv[kV];
  const int32_t* np[kV];
  for (int v = 0; v < kV; ++v) {
    yv[v] = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(v) * act_bytes);
    np[v] = np_all + 8 * v * nb;
  }
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    group_q6_K<kV>(w + static_cast<size_t>(r0) * row_bytes, nb, yv, np, y + r0, ldy);
  }
}

/// Vectors [0, nvec) in passes of up to 4 (every result the same bits whatever the pass).
void rows_interleaved_many(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                           size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK_K;
  const int32_t* np = neg_bsum_pairs(acts, act_bytes, nvec, nb);
  int64_t v = 0;
  for (; v + 4 <= nvec; v += 4) {
    rows_interleaved<4>(w, row_bytes, nrows, acts + static_cast<size_t>(v) * act_bytes, act_bytes, n,
                        y + v * ldy, ldy, np + 8 * v * nb);
  }
  const auto tail = [&]<int kV>() {
    rows_interleaved<kV>(w, row_bytes, nrows, acts + static_cast<size_t>(v) * act_bytes, act_bytes, n,
                         y + v * ldy, ldy, np + 8 * v * nb);
  };
  switch (nvec - v) {
    case 3:
      tail.template operator()<3>();
      break;
    case 2:
      tail.template operator()<2>();
      break;
    case 1:
      tail.template operator()<1>();
      break;
    default:
      break;
  }
}

}  // namespace

void interleave_q6_K(const uint8_t* w, size_t row_bytes, int64_t nrows, int64_t n, uint8_t* dst) {
  assert(nrows % kRows == 0 && n % QK_K == 0 &&
         row_bytes == static_cast<size_t>(n / QK_K) * sizeof(block_q6_K));
  const int64_t nb = n / QK_K;
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const uint8_t* src = w + static_cast<size_t>(r0) * row_bytes;
    uint8_t* out = dst + static_cast<size_t>(r0) * row_bytes;
    for (int64_t i = 0; i < nb; ++i) {
      q6k::write_block(
          [&](int r) -> const block_q6_K& {
            return reinterpret_cast<const block_q6_K*>(src + static_cast<size_t>(r) * row_bytes)[i];
          },
          out + static_cast<size_t>(i) * kBlockBytes);
    }
  }
}

void rows_q6_K_interleaved(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n,
                           float* y) {
  assert(nrows % kRows == 0 && n % QK_K == 0);
  const auto* a = static_cast<const uint8_t*>(act);
  rows_interleaved<1>(w, row_bytes, nrows, a, 0, n, y, 0, neg_bsum_pairs(a, 0, 1, n / QK_K));
}

void rows_q6_K_interleaved_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                               size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy) {
  assert(nrows % kRows == 0 && n % QK_K == 0);
  rows_interleaved_many(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

void tile_q6_K_interleaved(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                           size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                           const uint8_t* /*gemm: one order*/) {
  assert(nrows % kRows == 0 && n % QK_K == 0);
  rows_interleaved_many(w, row_bytes, nrows, acts, act_bytes, nvec, n, y, ldy);
}

}  // namespace car::tensor::detail::avx512

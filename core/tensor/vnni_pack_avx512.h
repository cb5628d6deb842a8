// Internal to core/tensor's AVX-512 VNNI tile files (matmul_*_vnni.cpp): the pieces of
// the lane-per-row layout they share. Those tiles put one weight row in each int32 lane of a register and
// broadcast one vector's 4 activation bytes into vpdpbusd, so each instruction adds 4 products to 16 (row,
// vector) sums with no horizontal reduction; the rows must first be transposed 16 at a time (dword k of 16
// rows -> one register). Include it only from files compiled with car_simd_source(... AVX512).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail::avx512 {
namespace {

/// Transpose the 8 dwords (32 bytes) of 16 rows into 8 registers, lane r of out[k] = row r's dword k.
/// z[r] holds row r in its low 256 bits and row r + 8 in its high 256 bits.
inline void transpose16x8_dwords(const __m512i* z, __m512i* out) {
  __m512i t[8], u[8];
#pragma GCC unroll 4
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm512_unpacklo_epi32(z[2 * p], z[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_epi32(z[2 * p], z[2 * p + 1]);
  }
  // u[q]: 128-bit lanes [dword q of rows 0-3, dword q + 4 of rows 0-3, the same of rows 8-11] (u[q + 4]: rows
  // 4-7 and 12-15)
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    __m512i* uh = u + 4 * h;
    const __m512i* th = t + 4 * h;
    uh[0] = _mm512_unpacklo_epi64(th[0], th[2]);
    uh[1] = _mm512_unpackhi_epi64(th[0], th[2]);
    uh[2] = _mm512_unpacklo_epi64(th[1], th[3]);
    uh[3] = _mm512_unpackhi_epi64(th[1], th[3]);
  }
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    out[q] = _mm512_permutex2var_epi64(u[q], lo, u[q + 4]);
    out[q + 4] = _mm512_permutex2var_epi64(u[q], hi, u[q + 4]);
  }
}

/// In each 128-bit lane l, the 4 x 4 dword transposition of the four registers: dword k of out[j]'s lane l is
/// dword j of z[k]'s lane l.
inline void transpose4x4_dwords_per_lane(const __m512i* z, __m512i* out) {
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}

/// The 16 rows of a packed group are 16 strided streams, too many for the hardware prefetcher; the next
/// group's rows are one contiguous range, fetched while this group's vectors run, spread evenly over the
/// group's runs of vectors (rows16 calls) and their blocks. Fetched in bursts during the pack, or all in the
/// first run, the prefetches waited on the core's outstanding misses; into L1 (_MM_HINT_T0) they evicted the
/// group's own data; into L2 (_MM_HINT_T1) batched decode of dense-1b Q4_K_M at 8 sequences ran 4-5 % slower
/// than with kWeightStreamHint's non-temporal fetch, prompts alike (docs/performance.md). Usage: one per
/// group, at() in each run's block loop, in order; decode's one-vector kernels use it with one run of
/// one vector. Each call takes the next ceil(lines / (runs x nb)) lines from a running cursor (the even share
/// per block cost two 64-bit divisions a call). The prefetches themselves cost an 8-vector Q4_K run ~9 % when
/// its rows are already in cache, and from memory it takes nearly twice as long without them (bench_kernels
/// FewVectors and MatvecVsStream .../t2/v8 with and without them, issue #25).
class NextGroup {
 public:
  /// The 16 rows after the group at `group`: past the call's last row they are usually the next chunk's
  /// (products call the tiles on consecutive chunks), and a prefetch never faults, even past the matrix.
  /// `nvec` vectors in runs of `vectors_per_run`, each run over `nb` blocks.
  NextGroup(const uint8_t* group, size_t row_bytes, int64_t nb, int64_t nvec, int vectors_per_run)
      : next_(reinterpret_cast<const char*>(group + 16 * row_bytes)),
        lines_(static_cast<int64_t>((16 * row_bytes + 63) / 64)) {
    const int64_t parts = (nvec + vectors_per_run - 1) / vectors_per_run * nb;
    per_ = (lines_ + parts - 1) / parts;
  }
  /// The lines that go with the next block of a run: none once every line is on its way (the runs' blocks
  /// take ceil(lines / parts) each, so every line is fetched by the end of the last run).
  void at() const {
    const int64_t end = std::min(done_ + per_, lines_);
    for (int64_t l = done_; l < end; ++l) _mm_prefetch(next_ + 64 * l, kWeightStreamHint);
    done_ = end;
  }

 private:
  const char* next_;
  int64_t lines_;
  int64_t per_;               ///< lines a block
  mutable int64_t done_ = 0;  ///< lines fetched so far
};

}  // namespace
}  // namespace car::tensor::detail::avx512

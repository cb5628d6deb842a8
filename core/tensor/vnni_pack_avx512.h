// Internal to core/tensor's AVX-512 VNNI tile files (matmul_q4k_vnni.cpp, matmul_q8_vnni.cpp): the pieces of
// the lane-per-row layout they share. Those tiles put one weight row in each int32 lane of a register and
// broadcast one vector's 4 activation bytes into vpdpbusd, so each instruction adds 4 products to 16 (row,
// vector) sums with no horizontal reduction; the rows must first be transposed 16 at a time (dword k of 16
// rows -> one register). Include it only from files compiled with car_simd_source(... AVX512).
#pragma once

#include <immintrin.h>

#include <cstdint>

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

/// acc + vpdpbusd(w, 4 bytes at p broadcast to every lane): w's bytes unsigned, p's signed. The broadcast is
/// folded into the instruction (GCC 12 loads it into a register first: one more instruction per product).
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* p) {
  using dword = int32_t __attribute__((may_alias, aligned(1)));
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const dword*>(p)));
  return acc;
}

}  // namespace
}  // namespace car::tensor::detail::avx512

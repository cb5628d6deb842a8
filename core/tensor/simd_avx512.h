// Internal to core/tensor's AVX-512 kernel files - dot_avx512.cpp (dot kernels and the table),
// matvec_avx512.cpp (multi-row kernels for y = W x) and matmul_avx512.cpp (tile kernels for prompt batches),
// each compiled with car_simd_source(... AVX512) and only called when CPUID reports AVX-512 F/BW/VL/DQ/VNNI/
// BF16: the AVX-512 helpers they share (the AVX2-level ones come from simd_x86.h, shared with the AVX2 files),
// the K-quant scale permutations, and where they meet. Include it from those files only: its inline functions
// are AVX-512 code.
#pragma once

#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers build masked builtins from _mm512_undefined_*() values, which -Wall
// reports as uninitialized at every inlined call site (a known false positive of those headers).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>

#include "core/tensor/blocks.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_x86.h"

namespace car::tensor::detail::avx512 {

inline __m512i load64(const void* p) {
  return _mm512_loadu_si512(p);
}
/// Two 32-byte loads side by side in one register.
inline __m512i load32x2(const void* lo, const void* hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load32(lo)), load32(hi), 1);
}

/// int32 lanes += sum of 4 adjacent s8 x s8 products (the sign moved onto y so dpbusd's u8 operand is |x|).
inline __m256i dpbssd_via_sign(__m256i acc, __m256i x, __m256i y) {
  return _mm256_dpbusd_epi32(acc, _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/// vpermw indices: from int16 scales in lanes 0..7, lanes [0,16) get scale a and [16,32) scale b.
struct Perm2 {
  alignas(64) int16_t idx[32];
};
constexpr Perm2 make_perm2(int a, int b) {
  Perm2 p{};
  for (int i = 0; i < 32; ++i) p.idx[i] = static_cast<int16_t>(i < 16 ? a : b);
  return p;
}
/// Four scales, each over 8 int16 lanes (16-element sub-blocks), from int16 scales in lanes 0..15.
constexpr Perm2 make_perm4(int first) {
  Perm2 p{};
  for (int i = 0; i < 32; ++i) p.idx[i] = static_cast<int16_t>(first + i / 8);
  return p;
}
// Q4_K / Q5_K: register jj (0, 1) covers sub-blocks {4jj, 4jj+2} (low nibbles) and {4jj+1, 4jj+3} (high).
inline constexpr Perm2 kK4Perm[2][2] = {{make_perm2(0, 2), make_perm2(1, 3)},
                                        {make_perm2(4, 6), make_perm2(5, 7)}};
// Q6_K: half h, part p covers scales 8h + 4p .. 8h + 4p + 3.
inline constexpr Perm2 kK6Perm[2][2] = {{make_perm4(0), make_perm4(4)}, {make_perm4(8), make_perm4(12)}};

inline __m512i perm_idx(const Perm2& p) {
  return _mm512_load_si512(p.idx);
}

/// 16 int32 lanes -> 8: lane k + lane k+8. Each half of the 512-bit sums holds whole 32-byte chunks, so this
/// yields exactly the 8 lanes ggml's AVX2 kernels accumulate (lane k: bytes 4k..4k+3 of every chunk).
inline __m256i fold16(__m512i v) {
  return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/// dot(Q8_0 row, Q8_0 activations) in llama.cpp's order (dot_avx512.cpp); the multi-row kernel's odd row.
float dot_q8_0(const void* w, const void* a, int64_t n);

/// Set the multi-row matvec kernels (matvec_avx512.cpp) / the matmul tile kernels (matmul_avx512.cpp) in `k`.
void add_matvec_kernels(DotKernels& k);
void add_matmul_kernels(DotKernels& k);

}  // namespace car::tensor::detail::avx512

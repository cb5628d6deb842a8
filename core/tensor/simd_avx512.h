// Internal to core/tensor's AVX-512 kernel files - dot_avx512.cpp (dot kernels and the table),
// matvec_avx512.cpp (multi-row kernels for y = W x) and matmul_avx512.cpp (tile kernels for prompt batches),
// each compiled with car_simd_source(... AVX512) and only called when CPUID reports AVX-512 F/BW/VL/DQ/VNNI/
// BF16: the AVX-512 helpers they share (the AVX2-level ones come from simd_x86.h, shared with the AVX2
// files), the K-quant scale permutations, and where they meet. Include it from those files only: its inline
// functions are AVX-512 code.
#pragma once

#include <immintrin.h>

// GCC 12's AVX-512 intrinsic headers build masked builtins from _mm512_undefined_*() values, which -Wall
// reports as uninitialized at every inlined call site (a known false positive of those headers).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <cstdint>
#include <type_traits>

#include "core/tensor/blocks.h"
#include "core/tensor/k_scales.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_x86.h"

namespace car::tensor::detail::avx512 {

/// The cache hint of the one-vector (decode) kernels' weight prefetches. They read each weight line once, as
/// it arrives, and never again in the call: a non-temporal prefetch brings the line close without pushing
/// the activations and the next lines out, and streamed the 1 GiB Q4_K matvec at 0.82-0.85 of the
/// same-breath read where _MM_HINT_T0 reached 0.75-0.80 (no prefetch at all 0.73-0.81; issue #29,
/// docs/performance.md "Non-temporal weight prefetches").
constexpr auto kWeightStreamHint = _MM_HINT_NTA;

inline __m512i load64(const void* p) {
  return _mm512_loadu_si512(p);
}
/// acc + vpdpbusd(w, 4 bytes at p broadcast to every lane), the broadcast folded into the instruction (GCC 12
/// loads it into a register first: one more instruction per product).
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* p) {
  using dword = int32_t __attribute__((may_alias, aligned(1)));
  __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const dword*>(p)));
  return acc;
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

/// The most vectors one pass of a few-vector kernel takes (vector_passes).
constexpr int kMaxVectorPass = 3;

/// The few-vector kernels' split of vectors [0, nvec) into passes of up to kMaxVectorPass, 4 as 2 + 2 (a pass
/// of 3 then 1 would run the one-vector body once more): fn(std::integral_constant<int, V>, the pass's first
/// vector) for each pass in order. Which pass a vector falls in changes no result: each kernel's vectors are
/// independent.
template <class Fn>
[[gnu::always_inline]] inline void vector_passes(int64_t nvec, Fn&& fn) {
  constexpr int kMaxPass = kMaxVectorPass;
  for (int64_t i = 0; i < nvec;) {
    const int64_t left = nvec - i;
    if (left >= kMaxPass && left != 4) {
      fn(std::integral_constant<int, kMaxPass>{}, i);
      i += kMaxPass;
    } else if (left >= 2) {
      fn(std::integral_constant<int, 2>{}, i);
      i += 2;
    } else {
      fn(std::integral_constant<int, 1>{}, i);
      i += 1;
    }
  }
}

/// dot(Q6_K row, Q8_K activations) over `nb` blocks in ggml's AVX2 lane order (8 int32 lanes, the 6-bit
/// levels kept unsigned and ggml's -32 offset subtracted per lane from the bsums once per block), for kV
/// vectors y[0..kV) at once: out[v * ldo] = the row's dot with y[v]. The weight side of a block (levels,
/// scale permutations) is unpacked once for all kV; each vector's operations are the one-vector kernel's, in
/// its order, so every result is the same bits whatever kV. The one body behind dot_q6_K (kV 1, no
/// prefetch), the matvec rows kernel (kV 1, weights prefetched kPrefetchBytes ahead) and the few-vector
/// kernel: a prefetch changes no arithmetic.
template <int kV, int64_t kPrefetchBytes>
[[gnu::always_inline]] inline void q6_K_row_v(const block_q6_K* x, const block_q8_K* const* y, int64_t nb,
                                              float* out, int64_t ldo) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i m30 = _mm512_set1_epi8(0x30);
  // Per 256-bit half of a register: left shifts 4 | 2 bring qh bits (0,1) | (2,3) to bits (4,5);
  // right shifts 0 | 2 bring bits (4,5) | (6,7) there.
  const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
  const __m512i shr = _mm512_inserti64x4(_mm512_set1_epi16(0), _mm256_set1_epi16(2), 1);
  const __m512i perm[2][2] = {{perm_idx(kK6Perm[0][0]), perm_idx(kK6Perm[0][1])},
                              {perm_idx(kK6Perm[1][0]), perm_idx(kK6Perm[1][1])}};
  __m256 acc[kV];
  for (int v = 0; v < kV; ++v) acc[v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    if constexpr (kPrefetchBytes > 0) {
      const char* ahead = reinterpret_cast<const char*>(&x[i]) + kPrefetchBytes;
      for (int line = 0; line < 4; ++line) _mm_prefetch(ahead + 64 * line, kWeightStreamHint);
    }
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
    const __m512i sc = _mm512_castsi256_si512(sc16);
    __m512i sumi[kV];
    for (int v = 0; v < kV; ++v) sumi[v] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      const __m512i l = load64(x[i].ql + 64 * h);  // ql bytes 0..31 | 32..63 of this half
      const __m512i hb = _mm512_broadcast_i64x4(load32(x[i].qh + 32 * h));
      const __m512i q01 =
          _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(hb, shl), m30));
      const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                          _mm512_and_si512(_mm512_srlv_epi16(hb, shr), m30));
      const __m512i s01 = _mm512_permutexvar_epi16(perm[h][0], sc);
      const __m512i s23 = _mm512_permutexvar_epi16(perm[h][1], sc);
      for (int v = 0; v < kV; ++v) {
        const int8_t* q8 = y[v][i].qs + 128 * h;
        // level (0..63) * y in int16 pairs; the offset is subtracted per block.
        const __m512i p01 = _mm512_maddubs_epi16(q01, load64(q8));
        const __m512i p23 = _mm512_maddubs_epi16(q23, load64(q8 + 64));
        sumi[v] = _mm512_dpwssd_epi32(sumi[v], p01, s01);
        sumi[v] = _mm512_dpwssd_epi32(sumi[v], p23, s23);
      }
    }
    for (int v = 0; v < kV; ++v) {
      // ggml's -32 offset: lane l loses 32 * (bsums[2l] sc[2l] + bsums[2l+1] sc[2l+1]) once per block.
      const __m256i offset = _mm256_slli_epi32(_mm256_madd_epi16(load32(y[v][i].bsums), sc16), 5);
      acc[v] = _mm256_fmadd_ps(_mm256_set1_ps(y[v][i].d * h2f(x[i].d)),
                               _mm256_cvtepi32_ps(_mm256_sub_epi32(fold16(sumi[v]), offset)), acc[v]);
    }
  }
  for (int v = 0; v < kV; ++v) out[v * ldo] = hsum8(acc[v]);
}

/// q6_K_row_v for one vector.
template <int64_t kPrefetchBytes>
[[gnu::always_inline]] inline float q6_K_row(const block_q6_K* x, const block_q8_K* y, int64_t nb) {
  float out;
  q6_K_row_v<1, kPrefetchBytes>(x, &y, nb, &out, 0);
  return out;
}

/// vpermw indices for Q3_K: step k's register holds chunk k (32 elements, int16 lanes 0..15) and chunk k + 4
/// (lanes 16..31); each chunk's two 16-element halves take scales 2c and 2c + 1.
constexpr Perm2 make_q3_K_perm(int k) {
  Perm2 p{};
  for (int i = 0; i < 32; ++i)
    p.idx[i] = static_cast<int16_t>(i < 16 ? 2 * k + i / 8 : 2 * (k + 4) + (i - 16) / 8);
  return p;
}
inline constexpr Perm2 kQ3KPerm[4] = {make_q3_K_perm(0), make_q3_K_perm(1), make_q3_K_perm(2),
                                      make_q3_K_perm(3)};

/// dot(Q3_K row, Q8_K activations) in ggml's AVX2 lane order (the AVX2 kernel, dot_k_avx2.cpp): per block, 8
/// int32 lanes, lane l summing bytes 4l..4l+3 of each 32-element chunk as level x y x scale (level = the two
/// low bits minus 4 where the high-mask bit is clear), then one FMA of the 8 lanes by d x y.d. Here a
/// 512-bit register takes chunks k and k + 4 at once (the same shift of the low bits for both), the scale
/// multiply-add is one vpdpwssd, and the two halves' lanes are added at the block's end: the same exact
/// integers per lane, the same float operations, so the same bits as the AVX2 kernel
/// (SimdMirror.Avx512EqualsAvx2BitForBitOnLlamaCppPaths). For kV vectors y[0..kV) at once (out[v * ldo]): the
/// weight side of a block (levels, high bits, scales) is unpacked once for all of them, each vector's
/// operations the one-vector kernel's in its order - dot_q3_K is the kV = 1 instance, the few-vector kernel
/// (matvec_avx512.cpp) the others.
template <int kV>
[[gnu::always_inline]] inline void q3_K_row_v(const block_q3_K* x, const block_q8_K* const* y, int64_t nb,
                                              float* out, int64_t ldo) {
  const __m512i m3 = _mm512_set1_epi8(3);
  const __m512i one = _mm512_set1_epi8(1);
  const __m512i perm[4] = {perm_idx(kQ3KPerm[0]), perm_idx(kQ3KPerm[1]), perm_idx(kQ3KPerm[2]),
                           perm_idx(kQ3KPerm[3])};
  __m256 acc[kV];
  for (int v = 0; v < kV; ++v) acc[v] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m512i sc = _mm512_castsi256_si512(q3_K_scales16(x[i].scales));
    const __m512i bits = load64(x[i].qs);  // bytes 0..31 | 32..63: chunks k | k + 4 after the same shift
    const __m512i hb = _mm512_broadcast_i64x4(load32(x[i].hmask));
    __m512i sumi[kV];
    for (int v = 0; v < kV; ++v) sumi[v] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      const __m512i q = _mm512_and_si512(_mm512_srli_epi16(bits, 2 * k), m3);
      // high-mask bit k (chunk k) | k + 4 (chunk k + 4); 4 where it is clear: level = q - that
      const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(k)),
                                               _mm256_set1_epi16(static_cast<int16_t>(k + 4)), 1);
      const __m512i q_hi = _mm512_slli_epi16(_mm512_andnot_si512(_mm512_srlv_epi16(hb, shift), one), 2);
      const __m512i s = _mm512_permutexvar_epi16(perm[k], sc);
      for (int v = 0; v < kV; ++v) {
        const int8_t* q8 = y[v][i].qs;
        const __m512i y8 = load32x2(q8 + 32 * k, q8 + 128 + 32 * k);
        const __m512i p = _mm512_sub_epi16(_mm512_maddubs_epi16(q, y8), _mm512_maddubs_epi16(q_hi, y8));
        sumi[v] = _mm512_dpwssd_epi32(sumi[v], p, s);
      }
    }
    for (int v = 0; v < kV; ++v) {
      acc[v] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * y[v][i].d), _mm256_cvtepi32_ps(fold16(sumi[v])),
                               acc[v]);
    }
  }
  for (int v = 0; v < kV; ++v) out[v * ldo] = hsum8(acc[v]);
}

/// dot(Q8_0 row, Q8_0 activations) in llama.cpp's order (dot_avx512.cpp); the multi-row kernel's odd row.
float dot_q8_0(const void* w, const void* a, int64_t n);

/// The Q8_0 matmul tiles: tile_q8_0 (matmul_avx512.cpp: vectors in pairs per register) and tile_q8_0_vnni
/// (matmul_q8_vnni.cpp: 16 rows per register, the table's tile; it runs tile_q8_0 for a few vectors). Both
/// bit-equal to dot_q8_0.
void tile_q8_0(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
               int64_t nvec, int64_t n, float* y, int64_t ldy);
void tile_q8_0_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts, size_t act_bytes,
                    int64_t nvec, int64_t n, float* y, int64_t ldy);

/// Set the multi-row matvec kernels (matvec_avx512.cpp) / the matmul tile kernels (matmul_avx512.cpp) in `k`.
void add_matvec_kernels(DotKernels& k);
void add_matmul_kernels(DotKernels& k);
/// Set the IQ4_NL / IQ4_XS / MXFP4 dot kernels (dot_iq4_avx512.cpp) in `k`.
void add_iq4_kernels(DotKernels& k);
/// The repacked Q4_K matmul tile (DotKernels::tile_repacked; matmul_q4k_vnni.cpp): vpdpbusd sums, 16 rows a
/// register, bit-equal to dot_q4_K_q8_K_gemm_ref / _gemv_ref.
/// Set the repacked-order Q4_0 / IQ4_NL / MXFP4 matmul tile and multi-row gemv (matmul_nl32_vnni.cpp).
void add_nl32_repacked_kernels(DotKernels& k);
void tile_q4_K_repacked_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                             size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                             const uint8_t* gemm);

/// The interleaved Q4_K layout (MatrixView::interleaved; matmul_q4k_vnni.cpp): the layout's writer, and its
/// products (DotKernels::Interleaved), bit-equal to dot_q4_K_q8_K_gemv_ref / _gemm_ref.
void interleave_q4_K_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, int64_t n, uint8_t* dst);
void rows_q4_K_interleaved_gemv(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n,
                                float* y);
void rows_q4_K_interleaved_gemv_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                    size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy);
void tile_q4_K_interleaved_vnni(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                                size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                                const uint8_t* gemm);
/// The interleaved Q6_K layout (q6k_interleaved.h; matmul_q6k_vnni.cpp): its writer and products, bit-equal
/// to dot_q6_K (the tile ignores `gemm`: Q6_K has one order).
void interleave_q6_K(const uint8_t* w, size_t row_bytes, int64_t nrows, int64_t n, uint8_t* dst);
void rows_q6_K_interleaved(const uint8_t* w, size_t row_bytes, int64_t nrows, const void* act, int64_t n,
                           float* y);
void rows_q6_K_interleaved_few(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                               size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy);
void tile_q6_K_interleaved(const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                           size_t act_bytes, int64_t nvec, int64_t n, float* y, int64_t ldy,
                           const uint8_t* gemm);

}  // namespace car::tensor::detail::avx512

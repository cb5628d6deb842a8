// AVX-512 dot kernels (F, BW, VL, DQ, VNNI, BF16; compiled with car_simd_source(... AVX512) and only called
// when CPUID reports all of them), and the AVX-512 table. The table starts from the AVX2 one and replaces the
// kernels that gain from AVX-512: VNNI's dpbusd / dpwssd fuse the u8 x s8 multiply with the int32
// accumulation, 512-bit registers halve the instruction count of the K-quant loops, and dpbf16ps multiplies
// bf16 pairs directly. Q2_K, Q4_1, Q5_0 and Q5_1 keep their AVX2 dot kernels. The multi-row matvec
// kernels (matvec_avx512.cpp) and the matmul tiles (matmul_avx512.cpp) compute each row / (row, vector)
// result with exactly the operations of the dot kernel here, so every product equals it bit for bit.
//
// Integer parts are exact (same identities as the scalar reference: levels <= 63 times |activation| <= 127
// never saturate maddubs' int16 pairs); float accumulation order differs from the scalar one.
#include <cmath>
#include <cstring>

#include "core/tensor/iq_panel.h"
#include "core/tensor/simd_avx512.h"

namespace car::tensor::detail {
namespace avx512 {

// ---------------------------------------------------------------------------------------------------------
// 32-element blocks with Q8_0 activations

// One 8-lane accumulator over the blocks in order (ggml's ggml_vec_dot_q8_0_q8_0 and llamafile's
// tinyBLAS_Q0_AVX, whose VNNI build uses exactly this dpbusd), so results equal llama.cpp's bit for bit.
float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q8_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256i p = dpbssd_via_sign(_mm256_setzero_si256(), load32(x[i].qs), load32(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum8(acc);
}

namespace {

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256i q = _mm256_sub_epi8(nibbles32(x[i].qs), eight);
    const __m256i p = dpbssd_via_sign(_mm256_setzero_si256(), q, load32(y[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), _mm256_cvtepi32_ps(p), acc);
  }
  return hsum8(acc);
}

// ---------------------------------------------------------------------------------------------------------
// K-quants

template <bool kHasHighBit, typename Block>
float dot_k4(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const Block*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  const int64_t nb = n / QK_K;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i bit4 = _mm512_set1_epi8(0x10);
  const __m512i p00 = perm_idx(kK4Perm[0][0]), p01 = perm_idx(kK4Perm[0][1]);
  const __m512i p10 = perm_idx(kK4Perm[1][0]), p11 = perm_idx(kK4Perm[1][1]);
  // ggml's AVX2 Q4_K keeps the mins in a 4-lane float accumulator; its Q5_K sums them to one int per block
  // and accumulates a scalar float. Both are mirrored so the results equal llama.cpp's.
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_m = _mm_setzero_ps();
  float summs = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    uint32_t sm[4];
    unpack_scale_min_k4_words(x[i].scales, sm);
    const float d = y[i].d * h2f(x[i].d);
    const float dmin = -y[i].d * h2f(x[i].dmin);
    const __m128i mins = mins_dot_bsums(sm + 2, y[i].bsums);
    if constexpr (kHasHighBit) {
      // An explicit FMA: what GCC's contraction makes of `summs += dmin * x` at -O2 (llama.cpp's build), and
      // what the Q5_K tiles do, at every optimization level (the sanitizer builds' -O1 does not contract).
      summs = std::fma(dmin, static_cast<float>(hsum_i32x4(mins)), summs);
    } else {
      acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), acc_m);
    }
    const __m512i sc16 =
        _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm))));
    const int8_t* q8 = y[i].qs;
    __m512i sumi = _mm512_setzero_si512();
    for (int jj = 0; jj < 2; ++jj, q8 += 128) {
      const __m512i bits = load64(x[i].qs + 64 * jj);
      __m512i lo = _mm512_and_si512(bits, m4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bits, 4), m4);
      if constexpr (kHasHighBit) {
        // qh bit (2j) of byte l is the fifth bit of the low-nibble element of sub-block j-pair ..., (2j+1) of
        // the high-nibble one; this register holds sub-block pairs j = 2jj (bytes 0..31) and 2jj+1 (32..63).
        const __m256i hb = load32(x[i].qh);
        const __m512i hbz = _mm512_broadcast_i64x4(hb);
        const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(4 * jj)),
                                                 _mm256_set1_epi16(static_cast<int16_t>(4 * jj + 2)), 1);
        const __m512i hl = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(hbz, sh_lo), 4), bit4);
        const __m512i hh = _mm512_and_si512(
            _mm512_slli_epi16(_mm512_srlv_epi16(hbz, _mm512_add_epi16(sh_lo, _mm512_set1_epi16(1))), 4),
            bit4);
        lo = _mm512_or_si512(lo, hl);
        hi = _mm512_or_si512(hi, hh);
      }
      const __m512i ylo = load32x2(q8, q8 + 64);
      const __m512i yhi = load32x2(q8 + 32, q8 + 96);
      const __m512i plo = _mm512_maddubs_epi16(lo, ylo);
      const __m512i phi = _mm512_maddubs_epi16(hi, yhi);
      sumi = _mm512_dpwssd_epi32(sumi, plo, _mm512_permutexvar_epi16(jj == 0 ? p00 : p10, sc16));
      sumi = _mm512_dpwssd_epi32(sumi, phi, _mm512_permutexvar_epi16(jj == 0 ? p01 : p11, sc16));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold16(sumi)), acc);
  }
  if constexpr (kHasHighBit) {
    return hsum8(acc) + summs;
  } else {
    return hsum8(acc) + hsum4(acc_m);
  }
}

float dot_q4_K(const void* w, const void* a, int64_t n) {
  return dot_k4<false, block_q4_K>(w, a, n);
}

float dot_q5_K(const void* w, const void* a, int64_t n) {
  return dot_k4<true, block_q5_K>(w, a, n);
}

float dot_q3_K(const void* w, const void* a, int64_t n) {
  float out;
  const auto* y = static_cast<const block_q8_K*>(a);
  q3_K_row_v<1>(static_cast<const block_q3_K*>(w), &y, n / QK_K, &out, 0);
  return out;
}

float dot_q6_K(const void* w, const void* a, int64_t n) {
  return q6_K_row<0>(static_cast<const block_q6_K*>(w), static_cast<const block_q8_K*>(a), n / QK_K);
}

// ---------------------------------------------------------------------------------------------------------
// Float formats. Two summation orders, as llama.cpp has two paths:
//  - mul_mat (dense weights): llamafile's tinyBLAS, one 16-lane accumulator over k (32 bf16 per dpbf16ps),
//    reduced with _mm512_reduce_add_ps; it requires k % 16 == 0 (bf16: 32), else ggml_vec_dot_* is used;
//  - mul_mat_id (MoE experts): ggml_vec_dot_f32 / _f16 (four 16-lane accumulators over 64-element steps,
//    reduced pairwise, leftovers added one by one, in float for F32 and double for F16) and _bf16 (two
//    dpbf16ps accumulators over 64-element steps, each reduced into a double, leftovers in double).

float dot_f32_vec(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  const int64_t np = n & ~int64_t{63};
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < np; i += 64) {
    for (int j = 0; j < 4; ++j)
      sum[j] = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16 * j), _mm512_loadu_ps(y + i + 16 * j), sum[j]);
  }
  sum[0] = _mm512_add_ps(sum[0], sum[2]);
  sum[1] = _mm512_add_ps(sum[1], sum[3]);
  sum[0] = _mm512_add_ps(sum[0], sum[1]);
  float sumf = _mm512_reduce_add_ps(sum[0]);
  for (int64_t i = np; i < n; ++i) sumf += x[i] * y[i];
  return sumf;
}

float dot_f32(const void* w, const void* a, int64_t n) {
  if (n % 16 != 0) return dot_f32_vec(w, a, n);
  const auto* x = static_cast<const float*>(w);
  const auto* y = static_cast<const float*>(a);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16)
    acc = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i), acc);
  return _mm512_reduce_add_ps(acc);
}

inline __m512 load_f16x16(const uint16_t* p) {
  return _mm512_cvtph_ps(load32(p));
}

float dot_f16_vec(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  const int64_t np = n & ~int64_t{63};
  __m512 sum[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t i = 0; i < np; i += 64) {
    for (int j = 0; j < 4; ++j)
      sum[j] = _mm512_fmadd_ps(load_f16x16(x + i + 16 * j), load_f16x16(y + i + 16 * j), sum[j]);
  }
  sum[0] = _mm512_add_ps(sum[0], sum[2]);
  sum[1] = _mm512_add_ps(sum[1], sum[3]);
  sum[0] = _mm512_add_ps(sum[0], sum[1]);
  double sumf = _mm512_reduce_add_ps(sum[0]);
  for (int64_t i = np; i < n; ++i) sumf += static_cast<double>(h2f(x[i]) * h2f(y[i]));
  return static_cast<float>(sumf);
}

float dot_f16(const void* w, const void* a, int64_t n) {
  if (n % 16 != 0) return dot_f16_vec(w, a, n);
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(load_f16x16(x + i), load_f16x16(y + i), acc);
  return _mm512_reduce_add_ps(acc);
}

inline float bf16f(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float dot_bf16_vec(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 c1 = _mm512_setzero_ps(), c2 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    c1 = _mm512_dpbf16_ps(c1, (__m512bh)load64(x + i), (__m512bh)load64(y + i));
    c2 = _mm512_dpbf16_ps(c2, (__m512bh)load64(x + i + 32), (__m512bh)load64(y + i + 32));
  }
  double sumf = 0.0;
  sumf += static_cast<double>(_mm512_reduce_add_ps(c1));
  sumf += static_cast<double>(_mm512_reduce_add_ps(c2));
  for (; i < n; ++i) sumf += static_cast<double>(bf16f(x[i]) * bf16f(y[i]));
  return static_cast<float>(sumf);
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  if (n % 32 != 0) return dot_bf16_vec(w, a, n);
  const auto* x = static_cast<const uint16_t*>(w);
  const auto* y = static_cast<const uint16_t*>(a);
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 32)
    acc = _mm512_dpbf16_ps(acc, (__m512bh)load64(x + i), (__m512bh)load64(y + i));
  return _mm512_reduce_add_ps(acc);
}

DotKernels make_table() {
  const DotKernels* base = avx2_kernels();
  DotKernels k = base != nullptr ? *base : scalar_kernels();
  k.dot[slot(GgmlType::F32)] = dot_f32;
  k.dot[slot(GgmlType::F16)] = dot_f16;
  k.dot[slot(GgmlType::BF16)] = dot_bf16;
  k.dot[slot(GgmlType::Q4_0)] = dot_q4_0;
  k.dot[slot(GgmlType::Q8_0)] = dot_q8_0;
  k.dot[slot(GgmlType::Q4_K)] = dot_q4_K;
  k.dot[slot(GgmlType::Q5_K)] = dot_q5_K;
  k.dot[slot(GgmlType::Q6_K)] = dot_q6_K;
  k.dot[slot(GgmlType::Q3_K)] = dot_q3_K;
  add_iq4_kernels(k);
  // After the quantized overrides: for those formats both orders are one kernel, and tile_for / rows_for
  // give mul_mat_id products (MoE experts) the tiles only where dot_id is dot. (Copied before them, the
  // experts' Q5_K / Q6_K / Q8_0 products ran the AVX2 dot kernel row by row: the same bits, no tile.)
  for (int t = 0; t < kTypeSlots; ++t) k.dot_id[t] = k.dot[t];
  k.dot_id[slot(GgmlType::F32)] = dot_f32_vec;
  k.dot_id[slot(GgmlType::F16)] = dot_f16_vec;
  k.dot_id[slot(GgmlType::BF16)] = dot_bf16_vec;
  add_matvec_kernels(k);
  add_matmul_kernels(k);
  add_nl32_repacked_kernels(k);
  k.iq_panel = iq_panel_rows_avx512;
  k.attend = attend_head_avx512;
  k.attend_group = attend_group_avx512;
  return k;
}

}  // namespace
}  // namespace avx512

const DotKernels* avx512_kernels() {
  static const DotKernels table = avx512::make_table();
  return &table;
}

}  // namespace car::tensor::detail

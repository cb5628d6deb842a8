// AVX2 + FMA + F16C activation rounding (Q8_0, Q8_1, Q8_K, F16), bit-identical to the scalar versions
// (compiled with car_simd_source(... AVX2); only called when the CPU has them).
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/simd_avx2.h"

namespace car::tensor::detail {
namespace {

// Activation rounding, bit-identical to the scalar versions (same multiplier, round-half-even conversion
// under the default MXCSR rounding mode, same first-maximum rule for Q8_K's signed extreme).

inline float hmax8(__m256 v) {
  __m128 r = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

/// 32 int32 (four registers) -> 32 int8 in order (values already within int8 range).
inline __m256i pack32(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i a = _mm256_packs_epi32(i0, i1);  // 0-3 8-11 4-7 12-15 (per-lane interleave)
  const __m256i b = _mm256_packs_epi32(i2, i3);
  const __m256i c = _mm256_packs_epi16(a, b);
  return _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/// Round 32 floats times `mul` to int32 (half to even).
inline void round32(const float* x, __m256 mul, __m256i* out) {
  for (int k = 0; k < 4; ++k) out[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), mul));
}

template <bool kWithSum>
void quantize_q8_0_like(const float* x, void* dst, int64_t n) {
  const size_t stride = kWithSum ? sizeof(block_q8_1) : sizeof(block_q8_0);
  auto* out = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n / 32; ++i, x += 32, out += stride) {
    __m256 m = abs8(_mm256_loadu_ps(x));
    for (int k = 1; k < 4; ++k) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + 8 * k)));
    const float amax = hmax8(m);
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    const uint16_t dh = static_cast<uint16_t>(_cvtss_sh(d, 0));
    std::memcpy(out, &dh, 2);
    __m256i q[4];
    round32(x, _mm256_set1_ps(id), q);
    if constexpr (kWithSum) {
      const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      t = _mm_add_epi32(t, _mm_unpackhi_epi64(t, t));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 1));
      const uint16_t sh = static_cast<uint16_t>(_cvtss_sh(d * static_cast<float>(_mm_cvtsi128_si32(t)), 0));
      std::memcpy(out + 2, &sh, 2);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (kWithSum ? 4 : 2)), pack32(q[0], q[1], q[2], q[3]));
  }
}

void quantize_act_q8_0_avx2(const float* x, void* dst, int64_t n) { quantize_q8_0_like<false>(x, dst, n); }
void quantize_act_q8_1_avx2(const float* x, void* dst, int64_t n) { quantize_q8_0_like<true>(x, dst, n); }

void quantize_act_q8_K_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_K*>(dst);
  for (int64_t i = 0; i < n / QK_K; ++i, x += QK_K) {
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < QK_K; k += 8) m = _mm256_max_ps(m, abs8(_mm256_loadu_ps(x + k)));
    const float amax = hmax8(m);
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    // The first element whose magnitude is amax gives the sign (the scalar loop's strict '>').
    int first = 0;
    const __m256 va = _mm256_set1_ps(amax);
    for (int k = 0; k < QK_K; k += 8) {
      const int mask = _mm256_movemask_ps(_mm256_cmp_ps(abs8(_mm256_loadu_ps(x + k)), va, _CMP_EQ_OQ));
      if (mask != 0) {
        first = k + __builtin_ctz(static_cast<unsigned>(mask));
        break;
      }
    }
    const float iscale = -127.f / x[first];
    const __m256 mul = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    for (int k = 0; k < QK_K; k += 32) {
      __m256i q[4];
      round32(x + k, mul, q);
      for (auto& v : q) v = _mm256_min_epi32(v, cap);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[i].qs + k), pack32(q[0], q[1], q[2], q[3]));
      // bsums of the two 16-element groups: horizontal sums of q[0]+q[1] and q[2]+q[3].
      const __m256i s01 = _mm256_add_epi32(q[0], q[1]), s23 = _mm256_add_epi32(q[2], q[3]);
      const __m256i h = _mm256_hadd_epi32(s01, s23);  // lane-wise pairs
      const __m256i h2 = _mm256_hadd_epi32(h, h);
      const __m128i t = _mm_add_epi32(_mm256_castsi256_si128(h2), _mm256_extracti128_si256(h2, 1));
      y[i].bsums[k / 16] = static_cast<int16_t>(_mm_extract_epi32(t, 0));
      y[i].bsums[k / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(t, 1));
    }
    y[i].d = 1 / iscale;
  }
}

void convert_act_f16_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) y[i] = static_cast<uint16_t>(_cvtss_sh(x[i], 0));
}

}  // namespace

void avx2::add_activation_kernels(DotKernels& k) {
  k.quantize_act[slot(GgmlType::Q8_0)] = quantize_act_q8_0_avx2;
  k.quantize_act[slot(GgmlType::Q8_1)] = quantize_act_q8_1_avx2;
  k.quantize_act[slot(GgmlType::Q8_K)] = quantize_act_q8_K_avx2;
  k.quantize_act[slot(GgmlType::F16)] = convert_act_f16_avx2;
}

}  // namespace car::tensor::detail

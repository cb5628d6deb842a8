// AVX2 + FMA + F16C dot kernels of the 32-element block formats and the float formats, and the AVX2 table
// (compiled with car_simd_source(... AVX2); only called when the CPU has them). The K-quant kernels are in
// dot_k_avx2.cpp, the activation rounding in quantize_avx2.cpp.
//
// Integer parts are computed exactly as the scalar references do (u8 x s8 pair products with maddubs, which
// cannot saturate for these formats: |level| <= 63 and |activation| <= 127, then madd into int32), so only
// the float accumulation differs: per block (or per 8 lanes) the integer sum is converted and multiplied by
// the block's scale product into 8-lane float accumulators, summed horizontally at the end.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "core/tensor/blocks.h"
#include "core/tensor/iq_panel.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/silu.h"
#include "core/tensor/simd_avx2.h"

namespace car::tensor::detail {
namespace {

// ---------------------------------------------------------------------------------------------------------
// 32-element blocks

// Q8_0 / Q4_0 / Q5_0: one 8-lane accumulator over the blocks in order, as ggml's AVX2 ggml_vec_dot_q*_q8_0
// and llamafile's tinyBLAS_Q0_AVX (llama.cpp's two paths for these types) do, so results match them bit for
// bit.
float dot_q8_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q8_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(load32(x[i].qs), load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc);
}

float dot_q4_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const __m256i eight = _mm256_set1_epi8(8);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < n / QK8_0; ++i) {
    const __m256i q = _mm256_sub_epi8(nibbles32(x[i].qs), eight);
    const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q, load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc);
}

float dot_q4_1(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q4_1*>(w);
  const auto* y = static_cast<const block_q8_1*>(a);
  const int64_t nb = n / QK8_1;
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t i = 0; i < nb; ++i) {
    summs = std::fma(h2f(x[i].m), h2f(y[i].s), summs);  // explicit: contracted at -O2 only otherwise
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(nibbles32(x[i].qs), load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc) + summs;
}

float dot_q5_0(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q5_0*>(w);
  const auto* y = static_cast<const block_q8_0*>(a);
  const int64_t nb = n / QK8_0;
  const __m256i hi_off = _mm256_set1_epi8(static_cast<char>(0xf0));
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    // level - 16 = nibble | (bit ? 0 : 0xf0) read as int8.
    const __m256i q = _mm256_or_si256(nibbles32(x[i].qs), _mm256_andnot_si256(bits32(x[i].qh), hi_off));
    const __m256 p = _mm256_cvtepi32_ps(dot_s8s8(q, load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc);
}

float dot_q5_1(const void* w, const void* a, int64_t n) {
  const auto* x = static_cast<const block_q5_1*>(w);
  const auto* y = static_cast<const block_q8_1*>(a);
  const int64_t nb = n / QK8_1;
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  __m256 acc = _mm256_setzero_ps();
  float summs = 0;
  for (int64_t i = 0; i < nb; ++i) {
    summs = std::fma(h2f(x[i].m), h2f(y[i].s), summs);  // explicit: contracted at -O2 only otherwise
    const __m256i q = _mm256_or_si256(nibbles32(x[i].qs), _mm256_and_si256(bits32(x[i].qh), bit4));
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(q, load32(y[i].qs)));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d)), p, acc);
  }
  return hsum8(acc) + summs;
}

// ---------------------------------------------------------------------------------------------------------
// Float formats (any length; scalar tail)

// The one order of the float formats: four 8-lane FMA accumulators over each 32 elements, then 8 at a time
// into the first, their pairwise sum reduced by hsum8, then the tail one element at a time. `load8` widens 8
// elements to fp32, `load1` one.
template <typename Elem, typename Load8, typename Load1>
float dot_float_format(const void* w, const void* a, int64_t n, Load8 load8, Load1 load1) {
  const auto* x = static_cast<const Elem*>(w);
  const auto* y = static_cast<const Elem*>(a);
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 4; ++k) {
      acc[k] = _mm256_fmadd_ps(load8(x + i + 8 * k), load8(y + i + 8 * k), acc[k]);
    }
  }
  for (; i + 8 <= n; i += 8) acc[0] = _mm256_fmadd_ps(load8(x + i), load8(y + i), acc[0]);
  float sum = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  for (; i < n; ++i) sum += load1(x[i]) * load1(y[i]);
  return sum;
}

float dot_f32(const void* w, const void* a, int64_t n) {
  return dot_float_format<float>(
      w, a, n, [](const float* p) { return _mm256_loadu_ps(p); }, [](float v) { return v; });
}

inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

float dot_f16(const void* w, const void* a, int64_t n) {
  return dot_float_format<uint16_t>(w, a, n, load_f16x8, [](uint16_t v) { return _cvtsh_ss(v); });
}

inline __m256 load_bf16x8(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

float dot_bf16(const void* w, const void* a, int64_t n) {
  return dot_float_format<uint16_t>(w, a, n, load_bf16x8, [](uint16_t v) {
    const uint32_t u = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  });
}

DotKernels make_table() {
  DotKernels k = scalar_kernels();
  avx2::add_activation_kernels(k);
  k.dot[slot(GgmlType::F32)] = dot_f32;
  k.dot[slot(GgmlType::F16)] = dot_f16;
  k.dot[slot(GgmlType::BF16)] = dot_bf16;
  k.dot[slot(GgmlType::Q4_0)] = dot_q4_0;
  k.dot[slot(GgmlType::Q4_1)] = dot_q4_1;
  k.dot[slot(GgmlType::Q5_0)] = dot_q5_0;
  k.dot[slot(GgmlType::Q5_1)] = dot_q5_1;
  k.dot[slot(GgmlType::Q8_0)] = dot_q8_0;
  avx2::add_k_quant_kernels(k);
  avx2::add_iq4_kernels(k);
  avx2::add_iq2_kernels(k);
  avx2::add_iq3_kernels(k);
  avx2::add_tq_kernels(k);
  for (int t = 0; t < kTypeSlots; ++t) k.dot_id[t] = k.dot[t];  // one order for every AVX2 kernel
  k.iq_panel = iq_panel_rows_avx2;
  k.attend = attend_head_avx2;
  k.swiglu = swiglu_avx2;
  return k;
}

}  // namespace

const DotKernels* avx2_kernels() {
  static const DotKernels table = make_table();
  return &table;
}

}  // namespace car::tensor::detail

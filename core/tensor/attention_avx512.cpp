// AVX-512 version of attend_head (kernels.h; the AVX-512 tables' kernel): attend_head_scalar's arithmetic,
// sixteen lanes at a time, so every result is the scalar kernel's bit for bit (and attend_head_avx2's).
//
// - Q.K: dot_f16_ggml's order is four 16-lane accumulators over 64 elements a step, summed (0+2)+(1+3), then
//   the 16 lanes folded to 8, 4 and the last four as (0+2)+(1+3). The AVX2 kernel emulates each accumulator
//   with two 8-lane halves; here each is one register. Q is rounded to fp16 and back once per call instead
//   of once per key.
// - V: the accumulator stays fp16 in memory, each element one fused multiply-add and a rounding per key
//   (rescaled, when a key is a new maximum, by one multiply and a rounding) - lane-wise, so any width
//   gives the same bits.
// A batched decode step runs this once per (sequence, head, layer): on the dense-1b model's short contexts
// (`car bench --parallel 8`) the AVX2 kernel was 6 % of the step.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "core/tensor/fp16.h"
#include "core/tensor/kernel_table.h"
#include "core/tensor/online_softmax.h"

namespace car::tensor::detail {

namespace {

constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
constexpr int64_t kMaxQ = 1024;  // longer heads (none in the architectures we load) take the AVX2 kernel

// (The zero-masked forms with a full mask: the unmasked intrinsics pass GCC 12 an undefined source register,
// which -Wmaybe-uninitialized reports.)
inline __m512 load_h16(const uint16_t* p) {
  return _mm512_maskz_cvtph_ps(0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void store_h16(uint16_t* p, __m512 x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_maskz_cvtps_ph(0xffff, x, kRne));
}
inline __m256 load_h8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void store_h8(uint16_t* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, kRne));
}

/// Q.K of one key from dot_f16_ggml's four accumulators: summed (0+2)+(1+3), then the 16 lanes folded to 8
/// (h[l] = s[l + 8] + s[l]), to 4 (r[l] = h[l + 4] + h[l]) and the last four as (0+2)+(1+3), as the AVX2
/// kernel (and ggml) fold them.
inline double fold_dot(const __m512 (&acc)[4]) {
  const __m512 s16 = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
  const __m256 h8 =
      _mm256_add_ps(_mm512_maskz_extractf32x8_ps(0xff, s16, 1), _mm512_maskz_extractf32x8_ps(0xff, s16, 0));
  const __m128 q4 = _mm_add_ps(_mm256_extractf128_ps(h8, 1), _mm256_castps256_ps128(h8));
  alignas(16) float r[4];
  _mm_store_ps(r, q4);
  return static_cast<double>((r[0] + r[2]) + (r[1] + r[3]));
}

}  // namespace

void attend_head_avx512(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk, int64_t dv,
                        float scale, float* out, uint16_t* q16, uint16_t* acc16, float sink) {
  if (dk > kMaxQ) {
    attend_head_avx2(q, k, v, n_kv, dk, dv, scale, out, q16, acc16, sink);
    return;
  }
  const int64_t dk64 = dk & ~int64_t{63};
  const int64_t dk16 = dk & ~int64_t{15};
  const int64_t dv16 = dv & ~int64_t{15};
  const int64_t dv8 = dv & ~int64_t{7};
  // q16 = fp16(q) (the hardware's round to nearest even is fp32_to_fp16's), qf = q16 in fp32.
  alignas(64) float qf[kMaxQ];
  for (int64_t d = 0; d < dk16; d += 16) {
    store_h16(q16 + d, _mm512_loadu_ps(q + d));
    _mm512_store_ps(qf + d, load_h16(q16 + d));
  }
  for (int64_t d = dk16; d < dk; ++d) {
    q16[d] = fp32_to_fp16(q[d]);
    qf[d] = fp16_to_fp32(q16[d]);
  }
  std::memset(acc16, 0, static_cast<size_t>(dv) * sizeof(uint16_t));
  float sum = 0.0f;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t ic = 0; ic < n_kv; ++ic) {
    const uint16_t* kr = k + ic * dk;
    double dot = 0.0;
    if (dk64 > 0) {
      __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
      for (int64_t i = 0; i < dk64; i += 64) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          acc[j] = _mm512_fmadd_ps(load_h16(kr + i + 16 * j), _mm512_load_ps(qf + i + 16 * j), acc[j]);
        }
      }
      dot = fold_dot(acc);
    }
    for (int64_t d = dk64; d < dk; ++d) {
      dot += static_cast<double>(fp16_to_fp32(kr[d]) * qf[d]);
    }
    const float s = static_cast<float>(dot) * scale;
    float ms, vs;
    if (online_softmax_step(s, mx, ms, vs)) {
      const __m512 vms = _mm512_set1_ps(ms);
      int64_t d = 0;
      for (; d < dv16; d += 16) store_h16(acc16 + d, _mm512_mul_ps(load_h16(acc16 + d), vms));
      for (; d < dv8; d += 8) store_h8(acc16 + d, _mm256_mul_ps(load_h8(acc16 + d), _mm256_set1_ps(ms)));
      for (; d < dv; ++d) acc16[d] = fp32_to_fp16(fp16_to_fp32(acc16[d]) * ms);
    }
    const uint16_t* vr = v + ic * dv;
    const __m512 vvs = _mm512_set1_ps(vs);
    int64_t d = 0;
    for (; d < dv16; d += 16) store_h16(acc16 + d, _mm512_fmadd_ps(load_h16(vr + d), vvs, load_h16(acc16 + d)));
    for (; d < dv8; d += 8) {
      store_h8(acc16 + d, _mm256_fmadd_ps(load_h8(vr + d), _mm256_set1_ps(vs), load_h8(acc16 + d)));
    }
    for (; d < dv; ++d) acc16[d] = fp32_to_fp16(std::fma(fp16_to_fp32(vr[d]), vs, fp16_to_fp32(acc16[d])));
    sum = sum * ms + vs;
  }
  // The output: the scalar kernel's float operations, lane-wise.
  float ms = 1.0f;
  if (sink != kNoSink) ms = online_sink_step(sink, mx, sum);  // a float scale of the converted accumulator
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 vms = _mm512_set1_ps(ms);
  int64_t d = 0;
  if (sink == kNoSink) {
    for (; d < dv16; d += 16) _mm512_storeu_ps(out + d, _mm512_mul_ps(load_h16(acc16 + d), vinv));
    for (; d < dv; ++d) out[d] = fp16_to_fp32(acc16[d]) * inv;
    return;
  }
  for (; d < dv16; d += 16) _mm512_storeu_ps(out + d, _mm512_mul_ps(_mm512_mul_ps(load_h16(acc16 + d), vms), vinv));
  for (; d < dv; ++d) out[d] = (fp16_to_fp32(acc16[d]) * ms) * inv;
}

namespace {

constexpr int64_t kGroupMaxQ = 256;  // the register kernel's longest K head (Q converted once per call)

/// kG heads (1-2) over the same keys and values, dk a multiple of 64 (<= kGroupMaxQ), dv = 16 x kNv: per
/// head attend_head_avx512's operations in its order, with the fp16 accumulator held in registers instead
/// of memory (the same rounding at each step: a float result converted to fp16 is the value a store and a
/// reload gives) and each key's and value's row converted once for the group. In the memory kernel each
/// key's accumulation waited on the previous key's store (store, reload, convert, FMA, convert): perf put
/// ~40 % of its samples there. Two heads give the core two independent chains.
template <int kG, int kNv>
void attend_heads_reg(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                      float scale, float* out, const float* sinks) {
  constexpr int64_t dv = 16 * kNv;
  alignas(64) float qf[kG][kGroupMaxQ];
  for (int h = 0; h < kG; ++h) {
    for (int64_t d = 0; d < dk; d += 16) {
      const __m256i h16 = _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(q + h * dk + d), kRne);
      _mm512_store_ps(qf[h] + d, _mm512_maskz_cvtph_ps(0xffff, h16));
    }
  }
  __m256i acc[kG][kNv];
  float sum[kG], mx[kG];
  for (int h = 0; h < kG; ++h) {
    for (int c = 0; c < kNv; ++c) acc[h][c] = _mm256_setzero_si256();
    sum[h] = 0.0f;
    mx[h] = -std::numeric_limits<float>::infinity();
  }
  // Keys in blocks: first every score of the block and its softmax step (the exp calls, which clobber every
  // vector register), then the values with the accumulators in registers, so they are saved around calls
  // once a block rather than once a key. The steps run in key order either way.
  constexpr int64_t kBlock = 16;
  for (int64_t ic0 = 0; ic0 < n_kv; ic0 += kBlock) {
    const int64_t nb = std::min(kBlock, n_kv - ic0);
    float sc[kG][kBlock];
    for (int64_t b = 0; b < nb; ++b) {
      const uint16_t* kr = k + (ic0 + b) * dk;
      __m512 a[kG][4];
      for (int h = 0; h < kG; ++h) {
        for (int j = 0; j < 4; ++j) a[h][j] = _mm512_setzero_ps();
      }
      for (int64_t i = 0; i < dk; i += 64) {
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m512 kx = load_h16(kr + i + 16 * j);
          for (int h = 0; h < kG; ++h)
            a[h][j] = _mm512_fmadd_ps(kx, _mm512_load_ps(qf[h] + i + 16 * j), a[h][j]);
        }
      }
      for (int h = 0; h < kG; ++h) sc[h][b] = static_cast<float>(fold_dot(a[h])) * scale;
    }
    float ms[kG][kBlock], vs[kG][kBlock];
    bool rescale[kG][kBlock];
    for (int h = 0; h < kG; ++h) {
      for (int64_t b = 0; b < nb; ++b)
        rescale[h][b] = online_softmax_step(sc[h][b], mx[h], ms[h][b], vs[h][b]);
    }
    for (int64_t b = 0; b < nb; ++b) {
      const uint16_t* vr = v + (ic0 + b) * dv;
      for (int h = 0; h < kG; ++h) {
        if (!rescale[h][b]) continue;
        const __m512 vms = _mm512_set1_ps(ms[h][b]);
        for (int c = 0; c < kNv; ++c) {
          acc[h][c] = _mm512_maskz_cvtps_ph(
              0xffff, _mm512_mul_ps(_mm512_maskz_cvtph_ps(0xffff, acc[h][c]), vms), kRne);
        }
      }
#pragma GCC unroll 8
      for (int c = 0; c < kNv; ++c) {
        const __m512 vx = load_h16(vr + 16 * c);
        for (int h = 0; h < kG; ++h) {
          const __m512 prev = _mm512_maskz_cvtph_ps(0xffff, acc[h][c]);
          acc[h][c] =
              _mm512_maskz_cvtps_ph(0xffff, _mm512_fmadd_ps(vx, _mm512_set1_ps(vs[h][b]), prev), kRne);
        }
      }
      for (int h = 0; h < kG; ++h) sum[h] = sum[h] * ms[h][b] + vs[h][b];
    }
  }
  for (int h = 0; h < kG; ++h) {
    float hm = 1.0f;
    const float sink = sinks != nullptr ? sinks[h] : kNoSink;
    if (sink != kNoSink) hm = online_sink_step(sink, mx[h], sum[h]);
    const float inv = sum[h] == 0.0f ? 0.0f : 1.0f / sum[h];
    const __m512 vinv = _mm512_set1_ps(inv);
    const __m512 vms = _mm512_set1_ps(hm);
    float* o = out + h * dv;
    for (int c = 0; c < kNv; ++c) {
      const __m512 x = _mm512_maskz_cvtph_ps(0xffff, acc[h][c]);
      _mm512_storeu_ps(o + 16 * c,
                       sink == kNoSink ? _mm512_mul_ps(x, vinv) : _mm512_mul_ps(_mm512_mul_ps(x, vms), vinv));
    }
  }
}

template <int kNv>
void attend_pairs(const float* q, int64_t g, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                  float scale, float* out, const float* sinks) {
  constexpr int64_t dv = 16 * kNv;
  int64_t h = 0;
  for (; h + 2 <= g; h += 2) {
    attend_heads_reg<2, kNv>(q + h * dk, k, v, n_kv, dk, scale, out + h * dv,
                             sinks != nullptr ? sinks + h : nullptr);
  }
  if (h < g)
    attend_heads_reg<1, kNv>(q + h * dk, k, v, n_kv, dk, scale, out + h * dv,
                             sinks != nullptr ? sinks + h : nullptr);
}

}  // namespace

bool attend_group_avx512(const float* q, int64_t g, const uint16_t* k, const uint16_t* v, int64_t n_kv,
                         int64_t dk, int64_t dv, float scale, float* out, const float* sinks) {
  if (dk % 64 != 0 || dk > kGroupMaxQ) return false;
  switch (dv) {
    case 64:
      attend_pairs<4>(q, g, k, v, n_kv, dk, scale, out, sinks);
      return true;
    case 128:
      attend_pairs<8>(q, g, k, v, n_kv, dk, scale, out, sinks);
      return true;
    default:
      return false;
  }
}

}  // namespace car::tensor::detail

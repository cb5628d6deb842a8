// Scalar reference kernels of the codebook formats IQ2_XXS and IQ1_S: dequantization and the dot products
// against Q8_K (the test oracles of the SIMD kernels), and a plain IQ2_XXS quantizer for synthetic models
// (per group of 32 a few trial scales and their least-squares refinements, per 8 weights the signs of x -
// parity fixed on the smallest - and the
// nearest of the 256 grid points by squared error; no importance matrix, so it is cruder than
// llama-quantize's). IQ1_S has no quantizer (can_quantize() says no): its files are read, not made.
//
// The dot follows ggml's x86 (AVX2) ggml_vec_dot_iq2_xxs_q8_K: per super-block 8 int32 lanes (lane l:
// elements 4l..4l+3 of each group of 32, each group's sum times its scale 2 * s + 1), converted and
// multiplied by d(x) * d(y) into 8 float lanes by FMA, reduced as hsum_float_8 does, times 0.125.
#include <cassert>
#include <cmath>
#include <cstring>

#include <immintrin.h>

#include "core/tensor/blocks.h"
#include "core/tensor/first_min.h"
#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/kernel_table.h"
#include "core/util/result.h"

namespace car::tensor::detail {
namespace {

/// Group g (0..7) of a block: its 4 grid indices and the word with the sign codes and the scale.
struct Iq2Group {
  uint32_t grid;   ///< byte l: grid index of elements 8l..8l+7
  uint32_t signs;  ///< bits 7l..7l+6: sign code of elements 8l..; bits 28..31: the group's scale
};
inline Iq2Group iq2_group(const block_iq2_xxs& b, int g) {
  Iq2Group out;
  std::memcpy(&out.grid, b.qs + 4 * g, 4);
  std::memcpy(&out.signs, b.qs + 4 * g + 2, 4);
  return out;
}

/// Element e (0..31) of a group as a signed grid value (magnitude 8, 25 or 43).
inline int iq2_value(const Iq2Group& q, int e) {
  const int l = e / 8, j = e % 8;
  const uint64_t point = iq2xxs_grid[(q.grid >> (8 * l)) & 0xff];
  const int v = static_cast<int>((point >> (8 * j)) & 0xff);
  return (ksigns_iq2xs(static_cast<int>((q.signs >> (7 * l)) & 127)) >> j) & 1 ? -v : v;
}

}  // namespace

bool dequantize_iq2_xxs_ref(const void* src, float* dst, int64_t nb) {
  const auto* x = static_cast<const block_iq2_xxs*>(src);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int g = 0; g < 8; ++g, dst += 32) {
      const Iq2Group q = iq2_group(x[i], g);
      const float db = d * (0.5f + static_cast<float>(q.signs >> 28)) * 0.25f;
      for (int e = 0; e < 32; ++e) dst[e] = db * static_cast<float>(iq2_value(q, e));
    }
  }
  return true;
}

float dot_iq2_xxs_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_iq2_xxs*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {};
    for (int g = 0; g < 8; ++g) {
      const Iq2Group q = iq2_group(x[i], g);
      const int ls = 2 * static_cast<int>(q.signs >> 28) + 1;
      const int8_t* q8 = y[i].qs + 32 * g;
      for (int l = 0; l < 8; ++l) {
        int32_t s = 0;
        for (int e = 4 * l; e < 4 * l + 4; ++e) s += iq2_value(q, e) * q8[e];
        lane[l] += ls * s;
      }
    }
    const float d = fp16_to_fp32(x[i].d) * y[i].d;
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
  }
  const float s0 = acc[4] + acc[0], s1 = acc[5] + acc[1], s2 = acc[6] + acc[2], s3 = acc[7] + acc[3];
  return 0.125f * ((s0 + s2) + (s1 + s3));
}

}  // namespace car::tensor::detail

namespace car::tensor::detail {
namespace {

/// The 3 magnitudes of the IQ2_XXS grid's bytes.
constexpr float kIq2Level[3] = {8.0f, 25.0f, 43.0f};

/// The IQ2_XXS grid as level indices: byte j of point p is one of kIq2Level, entry [j][p] its index.
struct Iq2Levels {
  alignas(32) uint8_t k[8][256];
  Iq2Levels() {
    for (int p = 0; p < 256; ++p) {
      for (int j = 0; j < 8; ++j) {
        const auto b = static_cast<float>((iq2xxs_grid[p] >> (8 * j)) & 0xff);
        int level = 0;
        while (level < 2 && kIq2Level[level] != b) ++level;
        CAR_CHECK(kIq2Level[level] == b);
        k[j][p] = static_cast<uint8_t>(level);
      }
    }
  }
};
const Iq2Levels& iq2_levels() {
  static const Iq2Levels levels;
  return levels;
}

/// err[p] = sum over j in order of sq[j][level of byte j of point p], for the 256 points.
void iq2_point_errors(const float (&sq)[8][3], float* err) {
  const Iq2Levels& lv = iq2_levels();
  for (int p = 0; p < 256; ++p) {
    float e = 0.0f;
    for (int j = 0; j < 8; ++j) e += sq[j][lv.k[j][p]];
    err[p] = e;
  }
}

/// iq2_point_errors with 8 points per register: each lane's entry picked from the element's 3 errors by
/// vpermps, the sums in the same order - the same floats.
__attribute__((target("avx2"))) void iq2_point_errors_avx2(const float (&sq)[8][3], float* err) {
  const Iq2Levels& lv = iq2_levels();
  __m256 table[8];
  for (int j = 0; j < 8; ++j) table[j] = _mm256_setr_ps(sq[j][0], sq[j][1], sq[j][2], 0, 0, 0, 0, 0);
  for (int p = 0; p < 256; p += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int j = 0; j < 8; ++j) {
      const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(lv.k[j] + p)));
      acc = _mm256_add_ps(acc, _mm256_permutevar8x32_ps(table[j], idx));
    }
    _mm256_storeu_ps(err + p, acc);
  }
}

/// One chunk of 8 weights on the IQ2_XXS grid at scale c (value = c * grid byte * sign): the signs of x with
/// an even number of negatives (the smallest |x| takes the odd one), the grid point nearest to the signed
/// magnitudes, and the squared error. `code`: the 7 sign bits of elements 0..6.
/// A point's error is sum_j (c * byte_j - t_j)^2 in element order; a byte is one of 3 magnitudes, so each
/// element's 3 possible squared errors are formed once (the same float operations) and each point's sum adds
/// its 8 entries in the same order - the same floats as forming every term per point, at a fraction of the
/// work (this search was most of the time of the tests that write IQ2_XXS fixtures).
float fit_iq2_chunk(const float* x, float c, int* point, int* code) {
  float t[8];
  int negatives = 0, smallest = 0;
  for (int j = 0; j < 8; ++j) {
    negatives += x[j] < 0.0f;
    if (std::fabs(x[j]) < std::fabs(x[smallest])) smallest = j;
  }
  int signs = 0;
  for (int j = 0; j < 8; ++j) {
    bool neg = x[j] < 0.0f;
    if (negatives % 2 == 1 && j == smallest) neg = !neg;
    signs |= neg ? 1 << j : 0;
    t[j] = neg ? -x[j] : x[j];  // the magnitude the grid must approximate (negative for the flipped one)
  }
  float sq[8][3];
  for (int j = 0; j < 8; ++j) {
    for (int k = 0; k < 3; ++k) {
      const float e = c * kIq2Level[k] - t[j];
      sq[j][k] = e * e;
    }
  }
  alignas(32) float err[256];
  if (search_has_avx2()) {
    iq2_point_errors_avx2(sq, err);
  } else {
    iq2_point_errors(sq, err);
  }
  *code = signs & 127;  // bit 7 is the parity of bits 0..6 (ksigns_iq2xs)
  const int p = first_min_best(err, 256);
  if (p < 0) return INFINITY;
  *point = p;
  return err[p];
}

/// Error of a group of 32 at scale c (its four chunks fitted).
float fit_iq2_group(const float* x, float c, int* points, int* codes) {
  float err = 0.0f;
  for (int l = 0; l < 4; ++l) err += fit_iq2_chunk(x + 8 * l, c, points + l, codes + l);
  return err;
}

}  // namespace

void quantize_iq2_xxs_ref(const float* x, void* dst, int64_t nb) {
  auto* y = static_cast<block_iq2_xxs*>(dst);
  int points[4], codes[4];
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    // Each group's best scale over a few trials around max|x| / 43 (the grid's largest magnitude).
    float group_scale[8];
    float max_scale = 0.0f;
    for (int g = 0; g < 8; ++g) {
      float amax = 0.0f;
      for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[32 * g + j]));
      group_scale[g] = 0.0f;
      float best = INFINITY;
      for (float f : {1.0f, 0.6f, 0.7f, 0.8f, 0.9f, 1.1f, 1.2f}) {
        if (amax == 0.0f) break;
        // A trial scale, then the least-squares scale for the points it picked.
        float c = amax / 43.0f * f;
        fit_iq2_group(x + 32 * g, c, points, codes);
        float sum_gt = 0.0f, sum_gg = 0.0f;
        for (int e = 0; e < 32; ++e) {
          const int l = e / 8, j = e % 8;
          const float gv = static_cast<float>((iq2xxs_grid[points[l]] >> (8 * j)) & 0xff);
          const bool neg = (ksigns_iq2xs(codes[l]) >> j) & 1;
          sum_gt += gv * (neg ? -x[32 * g + e] : x[32 * g + e]);
          sum_gg += gv * gv;
        }
        for (float trial : {c, sum_gt > 0.0f ? sum_gt / sum_gg : c}) {
          const float err = fit_iq2_group(x + 32 * g, trial, points, codes);
          if (err < best) {
            best = err;
            group_scale[g] = trial;
          }
        }
      }
      max_scale = std::fmax(max_scale, group_scale[g]);
    }
    // Super-block scale: the largest group scale is 4-bit scale 15, (0.5 + 15) / 4 = 3.875 units of d.
    y[i].d = fp32_to_fp16(max_scale / 3.875f);
    const float d = fp16_to_fp32(y[i].d);
    for (int g = 0; g < 8; ++g) {
      int s = 0;
      if (d > 0.0f) s = static_cast<int>(std::nearbyint(group_scale[g] / (0.25f * d) - 0.5f));
      s = s < 0 ? 0 : (s > 15 ? 15 : s);
      fit_iq2_group(x + 32 * g, d * (0.5f + static_cast<float>(s)) * 0.25f, points, codes);
      uint32_t aux[2] = {0, static_cast<uint32_t>(s) << 28};
      for (int l = 0; l < 4; ++l) {
        aux[0] |= static_cast<uint32_t>(points[l]) << (8 * l);
        aux[1] |= static_cast<uint32_t>(codes[l]) << (7 * l);
      }
      std::memcpy(y[i].qs + 4 * g, aux, 8);
    }
  }
}

}  // namespace car::tensor::detail

// ---- IQ1_S ----
//
// The dot follows ggml's x86 (AVX2) ggml_vec_dot_iq1_s_q8_K: per super-block 8 int32 lanes of the grid part
// (lane l: elements 4l..4l+3 of each group, times the group scale 2s + 1), FMA'd by d = d(y) * d(x) into 8
// float lanes; the delta part one int per super-block (sum over groups of (2s + 1) * +-1 * the group's
// activation sum, from bsums) accumulated as acc1 = fma(d, float(that), acc1); the result hsum_float_8(acc)
// + 0.125 * acc1.

namespace car::tensor::detail {
namespace {

/// Grid point of elements 8l..8l+7 of group g.
inline uint64_t iq1s_point(const block_iq1_s& b, int g, int l) {
  return iq1s_grid[b.qs[4 * g + l] | (((b.qh[g] >> (3 * l)) & 7) << 8)];
}
inline int iq1s_elem(uint64_t point, int j) {
  return static_cast<int8_t>((point >> (8 * j)) & 0xff);
}

}  // namespace

bool dequantize_iq1_s_ref(const void* src, float* dst, int64_t nb) {
  const auto* x = static_cast<const block_iq1_s*>(src);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(x[i].d);
    for (int g = 0; g < 8; ++g) {
      const float dl = d * static_cast<float>(2 * ((x[i].qh[g] >> 12) & 7) + 1);
      const float delta = x[i].qh[g] & 0x8000 ? -IQ1S_DELTA : IQ1S_DELTA;
      for (int l = 0; l < 4; ++l, dst += 8) {
        const uint64_t point = iq1s_point(x[i], g, l);
        for (int j = 0; j < 8; ++j) dst[j] = dl * (static_cast<float>(iq1s_elem(point, j)) + delta);
      }
    }
  }
  return true;
}

float dot_iq1_s_q8_K_ref(const void* w, const void* a, int64_t n) {
  assert(n % QK_K == 0);
  const auto* x = static_cast<const block_iq1_s*>(w);
  const auto* y = static_cast<const block_q8_K*>(a);
  float acc[8] = {};
  float acc1 = 0.0f;
  for (int64_t i = 0; i < n / QK_K; ++i) {
    int32_t lane[8] = {};
    int32_t sumi1 = 0;
    for (int g = 0; g < 8; ++g) {
      const int ls = 2 * ((x[i].qh[g] >> 12) & 7) + 1;
      const int8_t* q8 = y[i].qs + 32 * g;
      for (int e = 0; e < 32; ++e) lane[e / 4] += ls * iq1s_elem(iq1s_point(x[i], g, e / 8), e % 8) * q8[e];
      const int sign = x[i].qh[g] & 0x8000 ? -1 : 1;
      sumi1 += (y[i].bsums[2 * g] + y[i].bsums[2 * g + 1]) * sign * ls;
    }
    const float d = y[i].d * fp16_to_fp32(x[i].d);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(lane[l]), acc[l]);
    acc1 = std::fma(d, static_cast<float>(sumi1), acc1);
  }
  const float s0 = acc[4] + acc[0], s1 = acc[5] + acc[1], s2 = acc[6] + acc[2], s3 = acc[7] + acc[3];
  return ((s0 + s2) + (s1 + s3)) + IQ1S_DELTA * acc1;
}

}  // namespace car::tensor::detail

// Quantizers of the second slice of codebook formats (IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_M; and IQ1_S), for synthetic
// models (`car gguf synth --type ...`). Plainer than llama-quantize's, and deterministic:
//
//   importance  w_j = sigma2 + x_j^2 per weight (sigma2: the super-block's mean square) - llama-quantize's form
//               for a model without an importance-matrix file (activations assumed uniform), so large weights
//               count more and small ones are never ignored;
//   signs       (IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S) the signs of x; where the format's 7-bit sign code needs an
//               even number of negatives per 8 (IQ3_XXS, IQ2_XS), the least important weight takes the odd one;
//   scale       per scale unit (32 weights, 16 for IQ2_XS / IQ2_S / IQ1_M) four trial scales around
//               max|x| / (largest grid magnitude), each followed by its weighted least-squares rescale; the best
//               by weighted squared error wins. The super-block's fp16 scale maps the largest unit scale to the
//               top 4-bit (3-bit for IQ1_M) scale; each unit's scale is then rounded to its code and its points
//               fitted again at exactly the scale the file holds;
//   points      the grid point with the least weighted squared error: the point of every weight's own best
//               level when the grid has it, else an exhaustive search in which each point's error is the sum
//               of two half-point errors read from tables over every half-point (81 entries for 8 elements of
//               3 magnitudes, 64 for 4 of 8), so a 1024-point grid costs 1024 additions.
//   IQ1_M       as above without signs (its grid is ternary) and with both delta signs tried per 8 weights;
//   IQ1_S       the same with 32-weight scale units and one delta sign per 32.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/tensor/codebook.h"
#include "core/tensor/first_min.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {
namespace {

/// A grid as levels: each point's elements as indices into the grid's distinct values (ascending), and the
/// codes of each half-point (digits in base nlevels) for the half-table search.
struct Codebook {
  int width = 0;    ///< elements per point: 4 or 8
  int nlevels = 0;  ///< distinct element values (3 or 8)
  std::array<float, 8> level{};
  std::vector<uint16_t> lo, hi;  ///< per point: code of elements [0, width/2) and [width/2, width)
  int half_codes = 0;            ///< nlevels^(width/2)
  std::vector<int16_t> point_of;  ///< per full code lo + hi * half_codes: the point with those levels, or -1
};

template <class T>
Codebook make_codebook(const T* grid, int npoints, int width, bool signed_bytes) {
  Codebook cb;
  cb.width = width;
  std::vector<int> values;
  auto value = [&](int p, int j) {
    const int b = grid_byte(grid[p], j);
    return signed_bytes ? static_cast<int8_t>(b) : b;
  };
  for (int p = 0; p < npoints; ++p) {
    for (int j = 0; j < width; ++j) {
      const int v = value(p, j);
      bool seen = false;
      for (int u : values) seen = seen || u == v;
      if (!seen) values.push_back(v);
    }
  }
  std::sort(values.begin(), values.end());
  cb.nlevels = static_cast<int>(values.size());
  for (int k = 0; k < cb.nlevels; ++k) cb.level[static_cast<size_t>(k)] = static_cast<float>(values[static_cast<size_t>(k)]);
  cb.half_codes = 1;
  for (int j = 0; j < width / 2; ++j) cb.half_codes *= cb.nlevels;
  for (int p = 0; p < npoints; ++p) {
    int code[2] = {0, 0};
    for (int j = width - 1; j >= 0; --j) {
      int k = 0;
      while (values[static_cast<size_t>(k)] != value(p, j)) ++k;
      int& c = code[j < width / 2 ? 0 : 1];
      c = c * cb.nlevels + k;  // element j's digit has weight nlevels^(j mod width/2)
    }
    cb.lo.push_back(static_cast<uint16_t>(code[0]));
    cb.hi.push_back(static_cast<uint16_t>(code[1]));
  }
  cb.point_of.assign(static_cast<size_t>(cb.half_codes) * static_cast<size_t>(cb.half_codes), -1);
  for (int p = 0; p < npoints; ++p) {
    cb.point_of[cb.lo[static_cast<size_t>(p)] + static_cast<size_t>(cb.hi[static_cast<size_t>(p)]) *
                                                    static_cast<size_t>(cb.half_codes)] = static_cast<int16_t>(p);
  }
  return cb;
}

const Codebook& codebook(GgmlType t) {
  static const Codebook iq3xxs = make_codebook(iq3xxs_grid, 256, 4, false);
  static const Codebook iq3s = make_codebook(iq3s_grid, 512, 4, false);
  static const Codebook iq2xs = make_codebook(iq2xs_grid, 512, 8, false);
  static const Codebook iq2s = make_codebook(iq2s_grid, 1024, 8, false);
  static const Codebook iq1 = make_codebook(iq1s_grid, 2048, 8, true);
  switch (t) {
    case GgmlType::IQ3_XXS: return iq3xxs;
    case GgmlType::IQ3_S: return iq3s;
    case GgmlType::IQ2_XS: return iq2xs;
    case GgmlType::IQ2_S: return iq2s;
    default: return iq1;
  }
}

/// errs[p] = lo_err[lo code of p] + hi_err[hi code of p] for every point of `cb` (256 to 2048, a multiple of 8),
/// eight points per register by gathers: the same sums as one point at a time.
__attribute__((target("avx2"))) void point_errors_avx2(const Codebook& cb, const float* lo_err, const float* hi_err,
                                                       float* errs) {
  const int npoints = static_cast<int>(cb.lo.size());
  for (int p = 0; p < npoints; p += 8) {
    const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb.lo.data() + p)));
    const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb.hi.data() + p)));
    _mm256_storeu_ps(errs + p, _mm256_add_ps(_mm256_i32gather_ps(lo_err, lo, 4), _mm256_i32gather_ps(hi_err, hi, 4)));
  }
}

/// The point of `cb` nearest to targets t (weights w) at scale c, values offset by `shift` (IQ1_M's delta):
/// error sum_j w_j (c * (level + shift) - t_j)^2. Returns the point; *err its error. The error is a sum over
/// elements, so when every element's own best level makes a grid point that point is the answer; otherwise
/// every point is tried, its error the sum of two half-point errors from tables over all half-points.
int nearest_point(const Codebook& cb, const float* t, const float* w, float c, float shift, float* err) {
  const int h = cb.width / 2, nl = cb.nlevels;
  float cost[8][8];
  int code[2] = {0, 0};
  float free_err = 0.0f;
  for (int j = cb.width - 1; j >= 0; --j) {
    int best_k = 0;
    for (int k = 0; k < nl; ++k) {
      const float e = c * (cb.level[static_cast<size_t>(k)] + shift) - t[j];
      cost[j][k] = w[j] * e * e;
      if (cost[j][k] < cost[j][best_k]) best_k = k;
    }
    free_err += cost[j][best_k];
    code[j < h ? 0 : 1] = code[j < h ? 0 : 1] * nl + best_k;
  }
  const int direct = cb.point_of[static_cast<size_t>(code[0] + code[1] * cb.half_codes)];
  if (direct >= 0) {
    *err = free_err;
    return direct;
  }
  // Half-point tables built digit by digit: entry (code) of the first m elements, for m = 1..h.
  float half[2][81];
  for (int side = 0; side < 2; ++side) {
    float* out = half[side];
    int n = 1;
    out[0] = 0.0f;
    for (int j = 0; j < h; ++j) {  // element j is digit j (weight nl^j)
      for (int k = nl - 1; k >= 0; --k) {
        for (int r = 0; r < n; ++r) out[k * n + r] = out[r] + cost[side * h + j][k];
      }
      n *= nl;
    }
  }
  const int npoints = static_cast<int>(cb.lo.size());
  alignas(32) float errs[2048];
  if (search_has_avx2()) {
    point_errors_avx2(cb, half[0], half[1], errs);
  } else {
    for (int p = 0; p < npoints; ++p) {
      errs[p] = half[0][cb.lo[static_cast<size_t>(p)]] + half[1][cb.hi[static_cast<size_t>(p)]];
    }
  }
  const int best = first_min_best(errs, npoints);
  *err = best < 0 ? INFINITY : errs[best];
  return best < 0 ? 0 : best;
}

float point_value(const Codebook& cb, int p, int j) {
  const int h = cb.width / 2;
  int code = j < h ? cb.lo[static_cast<size_t>(p)] : cb.hi[static_cast<size_t>(p)];
  for (int k = 0; k < j % h; ++k) code /= cb.nlevels;
  return cb.level[static_cast<size_t>(code % cb.nlevels)];
}

/// What the signed formats differ in for the quantizer.
struct SignedFormat {
  int unit;      ///< weights per scale
  bool parity;   ///< sign codes of 7 bits with an even number of negatives per 8
  float step;    ///< value = d * step * (2s + 1) * grid value, s in 0..15
};

/// One super-block of a signed format, fitted: grid points (one per cb.width weights), sign bits (one byte
/// per 8 weights), 4-bit scales (one per unit) and the fp16 super-block scale.
struct SignedFit {
  int point[64];
  uint8_t signs[32];
  int scale[16];
  ggml_half d;
};

/// Points of one unit at scale c; returns the weighted squared error.
float fit_unit(const Codebook& cb, const float* t, const float* w, int n, float c, int* points) {
  float err = 0.0f;
  for (int p = 0; p < n / cb.width; ++p) {
    float e;
    points[p] = nearest_point(cb, t + cb.width * p, w + cb.width * p, c, 0.0f, &e);
    err += e;
  }
  return err;
}

float least_squares_scale(const Codebook& cb, const float* t, const float* w, int n, const int* points,
                          float shift, const float* shifts_per8) {
  float num = 0.0f, den = 0.0f;
  for (int e = 0; e < n; ++e) {
    const float g = point_value(cb, points[e / cb.width], e % cb.width) + shift +
                    (shifts_per8 ? shifts_per8[e / 8] : 0.0f);
    num += w[e] * g * t[e];
    den += w[e] * g * g;
  }
  return den > 0.0f && num > 0.0f ? num / den : 0.0f;
}

constexpr float kTrials[] = {0.7f, 0.85f, 1.0f, 1.1f};

void importance(const float* x, float* w) {
  float sigma2 = 0.0f;
  for (int j = 0; j < QK_K; ++j) sigma2 += x[j] * x[j];
  sigma2 /= QK_K;
  for (int j = 0; j < QK_K; ++j) w[j] = sigma2 + x[j] * x[j];
}

SignedFit fit_signed(const Codebook& cb, const SignedFormat& f, const float* x) {
  SignedFit fit{};
  float w[QK_K], t[QK_K];
  importance(x, w);
  for (int c = 0; c < QK_K / 8; ++c) {
    const float* xc = x + 8 * c;
    int signs = 0, smallest = 0;
    for (int j = 0; j < 8; ++j) {
      if (xc[j] < 0.0f) signs |= 1 << j;
      if (w[8 * c + j] * xc[j] * xc[j] < w[8 * c + smallest] * xc[smallest] * xc[smallest]) smallest = j;
    }
    if (f.parity && __builtin_popcount(static_cast<unsigned>(signs)) % 2 == 1) signs ^= 1 << smallest;
    fit.signs[c] = static_cast<uint8_t>(signs);
    for (int j = 0; j < 8; ++j) t[8 * c + j] = (signs >> j) & 1 ? -xc[j] : xc[j];
  }
  const float top = cb.level[static_cast<size_t>(cb.nlevels - 1)];
  const int units = QK_K / f.unit;
  float unit_scale[16];
  float max_scale = 0.0f;
  int points[64];
  for (int u = 0; u < units; ++u) {
    const float* tu = t + f.unit * u;
    const float* wu = w + f.unit * u;
    float amax = 0.0f;
    for (int e = 0; e < f.unit; ++e) amax = std::fmax(amax, std::fabs(tu[e]));
    unit_scale[u] = 0.0f;
    float best = INFINITY;
    for (float trial : kTrials) {
      if (amax == 0.0f) break;
      const float c = amax / top * trial;
      const float err = fit_unit(cb, tu, wu, f.unit, c, points);
      if (err < best) {
        best = err;
        unit_scale[u] = c;
      }
      const float refined = least_squares_scale(cb, tu, wu, f.unit, points, 0.0f, nullptr);
      if (refined <= 0.0f) continue;
      const float err_refined = fit_unit(cb, tu, wu, f.unit, refined, points);
      if (err_refined < best) {
        best = err_refined;
        unit_scale[u] = refined;
      }
    }
    max_scale = std::fmax(max_scale, unit_scale[u]);
  }
  fit.d = fp32_to_fp16(max_scale / (31.0f * f.step));
  const float d = fp16_to_fp32(fit.d);
  for (int u = 0; u < units; ++u) {
    int s = 0;
    if (d > 0.0f) s = static_cast<int>(std::nearbyint((unit_scale[u] / (d * f.step) - 1.0f) / 2.0f));
    s = s < 0 ? 0 : (s > 15 ? 15 : s);
    fit.scale[u] = s;
    fit_unit(cb, t + f.unit * u, w + f.unit * u, f.unit, d * f.step * static_cast<float>(2 * s + 1),
             fit.point + f.unit / cb.width * u);
  }
  return fit;
}

/// Bits 0..6 of a sign byte: the 7-bit code (bit 7 is implied by parity).
uint32_t code7(uint8_t signs) {
  return signs & 127u;
}

void quantize_iq3_xxs(const float* x, block_iq3_xxs* y, int64_t nb) {
  const Codebook& cb = codebook(GgmlType::IQ3_XXS);
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    const SignedFit f = fit_signed(cb, {32, true, 0.25f}, x);
    std::memset(&y[i], 0, sizeof y[i]);
    y[i].d = f.d;
    for (int g = 0; g < 8; ++g) {
      uint32_t aux = static_cast<uint32_t>(f.scale[g]) << 28;
      for (int l = 0; l < 4; ++l) aux |= code7(f.signs[4 * g + l]) << (7 * l);
      for (int k = 0; k < 8; ++k) y[i].qs[8 * g + k] = static_cast<uint8_t>(f.point[8 * g + k]);
      std::memcpy(y[i].qs + QK_K / 4 + 4 * g, &aux, 4);
    }
  }
}

void quantize_iq3_s(const float* x, block_iq3_s* y, int64_t nb) {
  const Codebook& cb = codebook(GgmlType::IQ3_S);
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    const SignedFit f = fit_signed(cb, {32, false, 1.0f}, x);
    std::memset(&y[i], 0, sizeof y[i]);
    y[i].d = f.d;
    for (int g = 0; g < 8; ++g) {
      for (int k = 0; k < 8; ++k) {
        const int p = f.point[8 * g + k];
        y[i].qs[8 * g + k] = static_cast<uint8_t>(p & 255);
        y[i].qh[g] = static_cast<uint8_t>(y[i].qh[g] | ((p >> 8) << k));
      }
      for (int l = 0; l < 4; ++l) y[i].signs[4 * g + l] = f.signs[4 * g + l];
      y[i].scales[g / 2] = static_cast<uint8_t>(y[i].scales[g / 2] | (f.scale[g] << (4 * (g % 2))));
    }
  }
}

void quantize_iq2_xs(const float* x, block_iq2_xs* y, int64_t nb) {
  const Codebook& cb = codebook(GgmlType::IQ2_XS);
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    const SignedFit f = fit_signed(cb, {16, true, 0.125f}, x);
    std::memset(&y[i], 0, sizeof y[i]);
    y[i].d = f.d;
    for (int c = 0; c < 32; ++c) {
      y[i].qs[c] = static_cast<uint16_t>(static_cast<uint32_t>(f.point[c]) | (code7(f.signs[c]) << 9));
    }
    for (int g = 0; g < 8; ++g) y[i].scales[g] = static_cast<uint8_t>(f.scale[2 * g] | (f.scale[2 * g + 1] << 4));
  }
}

void quantize_iq2_s(const float* x, block_iq2_s* y, int64_t nb) {
  const Codebook& cb = codebook(GgmlType::IQ2_S);
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    const SignedFit f = fit_signed(cb, {16, false, 0.125f}, x);
    std::memset(&y[i], 0, sizeof y[i]);
    y[i].d = f.d;
    for (int c = 0; c < 32; ++c) {
      y[i].qs[c] = static_cast<uint8_t>(f.point[c] & 255);
      y[i].qh[c / 4] = static_cast<uint8_t>(y[i].qh[c / 4] | ((f.point[c] >> 8) << (2 * (c % 4))));
      y[i].qs[QK_K / 8 + c] = f.signs[c];
    }
    for (int g = 0; g < 8; ++g) y[i].scales[g] = static_cast<uint8_t>(f.scale[2 * g] | (f.scale[2 * g + 1] << 4));
  }
}

/// IQ1_M: one unit of 16 weights at scale c - per 8 weights the better delta sign and its point. Returns the
/// weighted squared error.
float fit_iq1m_unit(const Codebook& cb, const float* x, const float* w, float c, int* points, float* shifts) {
  float err = 0.0f;
  for (int h = 0; h < 2; ++h) {
    float best = INFINITY;
    for (float shift : {IQ1M_DELTA, -IQ1M_DELTA}) {
      float e;
      const int p = nearest_point(cb, x + 8 * h, w + 8 * h, c, shift, &e);
      if (e < best) {
        best = e;
        points[h] = p;
        shifts[h] = shift;
      }
    }
    err += best;
  }
  return err;
}

void quantize_iq1_m(const float* x, block_iq1_m* y, int64_t nb) {
  const Codebook& cb = codebook(GgmlType::IQ1_M);
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float w[QK_K];
    importance(x, w);
    float unit_scale[16];
    float max_scale = 0.0f;
    int points[2];
    float shifts[2];
    for (int u = 0; u < 16; ++u) {
      const float* xu = x + 16 * u;
      const float* wu = w + 16 * u;
      float amax = 0.0f;
      for (int e = 0; e < 16; ++e) amax = std::fmax(amax, std::fabs(xu[e]));
      unit_scale[u] = 0.0f;
      float best = INFINITY;
      for (float trial : kTrials) {
        if (amax == 0.0f) break;
        const float c = amax / (1.0f + IQ1M_DELTA) * trial;
        const float err = fit_iq1m_unit(cb, xu, wu, c, points, shifts);
        if (err < best) {
          best = err;
          unit_scale[u] = c;
        }
        const float refined = least_squares_scale(cb, xu, wu, 16, points, 0.0f, shifts);
        if (refined <= 0.0f) continue;
        const float err_refined = fit_iq1m_unit(cb, xu, wu, refined, points, shifts);
        if (err_refined < best) {
          best = err_refined;
          unit_scale[u] = refined;
        }
      }
      max_scale = std::fmax(max_scale, unit_scale[u]);
    }
    const ggml_half dh = fp32_to_fp16(max_scale / 15.0f);
    const float d = fp16_to_fp32(dh);
    std::memset(&y[i], 0, sizeof y[i]);
    uint16_t sc[4] = {0, 0, 0, 0};
    for (int u = 0; u < 16; ++u) {
      int s = 0;
      if (d > 0.0f) s = static_cast<int>(std::nearbyint((unit_scale[u] / d - 1.0f) / 2.0f));
      s = s < 0 ? 0 : (s > 7 ? 7 : s);
      const int g = u / 2;
      sc[g / 2] = static_cast<uint16_t>(sc[g / 2] | (s << (6 * (g % 2) + 3 * (u % 2))));
      fit_iq1m_unit(cb, x + 16 * u, w + 16 * u, d * static_cast<float>(2 * s + 1), points, shifts);
      for (int h = 0; h < 2; ++h) {
        const int l = 2 * (u % 2) + h;  // point l of group g
        y[i].qs[4 * g + l] = static_cast<uint8_t>(points[h] & 255);
        const int nibble = (points[h] >> 8) | (shifts[h] < 0.0f ? 8 : 0);
        y[i].qh[2 * g + l / 2] = static_cast<uint8_t>(y[i].qh[2 * g + l / 2] | (nibble << (4 * (l % 2))));
      }
    }
    for (int k = 0; k < 4; ++k) sc[k] = static_cast<uint16_t>(sc[k] | (((dh >> (4 * k)) & 15) << 12));
    std::memcpy(y[i].scales, sc, 8);
  }
}

/// IQ1_S: one group of 32 at scale c - the better of the two delta signs (one for the group) and its points.
float fit_iq1s_group(const Codebook& cb, const float* x, const float* w, float c, int* points, float* shift) {
  float best = INFINITY;
  int pts[4];
  for (float s : {IQ1S_DELTA, -IQ1S_DELTA}) {
    float err = 0.0f;
    for (int l = 0; l < 4; ++l) {
      float e;
      pts[l] = nearest_point(cb, x + 8 * l, w + 8 * l, c, s, &e);
      err += e;
    }
    if (err < best) {
      best = err;
      *shift = s;
      std::memcpy(points, pts, sizeof pts);
    }
  }
  return best;
}

void quantize_iq1_s(const float* x, block_iq1_s* y, int64_t nb) {
  const Codebook& cb = codebook(GgmlType::IQ1_M);  // the same 2048-point grid
  for (int64_t i = 0; i < nb; ++i, x += QK_K) {
    float w[QK_K];
    importance(x, w);
    float group_scale[8];
    float max_scale = 0.0f;
    int points[4];
    float shift = 0.0f;
    for (int g = 0; g < 8; ++g) {
      const float* xg = x + 32 * g;
      const float* wg = w + 32 * g;
      float amax = 0.0f;
      for (int e = 0; e < 32; ++e) amax = std::fmax(amax, std::fabs(xg[e]));
      group_scale[g] = 0.0f;
      float best = INFINITY;
      for (float trial : kTrials) {
        if (amax == 0.0f) break;
        const float c = amax / (1.0f + IQ1S_DELTA) * trial;
        const float err = fit_iq1s_group(cb, xg, wg, c, points, &shift);
        if (err < best) {
          best = err;
          group_scale[g] = c;
        }
        const float shifts[4] = {shift, shift, shift, shift};
        const float refined = least_squares_scale(cb, xg, wg, 32, points, 0.0f, shifts);
        if (refined <= 0.0f) continue;
        const float err_refined = fit_iq1s_group(cb, xg, wg, refined, points, &shift);
        if (err_refined < best) {
          best = err_refined;
          group_scale[g] = refined;
        }
      }
      max_scale = std::fmax(max_scale, group_scale[g]);
    }
    std::memset(&y[i], 0, sizeof y[i]);
    y[i].d = fp32_to_fp16(max_scale / 15.0f);
    const float d = fp16_to_fp32(y[i].d);
    for (int g = 0; g < 8; ++g) {
      int s = 0;
      if (d > 0.0f) s = static_cast<int>(std::nearbyint((group_scale[g] / d - 1.0f) / 2.0f));
      s = s < 0 ? 0 : (s > 7 ? 7 : s);
      fit_iq1s_group(cb, x + 32 * g, w + 32 * g, d * static_cast<float>(2 * s + 1), points, &shift);
      uint32_t qh = static_cast<uint32_t>(s) << 12 | (shift < 0.0f ? 0x8000u : 0u);
      for (int l = 0; l < 4; ++l) {
        y[i].qs[4 * g + l] = static_cast<uint8_t>(points[l] & 255);
        qh |= static_cast<uint32_t>(points[l] >> 8) << (3 * l);
      }
      y[i].qh[g] = static_cast<uint16_t>(qh);
    }
  }
}

}  // namespace

bool quantize_codebook_ref(GgmlType t, const float* x, void* dst, int64_t nb) {
  switch (t) {
    case GgmlType::IQ3_XXS: quantize_iq3_xxs(x, static_cast<block_iq3_xxs*>(dst), nb); return true;
    case GgmlType::IQ3_S: quantize_iq3_s(x, static_cast<block_iq3_s*>(dst), nb); return true;
    case GgmlType::IQ2_XS: quantize_iq2_xs(x, static_cast<block_iq2_xs*>(dst), nb); return true;
    case GgmlType::IQ2_S: quantize_iq2_s(x, static_cast<block_iq2_s*>(dst), nb); return true;
    case GgmlType::IQ1_M: quantize_iq1_m(x, static_cast<block_iq1_m*>(dst), nb); return true;
    case GgmlType::IQ1_S: quantize_iq1_s(x, static_cast<block_iq1_s*>(dst), nb); return true;
    default: return false;
  }
}

}  // namespace car::tensor::detail

// The IQ panel's row kernel with AVX-512 VNNI (iq_panel.h). Sixteen rows at a time, one per int32 lane: each
// super-block of the 16 rows is decoded and laid out as [sub-block][4-weight group][row][4 bytes], so one
// vpdpbusd takes a group of 4 activations (broadcast, fed as unsigned bytes y + 128) against 16 rows' 4
// weights. Per sub-block the lanes are multiplied by the rows' integer scales and summed; less 128 * wsum
// that is each row's exact integer I, converted and added by FMA per lane - the scalar reference's
// arithmetic lane by lane, so the result equals dot_iq_panel_ref's bit for bit. Four vectors share each
// weight load. Every type decodes 32 values per register: IQ4_XS by pshufb, the sign-grid types as grid points
// with their signs applied by a masked subtraction, IQ1_S / IQ1_M as 8 * ternary point + delta.
#include <cstring>

#include "core/tensor/fp16.h"
#include "core/tensor/iq_panel.h"
#include "core/tensor/iq_panel_driver.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/simd_avx512.h"  // <immintrin.h>, and GCC 12's intrinsic-header warnings off
#include "core/util/result.h"

namespace car::tensor::detail {

namespace {

constexpr int kLanes = 16;             // rows per group
constexpr int kSubs = QK_K / kIqPanelSub;  // 16 sub-blocks of 16 weights

/// One super-block of 16 rows, laid out for the kernel.
struct alignas(64) Group {
  uint8_t w[kSubs][4][kLanes * 4];  // [sub-block][group of 4 weights][row * 4 + byte]
  int32_t scale[kSubs][kLanes];     // [sub-block][row]
  float dfac[kLanes];
  int32_t bias[kLanes];             // 128 * wsum
};

/// Lanes [rows, kLanes) of a group (a chunk's last rows) hold zeros.
void zero_lanes(int rows, Group& g) {
  for (int r = rows; r < kLanes; ++r) {
    for (int s = 0; s < kSubs; ++s) {
      for (int k = 0; k < 4; ++k) std::memset(&g.w[s][k][4 * r], 0, 4);
      g.scale[s][r] = 0;
    }
    g.dfac[r] = 0.0f;
    g.bias[r] = 0;
  }
}

/// One row's super-block decoded with SIMD: v[gi] holds weights 32 gi .. 32 gi + 31 (sub-blocks 2 gi, 2 gi + 1).
struct RowDecode {
  __m256i v[QK_K / 32];
  int8_t iscale[kSubs];
  float dfac;
};

/// Four 8-value grid points with their sign bytes (bit j of byte l: value 8 l + j negated).
inline __m256i signed_points(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, uint32_t signs) {
  const __m256i g = _mm256_setr_epi64x(static_cast<long long>(g0), static_cast<long long>(g1),
                                       static_cast<long long>(g2), static_cast<long long>(g3));
  return _mm256_mask_sub_epi8(g, static_cast<__mmask32>(signs), _mm256_setzero_si256(), g);
}

/// Four 8-value ternary points (bytes -1, 0, 1) as 8 * value + delta, delta one byte per value.
inline __m256i ternary_points(uint64_t g0, uint64_t g1, uint64_t g2, uint64_t g3, __m256i delta) {
  __m256i g = _mm256_setr_epi64x(static_cast<long long>(g0), static_cast<long long>(g1), static_cast<long long>(g2),
                                 static_cast<long long>(g3));
  g = _mm256_add_epi8(g, g);  // no byte shift: 8 * value by three doublings
  g = _mm256_add_epi8(g, g);
  g = _mm256_add_epi8(g, g);
  return _mm256_add_epi8(g, delta);
}

inline uint64_t two_points(uint32_t lo, uint32_t hi) { return static_cast<uint64_t>(lo) | static_cast<uint64_t>(hi) << 32; }

inline uint32_t ksigns4(uint32_t codes) {  // four 7-bit sign codes, 7 bits apart, as four sign bytes
  uint32_t out = 0;
  for (int l = 0; l < 4; ++l) out |= static_cast<uint32_t>(ksigns_iq2xs(static_cast<int>((codes >> (7 * l)) & 127))) << (8 * l);
  return out;
}

inline void pair(int8_t* iscale, int gi, int s) {
  iscale[2 * gi] = static_cast<int8_t>(s);
  iscale[2 * gi + 1] = static_cast<int8_t>(s);
}

/// The SIMD decode of every panel type: the same values, scales and factor as iq_panel_decode (false for any
/// other type).
bool decode_simd(GgmlType t, const uint8_t* block, RowDecode& d) {
  switch (t) {
    case GgmlType::IQ4_XS: {
      const auto& x = *reinterpret_cast<const block_iq4_xs*>(block);
      const __m128i lut = _mm_load_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl));
      const __m128i low4 = _mm_set1_epi8(0x0f);
      d.dfac = fp16_to_fp32(x.d);
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        pair(d.iscale, gi, iq4_xs_scale(x, gi));
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs + 16 * gi));
        d.v[gi] = _mm256_set_m128i(_mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), low4)),
                                   _mm_shuffle_epi8(lut, _mm_and_si128(q, low4)));
      }
      return true;
    }
    case GgmlType::IQ2_XXS: {
      const auto& x = *reinterpret_cast<const block_iq2_xxs*>(block);
      d.dfac = fp16_to_fp32(x.d) * 0.125f;
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        uint32_t aux[2];
        std::memcpy(aux, x.qs + 4 * gi, sizeof aux);
        pair(d.iscale, gi, 2 * static_cast<int>(aux[1] >> 28) + 1);
        d.v[gi] = signed_points(iq2xxs_grid[aux[0] & 0xff], iq2xxs_grid[(aux[0] >> 8) & 0xff],
                                iq2xxs_grid[(aux[0] >> 16) & 0xff], iq2xxs_grid[aux[0] >> 24], ksigns4(aux[1]));
      }
      return true;
    }
    case GgmlType::IQ2_XS: {
      const auto& x = *reinterpret_cast<const block_iq2_xs*>(block);
      d.dfac = fp16_to_fp32(x.d) * 0.125f;
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        d.iscale[2 * gi] = static_cast<int8_t>(2 * (x.scales[gi] & 15) + 1);
        d.iscale[2 * gi + 1] = static_cast<int8_t>(2 * (x.scales[gi] >> 4) + 1);
        const uint16_t* q = x.qs + 4 * gi;
        uint32_t signs = 0;
        for (int l = 0; l < 4; ++l) signs |= static_cast<uint32_t>(ksigns_iq2xs(q[l] >> 9)) << (8 * l);
        d.v[gi] = signed_points(iq2xs_grid[q[0] & 511], iq2xs_grid[q[1] & 511], iq2xs_grid[q[2] & 511],
                                iq2xs_grid[q[3] & 511], signs);
      }
      return true;
    }
    case GgmlType::IQ2_S: {
      const auto& x = *reinterpret_cast<const block_iq2_s*>(block);
      const uint8_t* signs = x.qs + QK_K / 8;
      d.dfac = fp16_to_fp32(x.d) * 0.125f;
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        d.iscale[2 * gi] = static_cast<int8_t>(2 * (x.scales[gi] & 15) + 1);
        d.iscale[2 * gi + 1] = static_cast<int8_t>(2 * (x.scales[gi] >> 4) + 1);
        const uint8_t* qs = x.qs + 4 * gi;
        const int qh = x.qh[gi];
        uint32_t sb;
        std::memcpy(&sb, signs + 4 * gi, 4);
        d.v[gi] = signed_points(iq2s_grid[qs[0] | ((qh << 8) & 0x300)], iq2s_grid[qs[1] | ((qh << 6) & 0x300)],
                                iq2s_grid[qs[2] | ((qh << 4) & 0x300)], iq2s_grid[qs[3] | ((qh << 2) & 0x300)], sb);
      }
      return true;
    }
    case GgmlType::IQ3_XXS: {
      const auto& x = *reinterpret_cast<const block_iq3_xxs*>(block);
      const uint8_t* qs = x.qs;
      d.dfac = fp16_to_fp32(x.d) * 0.25f;
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        uint32_t aux;
        std::memcpy(&aux, x.qs + QK_K / 4 + 4 * gi, sizeof aux);
        pair(d.iscale, gi, 2 * static_cast<int>(aux >> 28) + 1);
        const uint8_t* q = qs + 8 * gi;
        d.v[gi] = signed_points(two_points(iq3xxs_grid[q[0]], iq3xxs_grid[q[1]]),
                                two_points(iq3xxs_grid[q[2]], iq3xxs_grid[q[3]]),
                                two_points(iq3xxs_grid[q[4]], iq3xxs_grid[q[5]]),
                                two_points(iq3xxs_grid[q[6]], iq3xxs_grid[q[7]]), ksigns4(aux));
      }
      return true;
    }
    case GgmlType::IQ3_S: {
      const auto& x = *reinterpret_cast<const block_iq3_s*>(block);
      d.dfac = fp16_to_fp32(x.d);
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        pair(d.iscale, gi, 1 + 2 * ((x.scales[gi / 2] >> (4 * (gi % 2))) & 15));
        const uint8_t* q = x.qs + 8 * gi;
        const int qh = x.qh[gi];
        uint64_t pts[4];
        for (int l = 0; l < 4; ++l) {
          pts[l] = two_points(iq3s_grid[q[2 * l] | ((qh << (8 - 2 * l)) & 256)],
                              iq3s_grid[q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)]);
        }
        uint32_t sb;
        std::memcpy(&sb, x.signs + 4 * gi, 4);
        d.v[gi] = signed_points(pts[0], pts[1], pts[2], pts[3], sb);
      }
      return true;
    }
    case GgmlType::IQ1_S: {
      const auto& x = *reinterpret_cast<const block_iq1_s*>(block);
      d.dfac = fp16_to_fp32(x.d) * 0.125f;
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        const int qh = x.qh[gi];
        pair(d.iscale, gi, 2 * ((qh >> 12) & 7) + 1);
        const uint8_t* q = x.qs + 4 * gi;
        d.v[gi] = ternary_points(iq1s_grid[q[0] | ((qh & 7) << 8)], iq1s_grid[q[1] | (((qh >> 3) & 7) << 8)],
                                 iq1s_grid[q[2] | (((qh >> 6) & 7) << 8)], iq1s_grid[q[3] | (((qh >> 9) & 7) << 8)],
                                 _mm256_set1_epi8(static_cast<char>(qh & 0x8000 ? -1 : 1)));
      }
      return true;
    }
    case GgmlType::IQ1_M: {
      const auto& x = *reinterpret_cast<const block_iq1_m*>(block);
      uint16_t sc[4];
      std::memcpy(sc, x.scales, sizeof sc);
      const uint16_t d16 = iq1_m_scale_bits(sc);
      d.dfac = fp16_to_fp32(d16) * 0.125f;
      for (int gi = 0; gi < QK_K / 32; ++gi) {
        const int s = sc[gi / 2] >> (6 * (gi % 2));
        d.iscale[2 * gi] = static_cast<int8_t>(2 * (s & 7) + 1);
        d.iscale[2 * gi + 1] = static_cast<int8_t>(2 * ((s >> 3) & 7) + 1);
        const int h0 = x.qh[2 * gi];
        const int h1 = x.qh[2 * gi + 1];
        const uint8_t* q = x.qs + 4 * gi;
        // One delta byte per 8 values: -1 where the group's delta bit is set, else +1.
        const __m256i deltas = _mm256_setr_epi64x(static_cast<long long>(h0 & 0x08 ? ~0ull : 0x0101010101010101ull),
                                                  static_cast<long long>(h0 & 0x80 ? ~0ull : 0x0101010101010101ull),
                                                  static_cast<long long>(h1 & 0x08 ? ~0ull : 0x0101010101010101ull),
                                                  static_cast<long long>(h1 & 0x80 ? ~0ull : 0x0101010101010101ull));
        d.v[gi] = ternary_points(iq1s_grid[q[0] | ((h0 << 8) & 0x700)], iq1s_grid[q[1] | ((h0 << 4) & 0x700)],
                                 iq1s_grid[q[2] | ((h1 << 8) & 0x700)], iq1s_grid[q[3] | ((h1 << 4) & 0x700)], deltas);
      }
      return true;
    }
    default:
      return false;
  }
}

/// Row r of a group from a SIMD decode: the weights in the group's layout, the scales, dfac and
/// 128 * wsum (each sub-block's sum by psadbw on the values + 128).
void put_row(const RowDecode& d, int r, Group& g) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  int32_t wsum = 0;
  for (int gi = 0; gi < QK_K / 32; ++gi) {
    alignas(32) uint8_t v[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), d.v[gi]);
    for (int k = 0; k < 4; ++k) {
      std::memcpy(&g.w[2 * gi][k][4 * r], v + 4 * k, 4);
      std::memcpy(&g.w[2 * gi + 1][k][4 * r], v + 16 + 4 * k, 4);
    }
    alignas(32) uint64_t sad[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sad),
                       _mm256_sad_epu8(_mm256_xor_si256(d.v[gi], flip), _mm256_setzero_si256()));
    wsum += d.iscale[2 * gi] * (static_cast<int32_t>(sad[0] + sad[1]) - 16 * 128) +
            d.iscale[2 * gi + 1] * (static_cast<int32_t>(sad[2] + sad[3]) - 16 * 128);
  }
  for (int s = 0; s < kSubs; ++s) g.scale[s][r] = d.iscale[s];
  g.dfac[r] = d.dfac;
  g.bias[r] = 128 * wsum;
}

/// Rows [0, rows) of the group from their super-block at block_offset.
void load_group(GgmlType t, const uint8_t* w, size_t row_bytes, int rows, size_t block_offset, Group& g) {
  RowDecode d;
  for (int r = 0; r < rows; ++r) {
    const bool ok = decode_simd(t, w + static_cast<size_t>(r) * row_bytes + block_offset, d);
    CAR_CHECK(ok);
    put_row(d, r, g);
  }
  zero_lanes(rows, g);
}

inline __m512i bcast4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

struct Avx512Kernel {
  static constexpr int kLanes = detail::kLanes;
  using Act = uint8_t;  // y + 128
  using Group = detail::Group;
  static void convert(const int8_t* qs, uint8_t* dst) {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int c = 0; c < QK_K; c += 64) _mm512_storeu_si512(dst + c, _mm512_xor_si512(_mm512_loadu_si512(qs + c), flip));
  }
  static void load(GgmlType t, const uint8_t* w, size_t row_bytes, int rows, size_t block_offset, Group& g) {
    load_group(t, w, row_bytes, rows, block_offset, g);
  }
  /// acc[v] (16 floats each, one per row) = fma(float(I), dfac * d, acc[v]).
  template <int V>
  static void times(const Group& g, const uint8_t* const* y, const float* d, float* const* acc) {
    __m512i total[V];
    for (int v = 0; v < V; ++v) total[v] = _mm512_setzero_si512();
    for (int s = 0; s < kSubs; ++s) {
      __m512i part[V];
      for (int v = 0; v < V; ++v) part[v] = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) {
        const __m512i wv = _mm512_load_si512(g.w[s][k]);
        for (int v = 0; v < V; ++v) {
          part[v] = _mm512_dpbusd_epi32(part[v], bcast4(y[v] + kIqPanelSub * s + 4 * k), wv);
        }
      }
      const __m512i sc = _mm512_load_si512(g.scale[s]);
      for (int v = 0; v < V; ++v) total[v] = _mm512_add_epi32(total[v], _mm512_mullo_epi32(part[v], sc));
    }
    const __m512i bias = _mm512_load_si512(g.bias);
    const __m512 dfac = _mm512_load_ps(g.dfac);
    for (int v = 0; v < V; ++v) {
      const __m512 i = _mm512_cvtepi32_ps(_mm512_sub_epi32(total[v], bias));
      const __m512 dy = _mm512_mul_ps(dfac, _mm512_set1_ps(d[v]));
      _mm512_storeu_ps(acc[v], _mm512_fmadd_ps(i, dy, _mm512_loadu_ps(acc[v])));
    }
  }
};

}  // namespace

void iq_panel_rows_avx512(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                          size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  iq_panel_drive<Avx512Kernel>(t, w, row_bytes, nrows, acts, act_bytes, nvec, mask, n, y, ldy);
}

}  // namespace car::tensor::detail

// The IQ panel's row kernel with AVX-512 VNNI (iq_panel.h). Sixteen rows at a time, one per int32 lane: each
// super-block of the 16 rows is decoded and laid out as [sub-block][4-weight group][row][4 bytes], so one
// vpdpbusd takes a group of 4 activations (broadcast, fed as unsigned bytes y + 128) against 16 rows' 4
// weights. Per sub-block the lanes are multiplied by the rows' integer scales and summed; less 128 * wsum
// that is each row's exact integer I, converted and added by FMA per lane - the scalar reference's
// arithmetic lane by lane, so the result equals dot_iq_panel_ref's bit for bit. Four vectors share each
// weight load.
#include <cstring>

#include "core/tensor/fp16.h"
#include "core/tensor/iq_panel.h"
#include "core/tensor/iq_panel_driver.h"
#include "core/tensor/iq_tables.h"
#include "core/tensor/simd_avx512.h"  // <immintrin.h>, and GCC 12's intrinsic-header warnings off

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

/// Rows [0, rows) of the group from their super-block at block_offset, through iq_panel_decode.
void load_group(GgmlType t, const uint8_t* w, size_t row_bytes, int rows, size_t block_offset, Group& g) {
  PanelBlock pb;
  for (int r = 0; r < rows; ++r) {
    iq_panel_decode(t, w + static_cast<size_t>(r) * row_bytes + block_offset, pb);
    for (int s = 0; s < kSubs; ++s) {
      for (int k = 0; k < 4; ++k) std::memcpy(&g.w[s][k][4 * r], pb.q + kIqPanelSub * s + 4 * k, 4);
      g.scale[s][r] = pb.iscale[s];
    }
    g.dfac[r] = pb.dfac;
    g.bias[r] = 128 * pb.wsum;
  }
  zero_lanes(rows, g);
}

/// load_group for IQ4_XS, whose decode is a table lookup: 16 values per pshufb, the sums by psadbw.
void load_group_iq4_xs(const uint8_t* w, size_t row_bytes, int rows, size_t block_offset, Group& g) {
  const __m128i lut = _mm_load_si128(reinterpret_cast<const __m128i*>(kvalues_iq4nl));
  const __m128i low4 = _mm_set1_epi8(0x0f);
  const __m128i flip = _mm_set1_epi8(static_cast<char>(0x80));
  for (int r = 0; r < rows; ++r) {
    const auto& x = *reinterpret_cast<const block_iq4_xs*>(w + static_cast<size_t>(r) * row_bytes + block_offset);
    g.dfac[r] = fp16_to_fp32(x.d);
    int32_t wsum = 0;
    for (int gi = 0; gi < QK_K / 32; ++gi) {
      const int ls = ((x.scales_l[gi / 2] >> (4 * (gi % 2))) & 15) | (((x.scales_h >> (2 * gi)) & 3) << 4);
      g.scale[2 * gi][r] = ls - 32;
      g.scale[2 * gi + 1][r] = ls - 32;
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs + 16 * gi));
      const __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(q, low4));                     // sub-block 2 gi
      const __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(q, 4), low4));  // 2 gi + 1
      alignas(16) uint8_t v[32];
      _mm_store_si128(reinterpret_cast<__m128i*>(v), lo);
      _mm_store_si128(reinterpret_cast<__m128i*>(v + 16), hi);
      for (int k = 0; k < 4; ++k) {
        std::memcpy(&g.w[2 * gi][k][4 * r], v + 4 * k, 4);
        std::memcpy(&g.w[2 * gi + 1][k][4 * r], v + 16 + 4 * k, 4);
      }
      // sum(values) = sum(values + 128) - 32 * 128, the biased sums by psadbw against zero.
      const __m128i sad = _mm_add_epi64(_mm_sad_epu8(_mm_xor_si128(lo, flip), _mm_setzero_si128()),
                                        _mm_sad_epu8(_mm_xor_si128(hi, flip), _mm_setzero_si128()));
      const int32_t sum = static_cast<int32_t>(_mm_cvtsi128_si64(sad) + _mm_extract_epi64(sad, 1)) - 32 * 128;
      wsum += (ls - 32) * sum;
    }
    g.bias[r] = 128 * wsum;
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
    if (t == GgmlType::IQ4_XS) {
      load_group_iq4_xs(w, row_bytes, rows, block_offset, g);
    } else {
      load_group(t, w, row_bytes, rows, block_offset, g);
    }
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

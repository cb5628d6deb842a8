// The IQ panel's row kernel with AVX2 (iq_panel.h). Eight rows at a time, one per int32 lane: each
// super-block of the 8 rows is decoded and widened to int16, laid out as [sub-block][pair of weights][row][2],
// so one vpmaddwd takes 2 broadcast activations (widened once per call) against 8 rows' 2 weights - exact,
// where vpmaddubsw's int16 sums could saturate on IQ4_XS's values. Per sub-block the lanes are multiplied by
// the rows' integer scales and summed into each row's exact integer I, converted and added by FMA per lane:
// the scalar reference's arithmetic lane by lane, so the result equals dot_iq_panel_ref's bit for bit. Four
// vectors share each weight load.
#include <immintrin.h>

#include <cstring>

#include "core/tensor/iq_panel.h"
#include "core/tensor/iq_panel_driver.h"

namespace car::tensor::detail {

namespace {

constexpr int kLanes = 8;                   // rows per group
constexpr int kSubs = QK_K / kIqPanelSub;   // 16 sub-blocks of 16 weights
constexpr int kPairs = kIqPanelSub / 2;     // 8 pairs per sub-block

/// One super-block of 8 rows, laid out for the kernel.
struct alignas(32) Group {
  int16_t w[kSubs][kPairs][kLanes * 2];  // [sub-block][pair][row * 2 + element]
  int32_t scale[kSubs][kLanes];          // [sub-block][row]
  float dfac[kLanes];
};

/// Rows [0, rows) of the group from their super-block at block_offset; the other lanes zero.
void load_group(GgmlType t, const uint8_t* w, size_t row_bytes, int rows, size_t block_offset, Group& g) {
  PanelBlock pb;
  for (int r = 0; r < kLanes; ++r) {
    if (r < rows) {
      iq_panel_decode(t, w + static_cast<size_t>(r) * row_bytes + block_offset, pb);
      for (int s = 0; s < kSubs; ++s) {
        for (int p = 0; p < kPairs; ++p) {
          g.w[s][p][2 * r] = pb.q[kIqPanelSub * s + 2 * p];
          g.w[s][p][2 * r + 1] = pb.q[kIqPanelSub * s + 2 * p + 1];
        }
        g.scale[s][r] = pb.iscale[s];
      }
      g.dfac[r] = pb.dfac;
    } else {
      for (int s = 0; s < kSubs; ++s) {
        for (int p = 0; p < kPairs; ++p) g.w[s][p][2 * r] = g.w[s][p][2 * r + 1] = 0;
        g.scale[s][r] = 0;
      }
      g.dfac[r] = 0.0f;
    }
  }
}

inline __m256i bcast_pair(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

struct Avx2Kernel {
  static constexpr int kLanes = detail::kLanes;
  using Act = int16_t;
  using Group = detail::Group;
  static void convert(const int8_t* qs, int16_t* dst) {
    for (int c = 0; c < QK_K; c += 16) {
      const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), _mm256_cvtepi8_epi16(q));
    }
  }
  static void load(GgmlType t, const uint8_t* w, size_t row_bytes, int rows, size_t block_offset, Group& g) {
    load_group(t, w, row_bytes, rows, block_offset, g);
  }
  /// acc[v] (8 floats each, one per row) = fma(float(I), dfac * d, acc[v]).
  template <int V>
  static void times(const Group& g, const int16_t* const* y, const float* d, float* const* acc) {
    __m256i total[V];
    for (int v = 0; v < V; ++v) total[v] = _mm256_setzero_si256();
    for (int s = 0; s < kSubs; ++s) {
      __m256i part[V];
      for (int v = 0; v < V; ++v) part[v] = _mm256_setzero_si256();
      for (int p = 0; p < kPairs; ++p) {
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.w[s][p]));
        for (int v = 0; v < V; ++v) {
          part[v] = _mm256_add_epi32(part[v], _mm256_madd_epi16(bcast_pair(y[v] + kIqPanelSub * s + 2 * p), wv));
        }
      }
      const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.scale[s]));
      for (int v = 0; v < V; ++v) total[v] = _mm256_add_epi32(total[v], _mm256_mullo_epi32(part[v], sc));
    }
    const __m256 dfac = _mm256_load_ps(g.dfac);
    for (int v = 0; v < V; ++v) {
      const __m256 i = _mm256_cvtepi32_ps(total[v]);
      const __m256 dy = _mm256_mul_ps(dfac, _mm256_set1_ps(d[v]));
      _mm256_storeu_ps(acc[v], _mm256_fmadd_ps(i, dy, _mm256_loadu_ps(acc[v])));
    }
  }
};

}  // namespace

void iq_panel_rows_avx2(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  iq_panel_drive<Avx2Kernel>(t, w, row_bytes, nrows, acts, act_bytes, nvec, mask, n, y, ldy);
}

}  // namespace car::tensor::detail

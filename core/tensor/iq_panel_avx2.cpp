// The IQ panel's row kernel with AVX2 (iq_panel.h). Eight rows at a time, one per int32 lane: each
// super-block of the 8 rows is decoded and widened to int16, laid out as [sub-block][pair of weights][row][2],
// so one vpmaddwd takes 2 broadcast activations (widened once per call) against 8 rows' 2 weights - exact,
// where vpmaddubsw's int16 sums could saturate on IQ4_XS's values. Per sub-block the lanes are multiplied by
// the rows' integer scales and summed into each row's exact integer I, converted and added by FMA per lane:
// the scalar reference's arithmetic lane by lane, so the result equals dot_iq_panel_ref's bit for bit. Four
// vectors share each weight load.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/tensor/iq_panel.h"

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

/// V vectors against one group: acc[v] (8 floats each, one per row) = fma(float(I), dfac * d, acc[v]).
template <int V>
void group_times(const Group& g, const int16_t* const* y, const float* d, float* const* acc) {
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

}  // namespace

void iq_panel_rows_avx2(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                        size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK_K;
  const auto bb = static_cast<size_t>(geometry(t).block_bytes);
  // Grow-only scratch: the vectors this call computes, their activations widened to int16 with their
  // scales, [vector][super-block], and the running sums of a group, [vector][row].
  thread_local std::vector<int64_t> vecs;
  thread_local std::vector<int16_t> yw;
  thread_local std::vector<float> yd;
  thread_local std::vector<float> acc;
  vecs.clear();
  for (int64_t i = 0; i < nvec; ++i) {
    if (mask == nullptr || mask[i] != 0) vecs.push_back(i);
  }
  const auto nv = static_cast<int64_t>(vecs.size());
  if (nv == 0) return;
  const auto blocks = static_cast<size_t>(nv * nb);
  if (yw.size() < blocks * QK_K) yw.resize(blocks * QK_K);
  if (yd.size() < blocks) yd.resize(blocks);
  if (acc.size() < static_cast<size_t>(nv * kLanes)) acc.resize(static_cast<size_t>(nv * kLanes));
  for (int64_t j = 0; j < nv; ++j) {
    const auto* a =
        reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(vecs[static_cast<size_t>(j)]) * act_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      int16_t* dst = yw.data() + static_cast<size_t>(j * nb + b) * QK_K;
      for (int c = 0; c < QK_K; c += 16) {
        const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[b].qs + c));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), _mm256_cvtepi8_epi16(q));
      }
      yd[static_cast<size_t>(j * nb + b)] = a[b].d;
    }
  }
  Group g;
  for (int64_t r0 = 0; r0 < nrows; r0 += kLanes) {
    const int rows = static_cast<int>(std::min<int64_t>(kLanes, nrows - r0));
    std::fill(acc.begin(), acc.begin() + nv * kLanes, 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      load_group(t, w + static_cast<size_t>(r0) * row_bytes, row_bytes, rows, static_cast<size_t>(b) * bb, g);
      int64_t j = 0;
      for (; j + 4 <= nv; j += 4) {
        const int16_t* yp[4];
        float d[4];
        float* ap[4];
        for (int v = 0; v < 4; ++v) {
          yp[v] = yw.data() + static_cast<size_t>((j + v) * nb + b) * QK_K;
          d[v] = yd[static_cast<size_t>((j + v) * nb + b)];
          ap[v] = acc.data() + (j + v) * kLanes;
        }
        group_times<4>(g, yp, d, ap);
      }
      for (; j < nv; ++j) {
        const int16_t* yp = yw.data() + static_cast<size_t>(j * nb + b) * QK_K;
        const float d = yd[static_cast<size_t>(j * nb + b)];
        float* ap = acc.data() + j * kLanes;
        group_times<1>(g, &yp, &d, &ap);
      }
    }
    for (int64_t j = 0; j < nv; ++j) {
      float* out = y + vecs[static_cast<size_t>(j)] * ldy + r0;
      std::memcpy(out, acc.data() + j * kLanes, static_cast<size_t>(rows) * sizeof(float));
    }
  }
}

}  // namespace car::tensor::detail

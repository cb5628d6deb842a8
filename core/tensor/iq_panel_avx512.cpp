// The IQ panel's row kernel with AVX-512 VNNI (iq_panel.h). Sixteen rows at a time, one per int32 lane: each
// super-block of the 16 rows is decoded and laid out as [sub-block][4-weight group][row][4 bytes], so one
// vpdpbusd takes a group of 4 activations (broadcast, fed as unsigned bytes y + 128) against 16 rows' 4
// weights. Per sub-block the lanes are multiplied by the rows' integer scales and summed; less 128 * wsum
// that is each row's exact integer I, converted and added by FMA per lane - the scalar reference's
// arithmetic lane by lane, so the result equals dot_iq_panel_ref's bit for bit. Four vectors share each
// weight load.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/tensor/fp16.h"
#include "core/tensor/iq_panel.h"
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

/// V vectors against one group: acc[v] (16 floats each, one per row) = fma(float(I), dfac * d, acc[v]).
template <int V>
void group_times(const Group& g, const uint8_t* const* y, const float* d, float* const* acc) {
  __m512i total[V];
  for (int v = 0; v < V; ++v) total[v] = _mm512_setzero_si512();
  for (int s = 0; s < kSubs; ++s) {
    __m512i part[V];
    for (int v = 0; v < V; ++v) part[v] = _mm512_setzero_si512();
    for (int k = 0; k < 4; ++k) {
      const __m512i wv = _mm512_load_si512(g.w[s][k]);
      for (int v = 0; v < V; ++v) part[v] = _mm512_dpbusd_epi32(part[v], bcast4(y[v] + kIqPanelSub * s + 4 * k), wv);
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

}  // namespace

void iq_panel_rows_avx512(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                          size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK_K;
  const auto bb = static_cast<size_t>(geometry(t).block_bytes);
  // Grow-only scratch: the vectors this call computes, their activations as unsigned bytes (y + 128) with
  // their scales, [vector][super-block], and the running sums of a group, [vector][row].
  thread_local std::vector<int64_t> vecs;
  thread_local std::vector<uint8_t> yu;
  thread_local std::vector<float> yd;
  thread_local std::vector<float> acc;
  vecs.clear();
  for (int64_t i = 0; i < nvec; ++i) {
    if (mask == nullptr || mask[i] != 0) vecs.push_back(i);
  }
  const auto nv = static_cast<int64_t>(vecs.size());
  if (nv == 0) return;
  const auto blocks = static_cast<size_t>(nv * nb);
  if (yu.size() < blocks * QK_K) yu.resize(blocks * QK_K);
  if (yd.size() < blocks) yd.resize(blocks);
  if (acc.size() < static_cast<size_t>(nv * kLanes)) acc.resize(static_cast<size_t>(nv * kLanes));
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t j = 0; j < nv; ++j) {
    const auto* a = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(vecs[static_cast<size_t>(j)]) * act_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = yu.data() + static_cast<size_t>(j * nb + b) * QK_K;
      for (int c = 0; c < QK_K; c += 64) {
        _mm512_storeu_si512(dst + c, _mm512_xor_si512(_mm512_loadu_si512(a[b].qs + c), flip));
      }
      yd[static_cast<size_t>(j * nb + b)] = a[b].d;
    }
  }
  Group g;
  for (int64_t r0 = 0; r0 < nrows; r0 += kLanes) {
    const int rows = static_cast<int>(std::min<int64_t>(kLanes, nrows - r0));
    std::fill(acc.begin(), acc.begin() + nv * kLanes, 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      if (t == GgmlType::IQ4_XS) {
        load_group_iq4_xs(w + static_cast<size_t>(r0) * row_bytes, row_bytes, rows, static_cast<size_t>(b) * bb, g);
      } else {
        load_group(t, w + static_cast<size_t>(r0) * row_bytes, row_bytes, rows, static_cast<size_t>(b) * bb, g);
      }
      int64_t j = 0;
      for (; j + 4 <= nv; j += 4) {
        const uint8_t* yp[4];
        float d[4];
        float* ap[4];
        for (int v = 0; v < 4; ++v) {
          yp[v] = yu.data() + static_cast<size_t>((j + v) * nb + b) * QK_K;
          d[v] = yd[static_cast<size_t>((j + v) * nb + b)];
          ap[v] = acc.data() + (j + v) * kLanes;
        }
        group_times<4>(g, yp, d, ap);
      }
      for (; j < nv; ++j) {
        const uint8_t* yp = yu.data() + static_cast<size_t>(j * nb + b) * QK_K;
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

// The IQ panel's decode (weights as integers times one float factor), its scalar reference dot and the scalar
// row kernel: see iq_panel.h. The bit layouts are the ones the dequantizers in ref_iq2.cpp, ref_iq3.cpp and
// ref_iq4.cpp read; IqPanel.DecodeIsTheDequantizer (tests/tensor/iq_panel_test.cpp) checks every type's
// decode against them bit for bit.
#include "core/tensor/iq_panel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/tensor/fp16.h"
#include "core/tensor/iq_tables.h"
#include "core/util/result.h"

namespace car::tensor::detail {

namespace {

/// Eight values of a grid point (one byte each, element 0 lowest), element j negated where bit j of `signs`
/// is set.
inline void signed8(int8_t* dst, uint64_t point, uint8_t signs) {
  for (int j = 0; j < 8; ++j) {
    const auto v = static_cast<int8_t>((point >> (8 * j)) & 0xff);
    dst[j] = (signs >> j) & 1 ? static_cast<int8_t>(-v) : v;
  }
}

/// The same from two 4-element points (IQ3_XXS, IQ3_S).
inline void signed4x2(int8_t* dst, uint32_t lo, uint32_t hi, uint8_t signs) {
  signed8(dst, static_cast<uint64_t>(lo) | static_cast<uint64_t>(hi) << 32, signs);
}

/// IQ1_S / IQ1_M: eight ternary values (-1, 0, 1) as 8 * value + delta (delta +-1: the format's +-1/8, times 8).
inline void iq1_8(int8_t* dst, uint64_t point, int delta) {
  for (int j = 0; j < 8; ++j) {
    const auto v = static_cast<int8_t>((point >> (8 * j)) & 0xff);
    dst[j] = static_cast<int8_t>(8 * v + delta);
  }
}

inline void pair(int8_t* iscale, int g, int s) {
  iscale[2 * g] = static_cast<int8_t>(s);
  iscale[2 * g + 1] = static_cast<int8_t>(s);
}

void decode_iq2_xxs(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq2_xxs*>(src);
  o.dfac = fp16_to_fp32(x.d) * 0.125f;  // d (ls + 1/2) / 4 = d/8 (2 ls + 1)
  for (int g = 0; g < QK_K / 32; ++g) {
    uint32_t aux[2];
    std::memcpy(aux, x.qs + 4 * g, sizeof aux);
    pair(o.iscale, g, 2 * static_cast<int>(aux[1] >> 28) + 1);
    for (int l = 0; l < 4; ++l) {
      signed8(o.q + 32 * g + 8 * l, iq2xxs_grid[(aux[0] >> (8 * l)) & 0xff],
              ksigns_iq2xs(static_cast<int>((aux[1] >> (7 * l)) & 127)));
    }
  }
}

void decode_iq2_xs(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq2_xs*>(src);
  o.dfac = fp16_to_fp32(x.d) * 0.125f;
  for (int g = 0; g < QK_K / 32; ++g) {
    o.iscale[2 * g] = static_cast<int8_t>(2 * (x.scales[g] & 15) + 1);
    o.iscale[2 * g + 1] = static_cast<int8_t>(2 * (x.scales[g] >> 4) + 1);
    for (int l = 0; l < 4; ++l) {
      const uint16_t q = x.qs[4 * g + l];
      signed8(o.q + 32 * g + 8 * l, iq2xs_grid[q & 511], ksigns_iq2xs(q >> 9));
    }
  }
}

void decode_iq2_s(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq2_s*>(src);
  const uint8_t* signs = x.qs + QK_K / 8;
  o.dfac = fp16_to_fp32(x.d) * 0.125f;
  for (int g = 0; g < QK_K / 32; ++g) {
    o.iscale[2 * g] = static_cast<int8_t>(2 * (x.scales[g] & 15) + 1);
    o.iscale[2 * g + 1] = static_cast<int8_t>(2 * (x.scales[g] >> 4) + 1);
    for (int l = 0; l < 4; ++l) {
      const int idx = x.qs[4 * g + l] | ((x.qh[g] << (8 - 2 * l)) & 0x300);
      signed8(o.q + 32 * g + 8 * l, iq2s_grid[idx], signs[4 * g + l]);
    }
  }
}

void decode_iq3_xxs(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq3_xxs*>(src);
  const uint8_t* qs = x.qs;
  const uint8_t* scales_and_signs = x.qs + QK_K / 4;
  o.dfac = fp16_to_fp32(x.d) * 0.25f;  // d (ls + 1/2) / 2 = d/4 (2 ls + 1)
  for (int g = 0; g < QK_K / 32; ++g) {
    uint32_t aux;
    std::memcpy(&aux, scales_and_signs + 4 * g, sizeof aux);
    pair(o.iscale, g, 2 * static_cast<int>(aux >> 28) + 1);
    for (int l = 0; l < 4; ++l) {
      signed4x2(o.q + 32 * g + 8 * l, iq3xxs_grid[qs[8 * g + 2 * l]], iq3xxs_grid[qs[8 * g + 2 * l + 1]],
                ksigns_iq2xs(static_cast<int>((aux >> (7 * l)) & 127)));
    }
  }
}

void decode_iq3_s(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq3_s*>(src);
  o.dfac = fp16_to_fp32(x.d);  // d (1 + 2 ls)
  for (int g = 0; g < QK_K / 32; ++g) {
    pair(o.iscale, g, 1 + 2 * ((x.scales[g / 2] >> (4 * (g % 2))) & 15));
    for (int l = 0; l < 4; ++l) {
      const int i0 = x.qs[8 * g + 2 * l] | ((x.qh[g] << (8 - 2 * l)) & 256);
      const int i1 = x.qs[8 * g + 2 * l + 1] | ((x.qh[g] << (7 - 2 * l)) & 256);
      signed4x2(o.q + 32 * g + 8 * l, iq3s_grid[i0], iq3s_grid[i1], x.signs[4 * g + l]);
    }
  }
}

void decode_iq1_s(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq1_s*>(src);
  o.dfac = fp16_to_fp32(x.d) * 0.125f;  // d (2 ls + 1) (grid +- 1/8) = d/8 (2 ls + 1) (8 grid +- 1)
  for (int g = 0; g < QK_K / 32; ++g) {
    const int qh = x.qh[g];
    pair(o.iscale, g, 2 * ((qh >> 12) & 7) + 1);
    const int delta = qh & 0x8000 ? -1 : 1;
    for (int l = 0; l < 4; ++l) {
      iq1_8(o.q + 32 * g + 8 * l, iq1s_grid[x.qs[4 * g + l] | (((qh >> (3 * l)) & 7) << 8)], delta);
    }
  }
}

void decode_iq1_m(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq1_m*>(src);
  uint16_t sc[4];
  std::memcpy(sc, x.scales, sizeof sc);
  const uint16_t d16 = iq1_m_scale_bits(sc);
  o.dfac = fp16_to_fp32(d16) * 0.125f;
  for (int g = 0; g < QK_K / 32; ++g) {
    const int s = sc[g / 2] >> (6 * (g % 2));
    o.iscale[2 * g] = static_cast<int8_t>(2 * (s & 7) + 1);
    o.iscale[2 * g + 1] = static_cast<int8_t>(2 * ((s >> 3) & 7) + 1);
    const uint8_t h0 = x.qh[2 * g];
    const uint8_t h1 = x.qh[2 * g + 1];
    const uint8_t* qs = x.qs + 4 * g;
    iq1_8(o.q + 32 * g + 0, iq1s_grid[qs[0] | ((h0 << 8) & 0x700)], h0 & 0x08 ? -1 : 1);
    iq1_8(o.q + 32 * g + 8, iq1s_grid[qs[1] | ((h0 << 4) & 0x700)], h0 & 0x80 ? -1 : 1);
    iq1_8(o.q + 32 * g + 16, iq1s_grid[qs[2] | ((h1 << 8) & 0x700)], h1 & 0x08 ? -1 : 1);
    iq1_8(o.q + 32 * g + 24, iq1s_grid[qs[3] | ((h1 << 4) & 0x700)], h1 & 0x80 ? -1 : 1);
  }
}

void decode_iq4_xs(const void* src, PanelBlock& o) {
  const auto& x = *static_cast<const block_iq4_xs*>(src);
  o.dfac = fp16_to_fp32(x.d);  // d (ls - 32)
  for (int g = 0; g < QK_K / 32; ++g) {
    pair(o.iscale, g, iq4_xs_scale(x, g));
    const uint8_t* qs = x.qs + 16 * g;
    for (int j = 0; j < 16; ++j) {
      o.q[32 * g + j] = kvalues_iq4nl[qs[j] & 15];
      o.q[32 * g + 16 + j] = kvalues_iq4nl[qs[j] >> 4];
    }
  }
}

/// The exact integer I of a decoded super-block against one Q8_K block's values.
struct ScalarDot {
  static int32_t idot(const PanelBlock& b, const int8_t* y) {
    int32_t total = 0;
    for (int s = 0; s < QK_K / kIqPanelSub; ++s) {
      int32_t sum = 0;
      for (int k = 0; k < kIqPanelSub; ++k) sum += b.q[s * kIqPanelSub + k] * y[s * kIqPanelSub + k];
      total += b.iscale[s] * sum;
    }
    return total;
  }
};

}  // namespace

namespace {
std::atomic<bool> g_panel_enabled{true};
/// The scalar row kernel: rows kRows at a time, super-block by super-block, each decoded block serving every
/// vector while their blocks stay in cache; every output's float chain in super-block order.
void panel_rows_scalar(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                       size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  const int64_t nb = n / QK_K;
  const auto bb = static_cast<size_t>(geometry(t).block_bytes);
  thread_local std::vector<int64_t> vecs;  // grow-only scratch: the vectors this call computes
  thread_local std::vector<float> acc;     // kRows x vecs: the outputs' running sums
  vecs.clear();
  for (int64_t i = 0; i < nvec; ++i) {
    if (mask == nullptr || mask[i] != 0) vecs.push_back(i);
  }
  const auto nv = static_cast<int64_t>(vecs.size());
  if (nv == 0) return;
  // Rows are taken kRows at a time, super-block by super-block: each decoded block serves every vector while
  // their blocks (nv x 292 bytes) stay in cache, and each row is read once.
  constexpr int64_t kRows = 16;
  if (acc.size() < static_cast<size_t>(kRows * nv)) acc.resize(static_cast<size_t>(kRows * nv));
  PanelBlock pb;
  for (int64_t r0 = 0; r0 < nrows; r0 += kRows) {
    const int64_t r1 = std::min(nrows, r0 + kRows);
    std::fill(acc.begin(), acc.begin() + (r1 - r0) * nv, 0.0f);
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t r = r0; r < r1; ++r) {
        iq_panel_decode(t, w + static_cast<size_t>(r) * row_bytes + static_cast<size_t>(b) * bb, pb);
        float* ar = acc.data() + (r - r0) * nv;
        for (int64_t j = 0; j < nv; ++j) {
          const auto* a =
              reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(vecs[static_cast<size_t>(j)]) * act_bytes) +
              b;
          const float dy = pb.dfac * a->d;
          ar[j] = std::fma(static_cast<float>(ScalarDot::idot(pb, a->qs)), dy, ar[j]);
        }
      }
    }
    for (int64_t r = r0; r < r1; ++r) {
      const float* ar = acc.data() + (r - r0) * nv;
      for (int64_t j = 0; j < nv; ++j) y[vecs[static_cast<size_t>(j)] * ldy + r] = ar[j];
    }
  }
}

}  // namespace

PanelScratch panel_scratch(size_t nvec, size_t act_bytes, size_t blocks, size_t acc_floats) {
  thread_local std::vector<int64_t> vecs;
  thread_local std::vector<uint8_t> acts;
  thread_local std::vector<float> yd;
  thread_local std::vector<float> acc;
  if (vecs.size() < nvec) vecs.resize(nvec);
  if (acts.size() < act_bytes) acts.resize(act_bytes);
  if (yd.size() < blocks) yd.resize(blocks);
  if (acc.size() < acc_floats) acc.resize(acc_floats);
  return PanelScratch{vecs.data(), acts.data(), yd.data(), acc.data()};
}

bool iq_panel_enabled() { return g_panel_enabled.load(std::memory_order_relaxed); }

bool iq_panel_type(GgmlType t) {
  switch (t) {
    case GgmlType::IQ2_XXS:
    case GgmlType::IQ2_XS:
    case GgmlType::IQ2_S:
    case GgmlType::IQ3_XXS:
    case GgmlType::IQ3_S:
    case GgmlType::IQ1_S:
    case GgmlType::IQ1_M:
    case GgmlType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void iq_panel_decode(GgmlType t, const void* block, PanelBlock& out) {
  switch (t) {
    case GgmlType::IQ2_XXS: decode_iq2_xxs(block, out); break;
    case GgmlType::IQ2_XS: decode_iq2_xs(block, out); break;
    case GgmlType::IQ2_S: decode_iq2_s(block, out); break;
    case GgmlType::IQ3_XXS: decode_iq3_xxs(block, out); break;
    case GgmlType::IQ3_S: decode_iq3_s(block, out); break;
    case GgmlType::IQ1_S: decode_iq1_s(block, out); break;
    case GgmlType::IQ1_M: decode_iq1_m(block, out); break;
    case GgmlType::IQ4_XS: decode_iq4_xs(block, out); break;
    default: CAR_CHECK(false && "iq_panel_decode: not a panel type");
  }
  int32_t wsum = 0;
  for (int s = 0; s < QK_K / kIqPanelSub; ++s) {
    int32_t sum = 0;
    for (int k = 0; k < kIqPanelSub; ++k) sum += out.q[s * kIqPanelSub + k];
    wsum += out.iscale[s] * sum;
  }
  out.wsum = wsum;
}

float dot_iq_panel_ref(GgmlType t, const void* w, const void* a, int64_t n) {
  const auto bb = static_cast<size_t>(geometry(t).block_bytes);
  const auto* y = static_cast<const block_q8_K*>(a);
  PanelBlock pb;
  float acc = 0.0f;
  for (int64_t b = 0; b < n / QK_K; ++b) {
    iq_panel_decode(t, static_cast<const uint8_t*>(w) + static_cast<size_t>(b) * bb, pb);
    acc = std::fma(static_cast<float>(ScalarDot::idot(pb, y[b].qs)), pb.dfac * y[b].d, acc);
  }
  return acc;
}

void iq_panel_rows_scalar(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                          size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  panel_rows_scalar(t, w, row_bytes, nrows, acts, act_bytes, nvec, mask, n, y, ldy);
}

}  // namespace car::tensor::detail

namespace car::tensor {
void set_iq_panel_enabled(bool on) { detail::g_panel_enabled.store(on, std::memory_order_relaxed); }
}  // namespace car::tensor

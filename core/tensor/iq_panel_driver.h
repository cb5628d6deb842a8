// Internal to core/tensor: the row loop of the SIMD IQ panel kernels (iq_panel_avx2.cpp, iq_panel_avx512.cpp),
// instantiated by each with its own kernel type K:
//   K::kLanes                  rows per group (one per int32 lane)
//   K::Act                     the element the activations are turned into once per call
//   K::Group                   one super-block of kLanes rows, laid out for K::times
//   K::convert(qs, dst)        a Q8_K block's 256 values into Acts
//   K::load(t, w, row_bytes, rows, block_offset, g)   rows [0, rows) of a group, the other lanes zero
//   K::times<V>(g, y, d, acc)  V vectors against a group: acc[v][r] = fma(float(I), dfac[r] * d[v], acc[v][r])
// Its scratch comes from iq_panel.cpp (panel_scratch): these files instantiate no standard container, whose
// out-of-line copies, compiled with their ISA's flags, the linker could keep for the whole program.
#pragma once

#include <cstring>

#include "core/tensor/iq_panel.h"

namespace car::tensor::detail {

template <class K>
void iq_panel_drive(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
                    size_t act_bytes, int64_t nvec, const uint8_t* mask, int64_t n, float* y, int64_t ldy) {
  using Act = typename K::Act;
  constexpr int kLanes = K::kLanes;
  const int64_t nb = n / QK_K;
  const auto bb = static_cast<size_t>(geometry(t).block_bytes);
  int64_t nv = 0;
  for (int64_t i = 0; i < nvec; ++i) nv += mask == nullptr || mask[i] != 0 ? 1 : 0;
  if (nv == 0) return;
  const auto blocks = static_cast<size_t>(nv * nb);
  const PanelScratch sc = panel_scratch(static_cast<size_t>(nv), blocks * QK_K * sizeof(Act), blocks,
                                        static_cast<size_t>(nv * kLanes));
  nv = 0;
  for (int64_t i = 0; i < nvec; ++i) {
    if (mask == nullptr || mask[i] != 0) sc.vecs[nv++] = i;
  }
  // The vectors' activations, turned once, with their scales: [vector][super-block].
  auto* ya = static_cast<Act*>(sc.acts);
  for (int64_t j = 0; j < nv; ++j) {
    const auto* a = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(sc.vecs[j]) * act_bytes);
    for (int64_t b = 0; b < nb; ++b) {
      K::convert(a[b].qs, ya + static_cast<size_t>(j * nb + b) * QK_K);
      sc.yd[j * nb + b] = a[b].d;
    }
  }
  typename K::Group g;
  for (int64_t r0 = 0; r0 < nrows; r0 += kLanes) {
    const int rows = static_cast<int>(nrows - r0 < kLanes ? nrows - r0 : kLanes);
    std::memset(sc.acc, 0, static_cast<size_t>(nv * kLanes) * sizeof(float));
    for (int64_t b = 0; b < nb; ++b) {
      K::load(t, w + static_cast<size_t>(r0) * row_bytes, row_bytes, rows, static_cast<size_t>(b) * bb, g);
      int64_t j = 0;
      for (; j + 4 <= nv; j += 4) {  // four vectors share each weight load
        const Act* yp[4];
        float d[4];
        float* ap[4];
        for (int v = 0; v < 4; ++v) {
          yp[v] = ya + static_cast<size_t>((j + v) * nb + b) * QK_K;
          d[v] = sc.yd[(j + v) * nb + b];
          ap[v] = sc.acc + (j + v) * kLanes;
        }
        K::template times<4>(g, yp, d, ap);
      }
      for (; j < nv; ++j) {
        const Act* yp = ya + static_cast<size_t>(j * nb + b) * QK_K;
        const float d = sc.yd[j * nb + b];
        float* ap = sc.acc + j * kLanes;
        K::template times<1>(g, &yp, &d, &ap);
      }
    }
    for (int64_t j = 0; j < nv; ++j) {
      std::memcpy(y + sc.vecs[j] * ldy + r0, sc.acc + j * kLanes, static_cast<size_t>(rows) * sizeof(float));
    }
  }
}

}  // namespace car::tensor::detail

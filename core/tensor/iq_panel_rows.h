// Internal to core/tensor: the row loop of the IQ panel kernels (iq_panel.h), shared by the scalar and the
// AVX-512 kernel, each of which instantiates it with its integer dot in its own instruction set.
//
// K provides `Prepared K::prepare(const PanelBlock&)` (per decoded super-block) and
// `int32_t K::idot(const Prepared&, const int8_t* y_qs)` (the exact integer I of that super-block against one
// Q8_K block's values). The loop keeps every output's float chain in super-block order, as the reference does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/tensor/iq_panel.h"
#include "core/tensor/kernel_table.h"

namespace car::tensor::detail {

template <class K>
void iq_panel_rows_impl(GgmlType t, const uint8_t* w, size_t row_bytes, int64_t nrows, const uint8_t* acts,
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
        const auto prep = K::prepare(pb);
        float* ar = acc.data() + (r - r0) * nv;
        for (int64_t j = 0; j < nv; ++j) {
          const auto* a = reinterpret_cast<const block_q8_K*>(acts + static_cast<size_t>(vecs[static_cast<size_t>(j)]) * act_bytes) + b;
          const float dy = pb.dfac * a->d;
          ar[j] = std::fma(static_cast<float>(K::idot(prep, a->qs)), dy, ar[j]);
        }
      }
    }
    for (int64_t r = r0; r < r1; ++r) {
      const float* ar = acc.data() + (r - r0) * nv;
      for (int64_t j = 0; j < nv; ++j) y[vecs[static_cast<size_t>(j)] * ldy + r] = ar[j];
    }
  }
}

}  // namespace car::tensor::detail

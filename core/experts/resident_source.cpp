#include "core/experts/resident_source.h"

#include <algorithm>
#include <memory>

#include "core/tensor/kernels.h"
#include "core/util/result.h"

namespace car::experts {

ResidentExpertSource::Interleaved ResidentExpertSource::interleave(std::vector<ExpertBankInfo> banks,
                                                                   bool mapped) {
  std::vector<tensor::MatrixView*> views;
  for (ExpertBankInfo& b : banks) {
    if (b.n_expert <= 0) continue;
    for (tensor::MatrixView* v : {&b.gate_bank, &b.up_bank, &b.down_bank}) {
      // Every expert's slice whole groups of 16 rows: the bank's groups never straddle two experts.
      if (v->rows % b.n_expert == 0 && tensor::can_interleave(expert_slice(*v, b.n_expert, 0))) views.push_back(v);
    }
  }
  Interleaved out;
  out.owned = tensor::interleave_all(views, mapped, /*threads=*/0);
  out.banks = std::move(banks);
  return out;
}

ResidentExpertSource::ResidentExpertSource(std::vector<ExpertBankInfo> banks, bool mapped)
    : ResidentExpertSource(interleave(std::move(banks), mapped)) {}

ResidentExpertSource::ResidentExpertSource(Interleaved il)
    : ExpertSource(std::move(il.banks)), owned_(std::move(il.owned)) {
  size_t total = 0;
  layer_base_.reserve(static_cast<size_t>(n_layers()));
  for (int l = 0; l < n_layers(); ++l) {
    layer_base_.push_back(total);
    total += static_cast<size_t>(n_expert(l));
  }
  uses_ = std::make_unique<std::atomic<uint64_t>[]>(total);
  for (size_t i = 0; i < total; ++i) uses_[i].store(0, std::memory_order_relaxed);
}

Result<ExpertLease> ResidentExpertSource::acquire(int layer, int expert) {
  CAR_CHECK(layer >= 0 && layer < n_layers());
  const ExpertBankInfo& b = bank(layer);
  CAR_CHECK(expert >= 0 && expert < b.n_expert);
  uses_[layer_base_[static_cast<size_t>(layer)] + static_cast<size_t>(expert)].fetch_add(
      1, std::memory_order_relaxed);
  ExpertWeights w;
  w.gate = expert_slice(b.gate_bank, b.n_expert, expert);
  w.up = expert_slice(b.up_bank, b.n_expert, expert);
  w.down = expert_slice(b.down_bank, b.n_expert, expert);
  // No release needed: the mapping outlives every lease.
  return ExpertLease(nullptr, layer, expert, w, 0);
}

uint64_t ResidentExpertSource::use_count(int layer, int expert) const {
  CAR_CHECK(layer >= 0 && layer < n_layers() && expert >= 0 && expert < n_expert(layer));
  return uses_[layer_base_[static_cast<size_t>(layer)] + static_cast<size_t>(expert)].load(
      std::memory_order_relaxed);
}

}  // namespace car::experts

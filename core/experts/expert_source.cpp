#include "core/experts/expert_source.h"

#include "core/util/result.h"

namespace car::experts {

ExpertLease& ExpertLease::operator=(ExpertLease&& other) noexcept {
  if (this != &other) {
    reset();
    source_ = other.source_;
    layer_ = other.layer_;
    expert_ = other.expert_;
    token_ = other.token_;
    weights_ = other.weights_;
    other.source_ = nullptr;
    other.layer_ = -1;
    other.expert_ = -1;
  }
  return *this;
}

void ExpertLease::reset() {
  if (source_ != nullptr) {
    source_->release(layer_, expert_, token_);
    source_ = nullptr;
  }
  weights_ = {};
}

Result<void> ExpertSource::acquire_many(int layer, std::span<const int> experts,
                                        std::vector<ExpertLease>& out) {
  out.clear();
  out.reserve(experts.size());
  for (int e : experts) {
    Result<ExpertLease> r = acquire(layer, e);
    if (!r.ok()) {
      out.clear();
      return r.error();
    }
    out.push_back(std::move(r).value());
  }
  return {};
}

tensor::MatrixView expert_slice(const tensor::MatrixView& bank, int n_expert, int e) {
  CAR_CHECK(n_expert > 0 && e >= 0 && e < n_expert);
  CAR_CHECK(bank.rows % n_expert == 0);
  tensor::MatrixView v = bank;
  v.rows = bank.rows / n_expert;
  v.data = bank.data + static_cast<size_t>(e) * static_cast<size_t>(v.rows) * bank.row_bytes;
  return v;
}

}  // namespace car::experts

// ResidentExpertSource: experts are views into the mmapped GGUF file; acquire() does no I/O and no locking.
//
// The pages of the banks are faulted in by the kernels as they read them, like every other weight. Usage
// counts are kept per (layer, expert) with relaxed atomics so the streaming issue's sidecar can be fed
// from a resident run too.
//
// Thread safety: acquire() may be called concurrently; the banks are immutable.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "core/experts/expert_source.h"

namespace car::experts {

class ResidentExpertSource final : public ExpertSource {
 public:
  /// `banks` must outlive the source's leases (they point into the caller's mapping).
  explicit ResidentExpertSource(std::vector<ExpertBankInfo> banks);

  Result<ExpertLease> acquire(int layer, int expert) override;

  /// How many times expert `expert` of `layer` was acquired.
  uint64_t use_count(int layer, int expert) const;

 private:
  std::vector<size_t> layer_base_;                 // index of (layer, 0) in uses_
  std::unique_ptr<std::atomic<uint64_t>[]> uses_;  // per (layer, expert) acquire counts
};

}  // namespace car::experts

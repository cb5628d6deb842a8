// ResidentExpertSource: experts are views into the mmapped GGUF file, or into the source's interleaved copy
// of a bank; acquire() does no I/O and no locking.
//
// A bank whose experts can take the interleaved layout (tensor::can_interleave: Q4_K or Q6_K, rows a multiple
// of 16, under kernels that have it) is copied into it at construction, as the model's dense matrices are at
// load (issue #29: decode's expert rows then stream at the read bandwidth, and batched steps skip the
// per-call transposition), and the mapping's pages of the original are dropped when the caller says the banks
// are a file mapping. The pages of the other banks are faulted in by the kernels as they read them. Usage
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
  /// `banks` must outlive the source's leases (they point into the caller's mapping). `mapped`: the banks'
  /// bytes are a read-only file mapping whose pages may be dropped once interleaved (never set it for other
  /// memory).
  explicit ResidentExpertSource(std::vector<ExpertBankInfo> banks, bool mapped = false);

  Result<ExpertLease> acquire(int layer, int expert) override;

  /// How many times expert `expert` of `layer` was acquired.
  uint64_t use_count(int layer, int expert) const override;

 private:
  struct Interleaved {
    std::vector<ExpertBankInfo> banks;
    std::shared_ptr<uint8_t> owned;
  };
  static Interleaved interleave(std::vector<ExpertBankInfo> banks, bool mapped);
  explicit ResidentExpertSource(Interleaved il);

  std::shared_ptr<uint8_t> owned_;                 // the interleaved copies of banks (null: none)
  std::vector<size_t> layer_base_;                 // index of (layer, 0) in uses_
  std::unique_ptr<std::atomic<uint64_t>[]> uses_;  // per (layer, expert) acquire counts
};

}  // namespace car::experts

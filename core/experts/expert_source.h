// ExpertSource: where the MoE forward pass gets one routed expert's gate / up / down weights.
//
// A GGUF MoE layer stores its routed experts as three stacked banks, `blk.N.ffn_{gate,up,down}_exps.weight`
// with ggml shape [n_embd, n_ff, n_expert] (gate, up) and [n_ff, n_embd, n_expert] (down): expert e's matrix
// is the e-th run of `rows * row_bytes` bytes of the bank. The forward pass asks the source for an expert,
// holds the returned ExpertLease while it multiplies, and drops it afterwards; it never learns whether the
// bytes are a view into the mmapped file (ResidentExpertSource) or a slot in a cache filled by positional
// reads (the streamed source). A lease keeps its bytes valid - a streaming source must not evict a leased
// expert - so lease lifetimes should be short (one MoE block).
//
// Thread safety: acquire() and the lease's release may be called from several threads at once; each
// implementation says how it synchronizes. ResidentExpertSource is immutable and lock-free.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/experts/expert_bank.h"
#include "core/tensor/kernels.h"
#include "core/util/result.h"

namespace car::experts {

/// One expert's three matrices. Non-owning views; valid while the lease that produced them lives.
struct ExpertWeights {
  tensor::MatrixView gate;  ///< (n_ff, n_embd): rows n_ff, cols n_embd
  tensor::MatrixView up;    ///< (n_ff, n_embd)
  tensor::MatrixView down;  ///< (n_embd, n_ff)
};

/// Telemetry of one source (one model). All zero for the resident source. A streamed source's budget is
/// the shared pool's; its cap, cache and counters are its own.
struct ExpertStats {
  std::string mode = "resident";            ///< "resident" | "streamed"
  uint64_t budget_bytes = 0;                ///< the pool's budget (shared by every streamed model)
  uint64_t cache_bytes = 0;                 ///< this source's share: sum over its banks of cap x slot bytes
  uint64_t floor_bytes = 0;                 ///< its share at the smallest cap (one slot per bank)
  uint64_t resident_bytes = 0;              ///< slot memory held now (pinned + cached + in flight)
  uint64_t bytes_read = 0;                  ///< from disk, demand and prefetch
  int banks = 0;                            ///< MoE layers
  int cap = 0;                              ///< slots per bank (the smallest bank's, if they differ)
  int pinned = 0;                           ///< experts pinned and loaded, all banks
  int cached = 0;                           ///< experts loaded and not pinned, all banks
  uint64_t hits = 0, misses = 0;            ///< demand requests served without / with a new disk read
  double hit_rate = 0;                      ///< hits / (hits + misses)
  double read_p50_us = 0, read_p99_us = 0;  ///< one expert's load (gate + up + down), log histogram (+-10%)
  uint64_t prefetch_issued = 0;             ///< prefetch reads started
  uint64_t prefetch_used = 0;               ///< of those, demanded before eviction
  double prefetch_recall =
      0;  ///< prefetch_used / (prefetch_used + misses): share of needed reads prefetch had started
  /// The prefetch gate (StreamedExpertSource::prefetch). Guesses of experts not held, over each MoE layer's
  /// last steps, pooled: the share the step they were made for then used (read ahead or only scored).
  double prefetch_precision = 0;
  int prefetch_layers_on = 0;    ///< MoE layers whose guesses are read ahead now (the others are scored only)
  uint64_t prefetch_scored = 0;  ///< guesses scored without a read (their layer's gate was closed)
};

class ExpertSource;

/// A pinned expert: its weights stay valid until the lease is destroyed. Move-only.
class ExpertLease {
 public:
  ExpertLease() = default;
  ExpertLease(ExpertSource* source, int layer, int expert, ExpertWeights weights, uint64_t token)
      : source_(source), layer_(layer), expert_(expert), token_(token), weights_(weights) {}
  ExpertLease(ExpertLease&& other) noexcept { *this = std::move(other); }
  ExpertLease& operator=(ExpertLease&& other) noexcept;
  ExpertLease(const ExpertLease&) = delete;
  ExpertLease& operator=(const ExpertLease&) = delete;
  ~ExpertLease() { reset(); }

  const ExpertWeights& weights() const { return weights_; }
  int layer() const { return layer_; }
  int expert() const { return expert_; }
  /// Release early.
  void reset();

 private:
  ExpertSource* source_ = nullptr;  // non-owning; null for an empty lease or a source that needs no release
  int layer_ = -1;
  int expert_ = -1;
  uint64_t token_ = 0;  // the source's own bookkeeping (e.g. a cache slot)
  ExpertWeights weights_;
};

class ExpertSource {
 public:
  virtual ~ExpertSource() = default;

  /// Pin expert `expert` of MoE layer `layer` and return its weights. Both indices must be in range
  /// (the forward pass only asks for experts its router chose). Streaming sources may block on I/O.
  /// Errors: "io_error" (a streamed expert could not be read; the source stays usable).
  virtual Result<ExpertLease> acquire(int layer, int expert) = 0;
  /// All of one layer's experts at once: a streaming source issues every miss together, reads outside its
  /// lock and reads an expert wanted twice once. `out` is cleared and receives one lease per entry of
  /// `experts`, in the same order (duplicates get one lease each). Callers should ask for at most
  /// slots(layer) distinct experts at once. On error `out` is left empty (no lease held). Default: loop
  /// over acquire().
  virtual Result<void> acquire_many(int layer, std::span<const int> experts, std::vector<ExpertLease>& out);
  /// Hint: these experts of `layer` will be acquired soon (a streaming source may start reads on a
  /// low-priority queue that never delays a demand read). Called once per step and MoE layer before the
  /// layer's acquires (the streamed source scores each guess against the acquires that follow it, up to the
  /// next guess for the layer). Default: none.
  virtual void prefetch(int layer, std::span<const int> experts) {}
  /// Distinct experts of `layer` that can be leased at once within the memory budget (resident: n_expert).
  virtual int slots(int layer) const { return n_expert(layer); }
  /// Telemetry. Default: mode "resident", all zero.
  virtual ExpertStats stats() const { return {}; }
  /// Persist the usage sidecar (streamed source; the resident source has none). Thread-safe.
  virtual Result<void> save_usage() { return {}; }
  /// Bytes this source keeps in memory beyond the mapped file (0 for the resident source).
  virtual uint64_t resident_bytes() const { return 0; }
  /// True when experts come from disk reads rather than the mapping.
  virtual bool streams() const { return false; }
  /// How many leases expert `expert` of `layer` has had in this run (acquire_many counts each entry). A step
  /// leases each expert its rows chose once, whatever their number, so this counts the expert's weight reads.
  virtual uint64_t use_count(int layer, int expert) const = 0;

  int n_layers() const { return static_cast<int>(banks_.size()); }
  /// Experts of `layer`; 0 for a dense layer.
  int n_expert(int layer) const { return banks_[static_cast<size_t>(layer)].n_expert; }
  const ExpertBankInfo& bank(int layer) const { return banks_[static_cast<size_t>(layer)]; }

 protected:
  explicit ExpertSource(std::vector<ExpertBankInfo> banks) : banks_(std::move(banks)) {}

 private:
  friend class ExpertLease;
  /// Called once per non-empty lease with a source when it ends.
  virtual void release(int layer, int expert, uint64_t token) {}

  std::vector<ExpertBankInfo> banks_;  // one per layer; n_expert == 0 for dense layers
};

/// The slice of a bank that is expert `e`'s matrix: `rows_per_expert` rows starting at e * rows_per_expert.
tensor::MatrixView expert_slice(const tensor::MatrixView& bank, int n_expert, int e);

}  // namespace car::experts

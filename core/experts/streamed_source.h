// StreamedExpertSource: MoE experts read from disk on demand into a bounded cache, for models larger than
// memory. They share an ExpertPool (core/experts/expert_pool.h): one budget and the reader threads.
//
// Contract. Per MoE layer the source keeps one bank: a cache of slots, each slot holding one expert's gate,
// up and down matrices (the same file bytes as the resident slices, so output is bit-identical). acquire()
// serves an expert from the bank's pinned set, else from its LRU, else reads it (gate, up and down by one
// reader job, back to back). A leased slot is never evicted. acquire_many() leases the experts it finds held
// first (so none of them is evicted for one of the call's own misses), then issues all its misses at once to
// the pool's reader threads (queue depth = StreamOptions::io_threads, default 8) and waits for them.
// prefetch() queues reads on a low-priority queue: a reader takes a prefetch job only when no demand job is
// queued, and at most half the readers serve prefetches at once, so demand reads always find free readers;
// a demand for an expert whose prefetch is queued promotes it, one being read is waited for. A prefetch
// only takes a free slot or evicts one outside its own guess (it never over-commits), and is dropped when
// there is none.
//
// The prefetch gate. A prefetch never saves a byte: a right guess only moves a read the step would have made
// off its critical path, a wrong one is a read (and an eviction) more. So each bank scores its guesses: a
// guess of an expert not held is "used" when the acquires of the step it was made for (those up to the next
// prefetch() of the layer) ask for it - and, if it was read ahead, find that read still cached. Over the
// bank's last kGateSteps guesses (at least kGateMinSamples scored experts) the used share is its precision;
// the bank reads its guesses ahead only while that is at least StreamOptions::prefetch_min_precision.
// A bank starts closed: until its guesses have shown their precision, and whenever it falls below the
// threshold, they are scored without a read (a probe that costs no I/O, every step), so a closed gate opens
// again as soon as the guesses get better. Scoring never changes what is leased: output is the same either
// way.
//
// Capacity. The pool's budget sets a cap per bank (slots, pinned ones included). slots(layer) is the cap
// minus the bank's pin set. A request for more unpinned experts than the free slots is served by
// over-committing - the bank briefly holds more than its cap, by at most the number of leased slots, and
// gives the excess back as the leases end - never by blocking or failing. A caller that wants memory to stay
// within the budget acquires at most slots(layer) distinct experts at once (prefill in waves).
//
// I/O (ExpertFile, core/experts/expert_file.h). The file is opened with O_DIRECT when
// StreamOptions::direct_io is set and the filesystem accepts it; GGUF aligns tensor data to 32 bytes only,
// so each matrix is read as the 4096-aligned window around it into a page-aligned slot and the views point
// inside. If O_DIRECT is refused (open or read fails with EINVAL) the source falls back to buffered reads
// followed by posix_fadvise(DONTNEED) so the page cache stays bounded. A failed or short read fails that request with Error{"io_error", file, offset, errno
// text}; the slot is not admitted, every waiter gets the error and the next acquire retries the read.
//
// Learned pinning. Usage counts are kept per (layer, expert). The usage sidecar (StreamOptions::
// sidecar_path, one per model, see sidecar_path()) holds lines `name expert count`, name being the bank
// tensor `blk.N.ffn_{gate,up,down}_exps.weight` (the seed's format; the three names carry the same
// count). At open the counts pick each bank's pin set - its hottest experts, up to 25% of its cap - and
// those experts are read at once. save_usage() merges this run's new counts into the file crash-safely
// (temp file in the same directory, fsync, rename, under an advisory lock file so concurrent savers add
// up); malformed, torn (no final newline) or foreign lines are skipped with a warning (take_warnings()),
// never fatal. When the pool re-sizes a bank its pin set follows the new cap (pins dropped to the LRU, or
// added and read at their next use).
//
// Ownership. The source owns its file descriptors and slot memory; it holds the pool by shared_ptr and
// leaves it (its banks' share returns to the other models) when destroyed. Leases point into slots and
// must end before the source is destroyed.
//
// Thread safety. Every public member may be called from any thread. One mutex per source guards its banks;
// no lock is held across I/O. The pool has its own mutex (taken before a source's, never after).
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/experts/expert_pool.h"
#include "core/experts/expert_source.h"
#include "core/util/result.h"
#include "core/util/thread_annotations.h"

namespace car::experts {

class ExpertPool;
class StreamedExpertSource;

/// The bytes of one expert's slot: each projection's `proj_bytes` rounded up to the O_DIRECT alignment,
/// plus one alignment block (any alignment of its start in the file fits). What a bank's cap is charged per
/// slot; estimates of a streamed model's memory use it too.
uint64_t expert_slot_bytes(const uint64_t (&proj_bytes)[3]);

/// The sidecar for a model: `<state_dir>/experts/<model file stem>-<12 hex digits>.usage`, the digits a
/// hash of the model's absolute path and size, so two models (or a model replaced by another file of the
/// same name) never share counts. Errors: "not_found" (the model cannot be stat'ed).
Result<std::string> sidecar_path(const std::string& state_dir, const std::string& model_path);

class StreamedExpertSource final : public ExpertSource {
 public:
  /// Open `path` (the GGUF the banks come from) for streaming; `banks` as Model::expert_banks() gives them
  /// (n_expert 0 for dense layers; only the geometry, type and file offsets are used). Joins the pool,
  /// loads the sidecar and reads the pinned experts. Errors: "io_error" (open, or a pinned read, failed),
  /// "load_failed" (a bank's geometry does not fit the file).
  static Result<std::unique_ptr<StreamedExpertSource>> open(const std::string& path,
                                                            std::vector<ExpertBankInfo> banks,
                                                            StreamOptions options);
  ~StreamedExpertSource() override;

  Result<ExpertLease> acquire(int layer, int expert) override;
  Result<void> acquire_many(int layer, std::span<const int> experts, std::vector<ExpertLease>& out) override;
  void prefetch(int layer, std::span<const int> experts) override;
  int slots(int layer) const override;
  ExpertStats stats() const override;
  Result<void> save_usage() override;
  uint64_t resident_bytes() const override;
  bool streams() const override { return true; }

  /// True while reads use O_DIRECT (false after a fallback, or when the filesystem refused it).
  bool direct_io() const;
  /// This run's acquire count of (layer, expert), saved or not.
  uint64_t use_count(int layer, int expert) const override;
  /// The pool's layout line after this source joined (for the caller's log).
  const PoolLayout& join_layout() const { return join_layout_; }
  /// Warnings collected since the last call (sidecar lines skipped, O_DIRECT fallback); clears them.
  std::vector<std::string> take_warnings();

 private:
  struct Impl;
  friend class ExpertPool;
  StreamedExpertSource(std::vector<ExpertBankInfo> banks, std::unique_ptr<Impl> impl);
  void release(int layer, int expert, uint64_t token) override;

  // For the pool, which calls them with its own mutex held (they take the source's).
  struct BankShape {
    uint64_t slot_bytes = 0;
    int n_expert = 0;
  };
  std::vector<BankShape> bank_shapes() const;  // one per MoE bank
  /// Set every bank's cap to min(cap, its experts), re-pick the pin sets, give back unleased excess slots.
  /// Returns the pin-set sizes' sum.
  int apply_cap(int cap);

  std::unique_ptr<Impl> impl_;
  PoolLayout join_layout_;
};

}  // namespace car::experts

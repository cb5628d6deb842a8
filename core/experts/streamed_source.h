// StreamedExpertSource: MoE experts read from disk on demand into a bounded cache, for models larger than
// memory. ExpertPool: the one budget (and the reader threads) every streamed model of a process shares.
//
// Contract. Per MoE layer the source keeps one bank: a cache of slots, each slot holding one expert's gate,
// up and down matrices (the same file bytes as the resident slices, so output is bit-identical). acquire()
// serves an expert from the bank's pinned set, else from its LRU, else reads it (gate, up and down by one
// reader job, back to back). A leased slot is never evicted. acquire_many() issues all of a layer's misses at
// once to the pool's reader threads (queue depth = StreamOptions::io_threads, default 8) and waits for them.
// prefetch() queues reads on a low-priority queue: a reader takes a prefetch job only when no demand job is
// queued, and at most half the readers serve prefetches at once, so demand reads always find free readers;
// a demand for an expert whose prefetch is queued promotes it, one being read is waited for. A prefetch
// only takes a free or evictable slot (it never over-commits) and is dropped when there is none.
//
// Capacity. The pool's budget sets a cap per bank (slots, pinned ones included). slots(layer) is the cap
// minus the bank's pin set. A request for more unpinned experts than the free slots is served by
// over-committing - the bank briefly holds more than its cap, by at most the number of leased slots, and
// gives the excess back as the leases end - never by blocking or failing. A caller that wants memory to stay
// within the budget acquires at most slots(layer) distinct experts at once (prefill in waves).
//
// I/O. The file is opened with O_DIRECT when StreamOptions::direct_io is set and the filesystem accepts
// it; GGUF aligns tensor data to 32 bytes only, so each matrix is read as the 4096-aligned window around
// it into a page-aligned slot and the views point inside. If O_DIRECT is refused (open or read fails with
// EINVAL) the source falls back to buffered reads followed by posix_fadvise(DONTNEED) so the page cache
// stays bounded. A failed or short read fails that request with Error{"io_error", file, offset, errno
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

#include "core/experts/expert_source.h"
#include "core/util/result.h"
#include "core/util/thread_annotations.h"

namespace car::experts {

class ExpertPool;
class StreamedExpertSource;

/// The positional-read seam: pread(2)'s contract (bytes read, 0 at end of file, -1 with errno set). Tests
/// inject failing, short or counting readers; null means pread(2).
using PreadFn = std::function<ssize_t(int fd, void* buf, size_t count, off_t offset)>;

struct StreamOptions {
  // Pool-level: read by ExpertPool's constructor (or by open() when it makes a private pool).
  double ram_gb = 0;                           ///< > 0 forces the budget to ram_gb x 1e9 bytes
  std::string proc_root = "/proc";             ///< meminfo and self/cgroup are read below it (tests: a fake)
  std::string cgroup_root = "/sys/fs/cgroup";  ///< where the cgroup hierarchy is mounted (tests: a fake)
  int io_threads = 8;                          ///< reader threads = reads in flight at once
  // Per source:
  std::shared_ptr<ExpertPool> pool;  ///< the shared budget; null = a private pool from the fields above
  std::string sidecar_path;          ///< usage sidecar; empty = no learned pinning, save_usage() no-op
  bool direct_io = true;             ///< O_DIRECT where the filesystem allows it
  PreadFn reader;                    ///< null = pread(2)
};

/// What the process may use: MemAvailable, and the memory cgroup's remaining limit if there is one.
struct MemoryProbe {
  uint64_t mem_available = 0;                ///< /proc/meminfo MemAvailable (0 if unreadable)
  std::optional<uint64_t> cgroup_remaining;  ///< min over the cgroup and its ancestors of limit - usage
  uint64_t effective_available = 0;          ///< min of the two (MemAvailable alone when no limit)
  std::string cgroup_version;                ///< "v1", "v2" or "" (none found)
};

/// Read /proc/meminfo and the memory cgroup (v1 memory.limit_in_bytes - memory.usage_in_bytes, v2
/// memory.max - memory.current; "max" or a huge value = no limit) of /proc/self/cgroup, below the roots.
MemoryProbe probe_memory(const std::string& proc_root, const std::string& cgroup_root);

/// Budget for `available` bytes: available x 0.88 - reserves, where the reserves are the seed's 2.5 GB
/// page cache + 1.2 GB activations, or 30 % of `available` when that is less (small hosts and memory
/// cgroups, where the fixed reserves would leave no budget at all).
uint64_t budget_from_available(uint64_t available);

/// The bytes of one expert's slot: each projection's `proj_bytes` rounded up to the O_DIRECT alignment,
/// plus one alignment block (any alignment of its start in the file fits). What a bank's cap is charged per
/// slot; estimates of a streamed model's memory use it too.
uint64_t expert_slot_bytes(const uint64_t (&proj_bytes)[3]);

/// The bytes the pool may use beyond its sources' floors (one slot per bank); nullopt: no such limit.
/// The daemon passes the room its model cache's budget leaves (BackendCache::room_bytes).
using RoomFn = std::function<std::optional<uint64_t>()>;

/// The pool's sizing as of the last join or leave, for the one log line the caller writes.
struct PoolLayout {
  int sources = 0;                ///< streamed models sharing the budget
  int banks = 0;                  ///< MoE layers over all of them
  uint64_t bytes_per_expert = 0;  ///< largest slot (gate + up + down, with their alignment windows)
  uint64_t budget_bytes = 0;
  bool forced = false;       ///< budget from ram_gb rather than from available memory
  bool roomed = false;       ///< budget cut to the floors plus the room the owner gives (set_room)
  uint64_t floor_bytes = 0;  ///< sum over banks of one slot: what the caches hold at the smallest cap
  int cap = 0;               ///< slots per bank (banks with fewer experts are clamped to their count)
  uint64_t cache_bytes = 0;  ///< sum over banks of cap x slot bytes
  int pinned = 0;            ///< pin-set sizes over all banks
  /// "expert stream: 48 banks x 12.6 MB/expert; budget 30.1 GB -> cap 52/bank (cache 29.9 GB), pinned 480"
  std::string line() const;
};

/// One per daemon (or per `car run`): owns the budget and the reader threads; every StreamedExpertSource
/// that names it joins it. When a source joins or leaves, the budget is recomputed (forced, or from the
/// memory available now plus what the pool's caches already hold) and every bank's cap is re-sized: one
/// uniform cap c, the largest with sum over banks of min(c, n_expert) x slot bytes <= budget, at least 1 -
/// with identical banks that is budget / (banks x bytes per expert), clamped to [1, experts].
/// With a room function (set_room) the budget is also at most the floors plus the room, and refresh()
/// re-sizes when the room changed: the daemon's model cache and its streamed expert caches share one
/// budget, the caches growing into what the models leave and shrinking (to one slot per bank) before a
/// whole model is evicted.
class ExpertPool {
 public:
  explicit ExpertPool(const StreamOptions& options = {});
  ~ExpertPool();
  ExpertPool(const ExpertPool&) = delete;
  ExpertPool& operator=(const ExpertPool&) = delete;

  PoolLayout layout() const;
  uint64_t budget_bytes() const;
  /// Limit the budget to the floors plus `room()` from now on (empty: no limit), and re-size. `room` is
  /// called with the pool's lock held: it must not call into the pool.
  void set_room(RoomFn room);
  /// Re-size now (the room changed). Slots beyond a smaller cap are given back unless leased.
  void refresh();
  const StreamOptions& options() const { return options_; }

 private:
  friend class StreamedExpertSource;
  struct Job {
    const void* owner = nullptr;
    std::function<void()> run;
  };

  void join(StreamedExpertSource* source);   // sizes every bank (source included)
  void leave(StreamedExpertSource* source);  // re-sizes the others
  void resize_locked() CAR_REQUIRES(mutex_);
  /// Queue a read job. Demand jobs go before every prefetch job.
  void submit(const void* owner, bool demand, std::function<void()> run);
  /// Drop `owner`'s queued jobs and wait for its running ones.
  void cancel(const void* owner);
  void reader_loop();

  const StreamOptions options_;

  mutable Mutex mutex_;  // taken before a source's mutex, never after
  /// Non-owning; each source leaves in its destructor.
  std::vector<StreamedExpertSource*> sources_ CAR_GUARDED_BY(mutex_);
  RoomFn room_ CAR_GUARDED_BY(mutex_);
  PoolLayout layout_ CAR_GUARDED_BY(mutex_);

  Mutex queue_mutex_;                     // a leaf lock
  std::condition_variable_any queue_cv_;  // work queued or stopping
  std::condition_variable_any idle_cv_;   // a job finished (cancel waits on it)
  std::deque<Job> demand_ CAR_GUARDED_BY(queue_mutex_);
  std::deque<Job> prefetch_ CAR_GUARDED_BY(queue_mutex_);
  std::vector<const void*> running_ CAR_GUARDED_BY(queue_mutex_);  // owner of each job being run
  int prefetch_running_ CAR_GUARDED_BY(queue_mutex_) = 0;
  bool stop_ CAR_GUARDED_BY(queue_mutex_) = false;
  int max_prefetch_ = 1;  // readers that may serve prefetches at once (half); set before they start
  std::vector<std::thread> readers_;
};

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
  uint64_t use_count(int layer, int expert) const;
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

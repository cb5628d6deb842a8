// ExpertPool: the one budget (and the reader threads) every streamed model of a process shares, the
// memory probe its budget comes from, and the options a StreamedExpertSource is opened with. The sources
// themselves are in core/experts/streamed_source.h; the pool's code is in expert_pool.cpp.
//
// Thread safety. Every public member may be called from any thread. The pool has its own mutex, taken
// before a source's, never after; the room function (set_room) is called with it held.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

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
  /// The prefetch gate (StreamedExpertSource::prefetch): a layer's guesses are read ahead only while the
  /// share of them its next step used, over its last steps, is at least this; below it they are only scored.
  /// 0 = read every guess ahead (no gate).
  double prefetch_min_precision = 0.5;
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

}  // namespace car::experts

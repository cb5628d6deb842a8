// CachedBackend<T> and BackendLease<T>: one entry of BackendCache<T> (core/cache/backend_cache.h) - the
// loaded backend, its request lock, its size, load time, hit count, keep-alive and live-lease count - and
// the lease a request holds while it uses it.
//
// Ownership. An entry is owned through std::shared_ptr (the cache's Handle); the cache keeps one reference
// while the entry is cached, and a handle or lease keeps it (and its backend) alive after eviction. Entries
// share a cache_detail::Core with their cache, so an entry or lease outliving the cache still has a clock
// and a place to report its release.
//
// Use. A lease marks the entry in use (never evicted for capacity or idleness); its end records the end of
// use (idle time counts from there) and, while the cache is over budget, trims it. Only BackendCache
// creates entries and takes leases inside its lookup; `acquire()` takes one on an entry already held.
//
// Thread safety. Every member may be called from any thread: the lease count, last use, hits, keep-alive
// and eviction mark are atomics; the backend itself is serialized by the entry's ModelMutex (lock()).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/cache/model_mutex.h"
#include "core/util/thread_annotations.h"

namespace car {

/// The cache's notion of "now". Defaults to std::chrono::steady_clock::now.
using CacheClock = std::function<std::chrono::steady_clock::time_point()>;

namespace cache_detail {

/// State shared by the cache and every entry it created, so entries (and leases) outliving the cache
/// still have a clock and a place to report their release.
struct Core {
  explicit Core(CacheClock c) : clock(std::move(c)) {}
  Mutex mutex;  ///< the cache's one map mutex (guards BackendCache's members, see there)
  const CacheClock clock;
  std::atomic<std::size_t> evicted_held_entries{0};
  std::atomic<std::uint64_t> evicted_held_bytes{0};
  /// Set (under `mutex`) while the cached bytes exceed the budget because entries in use could not be
  /// evicted; a lease ending then calls trim(). The cache raises it before reading lease counts and a lease
  /// drops its count before reading it (all seq_cst), so a lease ending while the cache decides it cannot
  /// evict that entry either sees the flag or is seen as ended.
  std::atomic<bool> over_budget{false};
  /// Evicts entries not in use until within budget, appending the dropped references; called with `mutex`
  /// held; set by the cache, emptied by its destructor.
  std::function<void(std::vector<std::shared_ptr<void>>&)> trim_locked CAR_GUARDED_BY(mutex);

  /// Trim now (a lease ended while over budget). The dropped backends are released after unlocking.
  void trim() {
    std::vector<std::shared_ptr<void>> dropped;  // destroyed after `guard`
    MutexLock guard(mutex);
    if (trim_locked) trim_locked(dropped);
  }
};

inline std::int64_t to_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

inline double seconds_between(std::int64_t from_ns, std::int64_t to) {
  return to > from_ns ? static_cast<double>(to - from_ns) / 1e9 : 0.0;
}

}  // namespace cache_detail

template <typename T>
class BackendCache;
template <typename T>
class BackendLease;

/// One loaded backend plus its own mutex. Owned through std::shared_ptr (the Handle); the cache holds one
/// reference while the entry is cached.
template <typename T>
class CachedBackend : public std::enable_shared_from_this<CachedBackend<T>> {
 public:
  CachedBackend(const CachedBackend&) = delete;
  CachedBackend& operator=(const CachedBackend&) = delete;
  ~CachedBackend() {
    if (evicted_.load(std::memory_order_acquire)) {
      core_->evicted_held_entries.fetch_sub(1, std::memory_order_relaxed);
      core_->evicted_held_bytes.fetch_sub(size_bytes_, std::memory_order_relaxed);
    }
  }

  /// The backend. Callers serialize access with lock() (or a lease's lock()).
  T& backend() { return backend_; }
  const T& backend() const { return backend_; }
  /// The backend's own mutex (not the cache's).
  ModelMutex& mutex() { return mutex_; }
  /// Lock the backend for one request: `auto lock = handle->lock();`.
  [[nodiscard]] std::unique_lock<ModelMutex> lock() { return std::unique_lock<ModelMutex>(mutex_); }
  /// Lock the backend unless `stop` becomes true first (checked every `poll` while another request holds
  /// it): a request queued behind another on the same model can be cancelled while it waits. The returned
  /// lock does not own the mutex when `stop` won.
  [[nodiscard]] std::unique_lock<ModelMutex> lock_unless(
      const std::atomic<bool>& stop, std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
    std::unique_lock<ModelMutex> lock(mutex_, std::defer_lock);
    while (!stop.load(std::memory_order_acquire)) {
      if (lock.try_lock_for(poll)) return lock;
    }
    return lock;
  }

  /// Mark the entry in use until the returned lease dies (it is then idle from that moment).
  [[nodiscard]] BackendLease<T> acquire();

  const std::string& key() const { return key_; }
  std::uint64_t size_bytes() const { return size_bytes_; }
  bool in_use() const { return leases_.load(std::memory_order_acquire) > 0; }
  /// True once the cache dropped its reference (the handle still works).
  bool evicted() const { return evicted_.load(std::memory_order_acquire); }
  /// This entry's own idle TTL from now on (a request's keep-alive; zero: expire as soon as it is not in
  /// use); nullopt: the cache's TTL again. The last caller wins. Pinned keys ignore it.
  void set_keep_alive(std::optional<std::chrono::milliseconds> ttl) {
    keep_alive_ms_.store(ttl ? std::max<std::int64_t>(0, ttl->count()) : kNoKeepAlive,
                         std::memory_order_release);
  }
  /// The entry's own idle TTL; nullopt when it follows the cache's.
  std::optional<std::chrono::milliseconds> keep_alive() const {
    const std::int64_t ms = keep_alive_ms_.load(std::memory_order_acquire);
    if (ms == kNoKeepAlive) return std::nullopt;
    return std::chrono::milliseconds(ms);
  }

 private:
  friend class BackendCache<T>;
  friend class BackendLease<T>;
  struct Private {};

 public:
  /// Constructed by BackendCache only (Private is inaccessible elsewhere).
  CachedBackend(Private, std::shared_ptr<cache_detail::Core> core, std::string key, std::uint64_t size_bytes,
                T backend, std::int64_t now_ns)
      : core_(std::move(core)),
        key_(std::move(key)),
        size_bytes_(size_bytes),
        backend_(std::move(backend)),
        loaded_ns_(now_ns),
        last_used_ns_(now_ns) {}

 private:
  void release_lease() {
    // Record the end of use before the count drops, so a sweep that sees 0 leases sees the new time.
    last_used_ns_.store(cache_detail::to_ns(core_->clock()), std::memory_order_release);
    leases_.fetch_sub(1);  // seq_cst: pairs with Core::over_budget (see there)
    if (core_->over_budget.load()) core_->trim();
  }
  void touch(std::int64_t now_ns) { last_used_ns_.store(now_ns, std::memory_order_release); }
  // Called with core_->mutex held, exactly once.
  void mark_evicted() {
    core_->evicted_held_entries.fetch_add(1, std::memory_order_relaxed);
    core_->evicted_held_bytes.fetch_add(size_bytes_, std::memory_order_relaxed);
    evicted_.store(true, std::memory_order_release);
  }

  const std::shared_ptr<cache_detail::Core> core_;
  const std::string key_;
  const std::uint64_t size_bytes_;
  ModelMutex mutex_;  ///< serializes requests on backend_ (taken by callers, never by the cache)
  T backend_;
  const std::int64_t loaded_ns_;
  // Leases are taken under core_->mutex (so a sweep holding it sees a consistent count) and released
  // without it. last_used_ns_ is written on hits (under core_->mutex) and on lease release.
  std::atomic<std::uint32_t> leases_{0};
  std::atomic<std::int64_t> last_used_ns_;
  // Counted under the cache's mutex; atomic (relaxed) so that need not be proved to the thread-safety
  // analysis, which cannot tell that an entry's core_ is its cache's.
  std::atomic<std::uint64_t> hits_{0};
  std::atomic<bool> evicted_{false};
  static constexpr std::int64_t kNoKeepAlive = -1;
  std::atomic<std::int64_t> keep_alive_ms_{kNoKeepAlive};  ///< set_keep_alive; kNoKeepAlive: the cache's TTL
};

/// RAII "in use" mark on one backend, held for the length of a request. Move-only; holds the handle, so
/// the backend stays alive while the lease does.
template <typename T>
class BackendLease {
 public:
  using Handle = std::shared_ptr<CachedBackend<T>>;
  BackendLease() = default;
  BackendLease(BackendLease&& other) noexcept : entry_(std::move(other.entry_)) {}
  BackendLease& operator=(BackendLease&& other) noexcept {
    if (this != &other) {
      reset();
      entry_ = std::move(other.entry_);
    }
    return *this;
  }
  BackendLease(const BackendLease&) = delete;
  BackendLease& operator=(const BackendLease&) = delete;
  ~BackendLease() { reset(); }

  /// End the use now (idle time starts counting from here).
  void reset() {
    if (entry_) {
      entry_->release_lease();
      entry_.reset();
    }
  }
  explicit operator bool() const { return entry_ != nullptr; }
  const Handle& handle() const { return entry_; }
  CachedBackend<T>* operator->() const { return entry_.get(); }
  T& backend() const { return entry_->backend(); }
  [[nodiscard]] std::unique_lock<ModelMutex> lock() const { return entry_->lock(); }
  [[nodiscard]] std::unique_lock<ModelMutex> lock_unless(
      const std::atomic<bool>& stop, std::chrono::milliseconds poll = std::chrono::milliseconds(10)) const {
    return entry_->lock_unless(stop, poll);
  }

 private:
  friend class CachedBackend<T>;
  friend class BackendCache<T>;
  // Takes ownership of one already-counted lease on `entry`.
  explicit BackendLease(Handle entry) : entry_(std::move(entry)) {}
  Handle entry_;
};

template <typename T>
BackendLease<T> CachedBackend<T>::acquire() {
  {
    MutexLock guard(core_->mutex);
    leases_.fetch_add(1, std::memory_order_acq_rel);
  }
  return BackendLease<T>(this->shared_from_this());
}

}  // namespace car

// BackendCache<T>: a byte-budgeted LRU cache of loaded backends (models), with single-flight loading,
// idle eviction that respects models in use, and accounting for `stats`.
//
// Contract. `lease_or_load(key, estimate, loader)` / `get_or_load(...)` return the backend for `key`; on a
// miss the loader runs OUTSIDE the cache's lock, and concurrent misses on one key run ONE loader while the
// others wait for its outcome (single-flight). A failed load - the loader returns an Error, or throws (the
// exception is caught and becomes Error{"load_failed", what()}) - is reported to every waiter and nothing
// is cached.
//
// Charging. The budget caps the bytes the cache retains. `estimate` is a byte count, or a callable run
// only on a miss (outside the lock, before the loader) returning the bytes the backend will hold. Before
// the loader runs:
//   - an estimate larger than the whole budget is refused (Error{"load_failed", "... needs N bytes ...
//     budget is M bytes"}); nothing is evicted and the loader does not run;
//   - least-recently-used entries NOT in use (no live lease) are evicted until the cached bytes, the
//     estimates of other loads in flight (`reserved_bytes`) and this estimate fit the budget, so their
//     memory is released before the new backend allocates its own.
// An entry in use is never evicted for capacity: evicting it would not free its memory (the request holds
// it) and the next request for it would load a second copy. When the entries in use leave no room the load
// goes ahead over budget, and the excess is evicted as soon as enough of those leases end (`over_budget`).
// After the load the entry is charged what the loader reports (a loader returning Sized<T>), else the
// estimate; a backend that turns out larger than the whole budget is refused like an oversized estimate.
// A budget of 0 disables caching: every call loads, nothing is retained, nothing is refused.
//
// Room. `room_bytes()` is what the budget leaves beside the cached bytes and the loads in flight; a user
// that keeps memory outside the entries' charges (the daemon's streamed expert caches, which grow into the
// room and shrink out of it) registers a RoomListener and follows it. The room shrinks only when a load
// reserves its estimate (the listener runs before the loader), a load is charged more than it reserved,
// or the budget shrinks - each followed by the listener - so such a user gives memory back before a new
// backend allocates, and a whole entry is evicted only when the charges alone exceed the budget.
//
// Ownership. The cache holds one shared_ptr per entry; eviction (capacity, idle, invalidate, clear) only
// drops that reference. A handle keeps working after eviction, and the backend is destroyed when the last
// handle drops - never under the cache's lock. `stats()` reports the bytes of evicted entries that
// handles still hold.
//
// Keep-alive and pins. An entry's idle TTL is the cache's (`set_idle_ttl`) unless the entry has its own
// (`CachedBackend::set_keep_alive`, e.g. a request's `keep_alive`; 0 = expire as soon as it is not in use,
// which `evict_if_expired` does at once); a pinned key (`set_pinned`) is never evicted for idleness, and for
// capacity only after every unpinned entry not in use.
//
// Use. A request takes a Lease (`handle->acquire()` or `cache.lease_or_load(...)`), which marks the entry
// in use: an entry with a live lease is never evicted for capacity or idleness, and its idle time counts
// from the END of its last use. To serialize with other requests on the same backend, lock it:
// `auto lock = lease.lock();` (or `handle->lock()`). `stats()`, `list()`, `peek()` and `contains()` never
// refresh recency or idle time.
//
// Thread safety. Every member function is safe to call from any thread. One mutex (Core::mutex) guards the
// map, the LRU list, the in-flight loads and the counters; it is never held while an estimate or a loader
// runs or a backend is destroyed; the members it guards are annotated (core/util/thread_annotations.h) so
// Clang's -Wthread-safety checks every access. Each entry has its own mutex for the backend itself. The
// clock is injectable so idle eviction is tested without sleeping; it must be callable from any thread.
//
// Files. The entry and its lease: cached_backend.h; the per-model lock: model_mutex.h; running estimates and
// loaders: cache_loader.h; what the cache reports (stats, LoadInfo, eviction causes, listeners):
// cache_stats.h. This file holds the cache itself: the map and LRU list, the loads in flight, charging,
// capacity and idle eviction.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/cache/cache_loader.h"
#include "core/cache/cache_stats.h"
#include "core/cache/cached_backend.h"
#include "core/cache/model_mutex.h"
#include "core/util/error_codes.h"
#include "core/util/result.h"
#include "core/util/thread_annotations.h"

namespace car {

template <typename T>
class BackendCache {
 public:
  using Handle = std::shared_ptr<CachedBackend<T>>;
  using Lease = BackendLease<T>;

  /// `budget_bytes` 0 disables caching. `idle_ttl` nullopt (or zero) disables idle eviction.
  explicit BackendCache(
      std::uint64_t budget_bytes, std::optional<std::chrono::milliseconds> idle_ttl = std::nullopt,
      CacheClock clock = [] { return std::chrono::steady_clock::now(); })
      : core_(std::make_shared<cache_detail::Core>(std::move(clock))),
        budget_bytes_(budget_bytes),
        idle_ttl_(normalize_ttl(idle_ttl)) {
    core_->trim_locked = [this](std::vector<std::shared_ptr<void>>& dropped) CAR_REQUIRES(core_->mutex) {
      std::vector<Handle> handles;
      trim_locked(now_ns(), handles);
      dropped.insert(dropped.end(), handles.begin(), handles.end());
    };
  }

  BackendCache(const BackendCache&) = delete;
  BackendCache& operator=(const BackendCache&) = delete;
  /// Handles and leases outlive the cache safely; in-flight loads must have finished.
  ~BackendCache() {
    MutexLock guard(core_->mutex);
    core_->trim_locked = nullptr;
    core_->over_budget.store(false);
  }

  /// The handle for `key`, loading it on a miss. `estimate` is the bytes the backend will hold: a number,
  /// or a callable returning car::Result<std::uint64_t> (or an integer) that runs only on a miss, outside
  /// the lock (its error is the call's error). `loader` returns car::Result<T>, T, car::Result<Sized<T>> or
  /// Sized<T> (the last two correct the charge to what was really loaded); it runs outside the lock, at most
  /// once per key at a time. Errors: the estimate's or loader's own Error; Error{"load_failed", what()} when
  /// either throws; load_failed when the backend is larger than the whole budget (see the contract above).
  template <typename Estimate, typename Loader>
  Result<Handle> get_or_load(std::string_view key, Estimate&& estimate, Loader&& loader,
                             LoadInfo* info = nullptr) {
    return lookup(key, estimate, loader, info, /*take_lease=*/false);
  }

  /// Like get_or_load, but the returned lease is taken atomically with the lookup, so the entry cannot
  /// be evicted between the two. The way a request should get its backend.
  template <typename Estimate, typename Loader>
  Result<Lease> lease_or_load(std::string_view key, Estimate&& estimate, Loader&& loader,
                              LoadInfo* info = nullptr) {
    Result<Handle> h = lookup(key, estimate, loader, info, /*take_lease=*/true);
    if (!h.ok()) return h.error();
    return Lease(std::move(h.value()));
  }

  /// The cached handle for `key`, or nullptr. Does not count as a hit or refresh anything.
  Handle peek(std::string_view key) const {
    MutexLock guard(core_->mutex);
    auto it = map_.find(std::string(key));
    return it == map_.end() ? nullptr : *it->second;
  }
  bool contains(std::string_view key) const { return peek(key) != nullptr; }

  /// Remove `key` (e.g. its file changed). Returns whether it was cached. A load of `key` in flight is
  /// not cached when it completes (its callers still get the backend).
  bool invalidate(std::string_view key) {
    RoomNotice notice{this};
    std::vector<Handle> dropped;
    bool was_cached = false;
    {
      MutexLock guard(core_->mutex);
      std::string k(key);
      if (auto f = flights_.find(k); f != flights_.end()) f->second->invalidated = true;
      auto it = map_.find(k);
      if (it != map_.end()) {
        dropped.push_back(evict_locked(it, EvictionCause::invalidate, now_ns()));
        was_cached = true;
      }
    }
    return was_cached;  // `dropped` releases the cache's references outside the lock
  }

  /// Evict every entry (and keep loads in flight from being cached). Returns what was evicted.
  Evicted clear() {
    RoomNotice notice{this};
    std::vector<Handle> dropped;
    Evicted out;
    {
      MutexLock guard(core_->mutex);
      for (auto& [k, flight] : flights_) flight->invalidated = true;
      const std::int64_t now = now_ns();
      while (!lru_.empty()) {
        auto it = map_.find(lru_.back()->key());
        out.entries += 1;
        out.bytes += (*it->second)->size_bytes();
        dropped.push_back(evict_locked(it, EvictionCause::clear, now));
      }
    }
    return out;
  }

  /// Evict entries not in use and idle (since the end of their last use) for at least their idle TTL (their
  /// keep-alive, else the cache's); pinned keys never. Meant to be driven by a timer. `next_due`, when given,
  /// receives how long until the next entry not in use would expire (nullopt: none would).
  Evicted evict_idle(std::optional<std::chrono::nanoseconds>* next_due = nullptr) {
    RoomNotice notice{this, /*armed=*/false};  // a sweep that evicts nothing leaves the room as it was
    std::vector<Handle> dropped;
    Evicted out;
    std::optional<std::int64_t> soonest;
    {
      MutexLock guard(core_->mutex);
      const std::int64_t now = now_ns();
      // One walk over the entries (O(entries)); each removal is O(1).
      for (auto pos = lru_.begin(); pos != lru_.end();) {
        const Handle& e = *pos;
        ++pos;
        if (e->leases_.load(std::memory_order_acquire) > 0) continue;
        const std::optional<std::int64_t> ttl_ns = ttl_ns_locked(*e);
        if (!ttl_ns) continue;
        const std::int64_t idle_ns = now - e->last_used_ns_.load(std::memory_order_acquire);
        if (idle_ns < *ttl_ns) {
          soonest = std::min(soonest.value_or(*ttl_ns - idle_ns), *ttl_ns - idle_ns);
          continue;
        }
        out.entries += 1;
        out.bytes += e->size_bytes();
        dropped.push_back(evict_locked(map_.find(e->key()), EvictionCause::idle, now));
      }
    }
    notice.armed = out.entries != 0;
    if (next_due != nullptr) {
      *next_due = soonest ? std::optional<std::chrono::nanoseconds>(std::chrono::nanoseconds(*soonest))
                          : std::nullopt;
    }
    return out;
  }

  /// Evict `key` now (cause: idle) when it is cached, not in use, not pinned and idle for at least its idle
  /// TTL - at once for a keep-alive of 0, which is what a request asking to unload its model afterwards
  /// calls this for. Returns whether it was evicted.
  bool evict_if_expired(std::string_view key) {
    RoomNotice notice{this, /*armed=*/false};  // told only when the entry really leaves
    Handle dropped;  // released after the lock
    MutexLock guard(core_->mutex);
    auto it = map_.find(std::string(key));
    if (it == map_.end()) return false;
    const Handle& e = *it->second;
    if (e->leases_.load(std::memory_order_acquire) > 0) return false;
    const std::optional<std::int64_t> ttl_ns = ttl_ns_locked(*e);
    const std::int64_t now = now_ns();
    if (!ttl_ns || now - e->last_used_ns_.load(std::memory_order_acquire) < *ttl_ns) return false;
    dropped = evict_locked(it, EvictionCause::idle, now);
    notice.armed = true;
    guard.unlock();
    return true;
  }

  /// The keys never evicted for idleness (an admin's list; replaces the previous one). Keys need not be
  /// cached; one loaded later is pinned from its load. Capacity eviction takes pinned entries last.
  void set_pinned(const std::vector<std::string>& keys) {
    MutexLock guard(core_->mutex);
    pinned_ = std::unordered_set<std::string>(keys.begin(), keys.end());
  }
  bool is_pinned(std::string_view key) const {
    MutexLock guard(core_->mutex);
    return pinned_.count(std::string(key)) != 0;
  }

  /// Change the budget at runtime (SIGHUP). Shrinking evicts LRU entries not in use (cause: capacity)
  /// until within the new budget, and the entries in use as their leases end; 0 disables caching and
  /// evicts every entry, in use or not (a request in flight keeps its backend through its lease).
  Evicted set_budget(std::uint64_t budget_bytes) {
    RoomNotice notice{this};
    std::vector<Handle> dropped;
    {
      MutexLock guard(core_->mutex);
      budget_bytes_ = budget_bytes;
      const std::int64_t now = now_ns();
      if (budget_bytes_ == 0) {
        while (!lru_.empty())
          dropped.push_back(evict_locked(map_.find(lru_.back()->key()), EvictionCause::capacity, now));
        core_->over_budget.store(false);
      } else {
        trim_locked(now, dropped);
      }
    }
    Evicted out;
    for (const Handle& h : dropped) {
      out.entries += 1;
      out.bytes += h->size_bytes();
    }
    return out;
  }

  /// Call `listener` for every entry evicted from now on (any cause; empty: none). It runs under the cache's
  /// lock, on the thread that evicts: it must be quick and must not call into the cache. Observing only:
  /// what is evicted, and when, does not change.
  void set_eviction_listener(EvictionListener listener) {
    MutexLock guard(core_->mutex);
    eviction_listener_ = std::move(listener);
  }

  /// Change the idle TTL at runtime; nullopt or zero disables idle eviction (of entries without a
  /// keep-alive of their own). Takes effect on the next evict_idle().
  void set_idle_ttl(std::optional<std::chrono::milliseconds> ttl) {
    MutexLock guard(core_->mutex);
    idle_ttl_ = normalize_ttl(ttl);
  }

  std::uint64_t budget_bytes() const {
    MutexLock guard(core_->mutex);
    return budget_bytes_;
  }
  std::optional<std::chrono::milliseconds> idle_ttl() const {
    MutexLock guard(core_->mutex);
    return idle_ttl_;
  }
  bool is_disabled() const { return budget_bytes() == 0; }

  /// How many entries are cached (O(1); stats() lists them all).
  std::size_t entries() const {
    MutexLock guard(core_->mutex);
    return map_.size();
  }

  /// The budget less the cached bytes and the loads in flight (0 when they exceed it); nullopt when caching
  /// is disabled (budget 0: no budget to share).
  std::optional<std::uint64_t> room_bytes() const {
    MutexLock guard(core_->mutex);
    if (budget_bytes_ == 0) return std::nullopt;
    const std::uint64_t used = total_bytes_ + reserved_bytes_;
    return used >= budget_bytes_ ? 0 : budget_bytes_ - used;
  }

  /// Call `listener` whenever the room may have changed (see the contract above; empty: none).
  void set_room_listener(RoomListener listener) {
    MutexLock guard(core_->mutex);
    room_listener_ = std::move(listener);
  }

  /// The cached entries, most recently used first. Refreshes nothing.
  std::vector<CacheEntryInfo> list() const {
    MutexLock guard(core_->mutex);
    return list_locked(now_ns());
  }

  /// Counters and listing. Refreshes nothing.
  CacheStats stats() const {
    MutexLock guard(core_->mutex);
    CacheStats s;
    s.entries = map_.size();
    s.total_bytes = total_bytes_;
    s.budget_bytes = budget_bytes_;
    s.idle_ttl = idle_ttl_;
    s.hits = hits_;
    s.misses = misses_;
    s.coalesced = coalesced_;
    s.loads = loads_;
    s.load_failures = load_failures_;
    s.loading = flights_.size();
    s.reserved_bytes = reserved_bytes_;
    s.refused = refused_;
    s.over_budget = total_bytes_ > budget_bytes_ && budget_bytes_ != 0;
    s.evictions_capacity = evictions_[0];
    s.evictions_idle = evictions_[1];
    s.evictions_invalidate = evictions_[2];
    s.evictions_clear = evictions_[3];
    s.evicted_held_entries = core_->evicted_held_entries.load(std::memory_order_relaxed);
    s.evicted_held_bytes = core_->evicted_held_bytes.load(std::memory_order_relaxed);
    s.last_eviction_age_seconds = last_eviction_age_s_;
    const std::uint64_t n = s.evictions_total();
    s.mean_eviction_age_seconds = n == 0 ? 0.0 : eviction_age_sum_s_ / static_cast<double>(n);
    s.items = list_locked(now_ns());
    return s;
  }

 private:
  using LruList = std::list<Handle>;  // front = most recently used

  // One in-flight load; waiters sleep on `done_cv` with core_->mutex. The fields below are read and written
  // only under core_->mutex (an annotation in this struct cannot name the cache's mutex).
  struct Flight {
    std::condition_variable_any done_cv;
    bool done = false;
    bool invalidated = false;    ///< do not cache the result
    std::optional<Error> error;  ///< set when the load failed
    std::uint64_t reserved = 0;  ///< this load's estimate, in reserved_bytes_
    Handle handle;               ///< set when it succeeded
    std::chrono::steady_clock::time_point started;
  };

  static std::optional<std::chrono::milliseconds> normalize_ttl(std::optional<std::chrono::milliseconds> t) {
    if (t && t->count() <= 0) return std::nullopt;
    return t;
  }

  std::int64_t now_ns() const { return cache_detail::to_ns(core_->clock()); }

  // The idle TTL that applies to `e` in nanoseconds: nullopt when it is pinned or has no TTL at all.
  std::optional<std::int64_t> ttl_ns_locked(const CachedBackend<T>& e) const CAR_REQUIRES(core_->mutex) {
    if (pinned_.count(e.key()) != 0) return std::nullopt;
    std::optional<std::chrono::milliseconds> ttl = e.keep_alive();
    if (!ttl) ttl = idle_ttl_;
    if (!ttl) return std::nullopt;
    return std::chrono::duration_cast<std::chrono::nanoseconds>(*ttl).count();
  }

  template <typename Estimate, typename Loader>
  Result<Handle> lookup(std::string_view key_view, Estimate& estimate, Loader& loader, LoadInfo* info,
                        bool take_lease) {
    LoadInfo local;
    LoadInfo& out = info != nullptr ? *info : local;
    out = LoadInfo{};
    std::string key(key_view);
    std::shared_ptr<Flight> flight;
    {
      MutexLock guard(core_->mutex);
      if (auto it = map_.find(key); it != map_.end()) {
        Handle& h = *it->second;
        lru_.splice(lru_.begin(), lru_, it->second);  // O(1) move to front
        h->touch(now_ns());
        h->hits_.fetch_add(1, std::memory_order_relaxed);
        hits_ += 1;
        if (take_lease) h->leases_.fetch_add(1, std::memory_order_acq_rel);
        out.hit = true;
        out.cached = true;
        return h;
      }
      misses_ += 1;
      if (budget_bytes_ != 0) {
        if (auto f = flights_.find(key); f != flights_.end()) {
          // Someone is loading this key: wait for its outcome.
          coalesced_ += 1;
          std::shared_ptr<Flight> other = f->second;
          other->done_cv.wait(guard, [&] { return other->done; });
          out.waited = true;
          out.load_time = core_->clock() - other->started;
          if (other->error) return *other->error;
          Handle h = other->handle;
          out.cached = !h->evicted() && map_.count(key) != 0 && *map_.at(key) == h;
          if (take_lease) h->leases_.fetch_add(1, std::memory_order_acq_rel);
          return h;
        }
        flight = std::make_shared<Flight>();
        flight->started = core_->clock();
        flights_.emplace(key, flight);
      }
    }
    const auto started = core_->clock();

    // Caching on: estimate (outside the lock), refuse what cannot fit, make room, reserve the estimate.
    std::optional<std::uint64_t> estimated;
    if (flight) {
      Result<std::uint64_t> e = cache_detail::run_estimate(estimate);
      std::vector<Handle> dropped;  // released after the lock, before the loader allocates
      MutexLock guard(core_->mutex);
      if (!e.ok()) {
        load_failures_ += 1;
        finish_flight(key, flight, e.error(), nullptr);
        out.load_time = core_->clock() - started;
        return e.error();
      }
      estimated = *e;
      if (budget_bytes_ != 0 && *estimated > budget_bytes_) {
        refused_ += 1;
        Error err =
            make_error(errc::kLoadFailed, cache_detail::too_large(key, *estimated, budget_bytes_, false));
        finish_flight(key, flight, err, nullptr);
        return err;
      }
      flight->reserved = *estimated;
      reserved_bytes_ += flight->reserved;
      trim_locked(now_ns(), dropped);
      loads_ += 1;
    } else {
      MutexLock guard(core_->mutex);
      loads_ += 1;
    }
    // The room shrank by the estimate: whoever grows into it gives memory back before the loader runs.
    if (flight) notify_room();

    // Load outside the lock.
    Result<cache_detail::Loaded<T>> loaded = cache_detail::run_loader<T>(loader);
    out.loaded = true;
    std::uint64_t size_bytes = 0;
    if (loaded.ok()) {
      if (loaded.value().size_bytes) {
        size_bytes = *loaded.value().size_bytes;
      } else if (estimated) {
        size_bytes = *estimated;
      } else if (Result<std::uint64_t> e = cache_detail::run_estimate(estimate); e.ok()) {
        size_bytes = *e;  // caching off: the estimate only labels the handle
      }
    }

    RoomNotice notice{this};      // the reservation became a charge (or was released)
    std::vector<Handle> dropped;  // released after the lock
    MutexLock guard(core_->mutex);
    const std::int64_t now = now_ns();
    out.load_time = core_->clock() - started;
    if (flight) {
      reserved_bytes_ -= flight->reserved;
      flight->reserved = 0;
    }
    if (!loaded.ok()) {
      load_failures_ += 1;
      if (flight) finish_flight(key, flight, loaded.error(), nullptr);
      return loaded.error();
    }
    if (flight && budget_bytes_ != 0 && size_bytes > budget_bytes_) {
      refused_ += 1;
      Error err =
          make_error(errc::kLoadFailed, cache_detail::too_large(key, size_bytes, budget_bytes_, true));
      finish_flight(key, flight, err, nullptr);
      guard.unlock();
      return err;  // `loaded` is destroyed outside the lock
    }
    Handle h = std::make_shared<CachedBackend<T>>(typename CachedBackend<T>::Private{}, core_, key,
                                                  size_bytes, std::move(loaded.value().backend), now);
    if (take_lease) h->leases_.fetch_add(1, std::memory_order_acq_rel);
    if (flight == nullptr || budget_bytes_ == 0 || flight->invalidated) {
      // Caching disabled (now or when we started), or invalidated while loading: hand it out uncached.
      if (flight) finish_flight(key, flight, std::nullopt, h);
      return h;
    }
    lru_.push_front(h);
    map_.emplace(key, lru_.begin());
    total_bytes_ += size_bytes;
    out.cached = true;
    // The estimate may have been low, or entries in use kept the room: evict LRU entries not in use,
    // never the one just inserted (it is at the front and may be leased; an unleased one is kept too).
    trim_locked(now, dropped, h.get());
    finish_flight(key, flight, std::nullopt, h);
    guard.unlock();
    return h;
  }

  // Evicts least-recently-used entries without a lease (never `keep`) until the cached bytes plus the loads
  // in flight fit the budget; sets or clears core_->over_budget (see Core).
  void trim_locked(std::int64_t now, std::vector<Handle>& dropped, const CachedBackend<T>* keep = nullptr)
      CAR_REQUIRES(core_->mutex) {
    if (budget_bytes_ == 0) return;
    auto over = [&]() CAR_REQUIRES(core_->mutex) { return total_bytes_ + reserved_bytes_ > budget_bytes_; };
    if (!over()) {
      core_->over_budget.store(false);
      return;
    }
    // Raise the flag BEFORE reading any lease count: a lease that ends after we read it as held then sees
    // the flag and trims again (store-then-load on both sides, all seq_cst), so no excess outlives it.
    core_->over_budget.store(true);
    // Unpinned entries first, least recently used first; pinned ones only when that was not enough.
    for (const bool take_pinned : {false, true}) {
      for (auto pos = lru_.end(); over() && pos != lru_.begin();) {
        --pos;
        const Handle& e = *pos;
        if (e.get() == keep || e->leases_.load() > 0) continue;  // seq_cst: pairs with Core::over_budget
        if (!take_pinned && pinned_.count(e->key()) != 0) continue;
        auto victim = pos;
        ++pos;  // evict_locked erases `victim`; `pos` stays valid
        dropped.push_back(evict_locked(map_.find((*victim)->key()), EvictionCause::capacity, now));
      }
    }
    core_->over_budget.store(total_bytes_ > budget_bytes_);
  }

  // Tells the room listener when it goes out of scope: declared before a function's lock and dropped
  // references, so it runs after both are gone. A caller whose change may be nothing (an idle sweep that
  // finds nothing expired) disarms it, so the listener - which may re-read /proc and the cgroup - is not
  // run for a room that did not move.
  struct RoomNotice {
    BackendCache* cache;
    bool armed = true;
    ~RoomNotice() {
      if (armed) cache->notify_room();
    }
  };

  // Tells the room listener, if any; called with the lock NOT held.
  void notify_room() CAR_EXCLUDES(core_->mutex) {
    RoomListener listener;
    {
      MutexLock guard(core_->mutex);
      listener = room_listener_;
    }
    if (listener) listener();
  }

  // Publishes a load's outcome to its waiters and forgets the flight.
  void finish_flight(const std::string& key, const std::shared_ptr<Flight>& flight,
                     std::optional<Error> error, Handle h) CAR_REQUIRES(core_->mutex) {
    flight->done = true;
    flight->error = std::move(error);
    flight->handle = std::move(h);
    flights_.erase(key);
    flight->done_cv.notify_all();
  }

  // Removes one entry from the map and the LRU list and returns the cache's reference, which the caller
  // drops after unlocking (a backend is never destroyed under the lock).
  Handle evict_locked(typename std::unordered_map<std::string, typename LruList::iterator>::iterator it,
                      EvictionCause cause, std::int64_t now) CAR_REQUIRES(core_->mutex) {
    CAR_CHECK(it != map_.end());
    Handle h = std::move(*it->second);
    lru_.erase(it->second);
    map_.erase(it);
    CAR_CHECK(total_bytes_ >= h->size_bytes());
    total_bytes_ -= h->size_bytes();
    evictions_[static_cast<int>(cause)] += 1;
    last_eviction_age_s_ = cache_detail::seconds_between(h->loaded_ns_, now);
    eviction_age_sum_s_ += last_eviction_age_s_;
    if (eviction_listener_) eviction_listener_(cause, last_eviction_age_s_, h->size_bytes());
    h->mark_evicted();
    return h;
  }

  std::vector<CacheEntryInfo> list_locked(std::int64_t now) const CAR_REQUIRES(core_->mutex) {
    std::vector<CacheEntryInfo> items;
    items.reserve(lru_.size());
    for (const Handle& e : lru_) {
      CacheEntryInfo i;
      i.key = e->key();
      i.size_bytes = e->size_bytes();
      i.leases = e->leases_.load(std::memory_order_acquire);
      i.in_use = i.leases > 0;
      i.idle_seconds = i.in_use ? 0.0 : cache_detail::seconds_between(e->last_used_ns_.load(), now);
      i.age_seconds = cache_detail::seconds_between(e->loaded_ns_, now);
      i.hits = e->hits_.load(std::memory_order_relaxed);
      i.pinned = pinned_.count(i.key) != 0;
      i.keep_alive_set = e->keep_alive().has_value();
      if (!i.pinned) i.idle_ttl = i.keep_alive_set ? e->keep_alive() : idle_ttl_;
      items.push_back(std::move(i));
    }
    return items;
  }

  const std::shared_ptr<cache_detail::Core> core_;  ///< core_->mutex guards everything below
  // Invariant: an entry is in map_ iff it is in lru_; map_ points at its list node; total_bytes_ is the
  // sum of their sizes. A key is in flights_ while exactly one caller estimates and loads it (never when
  // caching is disabled). total_bytes_ <= budget_bytes_ unless entries in use hold more (then
  // core_->over_budget is set and the next lease to end trims).
  std::unordered_map<std::string, typename LruList::iterator> map_ CAR_GUARDED_BY(core_->mutex);
  LruList lru_ CAR_GUARDED_BY(core_->mutex);
  std::unordered_map<std::string, std::shared_ptr<Flight>> flights_ CAR_GUARDED_BY(core_->mutex);
  std::uint64_t total_bytes_ CAR_GUARDED_BY(core_->mutex) = 0;
  std::uint64_t reserved_bytes_ CAR_GUARDED_BY(core_->mutex) = 0;  ///< sum of the flights' `reserved`
  std::uint64_t refused_ CAR_GUARDED_BY(core_->mutex) = 0;
  std::uint64_t budget_bytes_ CAR_GUARDED_BY(core_->mutex);
  std::optional<std::chrono::milliseconds> idle_ttl_ CAR_GUARDED_BY(core_->mutex);
  std::unordered_set<std::string> pinned_ CAR_GUARDED_BY(core_->mutex);  ///< set_pinned
  std::uint64_t hits_ CAR_GUARDED_BY(core_->mutex) = 0;
  std::uint64_t misses_ CAR_GUARDED_BY(core_->mutex) = 0;
  std::uint64_t coalesced_ CAR_GUARDED_BY(core_->mutex) = 0;
  std::uint64_t loads_ CAR_GUARDED_BY(core_->mutex) = 0;
  std::uint64_t load_failures_ CAR_GUARDED_BY(core_->mutex) = 0;
  std::uint64_t evictions_[4] CAR_GUARDED_BY(core_->mutex) = {0, 0, 0, 0};  ///< indexed by EvictionCause
  double last_eviction_age_s_ CAR_GUARDED_BY(core_->mutex) = 0;
  double eviction_age_sum_s_ CAR_GUARDED_BY(core_->mutex) = 0;
  EvictionListener eviction_listener_ CAR_GUARDED_BY(core_->mutex);
  RoomListener room_listener_ CAR_GUARDED_BY(core_->mutex);
};

}  // namespace car

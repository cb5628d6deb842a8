// What BackendCache<T> (core/cache/backend_cache.h) reports and whom it tells: why an entry left (and the
// eviction listener told of each), the room listener, what one lookup did (LoadInfo), what one eviction
// call removed, and the counters and per-entry listing of `stats`. Plain values; the listeners' calling
// rules are stated where they are declared.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace car {

/// Why an entry left the cache.
enum class EvictionCause { capacity, idle, invalidate, clear };

/// "capacity", "idle", "invalidate" or "clear" (as `stats` and the metrics name them).
inline const char* eviction_cause_name(EvictionCause cause) {
  switch (cause) {
    case EvictionCause::capacity:
      return "capacity";
    case EvictionCause::idle:
      return "idle";
    case EvictionCause::invalidate:
      return "invalidate";
    case EvictionCause::clear:
      return "clear";
  }
  return "?";
}

/// Told about each entry that leaves the cache: why, its age since it was loaded, its bytes.
using EvictionListener = std::function<void(EvictionCause cause, double age_seconds, std::uint64_t bytes)>;

/// Told that the room the cache leaves in its budget (BackendCache::room_bytes) may have changed: called
/// after the cache's lock is released, on the thread that changed it; it may call into the cache.
using RoomListener = std::function<void()>;

/// What one get_or_load / lease_or_load call did (optional out-parameter).
struct LoadInfo {
  bool hit = false;     ///< found cached (the protocol's `cached`)
  bool waited = false;  ///< joined another caller's in-flight load of the same key
  bool loaded = false;  ///< this call ran the loader
  bool cached = false;  ///< the returned backend is retained by the cache (false when disabled/invalidated)
  std::chrono::nanoseconds load_time{0};  ///< time spent loading or waiting for the load (0 on a hit)
};

/// Entries and bytes removed by one eviction call.
struct Evicted {
  std::size_t entries = 0;
  std::uint64_t bytes = 0;
  bool operator==(const Evicted&) const = default;
};

/// One cached entry, as `stats`/`list` show it. Never refreshes the entry.
struct CacheEntryInfo {
  std::string key;
  std::uint64_t size_bytes = 0;
  bool in_use = false;       ///< at least one live lease
  std::uint32_t leases = 0;  ///< live leases
  double idle_seconds = 0;   ///< since the end of the last use (0 while in use)
  double age_seconds = 0;    ///< since it was loaded
  std::uint64_t hits = 0;    ///< cache hits on this entry
  bool pinned = false;       ///< never evicted for idleness (set_pinned)
  /// The idle TTL that applies to it (its keep-alive, else the cache's); nullopt: never evicted for
  /// idleness (pinned, or no TTL at all).
  std::optional<std::chrono::milliseconds> idle_ttl;
  bool keep_alive_set = false;  ///< idle_ttl is the entry's own keep-alive, not the cache's TTL
};

/// Counters and the per-entry listing. Counters are cumulative since construction.
struct CacheStats {
  std::size_t entries = 0;
  std::uint64_t total_bytes = 0;
  std::uint64_t budget_bytes = 0;
  std::optional<std::chrono::milliseconds> idle_ttl;  ///< nullopt: idle eviction disabled
  std::uint64_t hits = 0;                             ///< calls served from the cache
  std::uint64_t misses = 0;          ///< calls that did not find the key cached (incl. waiters)
  std::uint64_t coalesced = 0;       ///< misses that waited for another caller's load
  std::uint64_t loads = 0;           ///< loader invocations
  std::uint64_t load_failures = 0;   ///< loader invocations that failed (error or exception)
  std::size_t loading = 0;           ///< loads in flight right now
  std::uint64_t reserved_bytes = 0;  ///< the estimates of the loads in flight (room kept for them)
  std::uint64_t refused = 0;         ///< misses refused because the backend is larger than the budget
  bool over_budget = false;  ///< entries in use hold more than the budget; trimmed as their leases end
  std::uint64_t evictions_capacity = 0;
  std::uint64_t evictions_idle = 0;
  std::uint64_t evictions_invalidate = 0;
  std::uint64_t evictions_clear = 0;
  std::uint64_t evictions_total() const {
    return evictions_capacity + evictions_idle + evictions_invalidate + evictions_clear;
  }
  std::size_t evicted_held_entries = 0;  ///< evicted entries some handle still holds
  std::uint64_t evicted_held_bytes = 0;  ///< their bytes (released when the last handle drops)
  double last_eviction_age_seconds = 0;  ///< age (since load) of the last evicted entry
  double mean_eviction_age_seconds = 0;  ///< mean age at eviction over all evictions
  std::vector<CacheEntryInfo> items;     ///< most recently used first
};

}  // namespace car

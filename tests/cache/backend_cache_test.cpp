// BackendCache<T>: the seed's six behaviours, then each improvement (single-flight, O(1) LRU order,
// accounting, injectable clock, runtime budget/TTL, the eviction listener). Time is a ManualClock. Entries
// and leases: cached_backend_test.cpp; idle eviction, keep-alive and pins: backend_cache_idle_test.cpp;
// charging and room: backend_cache_budget_test.cpp.
#include "core/cache/backend_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "tests/cache/cache_test_support.h"

namespace car {
namespace {

using cache_test::ManualClock;
using cache_test::never_called;
using cache_test::value;
using std::chrono::milliseconds;
using std::chrono::seconds;

// --- The seed's tests -----------------------------------------------------------------------------

TEST(BackendCacheSeedTest, CacheHitReturnsSameHandle) {
  BackendCache<int> cache(1024);
  auto a = cache.get_or_load("a", 100, [] { return value(42); });
  ASSERT_TRUE(a.ok());
  auto b = cache.get_or_load("a", 100, never_called);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a.value(), b.value());
  EXPECT_EQ(a.value()->backend(), 42);
}

TEST(BackendCacheSeedTest, EvictsLruWhenOverBudget) {
  BackendCache<int> cache(250);
  auto a = cache.get_or_load("a", 100, [] { return value(1); });
  auto b = cache.get_or_load("b", 100, [] { return value(2); });
  auto a_again = cache.get_or_load("a", 100, never_called);  // b is now LRU
  auto c = cache.get_or_load("c", 100, [] { return value(3); });
  ASSERT_TRUE(a.ok() && b.ok() && a_again.ok() && c.ok());
  CacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 2u) << "a + c remain, b evicted";
  EXPECT_EQ(s.total_bytes, 200u);
  EXPECT_EQ(s.budget_bytes, 250u);
  EXPECT_TRUE(cache.contains("a"));
  EXPECT_FALSE(cache.contains("b"));
  EXPECT_TRUE(cache.contains("c"));
}

TEST(BackendCacheSeedTest, ZeroBudgetDisablesCacheButReturnsHandle) {
  BackendCache<int> cache(0);
  int load_count = 0;
  auto loader = [&] {
    ++load_count;
    return value(1);
  };
  LoadInfo info;
  auto a = cache.get_or_load("a", 100, loader, &info);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(info.cached);
  EXPECT_EQ(a.value()->backend(), 1);
  auto b = cache.get_or_load("a", 100, loader);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(load_count, 2) << "disabled cache reloads every call";
  EXPECT_NE(a.value(), b.value());
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_TRUE(cache.is_disabled());
}

TEST(BackendCacheSeedTest, EvictIdleDropsStaleEntriesBelowCapacity) {
  ManualClock clock;
  BackendCache<int> cache(1'000'000, milliseconds(20), clock.fn());
  ASSERT_TRUE(cache.get_or_load("a", 100, [] { return value(1); }).ok());
  ASSERT_TRUE(cache.get_or_load("b", 100, [] { return value(2); }).ok());
  EXPECT_EQ(cache.stats().entries, 2u);
  EXPECT_EQ(cache.evict_idle(), (Evicted{0, 0})) << "nothing idle yet";
  clock.advance(milliseconds(40));
  ASSERT_TRUE(cache.get_or_load("a", 100, never_called).ok());  // touch a: only b is stale
  EXPECT_EQ(cache.evict_idle(), (Evicted{1, 100}));
  CacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 1u);
  EXPECT_EQ(s.total_bytes, 100u);
  EXPECT_TRUE(cache.contains("a"));
}

TEST(BackendCacheSeedTest, EvictIdleNoopWhenDisabled) {
  ManualClock clock;
  BackendCache<int> cache(1024, std::nullopt, clock.fn());
  ASSERT_TRUE(cache.get_or_load("a", 100, [] { return value(1); }).ok());
  clock.advance(std::chrono::hours(24));
  EXPECT_EQ(cache.evict_idle(), (Evicted{0, 0}));
  EXPECT_EQ(cache.stats().entries, 1u);
}

TEST(BackendCacheSeedTest, InvalidateRemovesKey) {
  BackendCache<int> cache(1024);
  ASSERT_TRUE(cache.get_or_load("a", 100, [] { return value(1); }).ok());
  EXPECT_EQ(cache.stats().entries, 1u);
  EXPECT_TRUE(cache.invalidate("a"));
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_FALSE(cache.invalidate("a")) << "second invalidate finds nothing";
}

// --- Single-flight ----------------------------------------------------------------------------------

/// Poll until `pred` holds (bounded by a generous deadline, so a broken cache fails instead of hanging, and a
/// loaded CI machine under TSan does not fail a correct one).
template <typename Pred>
bool eventually(Pred pred) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

TEST(BackendCacheSingleFlightTest, ConcurrentMissesRunOneLoader) {
  constexpr int kThreads = 6;
  BackendCache<int> cache(1024);
  std::atomic<int> loads{0};
  auto loader = [&]() -> Result<int> {
    loads.fetch_add(1);
    // Hold the load open until every other caller is waiting on it.
    EXPECT_TRUE(eventually([&] { return cache.stats().coalesced == kThreads - 1; }));
    EXPECT_EQ(cache.stats().loading, 1u);
    return 7;
  };
  std::vector<std::future<std::pair<BackendCache<int>::Handle, LoadInfo>>> results;
  for (int i = 0; i < kThreads; ++i) {
    results.push_back(std::async(std::launch::async, [&] {
      LoadInfo info;
      auto h = cache.get_or_load("m", 10, loader, &info);
      EXPECT_TRUE(h.ok());
      return std::make_pair(h.ok() ? h.value() : nullptr, info);
    }));
  }
  std::vector<std::pair<BackendCache<int>::Handle, LoadInfo>> got;
  for (auto& f : results) got.push_back(f.get());
  EXPECT_EQ(loads.load(), 1);
  int loaded = 0;
  int waited = 0;
  for (const auto& [h, info] : got) {
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(h, got[0].first) << "every caller shares the one loaded backend";
    EXPECT_TRUE(info.cached);
    EXPECT_FALSE(info.hit);
    loaded += info.loaded ? 1 : 0;
    waited += info.waited ? 1 : 0;
  }
  EXPECT_EQ(loaded, 1);
  EXPECT_EQ(waited, kThreads - 1);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.loads, 1u);
  EXPECT_EQ(s.misses, static_cast<std::uint64_t>(kThreads));
  EXPECT_EQ(s.coalesced, static_cast<std::uint64_t>(kThreads - 1));
  EXPECT_EQ(s.loading, 0u);
  EXPECT_EQ(s.entries, 1u);
}

TEST(BackendCacheSingleFlightTest, FailedLoadIsReportedToEveryWaiterAndNotCached) {
  constexpr int kThreads = 4;
  BackendCache<int> cache(1024);
  std::atomic<int> loads{0};
  auto loader = [&]() -> Result<int> {
    loads.fetch_add(1);
    EXPECT_TRUE(eventually([&] { return cache.stats().coalesced == kThreads - 1; }));
    return make_error("load_failed", "m.gguf: bad magic");
  };
  std::vector<std::future<Result<BackendCache<int>::Handle>>> results;
  for (int i = 0; i < kThreads; ++i) {
    results.push_back(std::async(std::launch::async, [&] { return cache.get_or_load("m", 10, loader); }));
  }
  for (auto& f : results) {
    auto r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, "load_failed");
    EXPECT_EQ(r.error().message, "m.gguf: bad magic");
  }
  EXPECT_EQ(loads.load(), 1);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 0u);
  EXPECT_EQ(s.loads, 1u);
  EXPECT_EQ(s.load_failures, 1u);
  // Not cached: the next call loads again (and may succeed).
  auto again = cache.get_or_load("m", 10, [] { return value(3); });
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again.value()->backend(), 3);
  EXPECT_EQ(cache.stats().loads, 2u);
}

TEST(BackendCacheSingleFlightTest, ThrowingLoaderBecomesLoadFailedError) {
  BackendCache<int> cache(1024);
  auto r = cache.get_or_load("m", 10, []() -> Result<int> { throw std::runtime_error("out of memory"); });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "load_failed");
  EXPECT_EQ(r.error().message, "out of memory");
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().load_failures, 1u);
  EXPECT_EQ(cache.stats().loading, 0u) << "the flight is finished even when the loader throws";
  EXPECT_TRUE(cache.get_or_load("m", 10, [] { return value(1); }).ok());
}

TEST(BackendCacheSingleFlightTest, InvalidateDuringLoadKeepsResultUncached) {
  BackendCache<int> cache(1024);
  LoadInfo info;
  auto r = cache.get_or_load(
      "m", 10,
      [&]() -> Result<int> {
        EXPECT_FALSE(cache.invalidate("m")) << "not cached yet";
        return 5;
      },
      &info);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.value()->backend(), 5);
  EXPECT_TRUE(info.loaded);
  EXPECT_FALSE(info.cached);
  EXPECT_FALSE(cache.contains("m")) << "a load invalidated in flight is not cached";
}

TEST(BackendCacheSingleFlightTest, DifferentKeysLoadInParallel) {
  BackendCache<int> cache(1024);
  std::atomic<int> inside{0};
  auto loader = [&]() -> Result<int> {
    inside.fetch_add(1);
    // Both loaders must be inside at once: a cache lock held across loads would deadlock here.
    EXPECT_TRUE(eventually([&] { return inside.load() == 2; }));
    return 1;
  };
  auto a = std::async(std::launch::async, [&] { return cache.get_or_load("a", 1, loader).ok(); });
  auto b = std::async(std::launch::async, [&] { return cache.get_or_load("b", 1, loader).ok(); });
  EXPECT_TRUE(a.get());
  EXPECT_TRUE(b.get());
  EXPECT_EQ(cache.stats().entries, 2u);
}

// --- LRU order and capacity -------------------------------------------------------------------------

TEST(BackendCacheLruTest, ListIsMostRecentFirstAndHitsReorder) {
  BackendCache<int> cache(1000);
  for (const char* k : {"a", "b", "c", "d"})
    ASSERT_TRUE(cache.get_or_load(k, 10, [] { return value(0); }).ok());
  ASSERT_TRUE(cache.get_or_load("b", 10, never_called).ok());
  std::vector<std::string> keys;
  for (const auto& i : cache.list()) keys.push_back(i.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"b", "d", "c", "a"}));
}

TEST(BackendCacheLruTest, EvictsInLruOrderAcrossManyEntries) {
  BackendCache<int> cache(100 * 10);
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(cache.get_or_load("k" + std::to_string(i), 10, [i] { return value(i); }).ok());
  }
  // Touch the even keys, so the odd ones are the 50 least recently used.
  for (int i = 0; i < 100; i += 2)
    ASSERT_TRUE(cache.get_or_load("k" + std::to_string(i), 10, never_called).ok());
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(cache.get_or_load("n" + std::to_string(i), 10, [] { return value(0); }).ok());
  }
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(cache.contains("k" + std::to_string(i)), i % 2 == 0) << "k" << i;
  }
  CacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 100u);
  EXPECT_EQ(s.total_bytes, 1000u);
  EXPECT_EQ(s.evictions_capacity, 50u);
}

TEST(BackendCacheLruTest, OversizedEntryIsRefusedAndEvictsNothing) {
  BackendCache<int> cache(100);
  ASSERT_TRUE(cache.get_or_load("a", 40, [] { return value(1); }).ok());
  ASSERT_TRUE(cache.get_or_load("b", 40, [] { return value(2); }).ok());
  auto big = cache.get_or_load("big", 500, never_called);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.error().code, "load_failed");
  CacheStats s = cache.stats();
  EXPECT_EQ(s.entries, 2u) << "a refusal evicts nothing";
  EXPECT_EQ(s.total_bytes, 80u);
  EXPECT_EQ(s.evictions_capacity, 0u);
  EXPECT_EQ(s.refused, 1u);
  EXPECT_EQ(s.loads, 2u) << "big's loader never ran";
}

// --- Accounting -------------------------------------------------------------------------------------

TEST(BackendCacheStatsTest, CountsHitsMissesLoadsAndEvictionsByCause) {
  ManualClock clock;
  BackendCache<int> cache(30, seconds(100), clock.fn());
  LoadInfo info;
  ASSERT_TRUE(cache
                  .get_or_load(
                      "a", 10, [] { return value(1); }, &info)
                  .ok());
  EXPECT_TRUE(info.loaded);
  EXPECT_FALSE(info.hit);
  ASSERT_TRUE(cache.get_or_load("a", 10, never_called, &info).ok());
  EXPECT_TRUE(info.hit);
  EXPECT_TRUE(info.cached);
  EXPECT_FALSE(info.loaded);
  ASSERT_TRUE(cache.get_or_load("a", 10, never_called).ok());
  clock.advance(seconds(4));
  ASSERT_TRUE(cache.get_or_load("b", 10, [] { return value(2); }).ok());
  ASSERT_TRUE(cache.get_or_load("c", 10, [] { return value(3); }).ok());
  clock.advance(seconds(2));
  ASSERT_TRUE(cache.get_or_load("d", 10, [] { return value(4); }).ok());  // capacity-evicts a (age 6 s)
  CacheStats s = cache.stats();
  EXPECT_EQ(s.hits, 2u);
  EXPECT_EQ(s.misses, 4u);
  EXPECT_EQ(s.loads, 4u);
  EXPECT_EQ(s.evictions_capacity, 1u);
  EXPECT_DOUBLE_EQ(s.last_eviction_age_seconds, 6.0);
  EXPECT_TRUE(cache.invalidate("b"));
  clock.advance(seconds(100));
  EXPECT_EQ(cache.evict_idle(), (Evicted{2, 20}));  // c and d, both untouched for 100+ s
  s = cache.stats();
  EXPECT_EQ(s.evictions_capacity, 1u);
  EXPECT_EQ(s.evictions_invalidate, 1u);
  EXPECT_EQ(s.evictions_idle, 2u);
  EXPECT_EQ(s.evictions_clear, 0u);
  EXPECT_EQ(s.evictions_total(), 4u);
  EXPECT_EQ(s.entries, 0u);
}

TEST(BackendCacheStatsTest, PerEntryListingAndAgeAtEviction) {
  ManualClock clock;
  BackendCache<int> cache(1000, std::nullopt, clock.fn());
  ASSERT_TRUE(cache.get_or_load("a", 10, [] { return value(1); }).ok());
  clock.advance(seconds(3));
  ASSERT_TRUE(cache.get_or_load("b", 20, [] { return value(2); }).ok());
  ASSERT_TRUE(cache.get_or_load("a", 10, never_called).ok());
  ASSERT_TRUE(cache.get_or_load("a", 10, never_called).ok());
  clock.advance(seconds(2));
  CacheStats s = cache.stats();
  ASSERT_EQ(s.items.size(), 2u);
  EXPECT_EQ(s.items[0].key, "a");
  EXPECT_EQ(s.items[0].size_bytes, 10u);
  EXPECT_EQ(s.items[0].hits, 2u);
  EXPECT_DOUBLE_EQ(s.items[0].idle_seconds, 2.0);
  EXPECT_DOUBLE_EQ(s.items[0].age_seconds, 5.0);
  EXPECT_FALSE(s.items[0].in_use);
  EXPECT_EQ(s.items[1].key, "b");
  EXPECT_EQ(s.items[1].hits, 0u);
  EXPECT_DOUBLE_EQ(s.items[1].age_seconds, 2.0);
  EXPECT_EQ(cache.clear(), (Evicted{2, 30}));
  s = cache.stats();
  EXPECT_EQ(s.evictions_clear, 2u);
  EXPECT_EQ(s.evictions_total(), 2u);
  EXPECT_DOUBLE_EQ(s.mean_eviction_age_seconds, (5.0 + 2.0) / 2);
  EXPECT_TRUE(s.items.empty());
  EXPECT_EQ(s.total_bytes, 0u);
}

// --- Runtime budget and TTL -------------------------------------------------------------------------

TEST(BackendCacheRuntimeTest, ShrinkingTheBudgetEvictsLeastRecentlyUsed) {
  BackendCache<int> cache(100);
  for (const char* k : {"a", "b", "c", "d"})
    ASSERT_TRUE(cache.get_or_load(k, 25, [] { return value(0); }).ok());
  ASSERT_TRUE(cache.get_or_load("a", 25, never_called).ok());  // order now a d c b
  EXPECT_EQ(cache.set_budget(50), (Evicted{2, 50}));
  EXPECT_TRUE(cache.contains("a"));
  EXPECT_TRUE(cache.contains("d"));
  EXPECT_EQ(cache.stats().budget_bytes, 50u);
  EXPECT_EQ(cache.set_budget(1000), (Evicted{0, 0}));
  EXPECT_EQ(cache.set_budget(0), (Evicted{2, 50})) << "0 disables caching: everything goes";
  EXPECT_TRUE(cache.is_disabled());
  int loads = 0;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(cache
                    .get_or_load("a", 25,
                                 [&] {
                                   ++loads;
                                   return value(0);
                                 })
                    .ok());
  }
  EXPECT_EQ(loads, 2);
  EXPECT_EQ(cache.stats().evictions_capacity, 4u);
}

TEST(BackendCacheRuntimeTest, IdleTtlCanBeEnabledChangedAndDisabledLive) {
  ManualClock clock;
  BackendCache<int> cache(1000, std::nullopt, clock.fn());
  ASSERT_TRUE(cache.get_or_load("a", 10, [] { return value(1); }).ok());
  clock.advance(seconds(50));
  EXPECT_EQ(cache.evict_idle().entries, 0u);
  cache.set_idle_ttl(seconds(60));
  EXPECT_EQ(cache.idle_ttl(), std::optional<std::chrono::milliseconds>(seconds(60)));
  EXPECT_EQ(cache.evict_idle().entries, 0u);
  cache.set_idle_ttl(seconds(30));
  EXPECT_EQ(cache.evict_idle().entries, 1u);
  ASSERT_TRUE(cache.get_or_load("b", 10, [] { return value(1); }).ok());
  cache.set_idle_ttl(seconds(0));  // zero disables, like the setting
  EXPECT_FALSE(cache.idle_ttl().has_value());
  clock.advance(std::chrono::hours(5));
  EXPECT_EQ(cache.evict_idle().entries, 0u);
}

TEST(BackendCacheListenerTest, TheEvictionListenerSeesEachCauseAgeAndSize) {
  ManualClock clock;
  BackendCache<int> cache(250, seconds(60), clock.fn());
  struct Seen {
    EvictionCause cause;
    double age;
    std::uint64_t bytes;
  };
  std::vector<Seen> seen;
  cache.set_eviction_listener([&](EvictionCause c, double age, std::uint64_t bytes) {
    seen.push_back({c, age, bytes});
  });
  ASSERT_TRUE(cache.get_or_load("a", 100, [] { return value(1); }).ok());
  clock.advance(seconds(5));
  ASSERT_TRUE(cache.get_or_load("b", 100, [] { return value(2); }).ok());
  clock.advance(seconds(5));
  ASSERT_TRUE(cache.get_or_load("c", 100, [] { return value(3); }).ok());  // a (10 s old) goes for capacity
  clock.advance(seconds(61));
  EXPECT_EQ(cache.evict_idle(), (Evicted{2, 200}));  // b (66 s), c (61 s)
  ASSERT_TRUE(cache.get_or_load("d", 50, [] { return value(4); }).ok());
  clock.advance(seconds(2));
  EXPECT_TRUE(cache.invalidate("d"));
  ASSERT_TRUE(cache.get_or_load("e", 70, [] { return value(5); }).ok());
  EXPECT_EQ(cache.clear(), (Evicted{1, 70}));
  ASSERT_EQ(seen.size(), 5u);
  EXPECT_EQ(seen[0].cause, EvictionCause::capacity);
  EXPECT_DOUBLE_EQ(seen[0].age, 10);
  EXPECT_EQ(seen[0].bytes, 100u);
  EXPECT_EQ(seen[1].cause, EvictionCause::idle);
  EXPECT_EQ(seen[2].cause, EvictionCause::idle);
  EXPECT_DOUBLE_EQ(seen[1].age + seen[2].age, 66 + 61);
  EXPECT_EQ(seen[3].cause, EvictionCause::invalidate);
  EXPECT_DOUBLE_EQ(seen[3].age, 2);
  EXPECT_EQ(seen[3].bytes, 50u);
  EXPECT_EQ(seen[4].cause, EvictionCause::clear);
  EXPECT_DOUBLE_EQ(seen[4].age, 0);
  EXPECT_STREQ(eviction_cause_name(EvictionCause::invalidate), "invalidate");
  // The counters `stats` reports are the same with a listener as without one.
  CacheStats s = cache.stats();
  EXPECT_EQ(s.evictions_total(), 5u);
  EXPECT_DOUBLE_EQ(s.mean_eviction_age_seconds, (10 + 66 + 61 + 2 + 0) / 5.0);
}

}  // namespace
}  // namespace car

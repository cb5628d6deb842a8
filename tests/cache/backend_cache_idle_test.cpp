// BackendCache<T>'s idle eviction: idle means not in use and counts from the end of the last lease; a
// request's keep-alive replaces the cache's TTL; pinned keys are never idle-evicted. Time is a ManualClock.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include "core/cache/backend_cache.h"
#include "tests/cache/cache_test_support.h"

namespace car {
namespace {

using cache_test::ManualClock;
using cache_test::never_called;
using cache_test::value;
using std::chrono::milliseconds;
using std::chrono::seconds;

// --- Idle means not in use --------------------------------------------------------------------------

TEST(BackendCacheIdleTest, LeasedEntryIsNeverIdleEvicted) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(10), clock.fn());
  auto lease = cache.lease_or_load("a", 10, [] { return value(1); });
  ASSERT_TRUE(lease.ok());
  EXPECT_TRUE(lease.value()->in_use());
  clock.advance(std::chrono::hours(1));
  EXPECT_EQ(cache.evict_idle(), (Evicted{0, 0})) << "in the middle of a request";
  auto items = cache.list();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_TRUE(items[0].in_use);
  EXPECT_EQ(items[0].leases, 1u);
  EXPECT_EQ(items[0].idle_seconds, 0.0);
}

TEST(BackendCacheIdleTest, IdleTimeCountsFromTheEndOfTheLastUse) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(10), clock.fn());
  auto h = cache.get_or_load("a", 10, [] { return value(1); });
  ASSERT_TRUE(h.ok());
  {
    auto lease = h.value()->acquire();
    clock.advance(seconds(60));  // a long request
  }
  clock.advance(seconds(9));
  EXPECT_EQ(cache.evict_idle(), (Evicted{0, 0})) << "only 9 s since the request ended";
  EXPECT_DOUBLE_EQ(cache.list().at(0).idle_seconds, 9.0);
  clock.advance(seconds(1));
  EXPECT_EQ(cache.evict_idle(), (Evicted{1, 10}));
  EXPECT_EQ(cache.stats().evictions_idle, 1u);
}

TEST(BackendCacheIdleTest, TwoOverlappingLeasesBothMustEnd) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(5), clock.fn());
  auto first = cache.lease_or_load("a", 10, [] { return value(1); });
  auto second = cache.lease_or_load("a", 10, never_called);
  ASSERT_TRUE(first.ok() && second.ok());
  first.value().reset();
  clock.advance(seconds(30));
  EXPECT_EQ(cache.evict_idle().entries, 0u) << "the second request is still running";
  second.value().reset();
  clock.advance(seconds(5));
  EXPECT_EQ(cache.evict_idle().entries, 1u);
}

TEST(BackendCacheIdleTest, StatsListPeekNeverRefreshIdleTime) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(10), clock.fn());
  ASSERT_TRUE(cache.get_or_load("a", 10, [] { return value(1); }).ok());
  ASSERT_TRUE(cache.get_or_load("b", 10, [] { return value(2); }).ok());
  for (int i = 0; i < 10; ++i) {
    clock.advance(seconds(1));
    (void)cache.stats();
    (void)cache.list();
    EXPECT_NE(cache.peek("a"), nullptr);
    EXPECT_TRUE(cache.contains("a"));
  }
  EXPECT_EQ(cache.evict_idle(), (Evicted{2, 20}));
  EXPECT_EQ(cache.stats().hits, 0u) << "peek/contains are not hits";
}

TEST(BackendCacheIdleTest, PeekDoesNotChangeLruOrder) {
  BackendCache<int> cache(20);
  ASSERT_TRUE(cache.get_or_load("a", 10, [] { return value(1); }).ok());
  ASSERT_TRUE(cache.get_or_load("b", 10, [] { return value(2); }).ok());
  EXPECT_NE(cache.peek("a"), nullptr);
  ASSERT_TRUE(cache.get_or_load("c", 10, [] { return value(3); }).ok());
  EXPECT_FALSE(cache.contains("a")) << "a stayed least recently used despite the peek";
  EXPECT_TRUE(cache.contains("b"));
}

// ---- Keep-alive (a request's own idle TTL) and pinned keys ----

TEST(BackendCacheKeepAliveTest, AnEntrysKeepAliveReplacesTheCachesTtlUntilCleared) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(60), clock.fn());
  auto lease = cache.lease_or_load("a", 10, [] { return value(1); });
  ASSERT_TRUE(lease.ok());
  lease.value()->set_keep_alive(seconds(600));
  lease.value().reset();
  clock.advance(seconds(120));
  EXPECT_EQ(cache.evict_idle().entries, 0u) << "its keep-alive (600 s) applies, not the cache's 60 s";
  auto items = cache.list();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_TRUE(items[0].keep_alive_set);
  EXPECT_EQ(items[0].idle_ttl, std::optional<milliseconds>(seconds(600)));
  // The next request without a keep-alive of its own puts the cache's TTL back.
  auto again = cache.lease_or_load("a", 10, never_called);
  ASSERT_TRUE(again.ok());
  again.value()->set_keep_alive(std::nullopt);
  again.value().reset();
  clock.advance(seconds(59));
  EXPECT_EQ(cache.evict_idle().entries, 0u);
  clock.advance(seconds(1));
  EXPECT_EQ(cache.evict_idle(), (Evicted{1, 10}));
  EXPECT_EQ(cache.stats().evictions_idle, 1u);
}

TEST(BackendCacheKeepAliveTest, AKeepAliveWorksWhenTheCachesIdleEvictionIsOff) {
  ManualClock clock;
  BackendCache<int> cache(1000, std::nullopt, clock.fn());
  auto h = cache.get_or_load("a", 10, [] { return value(1); });
  ASSERT_TRUE(h.ok());
  h.value()->set_keep_alive(seconds(5));
  std::optional<std::chrono::nanoseconds> due;
  EXPECT_EQ(cache.evict_idle(&due).entries, 0u);
  EXPECT_EQ(due, std::optional<std::chrono::nanoseconds>(seconds(5))) << "the sweep says when to come back";
  clock.advance(seconds(5));
  EXPECT_EQ(cache.evict_idle(&due).entries, 1u);
  EXPECT_FALSE(due.has_value()) << "nothing left to expire";
}

TEST(BackendCacheKeepAliveTest, KeepAliveZeroExpiresOnlyWhenTheLastLeaseEnds) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(60), clock.fn());
  auto first = cache.lease_or_load("a", 10, [] { return value(1); });
  auto second = cache.lease_or_load("a", 10, never_called);
  ASSERT_TRUE(first.ok() && second.ok());
  first.value()->set_keep_alive(milliseconds(0));
  first.value().reset();
  EXPECT_FALSE(cache.evict_if_expired("a")) << "another request still uses it";
  EXPECT_TRUE(cache.contains("a"));
  second.value().reset();
  EXPECT_TRUE(cache.evict_if_expired("a"));
  EXPECT_FALSE(cache.contains("a"));
  EXPECT_FALSE(cache.evict_if_expired("a")) << "no longer cached";
  EXPECT_EQ(cache.stats().evictions_idle, 1u);
}

TEST(BackendCacheKeepAliveTest, EvictIfExpiredLeavesEntriesWithinTheirTtl) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(60), clock.fn());
  ASSERT_TRUE(cache.get_or_load("a", 10, [] { return value(1); }).ok());
  clock.advance(seconds(59));
  EXPECT_FALSE(cache.evict_if_expired("a"));
  clock.advance(seconds(1));
  EXPECT_TRUE(cache.evict_if_expired("a"));
}

TEST(BackendCachePinTest, APinnedKeyIsNeverIdleEvictedWhateverItsKeepAlive) {
  ManualClock clock;
  BackendCache<int> cache(1000, seconds(60), clock.fn());
  cache.set_pinned({"a"});
  auto a = cache.get_or_load("a", 10, [] { return value(1); });
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(cache.get_or_load("b", 10, [] { return value(2); }).ok());
  a.value()->set_keep_alive(milliseconds(0));
  EXPECT_FALSE(cache.evict_if_expired("a"));
  clock.advance(std::chrono::hours(24));
  EXPECT_EQ(cache.evict_idle(), (Evicted{1, 10})) << "b only";
  EXPECT_TRUE(cache.contains("a"));
  EXPECT_TRUE(cache.is_pinned("a"));
  auto items = cache.list();
  ASSERT_EQ(items.size(), 1u);
  EXPECT_TRUE(items[0].pinned);
  EXPECT_FALSE(items[0].idle_ttl.has_value()) << "never idle-evicted";
  // Unpinned (a reload of the admin's list): the keep-alive of 0 it was left with applies again.
  cache.set_pinned({});
  EXPECT_FALSE(cache.is_pinned("a"));
  EXPECT_EQ(cache.evict_idle().entries, 1u);
}

TEST(BackendCachePinTest, CapacityEvictsUnpinnedEntriesBeforePinnedOnes) {
  ManualClock clock;
  BackendCache<int> cache(300, std::nullopt, clock.fn());
  cache.set_pinned({"old"});
  ASSERT_TRUE(cache.get_or_load("old", 100, [] { return value(1); }).ok());  // least recently used
  ASSERT_TRUE(cache.get_or_load("mid", 100, [] { return value(2); }).ok());
  ASSERT_TRUE(cache.get_or_load("new", 100, [] { return value(3); }).ok());
  ASSERT_TRUE(cache.get_or_load("more", 100, [] { return value(4); }).ok());
  EXPECT_TRUE(cache.contains("old")) << "pinned: passed over while an unpinned entry could go";
  EXPECT_FALSE(cache.contains("mid"));
  // Only when the unpinned entries cannot make room does a pinned one go.
  ASSERT_TRUE(cache.get_or_load("huge", 300, [] { return value(5); }).ok());
  EXPECT_FALSE(cache.contains("old"));
  EXPECT_TRUE(cache.contains("huge"));
}

}  // namespace
}  // namespace car

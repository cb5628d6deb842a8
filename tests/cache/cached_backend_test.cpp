// CachedBackend<T> and BackendLease<T> (core/cache/cached_backend.h): a handle outlives eviction and the
// cache, a backend is never destroyed under the cache's lock, and the entry's own lock serializes requests.
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

// --- Handles, leases, and release -------------------------------------------------------------------

struct Tracked {
  explicit Tracked(std::atomic<int>* d) : destroyed(d) {}
  ~Tracked() { destroyed->fetch_add(1); }
  Tracked(const Tracked&) = delete;
  Tracked& operator=(const Tracked&) = delete;
  std::atomic<int>* destroyed;
  int uses = 0;
};
using TrackedPtr = std::unique_ptr<Tracked>;

TEST(BackendCacheHandleTest, HandleWorksAfterEvictionAndMemoryIsReleasedOnLastDrop) {
  std::atomic<int> destroyed{0};
  BackendCache<TrackedPtr> cache(100);
  auto a =
      cache.get_or_load("a", 80, [&] { return Result<TrackedPtr>(std::make_unique<Tracked>(&destroyed)); });
  ASSERT_TRUE(a.ok());
  BackendCache<TrackedPtr>::Handle handle = a.value();
  // Capacity-evict `a` by loading `b`.
  ASSERT_TRUE(
      cache.get_or_load("b", 80, [&] { return Result<TrackedPtr>(std::make_unique<Tracked>(&destroyed)); })
          .ok());
  EXPECT_FALSE(cache.contains("a"));
  EXPECT_TRUE(handle->evicted());
  EXPECT_EQ(destroyed.load(), 0) << "a handle still holds a";
  {
    auto lock = handle->lock();
    handle->backend()->uses += 1;  // still usable
  }
  CacheStats s = cache.stats();
  EXPECT_EQ(s.evicted_held_entries, 1u);
  EXPECT_EQ(s.evicted_held_bytes, 80u);
  EXPECT_EQ(s.total_bytes, 80u) << "the budget no longer charges a";
  handle.reset();
  a = make_error("x", "drop the last reference");
  EXPECT_EQ(destroyed.load(), 1);
  s = cache.stats();
  EXPECT_EQ(s.evicted_held_entries, 0u);
  EXPECT_EQ(s.evicted_held_bytes, 0u);
  // Invalidate with no outside handle releases at once.
  EXPECT_TRUE(cache.invalidate("b"));
  EXPECT_EQ(destroyed.load(), 2);
  EXPECT_EQ(cache.stats().evicted_held_bytes, 0u);
}

/// A backend whose destructor calls back into the cache: proves backends die outside the cache lock.
struct Reentrant {
  BackendCache<std::unique_ptr<Reentrant>>* cache = nullptr;
  std::atomic<int>* destroyed = nullptr;
  ~Reentrant() {
    (void)cache->stats();
    destroyed->fetch_add(1);
  }
};

TEST(BackendCacheHandleTest, BackendIsNeverDestroyedUnderTheCacheLock) {
  using Ptr = std::unique_ptr<Reentrant>;
  std::atomic<int> destroyed{0};
  BackendCache<Ptr> cache(100);
  auto make = [&]() -> Result<Ptr> {
    auto p = std::make_unique<Reentrant>();
    p->cache = &cache;
    p->destroyed = &destroyed;
    return p;
  };
  ASSERT_TRUE(cache.get_or_load("a", 60, make).ok());
  ASSERT_TRUE(cache.get_or_load("b", 60, make).ok());  // capacity eviction of a
  EXPECT_EQ(destroyed.load(), 1);
  EXPECT_TRUE(cache.invalidate("b"));
  EXPECT_EQ(destroyed.load(), 2);
  ASSERT_TRUE(cache.get_or_load("c", 60, make).ok());
  EXPECT_EQ(cache.clear(), (Evicted{1, 60}));
  EXPECT_EQ(destroyed.load(), 3);
}

TEST(BackendCacheHandleTest, HandlesAndLeasesOutliveTheCache) {
  std::atomic<int> destroyed{0};
  BackendCache<TrackedPtr>::Lease lease;
  {
    BackendCache<TrackedPtr> cache(100);
    auto r = cache.lease_or_load("a", 10,
                                 [&] { return Result<TrackedPtr>(std::make_unique<Tracked>(&destroyed)); });
    ASSERT_TRUE(r.ok());
    lease = std::move(r.value());
  }
  EXPECT_EQ(destroyed.load(), 0);
  auto lock = lease.lock();
  lease.backend()->uses += 1;
  lock.unlock();
  lease.reset();
  EXPECT_EQ(destroyed.load(), 1);
}

TEST(BackendCacheHandleTest, EntryLockSerializesRequests) {
  BackendCache<int> cache(100);
  auto h = cache.get_or_load("a", 10, [] { return value(0); });
  ASSERT_TRUE(h.ok());
  auto handle = h.value();
  auto lock = handle->lock();
  EXPECT_TRUE(lock.owns_lock());
  auto other = std::async(std::launch::async, [&] { return handle->mutex().try_lock(); });
  EXPECT_FALSE(other.get()) << "a second request cannot take the model while the first holds it";
}

TEST(BackendCacheHandleTest, LockUnlessGivesUpWhenStoppedAndLocksWhenFree) {
  BackendCache<int> cache(100);
  auto h = cache.get_or_load("a", 10, [] { return value(0); });
  ASSERT_TRUE(h.ok());
  auto handle = h.value();
  std::atomic<bool> stop{false};
  {
    auto first = handle->lock();
    auto waiter = std::async(std::launch::async, [&] { return handle->lock_unless(stop, milliseconds(1)); });
    EXPECT_EQ(waiter.wait_for(milliseconds(30)), std::future_status::timeout)
        << "waits while the model is held";
    stop = true;
    auto gave_up = waiter.get();
    EXPECT_FALSE(gave_up.owns_lock()) << "a stopped waiter returns without the lock";
    EXPECT_TRUE(first.owns_lock());
  }
  stop = false;
  auto free_lock = handle->lock_unless(stop);
  EXPECT_TRUE(free_lock.owns_lock()) << "a free model is locked at once";
  stop = true;
  auto again = std::async(std::launch::async, [&] { return handle->mutex().try_lock(); });
  EXPECT_FALSE(again.get()) << "the returned lock really holds the mutex";
}

}  // namespace
}  // namespace car

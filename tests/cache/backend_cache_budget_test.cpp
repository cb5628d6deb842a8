// BackendCache<T> charging: the budget is a cap on what the cache retains. An estimate runs before the
// loader (only on a miss); too-large backends are refused; room is made before loading; the charge is
// corrected to the loader's measurement; entries in use are kept and trimmed when their leases end.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/cache/backend_cache.h"

namespace car {
namespace {

struct Counted {
  explicit Counted(std::atomic<int>* d) : destroyed(d) {}
  ~Counted() { destroyed->fetch_add(1); }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  std::atomic<int>* destroyed;
};
using CountedPtr = std::unique_ptr<Counted>;

Result<int> int_value(int v) {
  return v;
}

Sized<int> sized(int v, std::uint64_t bytes) {
  return Sized<int>{v, bytes};
}

TEST(BackendCacheBudgetTest, EstimateRunsOnlyOnAMissAndChargesWhenTheLoaderDoesNotMeasure) {
  BackendCache<int> cache(1000);
  int estimates = 0;
  auto estimate = [&]() -> Result<std::uint64_t> {
    ++estimates;
    return std::uint64_t{300};
  };
  ASSERT_TRUE(cache.get_or_load("a", estimate, [] { return int_value(1); }).ok());
  ASSERT_TRUE(cache.get_or_load("a", estimate, [] { return int_value(2); }).ok());
  EXPECT_EQ(estimates, 1) << "a hit does not estimate";
  EXPECT_EQ(cache.entries(), 1u);
  EXPECT_EQ(cache.stats().total_bytes, 300u);
  EXPECT_EQ(cache.peek("a")->size_bytes(), 300u);
}

TEST(BackendCacheBudgetTest, RefusesAnEstimateLargerThanTheBudgetNamingBothSizes) {
  BackendCache<int> cache(40u << 20);
  bool loaded = false;
  auto r = cache.get_or_load(
      "big", [] { return std::uint64_t{69'000'000}; },
      [&] {
        loaded = true;
        return int_value(1);
      });
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(loaded);
  EXPECT_EQ(r.error().code, "load_failed");
  EXPECT_NE(r.error().message.find("69000000 bytes"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("41943040 bytes (40.0 MiB)"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("'big'"), std::string::npos) << r.error().message;
  CacheStats s = cache.stats();
  EXPECT_EQ(s.refused, 1u);
  EXPECT_EQ(s.loading, 0u) << "the refused flight is gone";
  EXPECT_EQ(s.reserved_bytes, 0u);
  // The refusal is not sticky: a bigger budget loads it.
  cache.set_budget(100u << 20);
  EXPECT_TRUE(cache.get_or_load("big", 69'000'000, [] { return int_value(1); }).ok());
}

TEST(BackendCacheBudgetTest, AFailedEstimateIsTheCallsErrorAndTheLoaderDoesNotRun) {
  BackendCache<int> cache(1000);
  bool loaded = false;
  auto r = cache.get_or_load(
      "x", [] { return Result<std::uint64_t>(make_error("not_found", "x.gguf: no such file")); },
      [&] {
        loaded = true;
        return int_value(1);
      });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "not_found");
  EXPECT_FALSE(loaded);
  EXPECT_EQ(cache.stats().load_failures, 1u);
  EXPECT_EQ(cache.stats().loading, 0u);
}

TEST(BackendCacheBudgetTest, MakesRoomBeforeTheLoaderRuns) {
  std::atomic<int> destroyed{0};
  BackendCache<CountedPtr> cache(100);
  ASSERT_TRUE(cache.get_or_load("a", 60, [&] { return std::make_unique<Counted>(&destroyed); }).ok());
  int destroyed_when_loading = -1;
  std::uint64_t total_when_loading = 0, reserved_when_loading = 0;
  auto b = cache.get_or_load("b", 60, [&] {
    destroyed_when_loading = destroyed.load();
    CacheStats s = cache.stats();
    total_when_loading = s.total_bytes;
    reserved_when_loading = s.reserved_bytes;
    return std::make_unique<Counted>(&destroyed);
  });
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(destroyed_when_loading, 1) << "a was evicted and destroyed before b's loader ran";
  EXPECT_EQ(total_when_loading, 0u);
  EXPECT_EQ(reserved_when_loading, 60u) << "b's estimate is reserved while it loads";
  CacheStats s = cache.stats();
  EXPECT_EQ(s.total_bytes, 60u);
  EXPECT_EQ(s.reserved_bytes, 0u);
  EXPECT_EQ(s.evictions_capacity, 1u);
}

TEST(BackendCacheBudgetTest, LoadsInFlightReserveTheirEstimates) {
  // While c loads (estimate 50), a load of d (estimate 50) must evict b to keep c's room.
  BackendCache<int> cache(150);
  ASSERT_TRUE(cache.get_or_load("a", 50, [] { return int_value(1); }).ok());
  ASSERT_TRUE(cache.get_or_load("b", 50, [] { return int_value(2); }).ok());
  std::promise<void> c_started, release_c;
  std::shared_future<void> release = release_c.get_future().share();
  auto c = std::async(std::launch::async, [&] {
    return cache.get_or_load("c", 50, [&] {
      c_started.set_value();
      release.wait();
      return int_value(3);
    });
  });
  c_started.get_future().wait();
  EXPECT_EQ(cache.stats().reserved_bytes, 50u);
  EXPECT_EQ(cache.stats().entries, 2u) << "a + b + c's 50 fit in 150";
  ASSERT_TRUE(cache.get_or_load("d", 50, [] { return int_value(4); }).ok());
  EXPECT_FALSE(cache.contains("a")) << "a (least recently used) made room for d with c's load reserved";
  release_c.set_value();
  ASSERT_TRUE(c.get().ok());
  CacheStats s = cache.stats();
  EXPECT_EQ(s.total_bytes, 150u);
  EXPECT_EQ(s.entries, 3u);
  EXPECT_EQ(s.reserved_bytes, 0u);
}

TEST(BackendCacheBudgetTest, TheLoadersMeasurementCorrectsTheChargeAndEvictsOthers) {
  BackendCache<int> cache(100);
  ASSERT_TRUE(cache.get_or_load("a", 50, [] { return int_value(1); }).ok());
  // Estimated at 10, really 70: after the load a (not in use) goes.
  LoadInfo info;
  auto b = cache.get_or_load(
      "b", 10, [] { return sized(2, 70); }, &info);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(info.cached);
  EXPECT_EQ(b.value()->size_bytes(), 70u);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.total_bytes, 70u);
  EXPECT_FALSE(cache.contains("a"));
  ASSERT_EQ(s.items.size(), 1u);
  EXPECT_EQ(s.items[0].size_bytes, 70u) << "stats, the handle and the total agree";
  // A measurement below the estimate lowers the charge too; Result<Sized<T>> works as well.
  auto c = cache.get_or_load("c", 30, []() -> Result<Sized<int>> { return sized(3, 20); });
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(cache.stats().total_bytes, 90u);
}

TEST(BackendCacheBudgetTest, AMeasurementLargerThanTheBudgetIsRefusedAndNotCached) {
  std::atomic<int> destroyed{0};
  BackendCache<CountedPtr> cache(100);
  auto r = cache.get_or_load("x", 10, [&] {
    return Sized<CountedPtr>{std::make_unique<Counted>(&destroyed), 500};
  });
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "load_failed");
  EXPECT_NE(r.error().message.find("measured after loading"), std::string::npos) << r.error().message;
  EXPECT_EQ(destroyed.load(), 1) << "the loaded backend was released";
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().refused, 1u);
}

TEST(BackendCacheBudgetTest, AnEntryInUseIsKeptAndTrimmedWhenItsLeaseEnds) {
  BackendCache<int> cache(100);
  auto a = cache.lease_or_load("a", 60, [] { return int_value(1); });
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(cache.get_or_load("b", 60, [] { return int_value(2); }).ok());
  CacheStats s = cache.stats();
  EXPECT_TRUE(cache.contains("a")) << "a is in use: evicting it would free nothing";
  EXPECT_TRUE(cache.contains("b"));
  EXPECT_EQ(s.total_bytes, 120u);
  EXPECT_TRUE(s.over_budget);
  EXPECT_EQ(s.evictions_capacity, 0u);
  a.value().reset();  // the lease ends: a is the least recently used entry not in use
  s = cache.stats();
  EXPECT_FALSE(cache.contains("a"));
  EXPECT_TRUE(cache.contains("b"));
  EXPECT_EQ(s.total_bytes, 60u);
  EXPECT_FALSE(s.over_budget);
  EXPECT_EQ(s.evictions_capacity, 1u);
}

TEST(BackendCacheBudgetTest, ShrinkingTheBudgetKeepsEntriesInUseUntilTheirLeasesEnd) {
  BackendCache<int> cache(100);
  auto a = cache.lease_or_load("a", 40, [] { return int_value(1); });
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(cache.get_or_load("b", 40, [] { return int_value(2); }).ok());
  EXPECT_EQ(cache.set_budget(40), (Evicted{1, 40})) << "b (not in use) goes";
  EXPECT_TRUE(cache.contains("a"));
  EXPECT_EQ(cache.set_budget(30), (Evicted{0, 0})) << "a is in use";
  EXPECT_TRUE(cache.stats().over_budget);
  a.value().reset();
  EXPECT_FALSE(cache.contains("a"));
  EXPECT_EQ(cache.stats().total_bytes, 0u);
}

TEST(BackendCacheBudgetTest, LeasesEndingAfterTheCacheIsGoneDoNotTrim) {
  std::optional<BackendCache<int>::Lease> lease;
  {
    BackendCache<int> cache(100);
    auto a = cache.lease_or_load("a", 60, [] { return int_value(1); });
    ASSERT_TRUE(a.ok());
    ASSERT_TRUE(cache.get_or_load("b", 60, [] { return int_value(2); }).ok());
    ASSERT_TRUE(cache.stats().over_budget);
    lease = std::move(a.value());
  }
  lease->reset();  // must not reach the destroyed cache
  EXPECT_FALSE(*lease);
}

TEST(BackendCacheBudgetTest, ZeroBudgetLoadsEveryTimeRefusesNothingAndReportsTheMeasuredSize) {
  BackendCache<int> cache(0);
  int estimates = 0;
  auto estimate = [&] {
    ++estimates;
    return std::uint64_t{1} << 40;
  };
  auto a = cache.get_or_load("a", estimate, [] { return sized(1, 1234); });
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value()->size_bytes(), 1234u);
  EXPECT_EQ(estimates, 0) << "with caching off a measured load needs no estimate";
  auto b = cache.get_or_load("a", estimate, [] { return int_value(1); });
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value()->size_bytes(), std::uint64_t{1} << 40) << "unmeasured: labelled with the estimate";
  EXPECT_NE(a.value(), b.value());
  EXPECT_EQ(cache.stats().entries, 0u);
  EXPECT_EQ(cache.stats().refused, 0u);
}

TEST(BackendCacheBudgetTest, ConcurrentLoadsNeverLeaveTheCacheOverBudgetWithoutLeases) {
  // Eight threads load 12 keys of varied, mis-estimated sizes; no lease outlives a call, so after every
  // call the cache is within budget, and at the end the charges add up.
  BackendCache<int> cache(1000);
  std::atomic<int> violations{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 400; ++i) {
        const int k = (i * 7 + t) % 12;
        const std::uint64_t real = 100 + 50 * static_cast<std::uint64_t>(k % 5);
        auto r = cache.get_or_load("k" + std::to_string(k), real / 2 + 40, [&] { return sized(k, real); });
        if (!r.ok()) violations.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  CacheStats s = cache.stats();
  EXPECT_EQ(violations.load(), 0);
  EXPECT_LE(s.total_bytes, 1000u);
  EXPECT_FALSE(s.over_budget);
  EXPECT_EQ(s.reserved_bytes, 0u);
  std::uint64_t sum = 0;
  for (const auto& item : s.items) sum += item.size_bytes;
  EXPECT_EQ(sum, s.total_bytes);
}

TEST(BackendCacheBudgetTest, LeasesEndingWhileOthersLoadLeaveNoExcessBehind) {
  // Threads hold leases across other threads' loads, so loads go over budget and leases ending must trim;
  // once every lease has ended the cache is within budget, whatever the interleaving.
  BackendCache<int> cache(500);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        const int k = (i * 5 + t) % 9;
        auto lease =
            cache.lease_or_load("k" + std::to_string(k), 200, [&] { return sized(k, 150 + 10 * (k % 3)); });
        ASSERT_TRUE(lease.ok()) << lease.error().message;
        std::this_thread::yield();
      }
    });
  }
  for (auto& th : threads) th.join();
  CacheStats s = cache.stats();
  EXPECT_LE(s.total_bytes, 500u);
  EXPECT_FALSE(s.over_budget);
  for (const auto& item : s.items) EXPECT_FALSE(item.in_use);
}

// The room (budget less charges and loads in flight) and its listener: the listener runs after the
// estimate is reserved and before the loader, so memory kept outside the charges can be given back before
// the new backend allocates; and after every change that moves the room.
TEST(BackendCacheBudgetTest, TheRoomListenerRunsBeforeTheLoaderAndAfterEveryChange) {
  BackendCache<int> cache(1000);
  std::vector<std::optional<std::uint64_t>> seen;
  cache.set_room_listener([&] { seen.push_back(cache.room_bytes()); });
  EXPECT_EQ(cache.room_bytes(), std::optional<std::uint64_t>(1000));
  std::size_t seen_at_load = 0;
  ASSERT_TRUE(cache
                  .get_or_load("a", std::uint64_t{300},
                               [&] {
                                 seen_at_load = seen.size();
                                 return int_value(1);
                               })
                  .ok());
  ASSERT_GE(seen_at_load, 1u) << "told before the loader ran";
  EXPECT_EQ(seen[seen_at_load - 1], std::optional<std::uint64_t>(700)) << "the estimate is reserved";
  EXPECT_EQ(seen.back(), std::optional<std::uint64_t>(700));
  // A load charged more than it reserved shrinks the room again; the listener hears of it.
  ASSERT_TRUE(cache.get_or_load("b", std::uint64_t{100}, [] { return sized(2, 400); }).ok());
  EXPECT_EQ(seen.back(), std::optional<std::uint64_t>(300));
  EXPECT_EQ(cache.room_bytes(), std::optional<std::uint64_t>(300));
  // Invalidation, a budget change and clear each move it and tell.
  const std::size_t before = seen.size();
  EXPECT_TRUE(cache.invalidate("a"));
  EXPECT_EQ(seen.back(), std::optional<std::uint64_t>(600));
  cache.set_budget(500);
  EXPECT_EQ(seen.back(), std::optional<std::uint64_t>(100));
  cache.clear();
  EXPECT_EQ(seen.back(), std::optional<std::uint64_t>(500));
  EXPECT_EQ(seen.size(), before + 3);
  // A refused estimate reserves nothing: the room it reports is unchanged, and no entry was evicted.
  ASSERT_TRUE(cache.get_or_load("c", std::uint64_t{200}, [] { return int_value(3); }).ok());
  EXPECT_FALSE(cache.get_or_load("big", std::uint64_t{600}, [] { return int_value(4); }).ok());
  EXPECT_TRUE(cache.contains("c"));
  EXPECT_EQ(cache.room_bytes(), std::optional<std::uint64_t>(300));
  // Caching disabled: no budget to share.
  cache.set_budget(0);
  EXPECT_EQ(cache.room_bytes(), std::nullopt);
  EXPECT_EQ(seen.back(), std::nullopt);
}

// The idle sweep runs every few seconds; with a streamed model the room listener re-sizes the expert pool
// (reading /proc and the cgroup), so a sweep or an expiry check that evicts nothing must not tell it.
TEST(BackendCacheBudgetTest, TheRoomListenerHearsOnlyOfIdleEvictionsThatHappened) {
  std::atomic<std::int64_t> now_ns{1'000'000'000};
  BackendCache<int> cache(1000, std::chrono::milliseconds(100), [&] {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(now_ns.load()));
  });
  ASSERT_TRUE(cache.get_or_load("a", std::uint64_t{300}, [] { return int_value(1); }).ok());
  int told = 0;
  cache.set_room_listener([&] { ++told; });
  EXPECT_EQ(cache.evict_idle(), Evicted{});
  EXPECT_FALSE(cache.evict_if_expired("a"));
  EXPECT_FALSE(cache.evict_if_expired("missing"));
  EXPECT_EQ(told, 0) << "nothing left the cache, so the room did not move";
  now_ns += 200'000'000;  // past the TTL
  EXPECT_EQ(cache.evict_idle(), (Evicted{1, 300}));
  EXPECT_EQ(told, 1);
  ASSERT_TRUE(cache.get_or_load("b", std::uint64_t{200}, [] { return int_value(2); }).ok());
  told = 0;
  now_ns += 200'000'000;
  EXPECT_TRUE(cache.evict_if_expired("b"));
  EXPECT_EQ(told, 1);
}

}  // namespace
}  // namespace car

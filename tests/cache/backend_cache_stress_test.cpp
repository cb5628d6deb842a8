// BackendCache<T> under concurrency: several threads hit, load (some loads fail), lease and use, invalidate,
// sweep idle entries, clear and resize a small budget at once. Run under TSan in CI. The assertions are
// the cache's invariants, checked while the storm runs and once it is over.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/cache/backend_cache.h"

namespace car {
namespace {

struct Model {
  explicit Model(int k, std::atomic<int>* live_count) : key(k), live(live_count) { live->fetch_add(1); }
  ~Model() { live->fetch_sub(1); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  int key;
  std::atomic<int>* live;
  std::uint64_t requests = 0;  // mutated only under the entry's lock (TSan checks that)
};
using ModelPtr = std::unique_ptr<Model>;

void check_sums(const CacheStats& s) {
  std::uint64_t sum = 0;
  for (const auto& item : s.items) sum += item.size_bytes;
  ASSERT_EQ(s.items.size(), s.entries);
  ASSERT_EQ(sum, s.total_bytes);
}

/// Within budget, except one entry that alone exceeds it (never evicting the entry just inserted).
void check_invariants(const CacheStats& s) {
  ASSERT_NO_FATAL_FAILURE(check_sums(s));
  ASSERT_TRUE(s.total_bytes <= s.budget_bytes || s.entries <= 1)
      << s.total_bytes << " bytes in " << s.entries << " entries, budget " << s.budget_bytes;
}

/// While leases are held the cache may be over budget: a load goes ahead when entries in use hold the
/// room, and a shrunk budget waits for their leases; the lease that ends last trims the excess. So during
/// the storm, more than one entry over budget needs an entry in use. A snapshot taken between a lease's
/// end and the trim it runs can see the excess with nothing in use; such a snapshot is taken again once.
void check_invariants_during(BackendCache<ModelPtr>& cache) {
  auto within = [](const CacheStats& s) {
    if (s.total_bytes <= s.budget_bytes || s.entries <= 1) return true;
    for (const auto& item : s.items)
      if (item.in_use) return true;
    return false;
  };
  CacheStats s = cache.stats();
  ASSERT_NO_FATAL_FAILURE(check_sums(s));
  if (!within(s)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    s = cache.stats();
  }
  ASSERT_TRUE(within(s)) << s.total_bytes << " bytes in " << s.entries << " entries, budget "
                         << s.budget_bytes << ", none in use";
}

TEST(BackendCacheStressTest, ConcurrentHitLoadInvalidateEvict) {
  constexpr int kThreads = 6;
  constexpr int kOpsPerThread = 1500;
  constexpr int kKeys = 8;
  std::atomic<int> live{0};
  std::atomic<std::int64_t> now_ns{0};
  BackendCache<ModelPtr> cache(300, std::chrono::milliseconds(5), [&] {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(now_ns.load()));
  });

  std::atomic<std::uint64_t> calls{0}, ok_calls{0}, failed_calls{0}, hits_seen{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<std::uint32_t>(1234 + t));
      for (int i = 0; i < kOpsPerThread; ++i) {
        const int op = static_cast<int>(rng() % 100);
        const int k = static_cast<int>(rng() % kKeys);
        const std::string key = "m" + std::to_string(k);
        const std::uint64_t size = 40 + static_cast<std::uint64_t>(k) * 10;
        if (op < 70) {
          const bool fail = rng() % 10 == 0;
          LoadInfo info;
          calls.fetch_add(1);
          auto lease = cache.lease_or_load(
              key, size,
              [&]() -> Result<ModelPtr> {
                if (fail) return make_error("load_failed", "injected failure");
                return std::make_unique<Model>(k, &live);
              },
              &info);
          if (!lease.ok()) {
            failed_calls.fetch_add(1);
            EXPECT_EQ(lease.error().code, "load_failed");
            continue;
          }
          ok_calls.fetch_add(1);
          if (info.hit) hits_seen.fetch_add(1);
          auto lock = lease.value().lock();
          EXPECT_EQ(lease.value().backend()->key, k);
          lease.value().backend()->requests += 1;
        } else if (op < 78) {
          (void)cache.invalidate(key);
        } else if (op < 86) {
          now_ns.fetch_add(1'000'000);  // 1 ms
          (void)cache.evict_idle();
        } else if (op < 94) {
          check_invariants_during(cache);
        } else if (op < 97) {
          (void)cache.set_budget(150 + (rng() % 3) * 100);
        } else if (op < 98) {
          (void)cache.clear();
        } else {
          auto h = cache.peek(key);
          if (h) {
            auto lock = h->lock();
            h->backend()->requests += 1;
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();

  CacheStats s = cache.stats();
  check_invariants(s);
  EXPECT_EQ(s.loading, 0u);
  EXPECT_EQ(s.hits + s.misses, calls.load());
  EXPECT_EQ(s.hits, hits_seen.load());
  EXPECT_GE(s.loads, s.load_failures);
  EXPECT_EQ(ok_calls.load() + failed_calls.load(), calls.load());
  EXPECT_GT(s.hits, 0u);
  EXPECT_GT(s.evictions_total(), 0u);
  // Every lease is gone: nothing evicted is still held, and only cached models are alive.
  EXPECT_EQ(s.evicted_held_entries, 0u);
  EXPECT_EQ(s.evicted_held_bytes, 0u);
  EXPECT_EQ(live.load(), static_cast<int>(s.entries));
  for (const auto& item : s.items) EXPECT_FALSE(item.in_use) << item.key;
  (void)cache.clear();
  EXPECT_EQ(live.load(), 0);
}

TEST(BackendCacheStressTest, SingleFlightUnderContentionLoadsEachKeyOncePerGeneration) {
  // No evictions here: every key must be loaded exactly once however many threads race for it.
  constexpr int kThreads = 6;
  constexpr int kKeys = 16;
  std::atomic<int> live{0};
  std::atomic<int> loads{0};
  BackendCache<ModelPtr> cache(1'000'000);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < 20; ++round) {
        for (int k = 0; k < kKeys; ++k) {
          auto h = cache.get_or_load("k" + std::to_string(k), 1, [&]() -> Result<ModelPtr> {
            loads.fetch_add(1);
            std::this_thread::yield();
            return std::make_unique<Model>(k, &live);
          });
          ASSERT_TRUE(h.ok());
          EXPECT_EQ(h.value()->backend()->key, k);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(loads.load(), kKeys);
  EXPECT_EQ(live.load(), kKeys);
  CacheStats s = cache.stats();
  EXPECT_EQ(s.loads, static_cast<std::uint64_t>(kKeys));
  EXPECT_EQ(s.hits + s.misses, static_cast<std::uint64_t>(kThreads * 20 * kKeys));
  EXPECT_EQ(s.misses - s.coalesced, static_cast<std::uint64_t>(kKeys));
}

}  // namespace
}  // namespace car

// bench_cache: what the daemon's BackendCache costs per request.
//   BM_Hit/N          lease_or_load of a cached key (the path of every warm request) with N entries cached
//   BM_MissEvict/N    a miss on a full cache: estimate, evict the least recently used, load, insert
//   BM_Stats/N        stats() (the `stats` op) with N entries: O(N), it lists every entry
// Each runs on 1 and 2 threads (Google Benchmark's ->Threads; times are per call on each thread).
// Usage: bench_cache [--benchmark_filter=Hit] [--benchmark_min_time=0.2]
#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cache/backend_cache.h"

namespace {

using Cache = car::BackendCache<int>;
constexpr std::uint64_t kEntryBytes = 1000;

std::vector<std::string> keys(std::size_t n, const char* prefix) {
  std::vector<std::string> out;
  out.reserve(n);
  // Model-id-like keys (the daemon's are file stems).
  for (std::size_t i = 0; i < n; ++i) out.push_back(std::string(prefix) + "-model-" + std::to_string(i));
  return out;
}

/// A cache of n entries, budget exactly n entries, shared by the threads of one run.
struct Shared {
  std::unique_ptr<Cache> cache;
  std::vector<std::string> names;
  std::atomic<std::uint64_t> next{0};
};
Shared g;

void fill(std::size_t n) {
  g.cache = std::make_unique<Cache>(n * kEntryBytes);
  g.names = keys(n, "m");
  g.next = 0;
  for (const auto& k : g.names)
    (void)g.cache->get_or_load(k, kEntryBytes, [] { return car::Result<int>(1); });
}

void BM_Hit(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  if (state.thread_index() == 0) fill(n);
  // A per-thread walk over the keys with a stride, so threads touch different entries and the LRU moves.
  std::size_t i = static_cast<std::size_t>(state.thread_index()) * 7919;
  for (auto _ : state) {
    const std::string& k = g.names[i % n];
    auto lease = g.cache->lease_or_load(k, kEntryBytes, [] { return car::Result<int>(0); });
    benchmark::DoNotOptimize(lease.value().backend());
    i += 104729;
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0 && g.cache->stats().loads != n) state.SkipWithError("a hit loaded");
}

void BM_MissEvict(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  if (state.thread_index() == 0) fill(n);
  const std::string prefix = "t" + std::to_string(state.thread_index()) + "-";
  std::uint64_t i = 0;
  std::string key;
  for (auto _ : state) {
    key = prefix;
    key += std::to_string(i++);  // a key never seen: a miss that evicts the least recently used entry
    auto h = g.cache->get_or_load(
        key, [] { return std::uint64_t{kEntryBytes}; },
        [] {
          return car::Sized<int>{1, kEntryBytes};
        });
    benchmark::DoNotOptimize(h.value()->backend());
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Stats(benchmark::State& state) {
  const auto n = static_cast<std::size_t>(state.range(0));
  if (state.thread_index() == 0) fill(n);
  for (auto _ : state) {
    car::CacheStats s = g.cache->stats();
    benchmark::DoNotOptimize(s.items.data());
  }
  state.SetItemsProcessed(state.iterations());
}

}  // namespace

BENCHMARK(BM_Hit)->Arg(10)->Arg(1000)->Arg(100000)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_MissEvict)->Arg(10)->Arg(1000)->Arg(100000)->Threads(1)->Threads(2)->UseRealTime();
BENCHMARK(BM_Stats)->Arg(10)->Arg(1000)->Arg(100000)->Threads(1)->Threads(2)->UseRealTime();

BENCHMARK_MAIN();

// detail::split_rows (matvec's split of rows over the pool): every chunk is passed exactly once, chunks are
// grain-aligned (one call for the whole range when only one thread takes part), each thread starts on its own
// contiguous share, and a stalled thread's share is finished by the others.
#include "core/tensor/row_split.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace car::tensor {
namespace {

TEST(RowSplit, CoversRangeExactlyOnceInGrainAlignedChunks) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 64, 1000, 4099}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        detail::split_rows(pool, n, grain, [&](int64_t b, int64_t e) {
          ASSERT_EQ(b % grain, 0);
          // A single participant gets the whole range in one call.
          const bool whole = threads == 1 || n <= grain;
          ASSERT_TRUE(whole ? (b == 0 && e == n) : (e - b == grain || (e == n && e - b < grain && e > b)))
              << b << " " << e;
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << n << " " << grain;
        }
      }
    }
  }
}

TEST(RowSplit, EachThreadStartsAtTheFrontOfItsShare) {
  ThreadPool pool(2);
  const int64_t chunks = 10;
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<int64_t> first[2] = {-1, -1};  // [0]: the caller's first chunk, [1]: the worker's
  std::atomic<int> starters{0};
  // Each thread records the first chunk it runs, then waits until both threads have started, so neither can
  // finish its share and steal before the other has begun.
  detail::split_rows(pool, chunks, 1, [&](int64_t b, int64_t) {
    std::atomic<int64_t>& mine = first[std::this_thread::get_id() == caller ? 0 : 1];
    if (mine.load() >= 0) return;
    mine.store(b);
    starters.fetch_add(1);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (starters.load() < 2 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  });
  EXPECT_EQ(first[0].load(), 0);
  EXPECT_EQ(first[1].load(), chunks / 2);
}

TEST(RowSplit, AStalledThreadsShareIsFinishedByTheOthers) {
  ThreadPool pool(3);
  const int64_t n = 300;
  std::atomic<int64_t> done{0};
  std::atomic<bool> all_but_one{false};
  const std::thread::id caller = std::this_thread::get_id();
  bool caller_stalled = false;
  detail::split_rows(pool, n, 1, [&](int64_t b, int64_t e) {
    if (std::this_thread::get_id() == caller && !caller_stalled) {
      // The caller (share 0) stalls in its first chunk until every other chunk is done.
      caller_stalled = true;
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (done.load() < n - 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      all_but_one.store(done.load() == n - 1);
    }
    done.fetch_add(e - b);
  });
  EXPECT_TRUE(all_but_one.load());
  EXPECT_EQ(done.load(), n);
}

}  // namespace
}  // namespace car::tensor

// car::ThreadPool: every participant index runs exactly once per run(), parallel_for covers a range exactly
// once, the pool is reusable and callable from several threads.
#include "core/util/thread_pool.h"

#include <gtest/gtest.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

namespace car {
namespace {

TEST(ThreadPool, RunCallsEachIndexOnce) {
  ThreadPool pool(3);
  EXPECT_EQ(pool.size(), 3);
  for (int n : {1, 2, 3, 5}) {
    std::vector<std::atomic<int>> hits(8);
    std::atomic<int> seen_n{-1};
    pool.run(n, [&](int i, int total) {
      hits[static_cast<size_t>(i)].fetch_add(1);
      seen_n.store(total);
    });
    const int expect_n = std::min(n, 3);
    EXPECT_EQ(seen_n.load(), expect_n);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), i < expect_n ? 1 : 0);
  }
}

TEST(ThreadPool, RunUsesDistinctThreadsAndTheCaller) {
  ThreadPool pool(2);
  std::thread::id ids[2];
  pool.run(2, [&](int i, int) { ids[i] = std::this_thread::get_id(); });
  EXPECT_EQ(ids[0], std::this_thread::get_id());
  EXPECT_NE(ids[0], ids[1]);
}

// Stop and reload signals go to the thread that waits for them (the daemon's io thread), never to a worker:
// under TSan a worker asleep in a futex would hold a SIGTERM's handler back indefinitely.
TEST(ThreadPool, WorkersBlockTheStopAndReloadSignalsAndTheCallerKeepsItsMask) {
  sigset_t before;
  ASSERT_EQ(pthread_sigmask(SIG_SETMASK, nullptr, &before), 0);
  ThreadPool pool(3);
  int blocked[3][3] = {};
  pool.run(3, [&](int i, int) {
    sigset_t now;
    pthread_sigmask(SIG_SETMASK, nullptr, &now);
    int k = 0;
    for (int sig : {SIGTERM, SIGINT, SIGHUP}) blocked[i][k++] = sigismember(&now, sig);
  });
  for (int i = 1; i < 3; ++i) {
    for (int k = 0; k < 3; ++k) EXPECT_EQ(blocked[i][k], 1) << "worker " << i << ", signal " << k;
  }
  int k = 0;
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) EXPECT_EQ(blocked[0][k++], sigismember(&before, sig));
}

TEST(ThreadPool, ParallelForCoversRangeExactlyOnce) {
  ThreadPool pool(2);
  for (int64_t n : {0, 1, 7, 64, 1000}) {
    for (int64_t grain : {1, 3, 64, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, grain, 0, [&](int64_t b, int64_t e) {
        ASSERT_LE(e - b, grain);
        for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << grain;
    }
  }
}

TEST(ThreadPool, ManyShortJobsAndConcurrentCallers) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  auto work = [&] {
    for (int k = 0; k < 500; ++k) pool.parallel_for(10, 1, 0, [&](int64_t b, int64_t e) { total += e - b; });
  };
  std::thread other(work);
  work();
  other.join();
  EXPECT_EQ(total.load(), 2 * 500 * 10);
}

TEST(ThreadPool, ParallelForSharesCoversRangeExactlyOnce) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 64, 1000}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        for (int n_threads : {0, 2}) {
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          pool.parallel_for_shares(n, grain, n_threads, [&](int64_t b, int64_t e) {
            // One thread runs the whole range in one call, as parallel_for does.
            if (threads > 1 && n > grain) {
              ASSERT_LE(e - b, grain);
            }
            ASSERT_TRUE(b % grain == 0 && e <= n && b < e);
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
          });
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << n << " " << grain;
        }
      }
    }
  }
}

TEST(ThreadPool, ParallelForSharesRunsOwnShareFrontToBackThenStealsFromTheBack) {
  // The caller (participant 0) owns chunks [0, 20) and stalls on its first one until the worker has finished
  // its own share [20, 40) and starts taking the caller's chunks from the back.
  ThreadPool pool(2);
  const int64_t n = 40;
  std::vector<std::atomic<int>> hits(n);
  std::vector<int64_t> caller_order, worker_order;
  std::atomic<bool> release{false};
  const std::thread::id caller = std::this_thread::get_id();
  pool.parallel_for_shares(n, 1, 0, [&](int64_t b, int64_t) {
    if (std::this_thread::get_id() == caller) {
      caller_order.push_back(b);
      while (!release.load()) std::this_thread::yield();
    } else {
      worker_order.push_back(b);
      if (b < n / 2) release.store(true);
    }
    hits[static_cast<size_t>(b)].fetch_add(1);
  });
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
  // A caller descheduled for the whole region (a loaded 2-core machine, the sanitizer builds) takes nothing:
  // the worker then takes all of the caller's share from the back, which the checks below still hold.
  if (!caller_order.empty()) {
    EXPECT_EQ(caller_order.front(), 0);
    EXPECT_TRUE(std::is_sorted(caller_order.begin(), caller_order.end()));
  }
  ASSERT_GT(worker_order.size(), size_t{20});
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(worker_order[static_cast<size_t>(i)], 20 + i);
  EXPECT_EQ(worker_order[20], 19);
  EXPECT_TRUE(std::is_sorted(worker_order.begin() + 20, worker_order.end(), std::greater<>()));
}

TEST(ThreadPool, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1);
  int calls = 0;
  pool.run(4, [&](int i, int n) {
    EXPECT_EQ(i, 0);
    EXPECT_EQ(n, 1);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
}

TEST(ThreadPool, ParallelForSharesFinishesAStalledThreadsShare) {
  ThreadPool pool(3);
  const int64_t n = 300;
  std::atomic<int64_t> done{0};
  std::atomic<bool> all_but_one{false};
  std::atomic<int> stalls{0};
  pool.parallel_for_shares(n, 1, 0, [&](int64_t b, int64_t e) {
    if (b == 0) {
      // Whoever runs the first chunk of share 0 (the caller, unless it was descheduled so long that the
      // workers took its whole share - stealers take from the back, so this chunk goes last) stalls there
      // until every other chunk is done: the others must finish the rest of its share.
      stalls.fetch_add(1);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (done.load() < n - 1 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
      all_but_one.store(done.load() == n - 1);
    }
    done.fetch_add(e - b);
  });
  EXPECT_EQ(stalls.load(), 1) << "chunk 0 runs once";
  EXPECT_TRUE(all_but_one.load());
  EXPECT_EQ(done.load(), n);
}

}  // namespace
}  // namespace car

// daemon/worker_pool.h: the bounded queue, parallel workers and their explicit stack size.
#include <pthread.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "daemon/worker_pool.h"

namespace car {
namespace {

TEST(DaemonWorkerPool, RunsJobsAndRefusesWhenTheQueueIsFull) {
  daemon::WorkerPool pool(1, 2);
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> started{0};
  std::atomic<int> ran{0};
  auto blocker = [&] {
    ++started;
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return release; });
    ++ran;
  };
  ASSERT_TRUE(pool.try_submit(blocker));
  while (started.load() == 0) std::this_thread::yield();  // the worker holds the first job
  EXPECT_TRUE(pool.try_submit([&] { ++ran; }));
  EXPECT_TRUE(pool.try_submit([&] { ++ran; }));
  EXPECT_FALSE(pool.try_submit([&] { ++ran; }));  // queue of 2 is full
  EXPECT_EQ(pool.queued(), 2u);
  EXPECT_EQ(pool.running(), 1u);
  {
    std::lock_guard lock(m);
    release = true;
  }
  cv.notify_all();
  pool.stop();  // drains the queue
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(pool.try_submit([] {}));
}

TEST(DaemonWorkerPool, ParallelWorkersRunConcurrently) {
  daemon::WorkerPool pool(3, 16);
  std::atomic<int> inside{0};
  std::atomic<int> peak{0};
  std::atomic<int> done{0};
  std::mutex m;
  std::condition_variable cv;
  int arrived = 0;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(pool.try_submit([&] {
      int now = ++inside;
      int p = peak.load();
      while (now > p && !peak.compare_exchange_weak(p, now)) {
      }
      std::unique_lock lock(m);
      ++arrived;
      cv.notify_all();
      cv.wait(lock, [&] { return arrived == 3; });  // a barrier: only passable if all three run at once
      --inside;
      ++done;
    }));
  }
  pool.stop();
  EXPECT_EQ(done.load(), 3);
  EXPECT_EQ(peak.load(), 3);
}

// Workers get an explicit stack (chat templates are rendered there), whatever RLIMIT_STACK says.
TEST(DaemonWorkerPool, WorkersHaveTheExplicitStackSize) {
  daemon::WorkerPool pool(1, 1);
  std::atomic<size_t> size{0};
  ASSERT_TRUE(pool.try_submit([&] {
    pthread_attr_t attr;
    size_t s = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstacksize(&attr, &s);
      pthread_attr_destroy(&attr);
    }
    size = s;
  }));
  pool.stop();
  EXPECT_GE(size.load(), daemon::WorkerPool::kStackBytes);
}

}  // namespace
}  // namespace car

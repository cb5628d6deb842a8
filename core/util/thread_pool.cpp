#include "core/util/thread_pool.h"
#include "core/util/thread_signals.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CAR_CPU_RELAX() _mm_pause()
#else
#define CAR_CPU_RELAX() ((void)0)
#endif

namespace car {
namespace {

// About 20-50 microseconds of polling before sleeping: long enough to bridge the gap between the matrix
// products of one forward pass, short enough not to burn a core that other processes want.
constexpr int kSpinIterations = 4000;

thread_local const ThreadPool* tls_current_pool = nullptr;  // set while a thread executes a job of a pool

}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  const int n = std::max(1, n_threads);
  workers_.reserve(static_cast<size_t>(n - 1));
  for (int i = 0; i < n - 1; ++i) workers_.emplace_back([this, i] { worker_main(i + 1); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_main(int index) {
  util::block_process_signals();
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      CAR_CPU_RELAX();
      g = generation_.load(std::memory_order_acquire);
    }
    if (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = g;
    if (stop_.load(std::memory_order_relaxed)) return;
    run_share(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

void ThreadPool::run_share(int index) {
  if (index < job_threads_) {
    tls_current_pool = this;
    (*job_)(index, job_threads_);
    tls_current_pool = nullptr;
  }
}

void ThreadPool::run(int n_threads, FunctionRef<void(int, int)> fn) {
  if (tls_current_pool == this) {
    std::fprintf(stderr, "car::ThreadPool::run called from inside one of its own jobs\n");
    std::abort();
  }
  const int n = std::clamp(n_threads, 1, size());
  if (n == 1) {
    fn(0, 1);
    return;
  }
  MutexLock lock(run_mutex_);
  job_ = &fn;
  job_threads_ = n;
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();

  tls_current_pool = this;
  fn(0, n);
  tls_current_pool = nullptr;

  int left = pending_.load(std::memory_order_acquire);
  for (int spin = 0; left != 0 && spin < kSpinIterations; ++spin) {
    CAR_CPU_RELAX();
    left = pending_.load(std::memory_order_acquire);
  }
  while (left != 0) {
    pending_.wait(left, std::memory_order_acquire);
    left = pending_.load(std::memory_order_acquire);
  }
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, int n_threads, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  int threads = n_threads <= 0 ? size() : std::min(n_threads, size());
  threads = static_cast<int>(std::min<int64_t>(threads, chunks));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  std::atomic<int64_t> cursor{0};
  run(threads, [&](int, int) {
    for (;;) {
      const int64_t c = cursor.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      const int64_t begin = c * grain;
      fn(begin, std::min(n, begin + grain));
    }
  });
}

namespace {

/// The chunks [front, back) of one thread's share not yet taken, packed in one word (front high, back low),
/// on a cache line of its own.
struct alignas(64) Share {
  std::atomic<uint64_t> span{0};

  void init(uint64_t front, uint64_t back) { span.store(front << 32 | back, std::memory_order_relaxed); }
  int64_t take_front() {
    uint64_t s = span.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t f = static_cast<uint32_t>(s >> 32), b = static_cast<uint32_t>(s);
      if (f >= b) return -1;
      if (span.compare_exchange_weak(s, s + (uint64_t{1} << 32), std::memory_order_relaxed)) return f;
    }
  }
  int64_t take_back() {
    uint64_t s = span.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t f = static_cast<uint32_t>(s >> 32), b = static_cast<uint32_t>(s);
      if (f >= b) return -1;
      if (span.compare_exchange_weak(s, s - 1, std::memory_order_relaxed)) return b - 1;
    }
  }
};

constexpr int kMaxShares = 64;

}  // namespace

void ThreadPool::parallel_for_shares(int64_t n, int64_t grain, int n_threads,
                                     FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  if (chunks >= (int64_t{1} << 32)) {  // the packed spans hold 32-bit chunk indices
    parallel_for(n, grain, n_threads, fn);
    return;
  }
  int threads = n_threads <= 0 ? size() : std::min(n_threads, size());
  threads = static_cast<int>(std::min<int64_t>({threads, chunks, kMaxShares}));
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  Share shares[kMaxShares];
  for (int t = 0; t < threads; ++t) {
    shares[t].init(static_cast<uint64_t>(chunks * t / threads),
                   static_cast<uint64_t>(chunks * (t + 1) / threads));
  }
  auto chunk = [&](int64_t c) {
    const int64_t begin = c * grain;
    fn(begin, std::min(n, begin + grain));
  };
  run(threads, [&](int t, int total) {
    for (int64_t c; (c = shares[t].take_front()) >= 0;) chunk(c);
    for (int k = 1; k < total; ++k) {
      Share& other = shares[(t + k) % total];
      for (int64_t c; (c = other.take_back()) >= 0;) chunk(c);
    }
  });
}

}  // namespace car

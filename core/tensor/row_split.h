// Internal to core/tensor (and bench/kernels): how matvec splits a matrix's rows across the thread pool.
//
// Each participating thread owns one contiguous share of the rows and takes it front to back in chunks, so
// every thread reads one long sequential stream (DRAM-page and prefetcher friendly; 64 KiB chunks handed out
// alternately from one shared cursor interleave the threads' streams instead). A thread that has finished
// its own share takes the chunks left in the others' shares from their back ends, one at a time, so a thread
// that was descheduled on a busy machine does not hold the product up. One compare-and-swap per chunk on a
// cache line of the share's own; nothing is allocated.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "core/util/result.h"
#include "core/util/thread_pool.h"

namespace car::tensor::detail {

inline constexpr int kMaxSplitShares = 64;

/// The chunks [front, back) of one share not yet taken, packed in one word (front high, back low).
struct alignas(64) SplitShare {
  std::atomic<uint64_t> span{0};

  void init(uint32_t front, uint32_t back) {
    span.store((static_cast<uint64_t>(front) << 32) | back, std::memory_order_relaxed);
  }
  /// The next chunk from the front, or -1 when the share is empty.
  int64_t take_front() {
    uint64_t s = span.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t f = static_cast<uint32_t>(s >> 32), b = static_cast<uint32_t>(s);
      if (f >= b) return -1;
      if (span.compare_exchange_weak(s, s + (uint64_t{1} << 32), std::memory_order_relaxed)) return f;
    }
  }
  /// The last chunk, or -1 when the share is empty.
  int64_t take_back() {
    uint64_t s = span.load(std::memory_order_relaxed);
    for (;;) {
      const uint32_t f = static_cast<uint32_t>(s >> 32), b = static_cast<uint32_t>(s);
      if (f >= b) return -1;
      if (span.compare_exchange_weak(s, s - 1, std::memory_order_relaxed)) return b - 1;
    }
  }
};

/// Call fn(begin, end) for chunks of `grain` indices covering [0, n) (the last may be shorter), on up to all
/// of the pool's threads: thread t's share is the t-th contiguous run of chunks, taken front to back; then
/// the other shares' remaining chunks from their back ends. Every chunk is passed exactly once; when only one
/// thread takes part (a pool of one, or a single chunk), fn(0, n) is called once.
template <typename Fn>
void split_rows(ThreadPool& pool, int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  CAR_CHECK(chunks < (int64_t{1} << 32));
  const int shares = static_cast<int>(std::min<int64_t>({pool.size(), chunks, kMaxSplitShares}));
  if (shares <= 1) {
    fn(int64_t{0}, n);
    return;
  }
  SplitShare share[kMaxSplitShares];
  for (int t = 0; t < shares; ++t) {
    share[t].init(static_cast<uint32_t>(chunks * t / shares),
                  static_cast<uint32_t>(chunks * (t + 1) / shares));
  }
  auto run_chunk = [&](int64_t c) {
    const int64_t begin = c * grain;
    fn(begin, std::min(n, begin + grain));
  };
  pool.run(shares, [&](int t, int) {
    for (int64_t c; (c = share[t].take_front()) >= 0;) run_chunk(c);
    for (int k = 1; k < shares; ++k) {
      SplitShare& other = share[(t + k) % shares];
      for (int64_t c; (c = other.take_back()) >= 0;) run_chunk(c);
    }
  });
}

}  // namespace car::tensor::detail

// ThreadPool: a fixed set of persistent worker threads for fork-join loops (the kernels' matvec / matmul).
//
// A pool of size N owns N - 1 workers; the thread calling run() is participant 0, so `ThreadPool(1)` runs
// everything inline. run(n, fn) calls fn(i, n) once for each i in [0, n) (n clamped to size()), each on a
// different thread, and returns when all calls have returned. parallel_for() hands out index ranges of a
// loop dynamically (an atomic cursor), so a thread that got descheduled on a busy machine does not hold
// the others up. Nothing is allocated per call: the job is passed as a non-owning FunctionRef.
//
// Idle workers spin briefly (a decode step issues hundreds of short jobs back to back) and then sleep on a
// futex (std::atomic::wait), so an unused pool costs no CPU.
//
// Thread safety: run() / parallel_for() may be called from any thread; concurrent calls are serialized by
// an internal mutex (one job at a time). Calling run() from inside a job of the same pool deadlocks (it is
// checked and aborts). fn must not throw.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/util/thread_annotations.h"

namespace car {

/// A non-owning reference to a callable (like std::function_ref): two pointers, never allocates.
template <typename Sig>
class FunctionRef;

template <typename R, typename... Args>
class FunctionRef<R(Args...)> {
 public:
  template <typename F,
            typename = std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
                                        std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): used like a function parameter
      : obj_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* obj, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(obj))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(obj_, std::forward<Args>(args)...); }

 private:
  void* obj_;
  R (*call_)(void*, Args...);
};

class ThreadPool {
 public:
  /// `n_threads` participants in total (>= 1; values < 1 mean 1): spawns n_threads - 1 workers.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  /// Participants, including the calling thread.
  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Call fn(i, n) for i in [0, n) concurrently, n = clamp(n_threads, 1, size()); the caller runs i = 0.
  void run(int n_threads, FunctionRef<void(int, int)> fn);

  /// Split [0, n) into chunks of `grain` indices (the last may be shorter) and call fn(begin, end) for each,
  /// on up to `n_threads` threads (<= 0: all), chunks taken in increasing order from a shared cursor.
  void parallel_for(int64_t n, int64_t grain, int n_threads, FunctionRef<void(int64_t, int64_t)> fn);

  /// Like parallel_for (every chunk of `grain` indices passed to fn exactly once), but each of the T threads
  /// owns the t-th contiguous run of about chunks / T chunks and takes it front to back, so it reads one
  /// sequential stream; a thread that has finished its own run then takes the chunks left in the others'
  /// runs from their back ends, one at a time. For memory-bound loops over rows: chunks handed out
  /// alternately from one cursor interleave the threads' streams, and every jump restarts the hardware
  /// prefetcher.
  void parallel_for_shares(int64_t n, int64_t grain, int n_threads, FunctionRef<void(int64_t, int64_t)> fn);

 private:
  void worker_main(int index);
  /// A worker runs its share of the current job. Reads the job fields without run_mutex_: the caller of
  /// run() holds it and publishes them through generation_ (release), read here after an acquire load.
  void run_share(int index) CAR_NO_THREAD_SAFETY_ANALYSIS;

  std::vector<std::thread> workers_;
  Mutex run_mutex_;  // serializes callers of run()

  // The current job: written under run_mutex_, published by a release increment of generation_ and read
  // by the workers (run_share) after an acquire load of it.
  FunctionRef<void(int, int)>* job_ CAR_GUARDED_BY(run_mutex_) = nullptr;
  int job_threads_ CAR_GUARDED_BY(run_mutex_) = 0;
  std::atomic<uint32_t> generation_{0};  // bumped once per run(); workers wait for it to change
  std::atomic<int> pending_{0};          // workers that have not finished the current generation
  std::atomic<bool> stop_{false};
};

}  // namespace car

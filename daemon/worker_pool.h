// WorkerPool: a fixed set of threads running jobs from a bounded FIFO queue. The daemon runs `load` and
// `infer` here so the io thread never blocks; when the queue is full, try_submit() refuses at once and the
// caller answers `busy` instead of queueing without bound.
//
// Thread safety: try_submit(), queued() and running() may be called from any thread; stop() by the owner.
// A job must not throw (the daemon's jobs catch everything and report an error reply). stop() lets queued
// jobs run, then joins the threads.
#pragma once

#include <pthread.h>

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <vector>

#include "core/util/thread_annotations.h"

namespace car::daemon {

class WorkerPool {
 public:
  using Job = std::function<void()>;

  /// Each worker's stack, set explicitly rather than inherited from RLIMIT_STACK (which a unit file or a
  /// shell may make anything): jobs render untrusted chat templates, whose limits (core/chat: at most 2 MiB
  /// of stack for a render, checked) are sized against it with a wide margin.
  static constexpr std::size_t kStackBytes = 8u << 20;

  /// `threads` >= 1 workers; at most `queue_capacity` jobs waiting (not counting running ones).
  WorkerPool(std::size_t threads, std::size_t queue_capacity);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Queue a job. False (and the job is dropped) when the queue is full or the pool is stopping.
  bool try_submit(Job job);
  /// Finish the queued jobs and join the workers. Idempotent.
  void stop();

  std::size_t threads() const { return threads_.size(); }
  std::size_t queued() const;
  std::size_t running() const;

 private:
  void run();

  const std::size_t capacity_;
  mutable Mutex mutex_;
  std::condition_variable_any wake_;  // waits on a MutexLock of mutex_
  std::deque<Job> queue_ CAR_GUARDED_BY(mutex_);
  std::size_t running_ CAR_GUARDED_BY(mutex_) = 0;  // jobs being executed right now
  bool stopping_ CAR_GUARDED_BY(mutex_) = false;
  std::vector<pthread_t> threads_;
};

}  // namespace car::daemon

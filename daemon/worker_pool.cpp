#include "daemon/worker_pool.h"

#include "core/util/result.h"
#include "core/util/thread_signals.h"

namespace car::daemon {

WorkerPool::WorkerPool(std::size_t threads, std::size_t queue_capacity) : capacity_(queue_capacity) {
  CAR_CHECK(threads >= 1);
  threads_.reserve(threads);
  // pthreads, not std::thread: only they take a stack size.
  pthread_attr_t attr;
  CAR_CHECK(pthread_attr_init(&attr) == 0);
  CAR_CHECK(pthread_attr_setstacksize(&attr, kStackBytes) == 0);
  for (std::size_t i = 0; i < threads; ++i) {
    pthread_t t;
    const int rc = pthread_create(
        &t, &attr,
        [](void* pool) -> void* {
          util::block_process_signals();
          static_cast<WorkerPool*>(pool)->run();
          return nullptr;
        },
        this);
    CAR_CHECK(rc == 0);
    threads_.push_back(t);
  }
  pthread_attr_destroy(&attr);
}

WorkerPool::~WorkerPool() { stop(); }

bool WorkerPool::try_submit(Job job) {
  {
    MutexLock lock(mutex_);
    if (stopping_ || queue_.size() >= capacity_) return false;
    queue_.push_back(std::move(job));
  }
  wake_.notify_one();
  return true;
}

void WorkerPool::stop() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (pthread_t t : threads_) pthread_join(t, nullptr);
  threads_.clear();
}

std::size_t WorkerPool::queued() const {
  MutexLock lock(mutex_);
  return queue_.size();
}

std::size_t WorkerPool::running() const {
  MutexLock lock(mutex_);
  return running_;
}

void WorkerPool::run() {
  MutexLock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this]() CAR_REQUIRES(mutex_) { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping and drained
    Job job = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    lock.unlock();
    job();
    job = nullptr;  // destroy captures outside the lock
    lock.lock();
    --running_;
  }
}

}  // namespace car::daemon

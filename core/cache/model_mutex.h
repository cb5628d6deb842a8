// ModelMutex: the lock a request takes on one cached backend (CachedBackend::lock / lock_unless), so two
// requests never run the same model at once. Not the cache's own mutex, which guards only its map.
//
// Thread safety: every member may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>

#include "core/util/thread_annotations.h"

namespace car {

/// The per-model request lock: a TimedLockable (lock, try_lock, try_lock_for, unlock) built from a mutex
/// and a condition variable. std::timed_mutex would do the same, but libstdc++ 12 implements its timed waits
/// with pthread_mutex_clocklock, which ThreadSanitizer does not intercept, so TSan then reports every unlock
/// as the unlock of an unlocked mutex. Not recursive; waiters are not queued in order.
class ModelMutex {
 public:
  void lock() {
    MutexLock guard(m_);
    cv_.wait(guard, [&]() CAR_REQUIRES(m_) { return !held_; });
    held_ = true;
  }
  bool try_lock() {
    MutexLock guard(m_);
    if (held_) return false;
    held_ = true;
    return true;
  }
  template <typename Rep, typename Period>
  bool try_lock_for(const std::chrono::duration<Rep, Period>& timeout) {
    MutexLock guard(m_);
    if (!cv_.wait_for(guard, timeout, [&]() CAR_REQUIRES(m_) { return !held_; })) return false;
    held_ = true;
    return true;
  }
  void unlock() {
    {
      MutexLock guard(m_);
      held_ = false;
    }
    cv_.notify_one();
  }

 private:
  Mutex m_;
  std::condition_variable_any cv_;
  bool held_ CAR_GUARDED_BY(m_) = false;
};

}  // namespace car

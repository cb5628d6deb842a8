// Lock discipline the compiler checks: Clang's thread-safety attributes behind portable macros, and a
// mutex and scoped locks that carry them.
//
// Under Clang with -Wthread-safety, a member declared `int x CAR_GUARDED_BY(mu_);` may only be read or
// written while `mu_` is held, a function declared `CAR_REQUIRES(mu_)` may only be called with it held,
// and one declared `CAR_EXCLUDES(mu_)` only without it. Other compilers see nothing (the macros expand to
// nothing), so the annotations cost nothing where they cannot be checked.
//
// libstdc++'s std::mutex carries no attributes, so annotated code locks a car::Mutex (a std::mutex with
// the capability attribute) through car::MutexLock. A condition variable waits on a MutexLock through
// std::condition_variable_any (MutexLock is BasicLockable). The analysis does not see into a wait's
// predicate: write it as a lambda annotated `CAR_REQUIRES(mu_)` or read the guarded state after the wait
// returns.
#pragma once

#include <mutex>

#if defined(__clang__)
#define CAR_THREAD_ATTRIBUTE(x) __attribute__((x))
#else
#define CAR_THREAD_ATTRIBUTE(x)
#endif

#define CAR_CAPABILITY(name) CAR_THREAD_ATTRIBUTE(capability(name))
#define CAR_SCOPED_CAPABILITY CAR_THREAD_ATTRIBUTE(scoped_lockable)
#define CAR_GUARDED_BY(m) CAR_THREAD_ATTRIBUTE(guarded_by(m))
#define CAR_PT_GUARDED_BY(m) CAR_THREAD_ATTRIBUTE(pt_guarded_by(m))
#define CAR_REQUIRES(...) CAR_THREAD_ATTRIBUTE(requires_capability(__VA_ARGS__))
#define CAR_ACQUIRE(...) CAR_THREAD_ATTRIBUTE(acquire_capability(__VA_ARGS__))
#define CAR_RELEASE(...) CAR_THREAD_ATTRIBUTE(release_capability(__VA_ARGS__))
#define CAR_TRY_ACQUIRE(...) CAR_THREAD_ATTRIBUTE(try_acquire_capability(__VA_ARGS__))
#define CAR_EXCLUDES(...) CAR_THREAD_ATTRIBUTE(locks_excluded(__VA_ARGS__))
#define CAR_RETURN_CAPABILITY(x) CAR_THREAD_ATTRIBUTE(lock_returned(x))
#define CAR_NO_THREAD_SAFETY_ANALYSIS CAR_THREAD_ATTRIBUTE(no_thread_safety_analysis)

namespace car {

/// A std::mutex the thread-safety analysis knows as a capability. Same cost and semantics.
class CAR_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() CAR_ACQUIRE() { m_.lock(); }
  void unlock() CAR_RELEASE() { m_.unlock(); }
  bool try_lock() CAR_TRY_ACQUIRE(true) { return m_.try_lock(); }

 private:
  std::mutex m_;
};

/// Holds a Mutex for its scope. unlock()/lock() release and retake it inside the scope (for work that
/// must not run under the lock, such as I/O); the destructor releases it only if held. BasicLockable, so
/// std::condition_variable_any can wait on it.
class CAR_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& m) CAR_ACQUIRE(m) : m_(m) { m_.lock(); }
  ~MutexLock() CAR_RELEASE() {
    if (held_) m_.unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void lock() CAR_ACQUIRE() {
    m_.lock();
    held_ = true;
  }
  void unlock() CAR_RELEASE() {
    held_ = false;
    m_.unlock();
  }

 private:
  Mutex& m_;
  bool held_ = true;
};

}  // namespace car

#include "core/chat/stack_limit.h"

#include <pthread.h>

namespace car::chat {

namespace {

// The lowest address of the calling thread's stack (0 when unknown). Cached per thread: reading it costs a
// parse of /proc/self/maps on the main thread, and a thread's stack does not move.
uintptr_t stack_bottom() {
  thread_local uintptr_t bottom = [] {
    uintptr_t b = 0;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* addr = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &addr, &size) == 0) b = reinterpret_cast<uintptr_t>(addr);
      pthread_attr_destroy(&attr);
    }
    return b;
  }();
  return bottom;
}

}  // namespace

StackLimit::StackLimit(size_t budget) {
  const uintptr_t top = here();
  floor_ = top > budget ? top - budget : 0;
  const uintptr_t bottom = stack_bottom();
  if (bottom != 0) {
    // Where the thread's stack is already this short, allow no recursion at all rather than wrap.
    const uintptr_t reserved = bottom + kReserveBytes;
    if (reserved > floor_) floor_ = reserved < top ? reserved : top;
  }
}

}  // namespace car::chat

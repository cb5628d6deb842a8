// A backstop beside the interpreter's depth limits: the parser and the evaluator check, at each level of
// their recursion, that the thread's stack has room left, and fail the template cleanly when it has not
// (instead of the process dying of a stack overflow). The depth limits keep real templates far from it;
// this catches what they miss (a limit that turns out too generous for a small stack, a sanitizer build's
// large frames, recursion through macros that each nest deeply).
#pragma once

#include <cstddef>
#include <cstdint>

namespace car::chat {

class StackLimit {
 public:
  /// The stack below the caller's frame that recursion may use: at most `budget` bytes, and never the
  /// last kReserveBytes of the thread's stack (what a leaf call, an exception's unwinding and error
  /// formatting need below the last checked frame).
  explicit StackLimit(size_t budget);

  /// True once the calling frame is below the limit.
  bool exceeded() const { return here() < floor_; }

  static uintptr_t here() { return reinterpret_cast<uintptr_t>(__builtin_frame_address(0)); }

  static constexpr size_t kReserveBytes = 256u << 10;

 private:
  uintptr_t floor_ = 0;
};

}  // namespace car::chat

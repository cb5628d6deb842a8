// TimerClock and Timer: the clock the daemon's timers (a session's line timeout, the server's idle sweep)
// measure their expiry on, so that tests move time forward instead of waiting for it (as the model cache's
// CacheClock lets them).
//
// A Timer is Asio's steady_timer with its expiry read off a TimerClock. On the steady clock (the default,
// steady_timer_clock()) it is one plain wait, exactly a steady_timer. A test clock that can jump ahead
// returns a short poll_interval(): the Timer then waits in slices of that much real time and reads now()
// after each, so a jump is seen within one slice.
//
// Thread safety: a TimerClock's now() may be called from any thread. A Timer belongs to one executor (the
// io thread), like the steady_timer it wraps; the clock must outlive it.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>

#include <boost/asio.hpp>

namespace car::daemon {

class TimerClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  using duration = std::chrono::steady_clock::duration;

  virtual ~TimerClock() = default;
  virtual time_point now() const = 0;
  /// The longest real wait a Timer makes before reading now() again: duration::max() for a clock that
  /// runs with the steady clock (one wait is exact), short for a clock that can jump.
  virtual duration poll_interval() const { return duration::max(); }
};

/// The steady clock (every Timer's clock in production).
inline const TimerClock& steady_timer_clock() {
  struct Steady final : TimerClock {
    time_point now() const override { return std::chrono::steady_clock::now(); }
  };
  static const Steady clock;
  return clock;
}

class Timer {
 public:
  using Handler = std::function<void(boost::system::error_code)>;

  explicit Timer(const boost::asio::any_io_executor& executor, const TimerClock& clock = steady_timer_clock())
      : timer_(executor), clock_(&clock) {}
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

  /// Expire `after` from the clock's now. A wait in progress ends with operation_aborted.
  void expires_after(TimerClock::duration after) {
    cancel();
    due_ = clock_->now() + after;
  }
  /// Call `handler` (on the timer's executor) once the clock reaches the expiry, with no error; with
  /// operation_aborted when cancel() or expires_after() comes first - even when the steady timer under it
  /// had already fired, which a bare steady_timer cannot promise.
  void async_wait(Handler handler) { wait_slice(generation_, std::move(handler)); }
  /// End the wait in progress (its handler gets operation_aborted).
  void cancel() {
    ++generation_;
    timer_.cancel();
  }

 private:
  void wait_slice(std::uint64_t generation, Handler handler) {
    const auto left = std::max(due_ - clock_->now(), TimerClock::duration::zero());
    timer_.expires_after(std::min(left, clock_->poll_interval()));
    timer_.async_wait([this, generation, handler = std::move(handler)](boost::system::error_code ec) mutable {
      if (!ec && generation != generation_) ec = boost::asio::error::operation_aborted;
      if (ec) return handler(ec);
      if (clock_->now() < due_) return wait_slice(generation, std::move(handler));
      handler(ec);
    });
  }

  boost::asio::steady_timer timer_;
  const TimerClock* clock_;  // not owned
  TimerClock::time_point due_{};
  std::uint64_t generation_ = 0;  // bumped by cancel(): a wait started under another generation is over
};

}  // namespace car::daemon

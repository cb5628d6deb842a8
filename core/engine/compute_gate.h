// ComputeGate: the machine's compute threads shared fairly between the models of one process.
//
// Every loaded model has a scheduler (core/engine/scheduler.h) whose steps run on the model's own pool of
// compute threads, sized to the cores. Two models stepping at once would run twice the cores' threads,
// and the fork-join loops of a forward pass wait on whichever thread the kernel descheduled: both slow
// down far more than by half. So a scheduler holds the gate for each step (one batched forward pass) and
// models that are busy at the same time take turns.
//
// Turns are fair in compute time, not in steps (a step of prompt chunks can cost a hundred decode
// steps, and a big model's decode step ten of a small one's): each member has a virtual time, the compute
// it has been granted. A member is *active* from its first ask until it says it is idle (its scheduler
// has nothing to run). Whenever the gate is free it goes to the active member with the least virtual
// time - also when that member is not asking at this instant (it is between two steps, sampling): the
// gate is then reserved for it, and the others wait, because with two busy models the one that just
// released is never queued at the moment of release and plain hand-off would only alternate steps. A
// reservation not taken within kReserveLimit passes to the waiting members (a scheduler that stalls must
// not stop the others). A member that becomes active starts from the virtual time of the turn last
// granted, so an idle spell buys no burst that would starve the members that kept busy. With one busy
// model the gate is never contended: it stays reserved for it (a lock and an unlock per step).
//
// Consequences, which docs/architecture.md states: a request to an idle model waits for at most the step
// in progress on another model before its first step; models busy at the same time each get an equal
// share of the machine's time, whatever their step lengths.
//
// Thread safety: every member function may be called from any thread. A Member is used by one thread at a
// time (its scheduler's) and must not outlive the gate.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/util/thread_annotations.h"

namespace car::engine {

class ComputeGate {
 public:
  using Clock = std::chrono::steady_clock;
  /// How long a reservation waits for its member's next ask before the waiting members may take it.
  static constexpr std::chrono::milliseconds kReserveLimit{20};

  /// `clock` is a test seam (the time a turn is charged for); null = steady_clock. `reserve_limit`: see
  /// kReserveLimit (tests lengthen it so that their grant order never depends on the machine's load).
  explicit ComputeGate(std::function<Clock::time_point()> clock = nullptr,
                       std::chrono::milliseconds reserve_limit = kReserveLimit);
  ComputeGate(const ComputeGate&) = delete;
  ComputeGate& operator=(const ComputeGate&) = delete;

  /// One model's account at the gate.
  class Member {
   public:
    explicit Member(ComputeGate& gate) : gate_(&gate) {}
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    ~Member() { idle(); }
    /// Compute time this member has held the gate for, in total (its turns).
    std::chrono::nanoseconds held() const;
    /// Nothing more to run for now: the gate stops keeping turns for this member. Its next Turn makes
    /// it active again.
    void idle();

   private:
    friend class ComputeGate;
    ComputeGate* gate_;
    // All under gate_->mu_.
    int64_t vtime_ns_ = 0;
    int64_t held_ns_ = 0;
    uint64_t ticket_ = 0;  // arrival order of its current ask
    bool active_ = false;
    bool waiting_ = false;
  };

  /// Holds the gate from construction (after waiting for this member's turn) to destruction, and charges
  /// the member the time between.
  class Turn {
   public:
    explicit Turn(Member& m);
    ~Turn();
    Turn(const Turn&) = delete;
    Turn& operator=(const Turn&) = delete;

   private:
    Member& member_;
    Clock::time_point start_;
  };

  /// Turns granted since construction, and turns that had to wait for another member's.
  uint64_t turns() const;
  uint64_t contended_turns() const;

 private:
  Clock::time_point now() const { return clock_ ? clock_() : Clock::now(); }
  void acquire(Member& m);
  void release(Member& m, Clock::duration held);
  void make_idle(Member& m);
  /// Give the free gate to the active member with the least virtual time (waiting ones first on a tie,
  /// then by arrival); `waiting_only` skips the members not asking. Notifies when it changes hands.
  void pick(bool waiting_only) CAR_REQUIRES(mu_);

  std::function<Clock::time_point()> clock_;
  std::chrono::milliseconds reserve_limit_;
  mutable Mutex mu_;
  std::condition_variable_any cv_;
  Member* owner_ CAR_GUARDED_BY(mu_) = nullptr;  // holding or reserved; null when nobody is active
  bool holding_ CAR_GUARDED_BY(mu_) = false;     // owner_ is inside a Turn
  std::chrono::steady_clock::time_point reserved_at_ CAR_GUARDED_BY(mu_);  // real time, for kReserveLimit
  int64_t floor_ns_ CAR_GUARDED_BY(mu_) = 0;     // virtual time of the turn last granted
  uint64_t next_ticket_ CAR_GUARDED_BY(mu_) = 0;
  uint64_t turns_ CAR_GUARDED_BY(mu_) = 0;
  uint64_t contended_ CAR_GUARDED_BY(mu_) = 0;
  std::vector<Member*> active_ CAR_GUARDED_BY(mu_);  // few: one per busy model
};

}  // namespace car::engine

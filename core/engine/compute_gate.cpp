#include "core/engine/compute_gate.h"

#include <algorithm>

namespace car::engine {

ComputeGate::ComputeGate(std::function<Clock::time_point()> clock, std::chrono::milliseconds reserve_limit)
    : clock_(std::move(clock)), reserve_limit_(reserve_limit) {}

std::chrono::nanoseconds ComputeGate::Member::held() const {
  MutexLock lock(gate_->mu_);
  return std::chrono::nanoseconds(held_ns_);
}

void ComputeGate::Member::idle() { gate_->make_idle(*this); }

uint64_t ComputeGate::turns() const {
  MutexLock lock(mu_);
  return turns_;
}

uint64_t ComputeGate::contended_turns() const {
  MutexLock lock(mu_);
  return contended_;
}

void ComputeGate::pick(bool waiting_only) {
  Member* best = nullptr;
  for (Member* c : active_) {
    if (waiting_only && !c->waiting_) continue;
    if (best == nullptr || c->vtime_ns_ < best->vtime_ns_ ||
        (c->vtime_ns_ == best->vtime_ns_ &&
         (c->waiting_ != best->waiting_ ? c->waiting_ : c->ticket_ < best->ticket_))) {
      best = c;
    }
  }
  owner_ = best;
  holding_ = false;
  reserved_at_ = std::chrono::steady_clock::now();
  if (best != nullptr) floor_ns_ = std::max(floor_ns_, best->vtime_ns_);
  cv_.notify_all();
}

void ComputeGate::acquire(Member& m) {
  MutexLock lock(mu_);
  ++turns_;
  if (!m.active_) {
    // An idle spell buys no burst: a member starts no further back than the turn last granted.
    m.vtime_ns_ = std::max(m.vtime_ns_, floor_ns_);
    m.active_ = true;
    active_.push_back(&m);
  }
  if (owner_ == nullptr) pick(false);
  if (owner_ != &m) {
    ++contended_;
    m.ticket_ = next_ticket_++;
    m.waiting_ = true;
    while (owner_ != &m) {
      if (cv_.wait_for(lock, reserve_limit_) == std::cv_status::timeout && owner_ != &m && !holding_ &&
          std::chrono::steady_clock::now() - reserved_at_ >= reserve_limit_) {
        pick(true);  // the reserved member did not come back in time: the waiting ones go on
      }
    }
    m.waiting_ = false;
  }
  holding_ = true;
}

void ComputeGate::release(Member& m, Clock::duration held) {
  MutexLock lock(mu_);
  const int64_t ns = std::max<int64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(held).count(), 0);
  m.vtime_ns_ += ns;
  m.held_ns_ += ns;
  pick(false);
}

void ComputeGate::make_idle(Member& m) {
  MutexLock lock(mu_);
  if (!m.active_) return;
  m.active_ = false;
  active_.erase(std::find(active_.begin(), active_.end(), &m));
  if (owner_ == &m && !holding_) pick(false);
}

ComputeGate::Turn::Turn(Member& m) : member_(m) {
  member_.gate_->acquire(member_);
  start_ = member_.gate_->now();
}

ComputeGate::Turn::~Turn() { member_.gate_->release(member_, member_.gate_->now() - start_); }

}  // namespace car::engine

// The compute gate (core/engine/compute_gate.h): one holder at a time; a released gate goes to the waiting
// member that has held it least (ties: the one that asked first); a member that was idle starts from the
// turn last granted, so it cannot take a burst of turns from the members that kept busy. The grant tests
// run on a fake clock that only the holder advances, so their order is deterministic.
#include "core/engine/compute_gate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/engine/engine.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using std::chrono::milliseconds;

TEST(ComputeGate, OneHolderAtATime) {
  ComputeGate gate;
  std::atomic<int> inside{0};
  std::atomic<int> most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      ComputeGate::Member m(gate);
      for (int i = 0; i < 300; ++i) {
        ComputeGate::Turn turn(m);
        const int now = ++inside;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        std::this_thread::yield();
        --inside;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(most.load(), 1);
  EXPECT_EQ(gate.turns(), 4u * 300u);
}

class GateOrder : public ::testing::Test {
 protected:
  /// `m` takes `n` turns of `held` each on its own thread, back to back (a busy model's steps), then
  /// goes idle; every grant is recorded under `name`.
  void busy(ComputeGate::Member& m, const std::string& name, int n, milliseconds held) {
    threads_.emplace_back([this, &m, name, n, held] {
      for (int i = 0; i < n; ++i) {
        ComputeGate::Turn turn(m);
        {
          std::lock_guard lock(mu_);
          order_.push_back(name);
        }
        now_ns_ += std::chrono::nanoseconds(held).count();
      }
      m.idle();
    });
  }
  /// Wait until `n` asks in all have had to wait for another member.
  void until_contended(uint64_t n) {
    while (gate_.contended_turns() < n) std::this_thread::yield();
  }
  /// Run `m`'s turn of `held` on this thread.
  void take(ComputeGate::Member& m, milliseconds held) {
    ComputeGate::Turn turn(m);
    now_ns_ += std::chrono::nanoseconds(held).count();
  }
  std::vector<std::string> drain() {
    for (auto& t : threads_) t.join();
    threads_.clear();
    std::lock_guard lock(mu_);
    return std::exchange(order_, {});
  }
  static int count(const std::vector<std::string>& v, const std::string& s, size_t end) {
    int n = 0;
    for (size_t i = 0; i < end && i < v.size(); ++i) n += v[i] == s;
    return n;
  }

  std::atomic<int64_t> now_ns_{0};
  // Reservations never expire here: the order must not depend on how fast the threads come back.
  ComputeGate gate_{[this] { return ComputeGate::Clock::time_point(std::chrono::nanoseconds(now_ns_.load())); },
                    std::chrono::hours(1)};
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::vector<std::string> order_;
};

TEST_F(GateOrder, MembersComingBackFromIdleTieAtTheFloorAndGoByArrival) {
  ComputeGate::Member holder(gate_), a(gate_), b(gate_), c(gate_);
  take(a, milliseconds(30));
  a.idle();
  take(b, milliseconds(10));
  b.idle();
  take(c, milliseconds(10));
  c.idle();
  {
    ComputeGate::Turn turn(holder);  // everyone below queues behind it
    busy(a, "a", 1, milliseconds(1));
    until_contended(1);
    busy(b, "b", 1, milliseconds(1));
    until_contended(2);
    busy(c, "c", 1, milliseconds(1));
    until_contended(3);
  }
  holder.idle();
  // All three restart from the floor (30 ms, the last grant's), so they tie and go by arrival.
  EXPECT_EQ(drain(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(a.held(), milliseconds(31));
  EXPECT_EQ(b.held(), milliseconds(11));
}

TEST_F(GateOrder, BusyMembersShareTheTimeNotTheTurns) {
  ComputeGate::Member holder(gate_), slow(gate_), quick(gate_);
  {
    ComputeGate::Turn turn(holder);
    busy(slow, "slow", 10, milliseconds(8));
    until_contended(1);
    busy(quick, "quick", 80, milliseconds(1));
    until_contended(2);
  }
  holder.idle();
  const auto order = drain();
  ASSERT_EQ(order.size(), 90u);
  EXPECT_EQ(order[0], "slow");  // a tie: slow asked first
  // Before the slow member's k-th turn the quick one has had 8 (k - 1) +- 8 ms: the two stay level in
  // time (strict alternation would give quick 1 ms per 8).
  int k = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i] != "slow") continue;
    const int quick_ms = count(order, "quick", i);
    EXPECT_LE(std::abs(quick_ms - 8 * k), 8) << "slow turn " << k;
    ++k;
  }
  EXPECT_EQ(slow.held(), milliseconds(80));
  EXPECT_EQ(quick.held(), milliseconds(80));
}

TEST_F(GateOrder, AnIdleMemberGetsNoBurstOfTurns) {
  ComputeGate::Member steady(gate_), newcomer(gate_);
  for (int i = 0; i < 10; ++i) take(steady, milliseconds(10));  // 100 ms alone; stays active
  busy(newcomer, "new", 6, milliseconds(10));
  until_contended(1);  // the newcomer waits (the gate is kept for the busy member)
  busy(steady, "steady", 6, milliseconds(10));
  const auto order = drain();
  ASSERT_EQ(order.size(), 12u);
  // The newcomer starts from the last grant (100 ms), not from 0: the two alternate. Charged from 0 it
  // would have taken all its six turns first.
  int run = 0;
  int longest = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    run = i > 0 && order[i] == order[i - 1] ? run + 1 : 1;
    if (order[i] == "new") longest = std::max(longest, run);
  }
  EXPECT_LE(longest, 2) << ::testing::PrintToString(order);
  EXPECT_EQ(newcomer.held(), milliseconds(60));
}

TEST(ComputeGate, AReservationNotTakenPassesToTheWaiting) {
  ComputeGate gate;  // the real reservation limit
  ComputeGate::Member stalled(gate), other(gate);
  { ComputeGate::Turn turn(stalled); }  // active, never asks again, never says idle
  std::atomic<bool> got{false};
  std::thread t([&] {
    ComputeGate::Turn turn(other);
    got = true;
  });
  t.join();  // returns once the reservation expires
  EXPECT_TRUE(got.load());
}

// Two models loaded with one gate (as the daemon loads every model): busy at the same time, every step
// of each is a turn at the gate, some had to wait for the other's, and each request's output is what it
// is alone.
TEST(ComputeGate, ModelsSharingAGateTakeTurnsAndKeepTheirOutput) {
  testing::TempDir dir;
  testing::TinySpec spec;
  spec.n_ctx = 256;
  const std::string path = (dir.path() / "m.gguf").string();
  testing::write_tiny_model(path, spec);
  LoadOptions o;
  o.threads = 2;
  o.context_length = 128;
  o.parallel = 2;
  auto alone_model = load_model(path, o);
  ASSERT_TRUE(alone_model.ok()) << alone_model.error().message;
  GenerateRequest req;
  for (int i = 0; i < 20; ++i) req.prompt_ids.push_back(static_cast<int32_t>(1 + i * 7 % (spec.n_vocab - 1)));
  req.max_tokens = 24;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  auto alone = generate(**alone_model, req, nullptr, nullptr);
  ASSERT_TRUE(alone.ok());

  o.compute_gate = std::make_shared<ComputeGate>();
  auto a = load_model(path, o);
  auto b = load_model(path, o);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<GenerateResult> results(4);
  std::vector<std::thread> threads;
  {
    // The test holds the gate until both models are waiting at it, so that they surely overlap.
    ComputeGate::Member test_member(*o.compute_gate);
    {
      ComputeGate::Turn hold(test_member);
      for (size_t i = 0; i < results.size(); ++i) {
        threads.emplace_back([&, i] {
          auto r = generate(i % 2 == 0 ? **a : **b, req, nullptr, nullptr);
          ASSERT_TRUE(r.ok());
          results[i] = *r;
        });
      }
      while (o.compute_gate->contended_turns() < 2) std::this_thread::yield();
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r.tokens, alone->tokens);
  const uint64_t steps = model_scheduler_stats(**a).steps + model_scheduler_stats(**b).steps;
  EXPECT_EQ(o.compute_gate->turns(), steps + 1);  // and the test's own
}

}  // namespace
}  // namespace car::engine

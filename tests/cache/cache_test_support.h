// What the BackendCache tests share: a clock that moves only when told to, and loaders.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>

#include "core/cache/backend_cache.h"

namespace car::cache_test {

/// A clock that moves only when told to. Thread-safe.
class ManualClock {
 public:
  std::chrono::steady_clock::time_point now() const {
    return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns_.load()));
  }
  void advance(std::chrono::nanoseconds d) { ns_.fetch_add(d.count()); }
  CacheClock fn() {
    return [this] { return now(); };
  }

 private:
  std::atomic<std::int64_t> ns_{1'000'000'000};
};

inline Result<int> value(int v) {
  return v;
}

inline auto never_called = []() -> Result<int> {
  ADD_FAILURE() << "loader must not run";
  return make_error("unexpected", "loader ran");
};

}  // namespace car::cache_test

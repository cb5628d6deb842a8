// Helpers for the daemon tests: talk NDJSON to a daemon over a ClientConnection, poll for a condition.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/client.h"

namespace car::testing {

using nlohmann::json;
using namespace std::chrono_literals;

/// Read the next line as JSON; fails the test (and returns null) on timeout, close or bad JSON.
inline json read_json(protocol::ClientConnection& conn, std::chrono::milliseconds timeout = 20s) {
  auto line = conn.read_line(timeout);
  if (!line.ok()) {
    ADD_FAILURE() << "read failed: " << line.error().message;
    return nullptr;
  }
  if (!line.value()) {
    ADD_FAILURE() << "no reply within " << timeout.count() << " ms";
    return nullptr;
  }
  json j = json::parse(**line, nullptr, false);
  if (j.is_discarded()) ADD_FAILURE() << "reply is not JSON: " << **line;
  return j;
}

/// Send `request` and read until its final reply (same id); token events for it go to `events`.
inline json call(protocol::ClientConnection& conn, const json& request, std::vector<json>* events = nullptr,
                 std::chrono::milliseconds timeout = 20s) {
  auto sent = conn.send_line(request.dump());
  if (!sent.ok()) {
    ADD_FAILURE() << "send failed: " << sent.error().message;
    return nullptr;
  }
  const json id = request.value("id", json(nullptr));
  for (;;) {
    json j = read_json(conn, timeout);
    if (j.is_null()) return j;
    if (j.contains("event")) {
      if (events != nullptr && j["id"] == id) events->push_back(j);
      continue;
    }
    if (j["id"] == id) return j;
  }
}

/// The error code of a failed reply ("" when it succeeded).
inline std::string error_code(const json& reply) {
  if (!reply.is_object() || reply.value("ok", true)) return "";
  const auto error = reply.find("error");
  if (error == reply.end() || !error->is_object()) return "";
  const auto code = error->find("code");
  return code != error->end() && code->is_string() ? code->get<std::string>() : std::string();
}

/// Poll `done` every `period` until it holds or `timeout` passes; returns its last value. A zero period
/// spins (yielding), for tests that must act within microseconds of a state change.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout = 10s,
                       std::chrono::milliseconds period = 10ms) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    if (period.count() > 0) {
      std::this_thread::sleep_for(period);
    } else {
      std::this_thread::yield();
    }
  }
  return true;
}

}  // namespace car::testing

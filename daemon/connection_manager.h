// ConnectionManager: owns the open sessions (NDJSON connections) and the connection limits (which the HTTP
// front's connections count against too), as Asio's HTTP server example keeps its connections in a
// connection_manager apart from the request_handler. The listener admits a connection against its limits;
// a session reports here, not to the request handler, when it has closed; shutdown cancels and closes
// every session through it.
//
// Every member runs on the io thread (no lock).
#pragma once

#include <functional>
#include <memory>
#include <unordered_set>

#include "daemon/connection_limits.h"
#include "daemon/server_options.h"

namespace car::daemon {

class Session;

class ConnectionManager {
 public:
  explicit ConnectionManager(const LiveSettings& live);
  ~ConnectionManager();
  ConnectionManager(const ConnectionManager&) = delete;
  ConnectionManager& operator=(const ConnectionManager&) = delete;

  /// Keep `session` (admitted and counted open by the listener) and start it.
  void start(const std::shared_ptr<Session>& session);
  /// `session` has closed its socket: forget it (the session calls this once).
  void closed(const std::shared_ptr<Session>& session);
  /// Cancel every request in flight on every session (the grace period is over).
  void cancel_all();
  /// Close every session: now, or (graceful) once its queued replies are written; `all_closed` runs on
  /// the io thread when the last session is gone (at once when there is none).
  void close_all(bool graceful, std::function<void()> all_closed);
  /// Take new connection limits (SIGHUP).
  void apply_live(const LiveSettings& live) { limits_.apply(live); }

  ConnectionLimits& limits() { return limits_; }
  const ConnectionLimits& limits() const { return limits_; }
  std::size_t size() const { return sessions_.size(); }

 private:
  ConnectionLimits limits_;  // before sessions_: sessions report to it until they are destroyed
  std::unordered_set<std::shared_ptr<Session>> sessions_;
  std::function<void()> all_closed_;
};

}  // namespace car::daemon

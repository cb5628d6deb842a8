// The daemon's side of the systemd service protocol: readiness/status/watchdog notifications (sd_notify)
// and socket activation (sd_listen_fds). Every call is a no-op outside systemd (no NOTIFY_SOCKET, no
// LISTEN_FDS), so the daemon runs the same in a terminal, in tests and under a unit.
//
// Thread safety: the notify calls are safe from any thread; take_listen_fds() is called once at start-up.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "core/util/result.h"

namespace car::daemon::systemd {

void notify_ready();
void notify_stopping();
void notify_status(const std::string& status);
void notify_watchdog();

/// The watchdog period systemd asked for (WATCHDOG_USEC for this pid), if any.
std::optional<std::chrono::microseconds> watchdog_interval();

/// The sockets passed by socket activation (LISTEN_FDS, LISTEN_PID = our pid), made close-on-exec: the one
/// named `http` (FileDescriptorName=http, car-inferenced-http.socket) is the HTTP front's, a listening TCP
/// or Unix stream socket; the other is the NDJSON socket. Each is nullopt when not passed. The LISTEN_*
/// variables are unset either way so a child never inherits them. Errors (code activation_failed): two
/// NDJSON or two HTTP fds, an NDJSON fd that is not a listening Unix stream socket, an HTTP fd that is not
/// a listening stream socket.
struct ListenFds {
  std::optional<int> socket;  ///< the NDJSON socket
  std::optional<int> http;    ///< the HTTP front's socket
};
Result<ListenFds> take_listen_fds();

}  // namespace car::daemon::systemd

// The daemon's side of the systemd service protocol: readiness/status/watchdog notifications (sd_notify)
// and socket activation (sd_listen_fds). Every call is a no-op outside systemd (no NOTIFY_SOCKET, no
// LISTEN_FDS), so the daemon runs the same in a terminal, in tests and under a unit.
//
// Thread safety: the notify calls are safe from any thread; take_listen_fd() is called once at start-up.
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

/// The socket passed by socket activation (LISTEN_FDS=1, LISTEN_PID = our pid), made close-on-exec, or
/// nullopt when the daemon was not socket-activated. The LISTEN_* variables are unset either way so a
/// child never inherits them. Errors (code activation_failed): more than one fd, or an
/// fd that is not a listening Unix stream socket.
Result<std::optional<int>> take_listen_fd();

}  // namespace car::daemon::systemd

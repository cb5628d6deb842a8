#include "daemon/systemd_notify.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstring>

namespace car::daemon::systemd {

void notify_ready() { sd_notify(0, "READY=1"); }
void notify_stopping() { sd_notify(0, "STOPPING=1"); }
void notify_watchdog() { sd_notify(0, "WATCHDOG=1"); }
void notify_status(const std::string& status) { sd_notify(0, ("STATUS=" + status).c_str()); }

std::optional<std::chrono::microseconds> watchdog_interval() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) > 0 && usec > 0) return std::chrono::microseconds(usec);
  return std::nullopt;
}

Result<std::optional<int>> take_listen_fd() {
  int n = sd_listen_fds(/*unset_environment=*/1);
  if (n < 0) return make_error("activation_failed", std::string("sd_listen_fds: ") + std::strerror(-n));
  if (n == 0) return std::optional<int>{};
  if (n > 1) {
    return make_error("activation_failed", "socket activation passed " + std::to_string(n) +
                                               " sockets; car-inferenced listens on exactly one");
  }
  int fd = SD_LISTEN_FDS_START;
  if (sd_is_socket_unix(fd, SOCK_STREAM, /*listening=*/1, nullptr, 0) <= 0) {
    return make_error("activation_failed", "the socket passed by systemd (fd 3) is not a listening Unix stream "
                                           "socket (check ListenStream= in car-inferenced.socket)");
  }
  int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  return std::optional<int>{fd};
}

}  // namespace car::daemon::systemd

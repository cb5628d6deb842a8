#include "daemon/systemd_notify.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <systemd/sd-daemon.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/util/error_codes.h"

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

Result<ListenFds> take_listen_fds() {
  char** names = nullptr;
  int n = sd_listen_fds_with_names(/*unset_environment=*/1, &names);
  if (n < 0) return make_error(errc::kActivationFailed, std::string("sd_listen_fds: ") + std::strerror(-n));
  ListenFds fds;
  Result<ListenFds> result = fds;
  for (int i = 0; i < n && result; ++i) {
    const int fd = SD_LISTEN_FDS_START + i;
    const bool http = names != nullptr && names[i] != nullptr && std::strcmp(names[i], "http") == 0;
    const std::string where = "the socket passed by systemd (fd " + std::to_string(fd) + ")";
    if (http) {
      if (fds.http) {
        result = make_error(errc::kActivationFailed, "socket activation passed two sockets named http");
      } else if (sd_is_socket(fd, AF_UNSPEC, SOCK_STREAM, /*listening=*/1) <= 0) {
        result =
            make_error(errc::kActivationFailed, where +
                                                    " named http is not a listening stream socket (check "
                                                    "ListenStream= in car-inferenced-http.socket)");
      } else {
        fds.http = fd;
      }
    } else if (fds.socket) {
      result =
          make_error(errc::kActivationFailed, "socket activation passed " + std::to_string(n) +
                                                  " sockets; car-inferenced listens on one Unix socket and "
                                                  "one named http (FileDescriptorName=http)");
    } else if (sd_is_socket_unix(fd, SOCK_STREAM, /*listening=*/1, nullptr, 0) <= 0) {
      result = make_error(errc::kActivationFailed, where +
                                                       " is not a listening Unix stream socket (check "
                                                       "ListenStream= in car-inferenced.socket)");
    } else {
      fds.socket = fd;
    }
    int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  }
  if (names != nullptr) {
    for (int i = 0; i < n; ++i) std::free(names[i]);
    std::free(names);
  }
  if (!result) return result;
  return fds;
}

}  // namespace car::daemon::systemd

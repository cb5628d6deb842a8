#include "daemon/socket_file.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/util/error_codes.h"

namespace car::daemon {

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

sockaddr_un unix_address(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), std::min(path.size(), sizeof(addr.sun_path) - 1));
  return addr;
}

}  // namespace

bool socket_is_live(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const sockaddr_un addr = unix_address(path);
  // A listener with a full backlog still counts: connect() then fails with EAGAIN, not ECONNREFUSED.
  const bool live = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 || errno == EAGAIN;
  ::close(fd);
  return live;
}

Result<int> listen_unix(const std::string& path, std::optional<gid_t> gid, std::string_view what,
                        OwnedSocketFile& file) {
  file = {};
  const std::string name = std::string(what) + " " + path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return make_error(errc::kListenFailed, name + ": the path is empty or longer than " +
                                           std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  }
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return make_error(errc::kListenFailed, path + " exists and is not a socket; refusing to replace it");
    }
    if (socket_is_live(path)) {
      return make_error(errc::kListenFailed, "another process is already listening on " + path +
                                             "; refusing to take over " + std::string(what));
    }
    spdlog::info("removing stale socket {}", path);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return make_error(errc::kListenFailed, "cannot remove the stale socket " + path + ": " + errno_text());
    }
  }
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(errc::kListenFailed, "socket(): " + errno_text());
  bool bound = false;
  // From bind on, a failure removes the file it made.
  auto fail = [&](std::string message) -> Result<int> {
    ::close(fd);
    if (bound) remove_owned_socket_file(file);
    file = {};
    return make_error(errc::kListenFailed, std::move(message));
  };
  // Bind with a umask that leaves the file 0660 from its first moment, then chmod to be explicit.
  const sockaddr_un addr = unix_address(path);
  const mode_t old_mask = ::umask(0117);
  const int rc = ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_mask);
  if (rc != 0) {
    errno = bind_errno;
    return fail("cannot bind " + path + ": " + errno_text());
  }
  bound = true;
  file.path = path;
  if (::lstat(path.c_str(), &st) == 0) {
    file.dev = st.st_dev;
    file.ino = st.st_ino;
  }
  if (::chmod(path.c_str(), 0660) != 0) return fail("chmod 0660 " + path + ": " + errno_text());
  if (gid && ::chown(path.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
    return fail("chown " + path + ": " + errno_text());
  }
  if (::listen(fd, SOMAXCONN) != 0) return fail("listen on " + path + ": " + errno_text());
  return fd;
}

void remove_owned_socket_file(OwnedSocketFile& file) {
  if (!file.owned()) return;
  struct stat st {};
  if (::lstat(file.path.c_str(), &st) != 0) {
    file = {};
    return;  // already gone
  }
  if (st.st_dev != file.dev || st.st_ino != file.ino) {
    spdlog::warn("{} is no longer the socket this daemon bound (another process replaced it): leaving it",
                 file.path);
  } else if (::unlink(file.path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("cannot remove {}: {}", file.path, errno_text());
  }
  file = {};
}

}  // namespace car::daemon

#include "daemon/client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/util/error_codes.h"

namespace car::protocol {

namespace {
std::string errno_text(int err) {
  return std::strerror(err);
}
}  // namespace

namespace {
/// A connected fd, or why not (the reason alone, without the path).
Result<int> connect_fd(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return make_error(errc::kConnectFailed, "the path is empty or longer than " +
                                                std::to_string(sizeof(addr.sun_path) - 1) + " bytes");
  }
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(errc::kConnectFailed, "socket(): " + errno_text(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    ::close(fd);
    std::string why = errno_text(err);
    if (err == EACCES)
      why += " (the system daemon's socket is for the car-inference group: see docs/operations.md)";
    return make_error(errc::kConnectFailed, why);
  }
  return fd;
}
}  // namespace

Result<ClientConnection> ClientConnection::connect(const std::string& path) {
  auto fd = connect_fd(path);
  if (!fd) {
    return make_error(errc::kConnectFailed, "cannot connect to car-inferenced at '" + path +
                                                "': " + fd.error().message +
                                                " (is the daemon running? --socket / CAR_INFERENCE_SOCKET)");
  }
  return ClientConnection(*fd);
}

Result<ClientConnection> ClientConnection::connect_first(const std::vector<std::string>& paths) {
  if (paths.size() == 1) return connect(paths.front());
  std::string tried;
  for (const auto& path : paths) {
    auto fd = connect_fd(path);
    if (fd) return ClientConnection(*fd);
    tried += "\n  " + path + ": " + fd.error().message;
  }
  if (paths.empty())
    return make_error(errc::kConnectFailed, "no socket path to try (--socket / CAR_INFERENCE_SOCKET)");
  return make_error(errc::kConnectFailed,
                    "cannot reach car-inferenced; tried" + tried +
                        "\nIs the daemon running? Pass --socket or set CAR_INFERENCE_SOCKET.");
}

ClientConnection::ClientConnection(ClientConnection&& other) noexcept
    : fd_(other.fd_), buffer_(std::move(other.buffer_)) {
  other.fd_ = -1;
}

ClientConnection& ClientConnection::operator=(ClientConnection&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    buffer_ = std::move(other.buffer_);
    other.fd_ = -1;
  }
  return *this;
}

ClientConnection::~ClientConnection() {
  close();
}

void ClientConnection::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void ClientConnection::shutdown_write() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

Result<void> ClientConnection::send_raw(std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(errc::kIoError, "write to car-inferenced failed: " + errno_text(errno));
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

Result<void> ClientConnection::send_line(std::string_view line) {
  std::string data(line);
  data.push_back('\n');
  return send_raw(data);
}

std::optional<Reply> ClientConnection::pending_error(std::chrono::milliseconds timeout) {
  auto line = read_line(timeout);
  if (!line || !line->has_value()) return std::nullopt;
  auto reply = parse_reply(**line);
  if (!reply || reply->is_event || reply->ok) return std::nullopt;
  return std::move(*reply);
}

Result<std::optional<std::string>> ClientConnection::read_line(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return std::optional<std::string>(std::move(line));
    }
    int wait_ms = -1;
    if (timeout.count() >= 0) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::optional<std::string>{};
      wait_ms = static_cast<int>(left.count());
    }
    pollfd pfd{fd_, POLLIN, 0};
    int r = ::poll(&pfd, 1, wait_ms);
    if (r < 0) {
      if (errno == EINTR) continue;
      return make_error(errc::kIoError, "poll failed: " + errno_text(errno));
    }
    if (r == 0) return std::optional<std::string>{};
    char chunk[65536];
    ssize_t n = ::recv(fd_, chunk, sizeof(chunk), 0);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      if (errno == ECONNRESET) return make_error(errc::kClosed, "car-inferenced closed the connection");
      return make_error(errc::kIoError, "read from car-inferenced failed: " + errno_text(errno));
    }
    if (n == 0) return make_error(errc::kClosed, "car-inferenced closed the connection");
    buffer_.append(chunk, static_cast<std::size_t>(n));
  }
}

}  // namespace car::protocol

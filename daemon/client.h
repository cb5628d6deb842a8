// A blocking client connection to car-inferenced: connect to the Unix socket, write request lines, read
// reply lines with a timeout. Used by the `car` client commands and by the daemon's integration tests.
//
// Owns one socket fd (closed on destruction; move-only). Not thread-safe: one thread uses a connection.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/result.h"
#include "daemon/protocol.h"

namespace car::protocol {

class ClientConnection {
 public:
  /// Connect to the socket at `path`. Errors: connect_failed (message names the path and errno text).
  static Result<ClientConnection> connect(const std::string& path);
  /// Connect to the first of `paths` that accepts (in order). Errors: connect_failed, whose message lists
  /// every path tried with the reason it failed (and a hint on permission denied); empty `paths` included.
  static Result<ClientConnection> connect_first(const std::vector<std::string>& paths);
  /// Adopt a connected socket fd.
  explicit ClientConnection(int fd) : fd_(fd) {}
  ClientConnection(ClientConnection&& other) noexcept;
  ClientConnection& operator=(ClientConnection&& other) noexcept;
  ClientConnection(const ClientConnection&) = delete;
  ClientConnection& operator=(const ClientConnection&) = delete;
  ~ClientConnection();

  /// Write `line` and a newline (the whole of it, retrying short writes). Error io_error.
  Result<void> send_line(std::string_view line);
  /// Write raw bytes as given (tests use it for partial and over-long lines). Error io_error.
  Result<void> send_raw(std::string_view bytes);
  /// The next line without '\n'. nullopt when the timeout passed first. Errors: closed (the daemon closed
  /// the connection), io_error. A negative timeout waits forever.
  Result<std::optional<std::string>> read_line(std::chrono::milliseconds timeout);
  /// After a failed write: the error reply the daemon sent before it closed the connection, if one arrives
  /// within `timeout`. A refused connection (too_many_connections) gets its error line at once and is
  /// closed, so a request written after that fails with EPIPE while the daemon's reason waits unread.
  std::optional<Reply> pending_error(std::chrono::milliseconds timeout);
  /// Close the write side (the daemon sees end-of-file).
  void shutdown_write();
  /// Close the connection now.
  void close();
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  std::string buffer_;  // bytes read past the last returned line
};

}  // namespace car::protocol

// Listener: the one front door both fronts use - the NDJSON socket (daemon/server.h) and the HTTP front
// (daemon/http/http_server.h). It owns a listening socket and its accept loop, and every connection either
// front serves came through it, admitted by the same rules in the same order:
//   1. On a Unix socket the peer's credentials (SO_PEERCRED) are read and checked against the allow-list;
//      a peer that cannot be identified or is not allowed is closed at once (logged, nothing sent).
//   2. ConnectionLimits decides - the daemon's connection cap (fitted under RLIMIT_NOFILE, shared by both
//      fronts) and, when the peer's uid is known, the uid's share - read at each accept, so SIGHUP reaches
//      both fronts. A refused connection gets the front's refusal (one `too_many_connections` line, an
//      HTTP 503), written without blocking into the new socket's empty send buffer, and is closed; the
//      refusal is counted, and a flood of them logs once a second.
//   3. An admitted connection is counted open (ConnectionLimits::opened) and handed to the front's
//      `on_admit`, which must call ConnectionLimits::closed(peer.uid()) once when the connection ends.
// The per-connection output rule both fronts apply afterwards (pause reading at the pending-output bound,
// cancel a stream at twice it) is ConnectionLimits' too (connection_limits.h).
//
// Binding: a Unix socket file through listen_unix (daemon/socket_file.h: mode 0660 from the first moment,
// optional group, another process's live socket refused, the file removed at exit only while still ours),
// a TCP address, or a descriptor passed by systemd.
//
// Ownership and threads: owns the acceptor and the socket file it bound (removed by remove_socket_file()
// or the destructor). Every member runs on the io thread; the io_context and the limits outlive it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio.hpp>

#include "config/http_address.h"
#include "core/util/result.h"
#include "daemon/connection_limits.h"
#include "daemon/peer_credentials.h"
#include "daemon/socket_file.h"

namespace car::daemon {

class Listener {
 public:
  using Socket = boost::asio::generic::stream_protocol::socket;

  /// Who connected: what the front keeps of an admitted connection.
  struct Peer {
    std::optional<PeerCredentials> credentials;  ///< a Unix socket's peer; nullopt on TCP
    uint64_t number = 0;                         ///< the connection's number in log lines
    std::optional<uid_t> uid() const {
      return credentials ? std::optional<uid_t>(credentials->uid) : std::nullopt;
    }
  };

  struct Options {
    std::string log_prefix = "conn";  ///< log lines say "<prefix> <number>: ..."
    uint64_t first_number = 1;        ///< the first connection's number (fronts keep theirs apart)
    std::vector<uid_t> allowed_uids;  ///< Unix sockets: the allow-list (both empty: every peer)
    std::vector<gid_t> allowed_gids;
    /// The bytes a refused connection is sent before it is closed, given why it was refused.
    std::function<std::string(const std::string& why)> refusal;
  };

  /// Receives each admitted connection (already counted open in the limits).
  using OnAdmit = std::function<void(Socket socket, const Peer& peer)>;

  Listener(boost::asio::io_context& io, ConnectionLimits& limits, Options options);
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  /// Listen on a new socket file at `path` (listen_unix; `group`: a name or gid, empty: the daemon's
  /// own). `what` names the socket in messages ("the socket", "the HTTP socket"). Errors: listen_failed,
  /// the group's lookup error.
  Result<void> listen_unix(const std::string& path, const std::string& group, std::string_view what);
  /// Bind and listen on a TCP address (port 0: any free port, see port()). Errors: listen_failed.
  Result<void> listen_tcp(const std::string& host, uint16_t port);
  /// Adopt a listening descriptor passed by systemd (a Unix or TCP socket). Errors: listen_failed.
  Result<void> adopt(int fd, std::string_view what);

  /// Start the accept loop (after listening).
  void start(OnAdmit on_admit);
  /// Stop accepting (shutdown). The socket file stays until remove_socket_file().
  void close();
  /// close(), then remove the socket file this listener bound, if it is still ours.
  void remove_socket_file();

  bool is_open() const { return acceptor_.is_open(); }
  bool unix_socket() const { return unix_socket_; }
  /// The bound TCP port; 0 for a Unix socket or when closed.
  uint16_t port() const;

 private:
  boost::asio::awaitable<void> accept_loop();
  /// Steps 1-3 above for one accepted socket.
  void admit(Socket socket);

  boost::asio::io_context& io_;
  ConnectionLimits& limits_;
  const Options options_;
  boost::asio::basic_socket_acceptor<boost::asio::generic::stream_protocol> acceptor_;
  bool unix_socket_ = false;
  OwnedSocketFile socket_file_;
  OnAdmit on_admit_;
  bool stopping_ = false;
  uint64_t next_number_;
  std::chrono::steady_clock::time_point last_refusal_log_{};
};

/// The address a listening descriptor is bound to (a socket passed by systemd), as CAR_INFERENCE_HTTP
/// would write it. Errors: listen_failed (not a socket, neither Unix nor TCP).
Result<config::HttpAddress> listening_address(int fd);

}  // namespace car::daemon

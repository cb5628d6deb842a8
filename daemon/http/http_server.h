// HttpFront: the OpenAI-compatible HTTP/1.1 front end (Boost.Beast) of car-inferenced, beside the NDJSON
// socket and on the same io_context. Each connection is a Client of the RequestHandler: a completion is an
// `infer` request built from the OpenAI body (openai.h) and handled like any socket request - the same
// worker pool, model cache, model locks, queue limit and cancellation.
//
// Listening: `HOST:PORT` / `[V6]:PORT` (TCP) or `unix:/PATH` (a 0660 socket file, optional group, peers
// checked against the allow-list like the NDJSON socket), or an fd passed by systemd socket activation.
// A TCP address that is not loopback needs an API key (open() refuses otherwise). With a key, every
// endpoint but /health and /ready needs `Authorization: Bearer KEY`.
//
// Limits: request bodies up to max_body_bytes (413 past it), headers must arrive within header_timeout,
// a keep-alive connection idle for idle_timeout is closed. Connections are accepted by the Listener both
// fronts share (daemon/listener.h) and count against the daemon's live ConnectionLimits with the socket's
// (one past the cap gets a 503 and is closed). A client that closes its connection while its completion runs
// (streamed or not) cancels it: the daemon watches the socket for end-of-file while it generates. A stream's
// output is held as encoded (the SSE events queued and the write in flight) up to max_pending_bytes() - twice
// CAR_INFERENCE_MAX_PENDING_OUTPUT_MB, as on the socket; a token past it cancels the completion, which
// ends with an `output_overflow` error event and is counted (ConnectionLimits: `stats`, /metrics). The
// output held is counted in the socket's `connections.queued_bytes` too.
//
// A `unix:` path is claimed like the NDJSON socket's (daemon/socket_file.h): refused while another
// process listens on it, and removed at exit only while it is still the file this front bound.
//
// Every member runs on the io thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio.hpp>

#include "core/util/result.h"
#include "daemon/connection_limits.h"
#include "daemon/http/http_options.h"
#include "daemon/listener.h"
#include "daemon/request_handler.h"

namespace car::daemon::http {

/// Where to listen: CAR_INFERENCE_HTTP, parsed once with the settings (config/http_address.h).
using Address = config::HttpAddress;

/// The API key in `path`: its first line, blanks trimmed. Errors: unreadable, empty.
Result<std::string> read_api_key(const std::filesystem::path& path);

class Connection;

class HttpFront {
 public:
  /// `limits`: the socket's connection limits - the pending-output bound (read at each use, so SIGHUP
  /// changes it) and the counts of queued bytes and overflows.
  HttpFront(boost::asio::io_context& io, RequestHandler& handler, ConnectionLimits& limits, HttpOptions options);
  ~HttpFront();
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  /// Bind and listen (or adopt listen_fd). Errors name the address and the cause.
  Result<void> open();
  /// Start accepting (after open()).
  void start();
  /// Stop accepting (shutdown).
  void stop_accepting();
  /// Cancel every request in flight (the grace period is over).
  void cancel_all();
  /// Close every connection: now, or (graceful) each once its current response is written.
  void close_all(bool graceful);

  std::size_t connections() const { return connections_.size(); }
  /// The bound TCP port (tests bind port 0... through an fd); 0 for a Unix socket.
  uint16_t port() const;
  const HttpOptions& options() const { return options_; }
  RequestHandler& handler() { return handler_; }
  ConnectionLimits& limits() { return limits_; }
  /// Stream bytes a connection may hold for a client that does not read before its completion is
  /// cancelled: twice CAR_INFERENCE_MAX_PENDING_OUTPUT_MB (the socket cancels a stream at the same size).
  std::size_t max_pending_bytes() const { return limits_.overflow_bound(); }
  void closed(const std::shared_ptr<Connection>& c);

 private:
  /// Serve a connection the listener admitted.
  void admit(Listener::Socket socket, const Listener::Peer& peer);

  RequestHandler& handler_;
  ConnectionLimits& limits_;
  HttpOptions options_;
  Address address_;
  Listener listener_;  // the front door, shared in kind with the socket's; removes a unix: file it bound
  /// The open connections, each with its peer's uid (Unix socket) to report its close to limits_.
  std::unordered_map<std::shared_ptr<Connection>, std::optional<uid_t>> connections_;
};

}  // namespace car::daemon::http

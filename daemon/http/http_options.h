// HttpOptions: how the OpenAI-compatible HTTP front (http_server.h) listens and what it allows. Part of
// ServerOptions (empty address and no listen_fd: the front is off). main() fills it from the settings.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/http_address.h"

namespace car::daemon::http {

struct HttpOptions {
  /// CAR_INFERENCE_HTTP, parsed by the settings (none and no listen_fd: the front is off).
  std::optional<config::HttpAddress> address;
  std::optional<int> listen_fd;  ///< a listening socket passed by systemd (FileDescriptorName=http)
  std::string api_key;           ///< empty: no key required
  std::size_t max_body_bytes = 1u << 20;
  std::chrono::seconds header_timeout{30};  ///< from accept (or the previous response) to a complete header
  std::chrono::seconds idle_timeout{60};    ///< keep-alive connections idle this long are closed
  // The connection cap and the pending-output bound are the daemon's live ConnectionLimits (SIGHUP).
  // Unix socket only (as the NDJSON socket):
  std::string socket_group;
  std::vector<uid_t> allowed_uids;
  std::vector<gid_t> allowed_gids;
  std::filesystem::path models_dir;
  /// GET /metrics: the Prometheus text; empty: 404.
  std::function<std::string()> metrics;
  /// GET /ready: are the preloaded models loaded? Empty: ready while not shutting down.
  std::function<bool()> ready;
};

}  // namespace car::daemon::http

// ServerOptions: everything car-inferenced's server needs to run, already validated. main() builds it
// from car::config Settings (defaults < config file < environment < flags); tests build it directly.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/util/result.h"

namespace car::daemon {

/// The settings SIGHUP may change while the daemon runs.
struct LiveSettings {
  uint64_t cache_budget_bytes = 24576ull << 20;
  std::chrono::seconds idle_ttl{300};  ///< 0 disables idle eviction
  std::string log_level = "info";
  // Connection limits (connection_limits.h).
  std::size_t max_connections = 256;         ///< open connections at most (lowered to fit RLIMIT_NOFILE)
  std::size_t max_connections_per_uid = 64;  ///< open connections at most per peer uid
  std::chrono::seconds line_timeout{30};     ///< an incomplete request line may take this long; 0: never
  std::size_t max_pending_output_bytes = 1u << 20;  ///< unread replies per connection before reading pauses
};

struct ServerOptions {
  std::filesystem::path socket_path;   ///< where to bind (ignored when listen_fd is set)
  std::optional<int> listen_fd;        ///< an inherited listening socket (systemd socket activation)
  std::filesystem::path models_dir;
  std::filesystem::path state_dir;
  LiveSettings live;
  std::string socket_group;            ///< chown the socket to this group (empty: leave it)
  std::vector<uid_t> allowed_uids;     ///< peers allowed to talk (empty with allowed_gids empty: all)
  std::vector<gid_t> allowed_gids;
  std::size_t workers = 2;             ///< worker threads running load/infer
  std::size_t queue_capacity = 64;     ///< queued jobs beyond which requests get `busy`
  std::chrono::milliseconds shutdown_grace{10000};  ///< in-flight work may finish this long after SIGTERM
  std::size_t max_line_bytes = 1u << 20;
  bool handle_signals = true;          ///< install SIGTERM/SIGINT/SIGHUP handlers (tests may not want them)
  /// Re-read the live settings on SIGHUP (config file and environment). Empty: SIGHUP only logs.
  std::function<Result<LiveSettings>()> reload;
};

}  // namespace car::daemon

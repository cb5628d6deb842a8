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

#include "config/settings.h"
#include "core/util/result.h"
#include "daemon/http/http_options.h"
#include "daemon/protocol.h"

namespace car::daemon {

/// The settings SIGHUP may change while the daemon runs. Defaults: config/settings.h (config::defaults).
struct LiveSettings {
  uint64_t cache_budget_bytes = config::defaults::cache_mb * config::kMiB;
  std::chrono::seconds idle_ttl{config::defaults::idle_secs};  ///< 0 disables idle eviction
  /// The longest `keep_alive` a request may ask for (longer ones are cut to it).
  std::chrono::seconds max_keep_alive{config::defaults::max_keep_alive_secs};
  std::vector<std::string> pinned_models;  ///< never idle-evicted (ids, checked by check_model_id)
  std::string log_level{config::to_string(config::defaults::log_level)};
  // Connection limits (connection_limits.h).
  std::size_t max_connections = config::defaults::max_connections;  ///< lowered to fit RLIMIT_NOFILE
  std::size_t max_connections_per_uid = config::defaults::max_connections_per_uid;  ///< per peer uid
  /// An incomplete request line may take this long; 0: never.
  std::chrono::seconds line_timeout{config::defaults::line_timeout_secs};
  /// Unread replies per connection before reading pauses.
  std::size_t max_pending_output_bytes = config::defaults::max_pending_output_mb * config::kMiB;
};

struct ServerOptions {
  std::filesystem::path socket_path;   ///< where to bind (ignored when listen_fd is set)
  std::optional<int> listen_fd;        ///< an inherited listening socket (systemd socket activation)
  std::filesystem::path models_dir;
  /// What runs, for the car_inference_build_info metric: version, git commit, the kernels' instruction set.
  struct Build {
    std::string version;
    std::string commit;
    std::string isa;
  } build;
  std::filesystem::path state_dir;
  LiveSettings live;
  std::string socket_group;            ///< chown the socket to this group (empty: leave it)
  std::vector<uid_t> allowed_uids;     ///< peers allowed to talk (empty with allowed_gids empty: all)
  std::vector<gid_t> allowed_gids;
  std::size_t workers = config::defaults::workers;             ///< worker threads running load/infer
  std::size_t queue_capacity = config::defaults::queue_depth;  ///< queued jobs beyond which requests get `busy`
  /// In-flight work may finish this long after SIGTERM.
  std::chrono::milliseconds shutdown_grace{std::chrono::seconds(config::defaults::shutdown_grace_secs)};
  std::size_t max_line_bytes = protocol::kMaxLineBytes;
  bool handle_signals = true;          ///< install SIGTERM/SIGINT/SIGHUP handlers (tests may not want them)
  /// Re-read the live settings on SIGHUP (config file and environment). Empty: SIGHUP only logs.
  std::function<Result<LiveSettings>()> reload;
  /// The OpenAI-compatible HTTP front (docs/http.md); off unless an address or an fd is set.
  http::HttpOptions http;
};

}  // namespace car::daemon

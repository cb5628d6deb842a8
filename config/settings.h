// Settings: the daemon's configuration, resolved from four layers in this order of precedence:
//   built-in default < config file (--config FILE or CAR_INFERENCE_CONFIG) < environment < command-line flag.
//
// Contract. load_settings() is a pure function of (argv, environment map, system facts): it reads the config
// file named by the flags/environment and nothing else of the process, so tests pass their own environment.
// Every value is validated; a bad one is an Error (code "invalid_setting", "unknown_setting",
// "config_file") whose message names the variable and the value and where it came from, e.g.
// "CAR_INFERENCE_MODEL_CACHE_MB=lots: not a non-negative integer (from environment)". `--help` is reported as
// an Error with code "help" whose message is the help text (print it, exit 0).
//
// The config file uses the format systemd's EnvironmentFile= reads (see parse_env_file), so one file serves
// both: KEY=VALUE lines, `#`/`;` comment lines, blank lines, single or double quotes, backslash continuation.
// Unknown CAR_INFERENCE_* keys in the file are errors (typos); other keys are ignored (they are for other
// programs). Unknown CAR_INFERENCE_* variables in the environment become warnings in Settings::warnings.
//
// Live reload (SIGHUP): only the budget, the idle TTL, the log level and the connection limits change in a
// running daemon (live_reloadable_settings()); reload_settings() + plan_reload() compute the new values and
// what changed.
//
// Thread safety: all functions are reentrant; Settings is a plain value.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/result.h"

namespace CLI {
class App;
}

namespace car::config {

/// Environment variables by name (the real one comes from current_environment()).
using EnvMap = std::map<std::string, std::string>;

enum class StreamExperts { on, off, automatic };  ///< `on`, `off`, `auto`
enum class LogLevel { trace, debug, info, warn, error };

std::string_view to_string(StreamExperts v);
std::string_view to_string(LogLevel v);

/// Facts about the machine/process the defaults depend on (injectable for tests).
struct SystemFacts {
  uid_t euid = 0;
  unsigned hardware_threads = 1;
  static SystemFacts current();  ///< geteuid(), std::thread::hardware_concurrency()
};

/// The resolved configuration. Field comments give the variable; docs/configuration.md has the table.
struct Settings {
  static constexpr std::uint64_t kMiB = 1024 * 1024;
  /// Protocol limit on one request line (fixed, not configurable).
  static constexpr std::size_t max_line_bytes = 1024 * 1024;

  std::uint64_t cache_mb = 24576;     ///< CAR_INFERENCE_MODEL_CACHE_MB; 0 disables caching
  std::uint64_t idle_secs = 300;      ///< CAR_INFERENCE_MODEL_IDLE_SECS; 0 disables idle eviction
  std::filesystem::path socket_path;  ///< CAR_INFERENCE_SOCKET (default: see default_socket_path)
  std::filesystem::path models_dir = "/var/lib/car-inference/models";  ///< CAR_INFERENCE_MODELS_DIR
  std::filesystem::path state_dir = "/var/lib/car-inference";          ///< CAR_INFERENCE_STATE_DIR
  unsigned threads = 1;  ///< CAR_INFERENCE_THREADS (default: hardware threads)
  StreamExperts stream_experts = StreamExperts::automatic;  ///< CAR_INFERENCE_STREAM_EXPERTS
  std::optional<double>
      expert_ram_gb;  ///< CAR_INFERENCE_EXPERT_RAM_GB / STREAM_EXPERTS_RAM_GB; nullopt: MemAvailable
  LogLevel log_level = LogLevel::info;  ///< CAR_INFERENCE_LOG_LEVEL
  std::string socket_group;       ///< CAR_INFERENCE_SOCKET_GROUP: name or gid; empty: the daemon's group
  std::vector<uid_t> allow_uids;  ///< CAR_INFERENCE_ALLOW_UIDS; empty (both lists): no peer check
  std::vector<gid_t> allow_gids;  ///< CAR_INFERENCE_ALLOW_GIDS
  unsigned workers = 2;           ///< CAR_INFERENCE_WORKERS: load/infer jobs run in parallel
  std::size_t queue_depth = 64;   ///< CAR_INFERENCE_QUEUE_DEPTH: queued jobs before `busy`
  std::uint64_t shutdown_grace_secs = 10;  ///< CAR_INFERENCE_SHUTDOWN_GRACE_SECS
  std::size_t max_connections = 256;       ///< CAR_INFERENCE_MAX_CONNECTIONS (live)
  std::size_t max_connections_per_uid = 64;  ///< CAR_INFERENCE_MAX_CONNECTIONS_PER_UID (live)
  std::uint64_t line_timeout_secs = 30;      ///< CAR_INFERENCE_LINE_TIMEOUT_SECS; 0: never (live)
  std::uint64_t max_pending_output_mb = 1;   ///< CAR_INFERENCE_MAX_PENDING_OUTPUT_MB (live)

  std::optional<std::filesystem::path> config_file;  ///< the file that was read, if any
  std::vector<std::string> warnings;  ///< non-fatal findings (unknown CAR_INFERENCE_* variables ...)
  /// The config file's raw values when the daemon STARTED (kept unchanged by reload_settings, which
  /// compares the file against them), by variable.
  std::map<std::string, std::string> file_values;

  /// cache_mb in bytes (0 disables caching).
  std::uint64_t cache_budget_bytes() const { return cache_mb * kMiB; }
  /// idle_secs as a TTL; nullopt when 0 (idle eviction disabled).
  std::optional<std::chrono::seconds> idle_ttl() const {
    if (idle_secs == 0) return std::nullopt;
    return std::chrono::seconds(static_cast<std::chrono::seconds::rep>(idle_secs));
  }
  /// Is a peer allowed? True when both allow-lists are empty, or uid or gid is listed.
  bool peer_allowed(uid_t uid, gid_t gid) const;
  /// One line per setting, `VARIABLE=value`, for the start-up log.
  std::string describe() const;
};

/// One row of the settings table (drives --help, validation and docs/configuration.md).
struct SettingInfo {
  std::string_view variable;       ///< CAR_INFERENCE_...
  std::string_view alias;          ///< another accepted variable name, or empty
  std::string_view flag;           ///< --cache-mb
  std::string_view default_value;  ///< as documented
  std::string_view meaning;
  bool live = false;  ///< changes on SIGHUP without a restart
};
const std::vector<SettingInfo>& setting_table();

/// The variables that SIGHUP changes live: CAR_INFERENCE_MODEL_CACHE_MB, _MODEL_IDLE_SECS, _LOG_LEVEL and the
/// connection limits (_MAX_CONNECTIONS, _MAX_CONNECTIONS_PER_UID, _LINE_TIMEOUT_SECS,
/// _MAX_PENDING_OUTPUT_MB).
std::vector<std::string_view> live_reloadable_settings();

/// Resolve from argv (argv[0] is the program), an environment, and system facts. Reads the config file.
Result<Settings> load_settings(int argc, const char* const* argv, const EnvMap& env,
                               const SystemFacts& facts = SystemFacts::current());

/// Raw flag values as bound to a CLI11 app, keyed by variable name.
struct SettingsFlags {
  std::map<std::string, std::string> values;  ///< variable -> value given by its flag
  std::optional<std::string> config;          ///< --config FILE
};
/// Add every settings flag (and --config) to `app`; parsed values land in `flags` (which must outlive app).
void bind_settings_flags(CLI::App& app, SettingsFlags& flags);
/// Resolve once the flags are parsed (load_settings = bind + parse + this).
Result<Settings> resolve_settings(const SettingsFlags& flags, const EnvMap& env,
                                  const SystemFacts& facts = SystemFacts::current());

/// SIGHUP: resolve again (re-reading the config file). A live setting whose value in the config file
/// changed since start-up (current.file_values) takes the file's new value even over the environment (under
/// systemd the environment holds the file's OLD value from EnvironmentFile=). Non-live settings are resolved
/// too; plan_reload() says which of them would need a restart.
Result<Settings> reload_settings(const Settings& current, int argc, const char* const* argv,
                                 const EnvMap& env, const SystemFacts& facts = SystemFacts::current());

/// What a reload changes.
struct ReloadPlan {
  bool budget_changed = false;
  bool idle_ttl_changed = false;
  bool log_level_changed = false;
  /// MAX_CONNECTIONS(_PER_UID), LINE_TIMEOUT_SECS or MAX_PENDING_OUTPUT_MB changed.
  bool connection_limits_changed = false;
  std::vector<std::string>
      needs_restart;  ///< variables that changed but are not live (ignored until restart)
  bool any_live_change() const {
    return budget_changed || idle_ttl_changed || log_level_changed || connection_limits_changed;
  }
};
ReloadPlan plan_reload(const Settings& current, const Settings& next);

/// The help text (usage, flags, variables, precedence).
std::string settings_help(std::string_view program = "car-inferenced");

/// The default socket: $RUNTIME_DIRECTORY/car-inference.sock (first entry if colon-separated), else
/// /run/car-inference/car-inference.sock when euid is 0, else $XDG_RUNTIME_DIR/car-inference.sock.
/// nullopt when none applies (non-root without XDG_RUNTIME_DIR).
std::optional<std::filesystem::path> default_socket_path(const EnvMap& env, uid_t euid);

/// One KEY=VALUE assignment from an environment file.
struct EnvAssignment {
  std::string key;
  std::string value;
  int line = 0;  ///< 1-based line where the assignment starts
};
/// Parse text in systemd EnvironmentFile= syntax. `name` prefixes error messages ("FILE:LINE: ...").
Result<std::vector<EnvAssignment>> parse_env_file(std::string_view text, std::string_view name);

/// The process environment (the thin impure wrapper; core never reads the environment).
EnvMap current_environment();

/// Resolve a socket group (name or decimal gid) to a gid.
Result<gid_t> resolve_group(const std::string& group);

}  // namespace car::config

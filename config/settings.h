// Settings: the daemon's configuration, resolved from four layers in this order of precedence:
//   built-in default < config file (--config FILE or CAR_INFERENCE_CONFIG) < environment < command-line flag.
//
// Contract. load_settings() is a pure function of (argv, environment map, system facts): it reads the config
// file named by the flags/environment and nothing else of the process, so tests pass their own environment.
// Every value is validated; a bad one is an Error (code "invalid_setting", "unknown_setting",
// "config_file") whose message names the variable and the value and where it came from, e.g.
// "CAR_INFERENCE_MODEL_CACHE_MB=lots: not a non-negative integer (from environment)". `--help` is reported as
// an Error with code "help" whose message is the help text (print it, exit 0); so is
// `--print-settings-markdown`.
//
// Every setting is one row of setting_table(): name, variable, flag, default, range, parser, description
// and what SIGHUP does with it. Everything here reads the rows.
//
// The config file uses the format systemd's EnvironmentFile= reads (config/env_file.h), so one file serves
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

#include "config/env_file.h"
#include "config/http_address.h"
#include "core/util/result.h"
#include "core/util/stream_experts.h"

namespace CLI {
class App;
}

namespace car::config {

/// Environment variables by name (the real one comes from current_environment()).
using EnvMap = std::map<std::string, std::string>;

using car::StreamExperts;  ///< `on`, `off`, `auto` (core/util/stream_experts.h: one type for every layer)
using car::to_string;
enum class LogLevel { trace, debug, info, warn, error };
/// The compute kernels (CAR_INFERENCE_ISA): `auto` is the best the CPU supports; the others are applied
/// with tensor::set_isa, which caps them at what the CPU supports.
enum class Isa { automatic, scalar, avx2, avx512 };

constexpr std::string_view to_string(LogLevel v) {
  switch (v) {
    case LogLevel::trace:
      return "trace";
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
  }
  return "info";
}
std::string_view to_string(Isa v);

/// Facts about the machine/process the defaults depend on (injectable for tests).
struct SystemFacts {
  uid_t euid = 0;
  unsigned hardware_threads = 1;
  std::uint64_t mem_total_bytes = 0;  ///< MemTotal of /proc/meminfo; 0 = unknown
  static SystemFacts current();       ///< geteuid(), std::thread::hardware_concurrency(), MemTotal
};

inline constexpr std::uint64_t kMiB = 1024 * 1024;

/// The NDJSON socket's variable, which messages about the socket path name.
inline constexpr std::string_view kSocketVariable = "CAR_INFERENCE_SOCKET";

/// The built-in defaults, each written once: Settings starts from them, and so do the daemon's
/// ServerOptions that tests build directly. docs/configuration.md shows them through setting_table().
namespace defaults {
inline constexpr std::uint64_t cache_mb = 24576;  ///< when the machine's memory is unknown
/// The memory left to the system, the daemon's own buffers and other processes when the cache budget
/// defaults from MemTotal: the larger of this and a tenth of MemTotal.
inline constexpr std::uint64_t cache_reserve_mb = 2048;
inline constexpr std::uint64_t idle_secs = 300;
inline constexpr std::uint64_t max_keep_alive_secs = 3600;
inline constexpr LogLevel log_level = LogLevel::info;
inline constexpr std::string_view models_dir = "/var/lib/car-inference/models";
inline constexpr std::string_view state_dir = "/var/lib/car-inference";
inline constexpr unsigned workers = 2;
inline constexpr unsigned step_tokens = 256;
/// Sequences per model: the cores, at least 8 (batching pays even on two cores: a step reads each weight
/// once for all its sequences) and at most 16. Their KV memory is the model's pool (kv_pool_mb), not a context
/// each, so more sequences cost only a logits row each.
inline unsigned parallel(unsigned hardware_threads) { return hardware_threads < 8 ? 8 : hardware_threads > 16 ? 16 : hardware_threads; }
inline constexpr std::size_t queue_depth = 64;
inline constexpr std::uint64_t shutdown_grace_secs = 10;
inline constexpr std::size_t max_connections = 256;
inline constexpr std::size_t max_connections_per_uid = 64;
inline constexpr std::uint64_t line_timeout_secs = 30;
inline constexpr std::uint64_t max_pending_output_mb = 1;
}  // namespace defaults

/// The cache budget default in MiB for a machine with `mem_total_bytes` of memory (0 = unknown:
/// defaults::cache_mb): MemTotal minus max(cache_reserve_mb, MemTotal / 10), at least a quarter of MemTotal.
std::uint64_t default_cache_mb(std::uint64_t mem_total_bytes);

/// The resolved configuration. setting_table() has one row per field (variable, flag, range, meaning).
struct Settings {
  static constexpr std::uint64_t kMiB = config::kMiB;

  std::uint64_t cache_mb = defaults::cache_mb;    ///< CAR_INFERENCE_MODEL_CACHE_MB; 0 disables caching
  /// Where cache_mb came from, for the start-up log: "MemTotal 31.3 GiB minus a reserve of 3.1 GiB", or
  /// "set" when a layer gave it, or "built-in (MemTotal unknown)".
  std::string cache_mb_origin = "built-in (MemTotal unknown)";
  std::uint64_t idle_secs = defaults::idle_secs;  ///< CAR_INFERENCE_MODEL_IDLE_SECS; 0 disables idle eviction
  /// CAR_INFERENCE_MAX_KEEP_ALIVE_SECS: the longest per-request `keep_alive`.
  std::uint64_t max_keep_alive_secs = defaults::max_keep_alive_secs;
  std::vector<std::string> pinned_models;  ///< CAR_INFERENCE_PIN_MODELS: never idle-evicted (sorted, unique)
  std::filesystem::path socket_path;              ///< CAR_INFERENCE_SOCKET (default: see default_socket_path)
  std::filesystem::path models_dir{defaults::models_dir};  ///< CAR_INFERENCE_MODELS_DIR
  std::filesystem::path state_dir{defaults::state_dir};    ///< CAR_INFERENCE_STATE_DIR
  unsigned threads = 1;  ///< CAR_INFERENCE_THREADS (resolved default: hardware threads)
  std::uint64_t context = 0;  ///< CAR_INFERENCE_CONTEXT: tokens; 0 = the trained context capped by memory
  StreamExperts stream_experts = StreamExperts::automatic;  ///< CAR_INFERENCE_STREAM_EXPERTS
  std::optional<double>
      expert_ram_gb;         ///< CAR_INFERENCE_EXPERT_RAM_GB / STREAM_EXPERTS_RAM_GB; nullopt: MemAvailable
  Isa isa = Isa::automatic;  ///< CAR_INFERENCE_ISA
  LogLevel log_level = defaults::log_level;  ///< CAR_INFERENCE_LOG_LEVEL
  std::string socket_group;       ///< CAR_INFERENCE_SOCKET_GROUP: name or gid; empty: the daemon's group
  std::vector<uid_t> allow_uids;  ///< CAR_INFERENCE_ALLOW_UIDS; empty (both lists): no peer check
  std::vector<gid_t> allow_gids;  ///< CAR_INFERENCE_ALLOW_GIDS
  unsigned workers = defaults::workers;  ///< CAR_INFERENCE_WORKERS: load/infer jobs run in parallel
  /// CAR_INFERENCE_PARALLEL: sequences each model runs at once (resolved default: defaults::parallel).
  unsigned parallel = 8;
  /// CAR_INFERENCE_KV_POOL_MB: each model's KV pool in MiB; 0 = the default (engine.h LoadOptions::kv_pool_tokens).
  std::uint64_t kv_pool_mb = 0;
  unsigned step_tokens = defaults::step_tokens;  ///< CAR_INFERENCE_STEP_TOKENS: rows of one batched step
  std::size_t queue_depth = defaults::queue_depth;  ///< CAR_INFERENCE_QUEUE_DEPTH: queued jobs before `busy`
  std::uint64_t shutdown_grace_secs = defaults::shutdown_grace_secs;  ///< CAR_INFERENCE_SHUTDOWN_GRACE_SECS
  std::size_t max_connections = defaults::max_connections;  ///< CAR_INFERENCE_MAX_CONNECTIONS (live)
  std::size_t max_connections_per_uid =
      defaults::max_connections_per_uid;  ///< CAR_INFERENCE_MAX_CONNECTIONS_PER_UID (live)
  std::uint64_t line_timeout_secs = defaults::line_timeout_secs;  ///< CAR_INFERENCE_LINE_TIMEOUT_SECS (live)
  std::uint64_t max_pending_output_mb =
      defaults::max_pending_output_mb;  ///< CAR_INFERENCE_MAX_PENDING_OUTPUT_MB (live)
  /// CAR_INFERENCE_HTTP: the OpenAI-compatible HTTP front's address (`HOST:PORT`, `[V6]:PORT`,
  /// `unix:/PATH`), parsed; nullopt: off.
  std::optional<HttpAddress> http;
  std::filesystem::path http_api_key_file;  ///< CAR_INFERENCE_HTTP_API_KEY_FILE; empty: no key

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
  /// One line per setting, `VARIABLE=value` (the rows' show()), for the start-up log.
  std::string describe() const;
};

/// What SIGHUP does with a setting: apply it live (which part of the daemon it changes), or log that it
/// needs a restart.
enum class Reload { restart, budget, idle_ttl, log_level, connection_limits };

/// One row of the settings table: everything about one setting. Resolution (finish), describe(),
/// plan_reload(), the flags and help (bind_settings_flags, settings_help) and docs/configuration.md's
/// table (settings_markdown, checked by a test) all read these rows; adding a setting is adding a row
/// (and its Settings field).
struct SettingInfo {
  std::string_view variable = {};  ///< CAR_INFERENCE_...
  std::string_view alias = {};     ///< another accepted variable name, or empty
  std::string_view flag = {};      ///< --cache-mb
  /// The default as documented (markdown) when it is computed at start-up; empty: the row's show() of a
  /// default Settings, in backticks.
  std::string_view default_doc = {};
  std::string_view meaning = {};  ///< markdown; "{range}" stands for the accepted range "min-max"
  Reload reload = Reload::restart;
  std::uint64_t min = 0;  ///< integer settings: the accepted range (max == 0: not an integer setting)
  std::uint64_t max = 0;
  /// Validate `value` (non-empty) and store it in `out`; returns why it is invalid, empty when accepted.
  std::string (*parse)(const SettingInfo& row, const std::string& value, Settings& out) = nullptr;
  /// The setting's value in `s` as text (describe(); plan_reload() compares these).
  std::string (*show)(const Settings& s) = nullptr;

  bool live() const { return reload != Reload::restart; }
  std::string default_value() const;  ///< markdown (default_doc, else show(Settings{}) in backticks)
  std::string description() const;    ///< markdown: meaning with {range} filled in
};
const std::vector<SettingInfo>& setting_table();
/// The row of `variable` (canonical name or alias); nullptr when there is none.
const SettingInfo* find_setting(std::string_view variable);

/// The variables that SIGHUP changes live: CAR_INFERENCE_MODEL_CACHE_MB, _MODEL_IDLE_SECS,
/// _MAX_KEEP_ALIVE_SECS, _PIN_MODELS, _LOG_LEVEL and the
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

/// What a reload changes (each row's Reload says where its change goes).
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
/// `running`, when given, holds the values the process started with: a setting that is not live is
/// reported in needs_restart when `next` differs from it (an edit put back to the running value is not a
/// change that awaits a restart, whatever an earlier reload read); without it, when it differs from
/// `current`.
ReloadPlan plan_reload(const Settings& current, const Settings& next, const Settings* running = nullptr);

/// The help text (usage, flags, variables, precedence).
std::string settings_help(std::string_view program = "car-inferenced");

/// docs/configuration.md's settings table (markdown), made from the rows; `car-inferenced
/// --print-settings-markdown` prints it (reported like --help: an Error with code "help").
std::string settings_markdown();

/// systemd/car-inference.env.example (installed to share/doc), made from the rows: each setting's meaning,
/// its default, whether SIGHUP applies it, and a commented KEY=VALUE line; `car-inferenced
/// --print-env-example` prints it (reported like --help), and a test checks the committed file is this.
std::string settings_env_example();

/// One setting from the environment alone (its canonical name, else its alias), validated by its row
/// exactly as the daemon validates it, stored in `out`. For the offline tools (car run, car bench), which
/// apply their own flags over it. false: unset or empty (`out` unchanged). Error "invalid_setting" naming
/// the variable and the value; "unknown_setting" for a variable with no row.
Result<bool> setting_from_environment(std::string_view variable, const EnvMap& env, Settings& out);

/// The default socket: $RUNTIME_DIRECTORY/car-inference.sock (first entry if colon-separated), else
/// /run/car-inference/car-inference.sock when euid is 0, else $XDG_RUNTIME_DIR/car-inference.sock.
/// nullopt when none applies (non-root without XDG_RUNTIME_DIR).
std::optional<std::filesystem::path> default_socket_path(const EnvMap& env, uid_t euid);

/// The process environment (the thin impure wrapper; core never reads the environment).
EnvMap current_environment();

}  // namespace car::config

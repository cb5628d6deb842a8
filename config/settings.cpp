// Settings resolution: layers (default < file < environment < flags), validation, help text, reload.
#include "config/settings.h"

#include <grp.h>
#include <unistd.h>

// CLI11 2.1's inlined string helpers trip GCC 12's -Wnull-dereference (a false positive in a system header).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

extern char** environ;  // NOLINT: POSIX

namespace car::config {
namespace {

constexpr std::string_view kCacheMb = "CAR_INFERENCE_MODEL_CACHE_MB";
constexpr std::string_view kIdleSecs = "CAR_INFERENCE_MODEL_IDLE_SECS";
constexpr std::string_view kSocket = "CAR_INFERENCE_SOCKET";
constexpr std::string_view kModelsDir = "CAR_INFERENCE_MODELS_DIR";
constexpr std::string_view kStateDir = "CAR_INFERENCE_STATE_DIR";
constexpr std::string_view kThreads = "CAR_INFERENCE_THREADS";
constexpr std::string_view kStreamExperts = "CAR_INFERENCE_STREAM_EXPERTS";
constexpr std::string_view kExpertRamGb = "CAR_INFERENCE_EXPERT_RAM_GB";
constexpr std::string_view kLogLevel = "CAR_INFERENCE_LOG_LEVEL";
constexpr std::string_view kSocketGroup = "CAR_INFERENCE_SOCKET_GROUP";
constexpr std::string_view kAllowUids = "CAR_INFERENCE_ALLOW_UIDS";
constexpr std::string_view kAllowGids = "CAR_INFERENCE_ALLOW_GIDS";
constexpr std::string_view kWorkers = "CAR_INFERENCE_WORKERS";
constexpr std::string_view kQueueDepth = "CAR_INFERENCE_QUEUE_DEPTH";
constexpr std::string_view kShutdownGrace = "CAR_INFERENCE_SHUTDOWN_GRACE_SECS";
constexpr std::string_view kMaxConnections = "CAR_INFERENCE_MAX_CONNECTIONS";
constexpr std::string_view kMaxConnectionsPerUid = "CAR_INFERENCE_MAX_CONNECTIONS_PER_UID";
constexpr std::string_view kLineTimeout = "CAR_INFERENCE_LINE_TIMEOUT_SECS";
constexpr std::string_view kMaxPendingOutput = "CAR_INFERENCE_MAX_PENDING_OUTPUT_MB";
/// Names the config file; read from flags/environment only, never from the file itself.
constexpr std::string_view kConfig = "CAR_INFERENCE_CONFIG";
constexpr std::string_view kPrefix = "CAR_INFERENCE_";
constexpr std::size_t kMaxConfigBytes = 1024 * 1024;
constexpr std::uint64_t kMaxIdleSecs = 10ULL * 365 * 24 * 3600;  // ten years: far beyond any use

/// A raw value and where it came from ("environment", "--cache-mb", "FILE:LINE").
struct RawValue {
  std::string value;
  std::string origin;
  bool via_alias = false;  ///< given under the alias name (the canonical name wins within a layer)
};
using Layer = std::map<std::string, RawValue>;  // canonical variable -> value

const SettingInfo* find_setting(std::string_view name) {
  for (const SettingInfo& s : setting_table()) {
    if (s.variable == name || (!s.alias.empty() && s.alias == name)) return &s;
  }
  return nullptr;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r';
}

std::string trim(std::string_view s) {
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

bool valid_key(std::string_view k) {
  if (k.empty()) return false;
  if (!(std::isalpha(static_cast<unsigned char>(k[0])) || k[0] == '_')) return false;
  return std::all_of(k.begin(), k.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; });
}

/// Put `value` for `name` (canonical or alias) into `layer`; the canonical name beats its alias.
void put(Layer& layer, const SettingInfo& s, std::string_view name, RawValue value) {
  const std::string key(s.variable);
  auto it = layer.find(key);
  value.via_alias = name != s.variable;
  if (it != layer.end() && value.via_alias && !it->second.via_alias) return;
  if (value.via_alias) value.origin += " as " + std::string(name);
  layer[key] = std::move(value);
}

Error invalid(std::string_view var, const RawValue& v, std::string_view why) {
  return make_error("invalid_setting",
                    std::string(var) + "=" + v.value + ": " + std::string(why) + " (from " + v.origin + ")");
}

/// Digits only, no sign or spaces; nullopt when malformed or above `max`.
std::optional<std::uint64_t> parse_u64(std::string_view s, std::uint64_t max) {
  if (s.empty() || s.size() > 20) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto d = static_cast<std::uint64_t>(c - '0');
    if (v > (max - d) / 10) return std::nullopt;
    v = v * 10 + d;
  }
  return v;
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

Result<std::uint64_t> get_u64(std::string_view var, const RawValue& v, std::uint64_t min, std::uint64_t max) {
  if (!all_digits(v.value)) {
    return invalid(var, v, min == 0 ? "not a non-negative integer" : "not a positive integer");
  }
  auto n = parse_u64(v.value, max);
  if (!n || *n < min) {
    return invalid(var, v, "out of range (" + std::to_string(min) + " to " + std::to_string(max) + ")");
  }
  return *n;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

template <typename Id>
Result<std::vector<Id>> get_id_list(std::string_view var, const RawValue& v, std::string_view what) {
  std::vector<Id> ids;
  std::string_view rest = v.value;
  while (true) {
    const auto comma = rest.find(',');
    const std::string item = trim(rest.substr(0, comma));
    if (item.empty()) return invalid(var, v, "empty item in the comma-separated list");
    // (Id)-1 is the "no id" value of chown(2) and never a real uid/gid.
    auto n = parse_u64(item, static_cast<std::uint64_t>(std::numeric_limits<Id>::max()) - 1);
    if (!all_digits(item) || !n)
      return invalid(var, v, "'" + item + "' is not a numeric " + std::string(what));
    ids.push_back(static_cast<Id>(*n));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

Result<std::string> read_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error("config_file", "cannot read config file " + path + ": " + std::strerror(errno));
  }
  std::string text;
  char buf[8192];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<std::size_t>(in.gcount()));
    if (text.size() > kMaxConfigBytes) {
      return make_error("config_file", "config file " + path + " is larger than 1 MiB");
    }
  }
  if (in.bad()) return make_error("config_file", "error reading config file " + path);
  return text;
}

/// Everything below the flags: the environment and the file, plus what resolve needs to finish.
struct Inputs {
  Layer file;
  Layer env;
  Layer flags;
  std::optional<std::string> config_path;
  std::map<std::string, std::string> file_values;
  std::vector<std::string> warnings;
};

Result<Inputs> gather(const SettingsFlags& flags, const EnvMap& env) {
  Inputs in;
  for (const auto& [name, value] : env) {
    if (name.rfind(kPrefix, 0) != 0 && find_setting(name) == nullptr) continue;
    if (name == kConfig) continue;
    const SettingInfo* s = find_setting(name);
    if (s == nullptr) {
      in.warnings.push_back("unknown variable " + name + " in the environment (ignored)");
      continue;
    }
    if (value.empty()) continue;  // an empty value means "not set" in every layer
    put(in.env, *s, name, RawValue{value, "environment"});
  }
  for (const auto& [var, value] : flags.values) {
    const SettingInfo* s = find_setting(var);
    CAR_CHECK(s != nullptr);  // bind_settings_flags only stores table variables
    if (value.empty()) continue;
    put(in.flags, *s, s->variable, RawValue{value, std::string(s->flag)});
  }
  if (flags.config) {
    in.config_path = *flags.config;
  } else if (auto it = env.find(std::string(kConfig)); it != env.end() && !it->second.empty()) {
    in.config_path = it->second;
  }
  if (in.config_path) {
    if (in.config_path->empty()) return make_error("config_file", "--config: empty file name");
    Result<std::string> text = read_config_file(*in.config_path);
    if (!text.ok()) return text.error();
    auto parsed = parse_env_file(text.value(), *in.config_path);
    if (!parsed.ok()) return parsed.error();
    for (const EnvAssignment& a : parsed.value()) {
      const std::string where = *in.config_path + ":" + std::to_string(a.line);
      if (a.key == kConfig) {
        in.warnings.push_back(where + ": " + a.key + " has no effect inside the config file (ignored)");
        continue;
      }
      const SettingInfo* s = find_setting(a.key);
      if (s == nullptr) {
        if (a.key.rfind(kPrefix, 0) == 0) {
          return make_error("unknown_setting", where + ": unknown setting " + a.key);
        }
        continue;  // another program's variable (the file doubles as systemd's EnvironmentFile=)
      }
      if (a.value.empty()) {
        in.file.erase(std::string(s->variable));
        in.file_values.erase(std::string(s->variable));
        continue;
      }
      put(in.file, *s, a.key, RawValue{a.value, where});
    }
    for (const auto& [var, raw] : in.file) in.file_values[var] = raw.value;
  }
  return in;
}

/// Validate the merged layers into Settings.
Result<Settings> finish(Inputs in, const EnvMap& env, const SystemFacts& facts,
                        const std::map<std::string, std::string>* previous_file_values) {
  Layer merged = in.file;
  for (auto& [k, v] : in.env) {
    // On reload, a live setting edited in the file since start-up beats the environment's stale copy.
    if (previous_file_values != nullptr) {
      const SettingInfo* s = find_setting(k);
      auto now = in.file_values.find(k);
      auto before = previous_file_values->find(k);
      const bool edited = (now == in.file_values.end()) != (before == previous_file_values->end()) ||
                          (now != in.file_values.end() && now->second != before->second);
      if (s != nullptr && s->live && edited && now != in.file_values.end()) continue;
    }
    merged[k] = v;
  }
  for (auto& [k, v] : in.flags) merged[k] = v;

  Settings out;
  out.threads = std::max(1U, facts.hardware_threads);
  auto get = [&](std::string_view var) -> const RawValue* {
    auto it = merged.find(std::string(var));
    return it == merged.end() ? nullptr : &it->second;
  };

  if (const RawValue* v = get(kCacheMb)) {
    auto n = get_u64(kCacheMb, *v, 0, std::numeric_limits<std::uint64_t>::max() / Settings::kMiB);
    if (!n.ok()) return n.error();
    out.cache_mb = n.value();
  }
  if (const RawValue* v = get(kIdleSecs)) {
    auto n = get_u64(kIdleSecs, *v, 0, kMaxIdleSecs);
    if (!n.ok()) return n.error();
    out.idle_secs = n.value();
  }
  if (const RawValue* v = get(kSocket)) {
    if (v->value.size() > 107)
      return invalid(kSocket, *v, "longer than 107 bytes (the Unix socket path limit)");
    if (v->value.back() == '/') return invalid(kSocket, *v, "names a directory, not a socket file");
    out.socket_path = v->value;
  } else if (auto def = default_socket_path(env, facts.euid)) {
    if (def->native().size() > 107) {
      return make_error("invalid_setting", "default socket path " + def->native() +
                                               " is longer than 107 bytes; set " + std::string(kSocket));
    }
    out.socket_path = *def;
  } else {
    return make_error("invalid_setting", "no socket path: set " + std::string(kSocket) +
                                             " or --socket (neither RUNTIME_DIRECTORY nor XDG_RUNTIME_DIR is "
                                             "set and the daemon does not run as root)");
  }
  if (const RawValue* v = get(kModelsDir)) out.models_dir = v->value;
  if (const RawValue* v = get(kStateDir)) out.state_dir = v->value;
  if (const RawValue* v = get(kThreads)) {
    auto n = get_u64(kThreads, *v, 1, 1024);
    if (!n.ok()) return n.error();
    out.threads = static_cast<unsigned>(n.value());
  }
  if (const RawValue* v = get(kStreamExperts)) {
    const std::string s = lower(v->value);
    if (s == "on") {
      out.stream_experts = StreamExperts::on;
    } else if (s == "off") {
      out.stream_experts = StreamExperts::off;
    } else if (s == "auto") {
      out.stream_experts = StreamExperts::automatic;
    } else {
      return invalid(kStreamExperts, *v, "not one of on, off, auto");
    }
  }
  if (const RawValue* v = get(kExpertRamGb)) {
    const std::string& s = v->value;
    char* end = nullptr;
    errno = 0;
    const double gb = std::strtod(s.c_str(), &end);
    const bool numeric = !s.empty() && end == s.c_str() + s.size() && errno == 0 &&
                         (std::isdigit(static_cast<unsigned char>(s[0])) != 0 || s[0] == '.');
    if (!numeric || !std::isfinite(gb) || gb <= 0)
      return invalid(kExpertRamGb, *v, "not a positive number of GB (10^9 bytes)");
    if (gb > 1024.0 * 1024.0) return invalid(kExpertRamGb, *v, "out of range (at most 1048576 GB)");
    out.expert_ram_gb = gb;
  }
  if (const RawValue* v = get(kLogLevel)) {
    const std::string s = lower(v->value);
    static const std::pair<std::string_view, LogLevel> kLevels[] = {{"trace", LogLevel::trace},
                                                                    {"debug", LogLevel::debug},
                                                                    {"info", LogLevel::info},
                                                                    {"warn", LogLevel::warn},
                                                                    {"error", LogLevel::error}};
    bool found = false;
    for (const auto& [name, level] : kLevels) {
      if (s == name) {
        out.log_level = level;
        found = true;
      }
    }
    if (!found) return invalid(kLogLevel, *v, "not one of trace, debug, info, warn, error");
  }
  if (const RawValue* v = get(kSocketGroup)) {
    const std::string& g = v->value;
    const bool name_ok = (std::isalpha(static_cast<unsigned char>(g[0])) != 0 || g[0] == '_') &&
                         std::all_of(g.begin(), g.end(),
                                     [](char c) {
                                       return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' ||
                                              c == '-' || c == '.';
                                     }) &&
                         g.size() <= 32;
    const bool gid_ok = all_digits(g) && parse_u64(g, std::numeric_limits<gid_t>::max() - 1).has_value();
    if (!name_ok && !gid_ok) return invalid(kSocketGroup, *v, "not a group name or numeric gid");
    out.socket_group = g;
  }
  if (const RawValue* v = get(kAllowUids)) {
    auto ids = get_id_list<uid_t>(kAllowUids, *v, "uid");
    if (!ids.ok()) return ids.error();
    out.allow_uids = std::move(ids.value());
  }
  if (const RawValue* v = get(kAllowGids)) {
    auto ids = get_id_list<gid_t>(kAllowGids, *v, "gid");
    if (!ids.ok()) return ids.error();
    out.allow_gids = std::move(ids.value());
  }
  if (const RawValue* v = get(kWorkers)) {
    auto n = get_u64(kWorkers, *v, 1, 256);
    if (!n.ok()) return n.error();
    out.workers = static_cast<unsigned>(n.value());
  }
  if (const RawValue* v = get(kQueueDepth)) {
    auto n = get_u64(kQueueDepth, *v, 1, 1'000'000);
    if (!n.ok()) return n.error();
    out.queue_depth = static_cast<std::size_t>(n.value());
  }
  if (const RawValue* v = get(kShutdownGrace)) {
    auto n = get_u64(kShutdownGrace, *v, 0, 86400);
    if (!n.ok()) return n.error();
    out.shutdown_grace_secs = n.value();
  }
  if (const RawValue* v = get(kMaxConnections)) {
    auto n = get_u64(kMaxConnections, *v, 1, 1'000'000);
    if (!n.ok()) return n.error();
    out.max_connections = static_cast<std::size_t>(n.value());
  }
  if (const RawValue* v = get(kMaxConnectionsPerUid)) {
    auto n = get_u64(kMaxConnectionsPerUid, *v, 1, 1'000'000);
    if (!n.ok()) return n.error();
    out.max_connections_per_uid = static_cast<std::size_t>(n.value());
  }
  if (const RawValue* v = get(kLineTimeout)) {
    auto n = get_u64(kLineTimeout, *v, 0, 86400);
    if (!n.ok()) return n.error();
    out.line_timeout_secs = n.value();
  }
  if (const RawValue* v = get(kMaxPendingOutput)) {
    auto n = get_u64(kMaxPendingOutput, *v, 1, 4096);
    if (!n.ok()) return n.error();
    out.max_pending_output_mb = n.value();
  }
  if (in.config_path) out.config_file = *in.config_path;
  // The baseline stays the start-up file across reloads: the environment mirrors that one, not the last.
  out.file_values = previous_file_values != nullptr ? *previous_file_values : std::move(in.file_values);
  out.warnings = std::move(in.warnings);
  return out;
}

Result<SettingsFlags> parse_args(int argc, const char* const* argv) {
  SettingsFlags flags;
  CLI::App app("car-inferenced: serve GGUF models over a Unix socket");
  bind_settings_flags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return make_error("help", settings_help(argc > 0 && argv[0] != nullptr
                                                ? std::filesystem::path(argv[0]).filename().string()
                                                : std::string("car-inferenced")));
  } catch (const CLI::ParseError& e) {
    return make_error("bad_flag", std::string(e.what()) + " (see --help)");
  }
  return flags;
}

}  // namespace

std::string_view to_string(StreamExperts v) {
  switch (v) {
    case StreamExperts::on:
      return "on";
    case StreamExperts::off:
      return "off";
    case StreamExperts::automatic:
      return "auto";
  }
  return "auto";
}

std::string_view to_string(LogLevel v) {
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

SystemFacts SystemFacts::current() {
  SystemFacts f;
  f.euid = ::geteuid();
  f.hardware_threads = std::max(1U, std::thread::hardware_concurrency());
  return f;
}

bool Settings::peer_allowed(uid_t uid, gid_t gid) const {
  if (allow_uids.empty() && allow_gids.empty()) return true;
  return std::binary_search(allow_uids.begin(), allow_uids.end(), uid) ||
         std::binary_search(allow_gids.begin(), allow_gids.end(), gid);
}

std::string Settings::describe() const {
  auto join = [](const auto& ids) {
    std::string s;
    for (auto id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
    return s;
  };
  std::ostringstream o;
  o << kCacheMb << '=' << cache_mb << '\n'
    << kIdleSecs << '=' << idle_secs << '\n'
    << kSocket << '=' << socket_path.native() << '\n'
    << kModelsDir << '=' << models_dir.native() << '\n'
    << kStateDir << '=' << state_dir.native() << '\n'
    << kThreads << '=' << threads << '\n'
    << kStreamExperts << '=' << to_string(stream_experts) << '\n'
    << kExpertRamGb << '=' << (expert_ram_gb ? std::to_string(*expert_ram_gb) : std::string("(MemAvailable)"))
    << '\n'
    << kLogLevel << '=' << to_string(log_level) << '\n'
    << kSocketGroup << '=' << socket_group << '\n'
    << kAllowUids << '=' << join(allow_uids) << '\n'
    << kAllowGids << '=' << join(allow_gids) << '\n'
    << kWorkers << '=' << workers << '\n'
    << kQueueDepth << '=' << queue_depth << '\n'
    << kShutdownGrace << '=' << shutdown_grace_secs << '\n'
    << kMaxConnections << '=' << max_connections << '\n'
    << kMaxConnectionsPerUid << '=' << max_connections_per_uid << '\n'
    << kLineTimeout << '=' << line_timeout_secs << '\n'
    << kMaxPendingOutput << '=' << max_pending_output_mb << '\n';
  return o.str();
}

const std::vector<SettingInfo>& setting_table() {
  static const std::vector<SettingInfo> table = {
      {kCacheMb, "", "--cache-mb", "24576", "backend cache budget in MiB; 0 disables caching", true},
      {kIdleSecs, "", "--idle-secs", "300", "evict models idle this long (seconds); 0 disables idle eviction",
       true},
      {kSocket, "", "--socket",
       "$RUNTIME_DIRECTORY/car-inference.sock, else /run/car-inference/car-inference.sock as root, else "
       "$XDG_RUNTIME_DIR/car-inference.sock",
       "the Unix socket", false},
      {kModelsDir, "", "--models-dir", "/var/lib/car-inference/models",
       "where model ids resolve: <dir>/<id>.gguf", false},
      {kStateDir, "", "--state-dir", "/var/lib/car-inference", "usage sidecars and other state", false},
      {kThreads, "", "--threads", "hardware threads", "compute threads per request (1-1024)", false},
      {kStreamExperts, "", "--stream-experts", "auto",
       "on, off, or auto (stream MoE experts when the model does not fit in memory)", false},
      {kExpertRamGb, "STREAM_EXPERTS_RAM_GB", "--expert-ram-gb", "from the memory limits",
       "expert cache budget in GB of 10^9 bytes, shared by every streamed model (positive number)", false},
      {kLogLevel, "", "--log-level", "info", "trace, debug, info, warn, error", true},
      {kSocketGroup, "", "--socket-group", "the daemon's group", "group (name or gid) owning the 0660 socket",
       false},
      {kAllowUids, "", "--allow-uids", "(empty)",
       "comma-separated uids allowed to connect; empty with "
       "ALLOW_GIDS empty: anyone who can open the socket",
       false},
      {kAllowGids, "", "--allow-gids", "(empty)", "comma-separated gids allowed to connect", false},
      {kWorkers, "", "--workers", "2", "load/infer jobs running at once (1-256)", false},
      {kQueueDepth, "", "--queue-depth", "64", "jobs waiting for a worker before requests get `busy`", false},
      {kShutdownGrace, "", "--shutdown-grace-secs", "10",
       "on SIGTERM, how long in-flight requests may finish before they are cancelled (0-86400)", false},
      {kMaxConnections, "", "--max-connections", "256",
       "open client connections at most (1-1000000); more are refused with `too_many_connections`, and the "
       "cap is lowered to fit the open-file limit",
       true},
      {kMaxConnectionsPerUid, "", "--max-connections-per-uid", "64",
       "open client connections at most per peer uid (1-1000000)", true},
      {kLineTimeout, "", "--line-timeout-secs", "30",
       "close a connection whose request line stays incomplete this long (0-86400; 0: never)", true},
      {kMaxPendingOutput, "", "--max-pending-output-mb", "1",
       "unread replies per connection (MiB, 1-4096) past which its requests are no longer read; past twice "
       "this its streamed requests are cancelled",
       true},
  };
  return table;
}

std::vector<std::string_view> live_reloadable_settings() {
  std::vector<std::string_view> out;
  for (const SettingInfo& s : setting_table()) {
    if (s.live) out.push_back(s.variable);
  }
  return out;
}

void bind_settings_flags(CLI::App& app, SettingsFlags& flags) {
  for (const SettingInfo& s : setting_table()) {
    const std::string var(s.variable);
    app.add_option_function<std::string>(
           std::string(s.flag), [&flags, var](const std::string& v) { flags.values[var] = v; },
           std::string(s.meaning) + " [" + var + ", default " + std::string(s.default_value) + "]")
        ->type_name("VALUE");
  }
  app.add_option_function<std::string>(
         "--config", [&flags](const std::string& v) { flags.config = v; },
         "read KEY=VALUE settings from FILE (systemd EnvironmentFile= syntax) [CAR_INFERENCE_CONFIG]")
      ->type_name("FILE");
}

Result<Settings> resolve_settings(const SettingsFlags& flags, const EnvMap& env, const SystemFacts& facts) {
  Result<Inputs> in = gather(flags, env);
  if (!in.ok()) return in.error();
  return finish(std::move(in.value()), env, facts, nullptr);
}

Result<Settings> load_settings(int argc, const char* const* argv, const EnvMap& env,
                               const SystemFacts& facts) {
  Result<SettingsFlags> flags = parse_args(argc, argv);
  if (!flags.ok()) return flags.error();
  return resolve_settings(flags.value(), env, facts);
}

Result<Settings> reload_settings(const Settings& current, int argc, const char* const* argv,
                                 const EnvMap& env, const SystemFacts& facts) {
  Result<SettingsFlags> flags = parse_args(argc, argv);
  if (!flags.ok()) return flags.error();
  Result<Inputs> in = gather(flags.value(), env);
  if (!in.ok()) return in.error();
  return finish(std::move(in.value()), env, facts, &current.file_values);
}

ReloadPlan plan_reload(const Settings& current, const Settings& next) {
  ReloadPlan p;
  p.budget_changed = current.cache_mb != next.cache_mb;
  p.idle_ttl_changed = current.idle_secs != next.idle_secs;
  p.log_level_changed = current.log_level != next.log_level;
  p.connection_limits_changed = current.max_connections != next.max_connections ||
                                current.max_connections_per_uid != next.max_connections_per_uid ||
                                current.line_timeout_secs != next.line_timeout_secs ||
                                current.max_pending_output_mb != next.max_pending_output_mb;
  auto check = [&](bool changed, std::string_view var) {
    if (changed) p.needs_restart.emplace_back(var);
  };
  check(current.socket_path != next.socket_path, kSocket);
  check(current.models_dir != next.models_dir, kModelsDir);
  check(current.state_dir != next.state_dir, kStateDir);
  check(current.threads != next.threads, kThreads);
  check(current.stream_experts != next.stream_experts, kStreamExperts);
  check(current.expert_ram_gb != next.expert_ram_gb, kExpertRamGb);
  check(current.socket_group != next.socket_group, kSocketGroup);
  check(current.allow_uids != next.allow_uids, kAllowUids);
  check(current.allow_gids != next.allow_gids, kAllowGids);
  check(current.workers != next.workers, kWorkers);
  check(current.queue_depth != next.queue_depth, kQueueDepth);
  check(current.shutdown_grace_secs != next.shutdown_grace_secs, kShutdownGrace);
  return p;
}

std::string settings_help(std::string_view program) {
  std::ostringstream o;
  o << "Usage: " << program << " [--config FILE] [--FLAG VALUE ...]\n\n"
    << "Serve GGUF models over a Unix socket (newline-delimited JSON).\n\n"
    << "Every setting has a flag and an environment variable. Precedence:\n"
    << "  built-in default < config file < environment < flag\n\n"
    << "  --config FILE  (CAR_INFERENCE_CONFIG)\n"
    << "      read KEY=VALUE lines in systemd EnvironmentFile= syntax\n";
  for (const SettingInfo& s : setting_table()) {
    o << "  " << s.flag << " VALUE  (" << s.variable;
    if (!s.alias.empty()) o << ", alias " << s.alias;
    o << ")" << (s.live ? "  [reloaded on SIGHUP]" : "") << "\n"
      << "      " << s.meaning << "\n"
      << "      default: " << s.default_value << "\n";
  }
  o << "  -h, --help\n      print this help\n\n"
    << "An empty value counts as unset. A malformed value stops start-up with a message naming it.\n";
  return o.str();
}

std::optional<std::filesystem::path> default_socket_path(const EnvMap& env, uid_t euid) {
  constexpr std::string_view kName = "car-inference.sock";
  if (auto it = env.find("RUNTIME_DIRECTORY"); it != env.end() && !it->second.empty()) {
    // systemd joins several RuntimeDirectory= entries with ':'; the first is ours.
    const std::string first = it->second.substr(0, it->second.find(':'));
    if (!first.empty()) return std::filesystem::path(first) / kName;
  }
  if (euid == 0) return std::filesystem::path("/run/car-inference") / kName;
  if (auto it = env.find("XDG_RUNTIME_DIR"); it != env.end() && !it->second.empty()) {
    return std::filesystem::path(it->second) / kName;
  }
  return std::nullopt;
}

Result<std::vector<EnvAssignment>> parse_env_file(std::string_view text, std::string_view name) {
  // A state machine after systemd's env-file parser: comments only where a key could start; values
  // unquoted (backslash escapes, trailing whitespace dropped), '...' (verbatim) or "..." (shell escapes
  // for \" \\ \` \$ and line continuation); quoted and unquoted pieces concatenate.
  enum class State {
    pre_key,
    comment,
    key,
    pre_value,
    value,
    value_escape,
    single_quote,
    double_quote,
    double_quote_escape
  };
  std::vector<EnvAssignment> out;
  State state = State::pre_key;
  std::string key;
  std::string value;
  std::size_t value_keep = 0;  // length of `value` without trailing unquoted whitespace
  int line = 1;
  int start_line = 1;
  auto where = [&](int l) { return std::string(name) + ":" + std::to_string(l); };
  auto finish_assignment = [&]() -> Result<void> {
    value.resize(value_keep);
    std::string k = trim(key);
    if (!valid_key(k)) {
      return make_error("config_file", where(start_line) + ": '" + k + "' is not a valid variable name");
    }
    out.push_back(EnvAssignment{std::move(k), value, start_line});
    key.clear();
    value.clear();
    value_keep = 0;
    return {};
  };
  if (text.size() >= 3 && text.substr(0, 3) == "\xEF\xBB\xBF") text.remove_prefix(3);  // UTF-8 BOM
  for (std::size_t i = 0; i <= text.size(); ++i) {
    const bool eof = i == text.size();
    const char c = eof ? '\n' : text[i];
    if (!eof && c == '\0') return make_error("config_file", where(line) + ": NUL byte in config file");
    const bool newline = c == '\n';
    switch (state) {
      case State::pre_key:
        if (c == '#' || c == ';') {
          state = State::comment;
        } else if (c == '=') {  // "=value": an empty key, reported as invalid when the value ends
          start_line = line;
          key.clear();
          state = State::pre_value;
        } else if (!newline && !is_space(c)) {
          state = State::key;
          start_line = line;
          key.assign(1, c);
        }
        break;
      case State::comment:
        if (newline) state = State::pre_key;
        break;
      case State::key:
        if (newline) {
          key.clear();  // a line without '=' is ignored, as systemd does
          state = State::pre_key;
        } else if (c == '=') {
          state = State::pre_value;
        } else {
          key.push_back(c);
        }
        break;
      case State::pre_value:
        if (newline) {
          if (auto r = finish_assignment(); !r.ok()) return r.error();
          state = State::pre_key;
        } else if (c == '\'') {
          state = State::single_quote;
        } else if (c == '"') {
          state = State::double_quote;
        } else if (c == '\\') {
          state = State::value_escape;
        } else if (!is_space(c)) {
          value.push_back(c);
          value_keep = value.size();
          state = State::value;
        }
        break;
      case State::value:
        if (newline) {
          if (auto r = finish_assignment(); !r.ok()) return r.error();
          state = State::pre_key;
        } else if (c == '\\') {
          state = State::value_escape;
        } else {
          value.push_back(c);
          if (!is_space(c)) value_keep = value.size();
        }
        break;
      case State::value_escape:
        if (eof) return make_error("config_file", where(line) + ": backslash at end of file");
        if (!newline) {  // backslash-newline is a continuation; otherwise the next char is literal
          value.push_back(c);
          value_keep = value.size();
        }
        state = State::value;
        break;
      case State::single_quote:
        if (eof) return make_error("config_file", where(start_line) + ": unterminated ' quote");
        if (c == '\'') {
          state = State::pre_value;
        } else {
          value.push_back(c);
          value_keep = value.size();
        }
        break;
      case State::double_quote:
        if (eof) return make_error("config_file", where(start_line) + ": unterminated \" quote");
        if (c == '"') {
          state = State::pre_value;
        } else if (c == '\\') {
          state = State::double_quote_escape;
        } else {
          value.push_back(c);
          value_keep = value.size();
        }
        break;
      case State::double_quote_escape:
        if (eof) return make_error("config_file", where(start_line) + ": unterminated \" quote");
        if (c == '"' || c == '\\' || c == '`' || c == '$') {
          value.push_back(c);
        } else if (!newline) {
          value.push_back('\\');
          value.push_back(c);
        }
        value_keep = value.size();
        state = State::double_quote;
        break;
    }
    if (newline && !eof) ++line;
  }
  return out;
}

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
  }
  return env;
}

Result<gid_t> resolve_group(const std::string& group) {
  if (all_digits(group)) {
    auto n = parse_u64(group, std::numeric_limits<gid_t>::max() - 1);
    if (!n) return make_error("invalid_setting", "group id " + group + " is out of range");
    return static_cast<gid_t>(*n);
  }
  long size_hint = ::sysconf(_SC_GETGR_R_SIZE_MAX);
  std::vector<char> buf(static_cast<std::size_t>(size_hint > 0 ? size_hint : 16384));
  struct group gr {};
  struct group* result = nullptr;
  int rc = 0;
  while ((rc = ::getgrnam_r(group.c_str(), &gr, buf.data(), buf.size(), &result)) == ERANGE &&
         buf.size() < (1U << 20)) {
    buf.resize(buf.size() * 2);
  }
  if (rc != 0) return make_error("invalid_setting", "looking up group " + group + ": " + std::strerror(rc));
  if (result == nullptr) return make_error("invalid_setting", "no such group: " + group);
  return result->gr_gid;
}

}  // namespace car::config

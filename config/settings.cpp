// Settings resolution: layers (default < file < environment < flags), validation, help text, reload. Every
// per-setting fact is in the table at the end of the anonymous namespace; the rest of the file walks it.
#include "config/settings.h"

#include <unistd.h>

// CLI11 2.1's inlined string helpers trip GCC 12's -Wnull-dereference (a false positive in a system header).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <type_traits>
#include <utility>

#include "core/util/error_codes.h"
#include "core/util/limits.h"

extern char** environ;  // NOLINT: POSIX

namespace car::config {
namespace {

/// Names the config file; read from flags/environment only, never from the file itself.
constexpr std::string_view kConfig = "CAR_INFERENCE_CONFIG";
constexpr std::string_view kConfigMeaning =
    "the config file to read (KEY=VALUE lines, systemd EnvironmentFile= syntax)";
constexpr std::string_view kSocket = "CAR_INFERENCE_SOCKET";
constexpr std::string_view kPrefix = "CAR_INFERENCE_";
constexpr std::uint64_t kMaxIdleSecs = limits::kMaxIdleSecs;
constexpr std::size_t kMaxSocketPath = limits::kMaxSocketPath;  // the NDJSON socket's path

/// A raw value and where it came from ("environment", "--cache-mb", "FILE:LINE").
struct RawValue {
  std::string value;
  std::string origin;
  bool via_alias = false;  ///< given under the alias name (the canonical name wins within a layer)
};
using Layer = std::map<std::string, RawValue>;  // canonical variable -> value

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
  return make_error(errc::kInvalidSetting,
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

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r'; };
  std::size_t b = 0;
  std::size_t e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

std::string strip_backticks(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '`') out.push_back(c);
  }
  return out;
}

// --- Row parsers and printers (each row names one of these) -------------------------------------------

/// The type of Settings::*Field.
template <auto Field>
using FieldType = std::remove_cvref_t<decltype(std::declval<Settings&>().*Field)>;

/// A decimal integer in [row.min, row.max].
template <auto Field>
std::string parse_integer(const SettingInfo& row, const std::string& v, Settings& out) {
  if (!all_digits(v)) return row.min == 0 ? "not a non-negative integer" : "not a positive integer";
  const auto n = parse_u64(v, row.max);
  if (!n || *n < row.min) {
    return "out of range (" + std::to_string(row.min) + " to " + std::to_string(row.max) + ")";
  }
  out.*Field = static_cast<FieldType<Field>>(*n);
  return {};
}

template <auto Field>
std::string show_number(const Settings& s) {
  return std::to_string(s.*Field);
}

template <auto Field>
std::string show_path(const Settings& s) {
  return (s.*Field).native();
}

template <auto Field>
std::string parse_path(const SettingInfo&, const std::string& v, Settings& out) {
  out.*Field = v;
  return {};
}

template <auto Field>
std::string show_enum(const Settings& s) {
  return std::string(to_string(s.*Field));
}

/// One of the enum's names (any case), e.g. to_string's outputs.
template <auto Field, auto... Values>
std::string parse_enum(const SettingInfo&, const std::string& v, Settings& out) {
  const std::string s = lower(v);
  std::string names;
  for (auto value : {Values...}) {
    if (s == to_string(value)) {
      out.*Field = value;
      return {};
    }
    names += (names.empty() ? "" : ", ") + std::string(to_string(value));
  }
  return "not one of " + names;
}

std::string parse_socket(const SettingInfo&, const std::string& v, Settings& out) {
  if (v.size() > kMaxSocketPath) return "longer than 107 bytes (the Unix socket path limit)";
  if (v.back() == '/') return "names a directory, not a socket file";
  out.socket_path = v;
  return {};
}

std::string parse_expert_ram(const SettingInfo&, const std::string& s, Settings& out) {
  char* end = nullptr;
  errno = 0;
  const double gb = std::strtod(s.c_str(), &end);
  const bool numeric = !s.empty() && end == s.c_str() + s.size() && errno == 0 &&
                       (std::isdigit(static_cast<unsigned char>(s[0])) != 0 || s[0] == '.');
  if (!numeric || !std::isfinite(gb) || gb <= 0) return "not a positive number of GB (10^9 bytes)";
  if (gb > 1024.0 * 1024.0) return "out of range (at most 1048576 GB)";
  out.expert_ram_gb = gb;
  return {};
}

std::string show_expert_ram(const Settings& s) {
  if (!s.expert_ram_gb) return "(from the memory limits)";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, *s.expert_ram_gb);  // shortest exact form
  return std::string(buf, r.ptr);
}

std::string parse_socket_group(const SettingInfo&, const std::string& g, Settings& out) {
  const bool name_ok = (std::isalpha(static_cast<unsigned char>(g[0])) != 0 || g[0] == '_') &&
                       std::all_of(g.begin(), g.end(),
                                   [](char c) {
                                     return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' ||
                                            c == '-' || c == '.';
                                   }) &&
                       g.size() <= 32;
  const bool gid_ok = all_digits(g) && parse_u64(g, std::numeric_limits<gid_t>::max() - 1).has_value();
  if (!name_ok && !gid_ok) return "not a group name or numeric gid";
  out.socket_group = g;
  return {};
}

std::string show_socket_group(const Settings& s) {
  return s.socket_group;
}

/// Comma-separated numeric ids, sorted and deduplicated.
template <auto Field>
std::string parse_ids(const SettingInfo& row, const std::string& v, Settings& out) {
  using Id = typename FieldType<Field>::value_type;
  const std::string_view what = row.variable.ends_with("UIDS") ? "uid" : "gid";
  std::vector<Id> ids;
  std::string_view rest = v;
  while (true) {
    const auto comma = rest.find(',');
    const std::string item = trim(rest.substr(0, comma));
    if (item.empty()) return "empty item in the comma-separated list";
    // (Id)-1 is the "no id" value of chown(2) and never a real uid/gid.
    auto n = parse_u64(item, static_cast<std::uint64_t>(std::numeric_limits<Id>::max()) - 1);
    if (!all_digits(item) || !n) return "'" + item + "' is not a numeric " + std::string(what);
    ids.push_back(static_cast<Id>(*n));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  out.*Field = std::move(ids);
  return {};
}

/// CAR_INFERENCE_PIN_MODELS: comma-separated model ids (spaces around items ignored, duplicates dropped).
/// The spelling is checked here as far as a path goes; the daemon applies the full id rule at start-up.
std::string parse_pins(const SettingInfo&, const std::string& v, Settings& out) {
  std::vector<std::string> ids;
  std::string_view rest = v;
  while (true) {
    const auto comma = rest.find(',');
    const std::string item = trim(rest.substr(0, comma));
    if (item.empty()) return "empty item in the comma-separated list";
    if (item.find('/') != std::string::npos) return "'" + item + "' is a path, not a model id";
    ids.push_back(item);
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  out.pinned_models = std::move(ids);
  return {};
}

std::string show_pins(const Settings& s) {
  std::string out;
  for (const auto& id : s.pinned_models) out += (out.empty() ? "" : ",") + id;
  return out;
}

template <auto Field>
std::string show_ids(const Settings& s) {
  std::string out;
  for (auto id : s.*Field) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

/// CAR_INFERENCE_HTTP: parsed here, once, into the address the daemon binds (config/http_address.h).
std::string parse_http(const SettingInfo&, const std::string& v, Settings& out) {
  auto a = parse_http_address(v);
  if (!a) return a.error().message;
  out.http = std::move(*a);
  return {};
}

std::string show_http(const Settings& s) {
  return s.http ? s.http->to_string() : std::string();
}

// --- The table --------------------------------------------------------------------------------------

const std::vector<SettingInfo>& rows() {
  using S = Settings;
  static const std::vector<SettingInfo> table = {
      {.variable = "CAR_INFERENCE_MODEL_CACHE_MB",
       .flag = "--cache-mb",
       .default_doc = "MemTotal minus a reserve of max(2048 MiB, a tenth of it), at least a quarter of it "
                      "(`24576` when MemTotal is unknown)",
       .meaning = "backend cache budget in MiB; `0` disables caching (every request loads afresh)",
       .reload = Reload::budget,
       .max = std::numeric_limits<std::uint64_t>::max() / kMiB,  // the budget in bytes fits 64 bits
       .parse = parse_integer<&S::cache_mb>,
       .show = show_number<&S::cache_mb>},
      {.variable = "CAR_INFERENCE_MODEL_IDLE_SECS",
       .flag = "--idle-secs",
       .meaning = "evict models not in use for this many seconds (counted from the end of their last "
                  "request); `0` disables idle eviction",
       .reload = Reload::idle_ttl,
       .max = kMaxIdleSecs,
       .parse = parse_integer<&S::idle_secs>,
       .show = show_number<&S::idle_secs>},
      {.variable = "CAR_INFERENCE_MAX_KEEP_ALIVE_SECS",
       .flag = "--max-keep-alive-secs",
       .meaning = "the longest `keep_alive` a request may ask for (seconds a model stays loaded after it; "
                  "longer ones are cut to this); `0` lets requests only ask to unload at once",
       .reload = Reload::idle_ttl,
       .max = kMaxIdleSecs,
       .parse = parse_integer<&S::max_keep_alive_secs>,
       .show = show_number<&S::max_keep_alive_secs>},
      {.variable = "CAR_INFERENCE_PIN_MODELS",
       .flag = "--pin-models",
       .default_doc = "empty",
       .meaning = "comma-separated model ids never evicted for idleness (whatever a request's `keep_alive`), "
                  "and evicted for room only after every unpinned model not in use; pinning does not load",
       .reload = Reload::idle_ttl,
       .parse = parse_pins,
       .show = show_pins},
      {.variable = kSocket,
       .flag = "--socket",
       .default_doc = "`$RUNTIME_DIRECTORY/car-inference.sock`, else `/run/car-inference/car-inference.sock` "
                      "as root, else `$XDG_RUNTIME_DIR/car-inference.sock`",
       .meaning = "the Unix socket (at most 107 bytes)",
       .parse = parse_socket,
       .show = show_path<&S::socket_path>},
      {.variable = "CAR_INFERENCE_MODELS_DIR",
       .flag = "--models-dir",
       .meaning = "where model ids resolve: `<dir>/<id>.gguf`",
       .parse = parse_path<&S::models_dir>,
       .show = show_path<&S::models_dir>},
      {.variable = "CAR_INFERENCE_STATE_DIR",
       .flag = "--state-dir",
       .meaning = "usage sidecars and other state (the expert usage sidecars live in `<dir>/experts/`)",
       .parse = parse_path<&S::state_dir>,
       .show = show_path<&S::state_dir>},
      {.variable = "CAR_INFERENCE_CONTEXT",
       .flag = "--context",
       .default_doc = "the model's trained context, shortened so its KV cache takes at most a quarter of "
                      "MemTotal less the cache reserve",
       .meaning = "context length (KV cache, tokens) models are loaded with ({range}; `0` = the default); a "
                  "request's `num_ctx` may only narrow it",
       .max = limits::kMaxContextTokens,
       .parse = parse_integer<&S::context>,
       .show = show_number<&S::context>},
      {.variable = "CAR_INFERENCE_THREADS",
       .flag = "--threads",
       .default_doc = "hardware threads",
       .meaning = "compute threads per request ({range})",
       .min = 1,
       .max = 1024,
       .parse = parse_integer<&S::threads>,
       .show = show_number<&S::threads>},
      {.variable = "CAR_INFERENCE_STREAM_EXPERTS",
       .flag = "--stream-experts",
       .meaning =
           "`on`, `off`, or `auto` (stream MoE experts from disk when the model does not fit in memory)",
       .parse =
           parse_enum<&S::stream_experts, StreamExperts::on, StreamExperts::off, StreamExperts::automatic>,
       .show = show_enum<&S::stream_experts>},
      {.variable = "CAR_INFERENCE_EXPERT_RAM_GB",
       .alias = "STREAM_EXPERTS_RAM_GB",
       .flag = "--expert-ram-gb",
       .default_doc = "from the memory limits",
       .meaning = "expert cache budget in GB of 10^9 bytes (a positive number, e.g. `1.5`), shared by every "
                  "streamed model",
       .parse = parse_expert_ram,
       .show = show_expert_ram},
      {.variable = "CAR_INFERENCE_ISA",
       .flag = "--isa",
       .meaning =
           "compute kernels: `auto` (the best the CPU supports), `scalar`, `avx2` or `avx512` (capped at "
           "what the CPU supports); for comparing kernels",
       .parse = parse_enum<&S::isa, Isa::automatic, Isa::scalar, Isa::avx2, Isa::avx512>,
       .show = show_enum<&S::isa>},
      {.variable = "CAR_INFERENCE_LOG_LEVEL",
       .flag = "--log-level",
       .meaning = "`trace`, `debug`, `info`, `warn`, `error` (any case)",
       .reload = Reload::log_level,
       .parse = parse_enum<&S::log_level, LogLevel::trace, LogLevel::debug, LogLevel::info, LogLevel::warn,
                           LogLevel::error>,
       .show = show_enum<&S::log_level>},
      {.variable = "CAR_INFERENCE_SOCKET_GROUP",
       .flag = "--socket-group",
       .default_doc = "the daemon's group",
       .meaning = "group (name or numeric gid) that owns the `0660` socket",
       .parse = parse_socket_group,
       .show = show_socket_group},
      {.variable = "CAR_INFERENCE_ALLOW_UIDS",
       .flag = "--allow-uids",
       .default_doc = "empty",
       .meaning = "comma-separated uids allowed to connect (checked with `SO_PEERCRED`)",
       .parse = parse_ids<&S::allow_uids>,
       .show = show_ids<&S::allow_uids>},
      {.variable = "CAR_INFERENCE_ALLOW_GIDS",
       .flag = "--allow-gids",
       .default_doc = "empty",
       .meaning = "comma-separated gids allowed to connect",
       .parse = parse_ids<&S::allow_gids>,
       .show = show_ids<&S::allow_gids>},
      {.variable = "CAR_INFERENCE_WORKERS",
       .flag = "--workers",
       .meaning = "`load`/`infer` jobs running at once ({range})",
       .min = 1,
       .max = 256,
       .parse = parse_integer<&S::workers>,
       .show = show_number<&S::workers>},
      {.variable = "CAR_INFERENCE_QUEUE_DEPTH",
       .flag = "--queue-depth",
       .meaning = "jobs waiting for a worker; when full, requests get `busy` at once ({range})",
       .min = 1,
       .max = 1'000'000,
       .parse = parse_integer<&S::queue_depth>,
       .show = show_number<&S::queue_depth>},
      {.variable = "CAR_INFERENCE_SHUTDOWN_GRACE_SECS",
       .flag = "--shutdown-grace-secs",
       .meaning = "on SIGTERM, how long in-flight requests may finish before they are cancelled ({range})",
       .max = 86400,
       .parse = parse_integer<&S::shutdown_grace_secs>,
       .show = show_number<&S::shutdown_grace_secs>},
      {.variable = "CAR_INFERENCE_MAX_CONNECTIONS",
       .flag = "--max-connections",
       .meaning = "open client connections at most ({range}); more are refused with `too_many_connections`. "
                  "Lowered, with a warning, to fit the open-file limit less max(128, limit/8)",
       .reload = Reload::connection_limits,
       .min = 1,
       .max = 1'000'000,
       .parse = parse_integer<&S::max_connections>,
       .show = show_number<&S::max_connections>},
      {.variable = "CAR_INFERENCE_MAX_CONNECTIONS_PER_UID",
       .flag = "--max-connections-per-uid",
       .meaning = "open client connections at most per peer uid ({range})",
       .reload = Reload::connection_limits,
       .min = 1,
       .max = 1'000'000,
       .parse = parse_integer<&S::max_connections_per_uid>,
       .show = show_number<&S::max_connections_per_uid>},
      {.variable = "CAR_INFERENCE_LINE_TIMEOUT_SECS",
       .flag = "--line-timeout-secs",
       .meaning =
           "a request line still incomplete this long after its first byte gets `line_timeout` and the "
           "connection is closed ({range}; `0` never times out). Idle connections are not timed out",
       .reload = Reload::connection_limits,
       .max = 86400,
       .parse = parse_integer<&S::line_timeout_secs>,
       .show = show_number<&S::line_timeout_secs>},
      {.variable = "CAR_INFERENCE_MAX_PENDING_OUTPUT_MB",
       .flag = "--max-pending-output-mb",
       .meaning =
           "MiB of replies a connection may leave unread before the daemon stops reading its requests; "
           "past twice this its streamed requests are cancelled with `output_overflow` ({range})",
       .reload = Reload::connection_limits,
       .min = 1,
       .max = 4096,
       .parse = parse_integer<&S::max_pending_output_mb>,
       .show = show_number<&S::max_pending_output_mb>},
      {.variable = "CAR_INFERENCE_HTTP",
       .flag = "--http",
       .default_doc = "off",
       .meaning = "also serve the OpenAI-compatible HTTP API (docs/http.md) on `127.0.0.1:PORT`, `[::1]:PORT` "
                  "or `unix:/PATH` (a Unix path gets the socket's `0660` mode and allow-list); a non-loopback "
                  "address needs `CAR_INFERENCE_HTTP_API_KEY_FILE`",
       .parse = parse_http,
       .show = show_http},
      {.variable = "CAR_INFERENCE_HTTP_API_KEY_FILE",
       .flag = "--http-api-key-file",
       .default_doc = "none",
       .meaning = "file holding the API key HTTP clients must send as `Authorization: Bearer KEY` (first "
                  "line, surrounding blanks ignored)",
       .parse = parse_path<&S::http_api_key_file>,
       .show = show_path<&S::http_api_key_file>},
  };
  return table;
}

// --- Resolution -------------------------------------------------------------------------------------

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
    if (in.config_path->empty()) return make_error(errc::kConfigFile, "--config: empty file name");
    Result<std::string> text = read_env_file(*in.config_path);
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
          return make_error(errc::kUnknownSetting, where + ": unknown setting " + a.key);
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

/// Validate the merged layers into Settings, row by row.
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
      if (s != nullptr && s->live() && edited && now != in.file_values.end()) continue;
    }
    merged[k] = v;
  }
  for (auto& [k, v] : in.flags) merged[k] = v;

  Settings out;
  out.threads = std::max(1U, facts.hardware_threads);
  out.cache_mb = default_cache_mb(facts.mem_total_bytes);
  if (facts.mem_total_bytes != 0) {
    char origin[128];
    std::snprintf(origin, sizeof(origin), "MemTotal %.1f GiB minus a reserve of %.1f GiB",
                  static_cast<double>(facts.mem_total_bytes) / (1024.0 * kMiB),
                  static_cast<double>(facts.mem_total_bytes / kMiB - out.cache_mb) / 1024.0);
    out.cache_mb_origin = origin;
  }
  if (merged.count(std::string("CAR_INFERENCE_MODEL_CACHE_MB")) != 0) out.cache_mb_origin = "set";
  for (const SettingInfo& row : setting_table()) {
    auto it = merged.find(std::string(row.variable));
    if (it == merged.end()) continue;
    if (std::string why = row.parse(row, it->second.value, out); !why.empty()) {
      return invalid(row.variable, it->second, why);
    }
  }
  if (out.socket_path.empty()) {
    auto def = default_socket_path(env, facts.euid);
    if (!def) {
      return make_error(errc::kInvalidSetting,
                        "no socket path: set " + std::string(kSocket) +
                            " or --socket (neither RUNTIME_DIRECTORY nor XDG_RUNTIME_DIR is "
                            "set and the daemon does not run as root)");
    }
    if (def->native().size() > kMaxSocketPath) {
      return make_error(errc::kInvalidSetting, "default socket path " + def->native() +
                                                   " is longer than 107 bytes; set " + std::string(kSocket));
    }
    out.socket_path = *def;
  }
  // Both front doors on one path: the second bind would find the first listening (or, before the daemon
  // checked that, replace it). A configuration error, not a start-up failure.
  if (out.http && out.http->unix_socket &&
      std::filesystem::path(out.http->path).lexically_normal() == out.socket_path.lexically_normal()) {
    return make_error(errc::kInvalidSetting, "CAR_INFERENCE_HTTP=" + out.http->to_string() +
                                                 " is the NDJSON socket's own path (" + std::string(kSocket) +
                                                 "): give the HTTP front a socket path of its own");
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
  bool markdown = false;
  bool env_example = false;
  app.add_flag("--print-settings-markdown", markdown,
               "print the settings table of docs/configuration.md (generated from the settings table)");
  app.add_flag("--print-env-example", env_example,
               "print the example environment file (generated from the settings table)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return make_error(errc::kHelp, settings_help(argc > 0 && argv[0] != nullptr
                                                     ? std::filesystem::path(argv[0]).filename().string()
                                                     : std::string("car-inferenced")));
  } catch (const CLI::ParseError& e) {
    return make_error(errc::kBadFlag, std::string(e.what()) + " (see --help)");
  }
  if (markdown) return make_error(errc::kHelp, settings_markdown());
  if (env_example) return make_error(errc::kHelp, settings_env_example());
  return flags;
}

}  // namespace


std::string_view to_string(Isa v) {
  switch (v) {
    case Isa::automatic:
      return "auto";
    case Isa::scalar:
      return "scalar";
    case Isa::avx2:
      return "avx2";
    case Isa::avx512:
      return "avx512";
  }
  return "auto";
}

SystemFacts SystemFacts::current() {
  SystemFacts f;
  f.euid = ::geteuid();
  f.hardware_threads = std::max(1U, std::thread::hardware_concurrency());
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  while (meminfo >> key >> kib) {
    if (key == "MemTotal:") {
      f.mem_total_bytes = kib * 1024;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return f;
}

std::uint64_t default_cache_mb(std::uint64_t mem_total_bytes) {
  if (mem_total_bytes == 0) return defaults::cache_mb;
  const std::uint64_t total_mb = mem_total_bytes / kMiB;
  const std::uint64_t reserve_mb = std::max(defaults::cache_reserve_mb, total_mb / 10);
  return std::max(total_mb / 4, total_mb > reserve_mb ? total_mb - reserve_mb : 0);
}

std::string Settings::describe() const {
  std::string out;
  for (const SettingInfo& row : setting_table()) {
    out += std::string(row.variable) + '=' + row.show(*this) + '\n';
  }
  return out;
}

std::string SettingInfo::default_value() const {
  if (!default_doc.empty()) return std::string(default_doc);
  return "`" + show(Settings{}) + "`";
}

std::string SettingInfo::description() const {
  std::string out(meaning);
  constexpr std::string_view kRange = "{range}";
  if (const auto at = out.find(kRange); at != std::string::npos) {
    out.replace(at, kRange.size(), std::to_string(min) + "-" + std::to_string(max));
  }
  return out;
}

const std::vector<SettingInfo>& setting_table() {
  return rows();
}

const SettingInfo* find_setting(std::string_view name) {
  for (const SettingInfo& s : setting_table()) {
    if (s.variable == name || (!s.alias.empty() && s.alias == name)) return &s;
  }
  return nullptr;
}

std::vector<std::string_view> live_reloadable_settings() {
  std::vector<std::string_view> out;
  for (const SettingInfo& s : setting_table()) {
    if (s.live()) out.push_back(s.variable);
  }
  return out;
}

void bind_settings_flags(CLI::App& app, SettingsFlags& flags) {
  for (const SettingInfo& s : setting_table()) {
    const std::string var(s.variable);
    app.add_option_function<std::string>(
           std::string(s.flag), [&flags, var](const std::string& v) { flags.values[var] = v; },
           strip_backticks(s.description()) + " [" + var + ", default " + strip_backticks(s.default_value()) +
               "]")
        ->type_name("VALUE");
  }
  app.add_option_function<std::string>(
         "--config", [&flags](const std::string& v) { flags.config = v; },
         std::string(kConfigMeaning) + " [" + std::string(kConfig) + "]")
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

ReloadPlan plan_reload(const Settings& current, const Settings& next, const Settings* running) {
  ReloadPlan p;
  for (const SettingInfo& row : setting_table()) {
    if (row.reload == Reload::restart && running != nullptr) {
      if (row.show(*running) != row.show(next)) p.needs_restart.emplace_back(row.variable);
      continue;
    }
    if (row.show(current) == row.show(next)) continue;
    switch (row.reload) {
      case Reload::budget:
        p.budget_changed = true;
        break;
      case Reload::idle_ttl:
        p.idle_ttl_changed = true;
        break;
      case Reload::log_level:
        p.log_level_changed = true;
        break;
      case Reload::connection_limits:
        p.connection_limits_changed = true;
        break;
      case Reload::restart:
        p.needs_restart.emplace_back(row.variable);
        break;
    }
  }
  return p;
}

std::string settings_help(std::string_view program) {
  std::ostringstream o;
  o << "Usage: " << program << " [--config FILE] [--FLAG VALUE ...]\n\n"
    << "Serve GGUF models over a Unix socket (newline-delimited JSON).\n\n"
    << "Every setting has a flag and an environment variable. Precedence:\n"
    << "  built-in default < config file < environment < flag\n\n"
    << "  --config FILE  (" << kConfig << ")\n"
    << "      " << kConfigMeaning << "\n";
  for (const SettingInfo& s : setting_table()) {
    o << "  " << s.flag << " VALUE  (" << s.variable;
    if (!s.alias.empty()) o << ", alias " << s.alias;
    o << ")" << (s.live() ? "  [reloaded on SIGHUP]" : "") << "\n"
      << "      " << strip_backticks(s.description()) << "\n"
      << "      default: " << strip_backticks(s.default_value()) << "\n";
  }
  o << "  --print-settings-markdown\n      print this table as docs/configuration.md has it\n"
    << "  --print-env-example\n      print the example environment file (every setting, commented out)\n"
    << "  -h, --help\n      print this help\n\n"
    << "An empty value counts as unset. A malformed value stops start-up with a message naming it.\n";
  return o.str();
}

std::string settings_markdown() {
  std::string o = "| variable | flag | default | meaning | live |\n|---|---|---|---|---|\n";
  for (const SettingInfo& s : setting_table()) {
    o += "| `" + std::string(s.variable) + "`";
    if (!s.alias.empty()) o += " (alias `" + std::string(s.alias) + "`)";
    o += " | `" + std::string(s.flag) + "` | " + s.default_value() + " | " + s.description() + " | " +
         (s.live() ? "yes" : "no") + " |\n";
  }
  o += "| `" + std::string(kConfig) + "` | `--config` | none | the config file to read (see below) | - |\n";
  return o;
}

namespace {
/// `text` as '# ' comment lines of at most `width` characters, broken at spaces.
std::string comment_lines(std::string_view text, std::size_t width = 108) {
  std::string out;
  std::string line;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t j = text.find(' ', i);
    if (j == std::string_view::npos) j = text.size();
    const std::string_view word = text.substr(i, j - i);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += "# " + line + "\n";
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += word;
    i = j + 1;
  }
  if (!line.empty()) out += "# " + line + "\n";
  return out;
}
}  // namespace

std::string settings_env_example() {
  std::string o =
      "# /etc/car-inference/car-inference.env - read by car-inferenced.service (EnvironmentFile=) and usable as\n"
      "# `car-inferenced --config FILE`. KEY=VALUE lines; '#' starts a comment. Every setting is optional: each\n"
      "# commented line below shows the built-in default (empty where it is computed at start-up). A malformed\n"
      "# value stops the daemon at start-up with a message naming the variable. After editing: `systemctl\n"
      "# reload car-inferenced` applies the settings marked live (SIGHUP); the others need `systemctl restart\n"
      "# car-inferenced`. Under the packaged units, enable car-inferenced-http.socket rather than setting\n"
      "# CAR_INFERENCE_HTTP (docs/http.md), and leave CAR_INFERENCE_SOCKET to the socket unit's ListenStream=.\n"
      "#\n"
      "# Generated from the settings table: `car-inferenced --print-env-example` (docs/configuration.md).\n";
  for (const SettingInfo& s : setting_table()) {
    std::string meaning = strip_backticks(s.description());
    if (!meaning.empty()) meaning[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(meaning[0])));
    meaning += std::string(s.live() ? " (live)." : ".");
    if (!s.alias.empty()) meaning += " Also read as " + std::string(s.alias) + ".";
    o += "\n" + comment_lines(meaning) + comment_lines("Default: " + strip_backticks(s.default_value()) + ".");
    o += "#" + std::string(s.variable) + "=" + (s.default_doc.empty() ? s.show(Settings{}) : std::string()) + "\n";
  }
  return o;
}

Result<bool> setting_from_environment(std::string_view variable, const EnvMap& env, Settings& out) {
  const SettingInfo* row = find_setting(variable);
  if (row == nullptr) return make_error(errc::kUnknownSetting, "unknown setting " + std::string(variable));
  Layer layer;
  for (std::string_view name : {row->variable, row->alias}) {
    if (name.empty()) continue;
    auto it = env.find(std::string(name));
    if (it != env.end() && !it->second.empty()) put(layer, *row, name, RawValue{it->second, "environment"});
  }
  auto it = layer.find(std::string(row->variable));
  if (it == layer.end()) return false;
  if (std::string why = row->parse(*row, it->second.value, out); !why.empty()) {
    return invalid(row->variable, it->second, why);
  }
  return true;
}

std::optional<std::filesystem::path> default_socket_path(const EnvMap& env, uid_t euid) {
  constexpr std::string_view kName = "car-inference.sock";
  if (auto it = env.find("RUNTIME_DIRECTORY"); it != env.end() && !it->second.empty()) {
    // systemd joins several RuntimeDirectory= entries with ':'; the first is ours.
    const std::string first = it->second.substr(0, it->second.find(':'));
    if (!first.empty()) return std::filesystem::path(first) / kName;
  }
  if (euid == 0) return std::filesystem::path(limits::kSystemSocketPath);
  if (auto it = env.find("XDG_RUNTIME_DIR"); it != env.end() && !it->second.empty()) {
    return std::filesystem::path(it->second) / kName;
  }
  return std::nullopt;
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

}  // namespace car::config

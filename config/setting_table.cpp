// The settings table: one row per setting - variable, flag, default, range, meaning, its parser and printer,
// and what SIGHUP does with it (SettingInfo, config/settings.h) - and the row parsers that turn a raw value
// into a field of Settings, each returning what is wrong with the value (empty when it is fine). The queries
// over the rows live here too; resolution, reload, help and the generated documents (settings.cpp) walk
// setting_table().
#include <sys/types.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config/settings.h"
#include "core/util/limits.h"

namespace car::config {
namespace {

constexpr std::string_view kSocket = kSocketVariable;
constexpr std::uint64_t kMaxIdleSecs = limits::kMaxIdleSecs;
constexpr std::size_t kMaxSocketPath = limits::kMaxSocketPath;  // the NDJSON socket's path

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
       .default_doc = "the model's trained context, shortened so that min(`CAR_INFERENCE_PARALLEL`, 4) full "
                      "contexts fit in the KV pool (`CAR_INFERENCE_KV_POOL_MB`, or a quarter of MemTotal less the "
                      "cache reserve)",
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
      {.variable = "CAR_INFERENCE_PARALLEL",
       .flag = "--parallel",
       .default_doc = "the hardware threads, at least 8 and at most 16",
       .meaning = "sequences each model runs at once, batched in one forward pass per step ({range}); their "
                  "KV caches share the model's KV pool (`CAR_INFERENCE_KV_POOL_MB`), so more sequences cost no "
                  "KV memory; more requests wait in the model's queue",
       .min = 1,
       .max = 256,
       .parse = parse_integer<&S::parallel>,
       .show = show_number<&S::parallel>},
      {.variable = "CAR_INFERENCE_KV_POOL_MB",
       .flag = "--kv-pool-mb",
       .meaning = "MiB of KV cache each model's sequences share - its KV pool, charged to the model in the "
                  "cache budget ({range}; `0` = min(`CAR_INFERENCE_PARALLEL`, 4) full contexts - for "
                  "short contexts up to the positions of 4 contexts of 4096 tokens, so that every sequence "
                  "fits - which the default context fits in a quarter of MemTotal less the cache reserve). "
                  "A request "
                  "reserves prompt + `max_tokens` positions and waits in the model's queue until the pool "
                  "has them; one that needs more than the whole pool gets `context_overflow`",
       .max = 16'777'216,
       .parse = parse_integer<&S::kv_pool_mb>,
       .show = show_number<&S::kv_pool_mb>},
      {.variable = "CAR_INFERENCE_STEP_TOKENS",
       .flag = "--step-tokens",
       .meaning = "tokens one batched step evaluates at most: a token of every generating sequence, then "
                  "prompt chunks of the others, so a long prompt does not stall the streams ({range})",
       .min = 8,
       .max = 256,
       .parse = parse_integer<&S::step_tokens>,
       .show = show_number<&S::step_tokens>},
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
       .meaning =
           "also serve the OpenAI-compatible HTTP API (docs/http.md) on `127.0.0.1:PORT`, `[::1]:PORT` "
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

}  // namespace

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

}  // namespace car::config

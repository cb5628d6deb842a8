// Settings resolution: layers (default < file < environment < flags), validation, help text, reload. Every
// per-setting fact is a row of the table (config/setting_table.cpp); this file walks setting_table().
#include "config/settings.h"

#include <unistd.h>

// CLI11 2.1's inlined string helpers trip GCC 12's -Wnull-dereference (a false positive in a system header).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <utility>

#include "config/cli_errors.h"
#include "core/util/error_codes.h"
#include "core/util/limits.h"

extern char** environ;  // NOLINT: POSIX

namespace car::config {
namespace {

/// Names the config file; read from flags/environment only, never from the file itself.
constexpr std::string_view kConfig = "CAR_INFERENCE_CONFIG";
constexpr std::string_view kConfigMeaning =
    "the config file to read (KEY=VALUE lines, systemd EnvironmentFile= syntax)";
constexpr std::string_view kSocket = kSocketVariable;
constexpr std::string_view kPrefix = "CAR_INFERENCE_";
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

std::string strip_backticks(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c != '`') out.push_back(c);
  }
  return out;
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
      std::vector<std::string_view> names;
      for (const SettingInfo& row : setting_table()) names.push_back(row.variable);
      const std::string best = closest_name(name, names);
      in.warnings.push_back("unknown variable " + name + " in the environment (ignored" +
                            (best.empty() ? "" : "; did you mean " + best + "?") + ")");
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
          std::vector<std::string_view> names;
          for (const SettingInfo& row : setting_table()) names.push_back(row.variable);
          const std::string best = closest_name(a.key, names);
          return make_error(errc::kUnknownSetting, where + ": unknown setting " + a.key +
                                                       (best.empty() ? "" : " (did you mean " + best + "?)"));
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
  out.parallel = defaults::parallel(facts.hardware_threads);
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
    return make_error(errc::kBadFlag, describe_parse_error(app, e, argc, argv) + " (see --help)");
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

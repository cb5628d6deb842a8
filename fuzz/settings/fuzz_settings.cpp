// fuzz_settings: arbitrary bytes as a settings file (the KEY=VALUE syntax of systemd's EnvironmentFile=,
// which both --config files and the unit's environment file use). parse_env_file must return assignments
// or an error, never throw or crash; assignments have a non-empty key without '=', NUL or newline, and
// line numbers that are positive and non-decreasing. The assignments are then resolved as an environment
// (resolve_settings with fixed system facts), which must validate every value without throwing. Keys that
// would make it read a file (the config file) are dropped, so a run depends on its input alone.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "config/settings.h"

namespace {
void require(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = car::config::parse_env_file(text, "fuzz.env");
  if (!parsed.ok()) {
    require(!parsed.error().message.empty());
    return 0;
  }
  car::config::EnvMap env;
  int last_line = 1;
  for (const auto& a : *parsed) {
    require(!a.key.empty());
    require(a.key.find_first_of(std::string_view("=\n\0", 3)) == std::string::npos);
    require(a.line >= last_line);
    last_line = a.line;
    if (a.key.find("CONFIG") != std::string::npos) continue;
    env[a.key] = a.value;
  }
  car::config::SettingsFlags flags;
  car::config::SystemFacts facts;
  facts.euid = 1000;
  facts.hardware_threads = 4;
  env.emplace("XDG_RUNTIME_DIR", "/run/user/1000");
  auto settings = car::config::resolve_settings(flags, env, facts);
  if (!settings.ok()) require(!settings.error().message.empty());
  return 0;
}

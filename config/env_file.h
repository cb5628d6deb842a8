// The config file's reader: text in the syntax systemd's EnvironmentFile= reads (so one file serves the
// service unit and the daemon), parsed into KEY=VALUE assignments. Pure and reentrant; read_env_file() is
// the one function that touches the file system. docs/configuration.md, "The config file", has the rules.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/result.h"

namespace car::config {

/// Config files larger than this are refused (a settings file is a few hundred bytes).
inline constexpr std::size_t kMaxEnvFileBytes = std::size_t{1} << 20;

/// One KEY=VALUE assignment from an environment file.
struct EnvAssignment {
  std::string key;
  std::string value;
  int line = 0;  ///< 1-based line where the assignment starts
};

/// Parse text in systemd EnvironmentFile= syntax. `name` prefixes error messages ("FILE:LINE: ...").
/// Errors (code "config_file"): NUL bytes, unterminated quotes, a trailing backslash, invalid names.
Result<std::vector<EnvAssignment>> parse_env_file(std::string_view text, std::string_view name);

/// Read a whole config file (at most kMaxEnvFileBytes). Error "config_file" naming the path.
Result<std::string> read_env_file(const std::string& path);

}  // namespace car::config

// The `car` command line is assembled from command groups, one per file (cmd_gguf.cpp, cmd_run.cpp, ...).
// Each file registers a setup function at static-initialization time with CAR_REGISTER_COMMANDS; main()
// calls every setup function on the root CLI11 app, then parses. A command's callback reports failure by
// throwing car::tools::CommandFailed(exit_code) after printing its message to stderr.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <stdexcept>
#include <vector>

namespace car::tools {

using CommandSetup = void (*)(CLI::App& root);

/// Exit codes of the commands that talk to the daemon (man page car.1, EXIT STATUS: 1 the daemon answered an
/// error, 3 no daemon could be reached; 2 is CLI11's usage error).
inline constexpr int kExitDaemonError = 1;
inline constexpr int kExitUnreachable = 3;

struct CommandFailed : std::runtime_error {
  explicit CommandFailed(int code) : std::runtime_error("command failed"), exit_code(code) {}
  int exit_code;
};

inline std::vector<CommandSetup>& command_setups() {
  static std::vector<CommandSetup> setups;
  return setups;
}

inline bool register_commands(CommandSetup setup) {
  command_setups().push_back(setup);
  return true;
}

}  // namespace car::tools

#define CAR_REGISTER_COMMANDS(fn) \
  static const bool car_registered_##fn [[maybe_unused]] = ::car::tools::register_commands(&fn)

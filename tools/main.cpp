// `car`: the client of car-inferenced and the offline model tools. See docs/ and CONTRACT.md.
#include <cstdio>
#include <exception>

#include "core/util/fault_guard.h"
#include "tools/command_registry.h"

int main(int argc, char** argv) {
  // A model file cut short while `car run`/`bench` maps it: an io_error instead of death by SIGBUS
  // (process-wide, so installed here by the owner of main; see core/util/fault_guard.h).
  if (auto guard = car::fault_guard::install(); !guard) {
    std::fprintf(stderr, "car: %s\n", guard.error().message.c_str());
  }
  CLI::App app{"car: car-inference client and offline model tools"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "car 0.1.0");
  for (auto setup : car::tools::command_setups()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const car::tools::CommandFailed& e) {
    return e.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "car: %s\n", e.what());
    return 1;
  }
  return 0;
}

// `car`: the client of car-inferenced and the offline model tools. See docs/ and CONTRACT.md.
// GCC 12 reports a potential null dereference inside CLI11's inlined string splitting (libstdc++'s vector
// relocation, reached from App::help()); a false positive in library code, silenced for this file only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wnull-dereference"
#endif
#include <cstdio>
#include <exception>
#include <string>

#include "car_version.h"
#include "config/cli_errors.h"
#include "core/tensor/kernels.h"
#include "core/util/fault_guard.h"
#include "tools/command_registry.h"
#include "tools/offline_env.h"

namespace {
/// `car --version`: version, the git commit built, and the kernels' instruction set `car run` would use
/// (CAR_INFERENCE_ISA applied, clamped to the CPU).
std::string version_text() {
  std::string isa_note;
  if (auto applied = car::tools::apply_isa_from_env(); !applied)
    isa_note = " (" + applied.error().message + ")";
  return std::string("car ") + CAR_VERSION + "\ncommit " + CAR_GIT_COMMIT + "\nisa " +
         std::string(car::tensor::isa_name(car::tensor::current_isa())) + isa_note;
}
}  // namespace

int main(int argc, char** argv) {
  // A model file cut short while `car run`/`bench` maps it: an io_error instead of death by SIGBUS
  // (process-wide, so installed here by the owner of main; see core/util/fault_guard.h).
  if (auto guard = car::fault_guard::install(); !guard) {
    std::fprintf(stderr, "car: %s\n", guard.error().message.c_str());
  }
  CLI::App app{"car: car-inference client and offline model tools", "car"};
  app.require_subcommand(1);
  app.option_defaults()->always_capture_default();  // every --help shows the defaults
  app.set_version_flag("--version", version_text,
                       "print the version, git commit and instruction set, then exit");
  for (auto setup : car::tools::command_setups()) setup(app);
  if (argc <= 1) {  // plain `car`: what it can do
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // Usage errors exit 2 (as getopt tools do), whatever CLI11's own code for the kind of error.
    const std::string first = argv[1];
    if (app.get_subcommands().empty() && !first.empty() && first[0] != '-') {
      std::fprintf(stderr, "car: unknown command '%s'%s; 'car --help' lists the commands\n", first.c_str(),
                   car::config::did_you_mean(first, car::config::known_commands(&app)).c_str());
    } else {
      std::fprintf(stderr, "car: %s\n", car::config::describe_parse_error(app, e, argc, argv).c_str());
      if (const auto* sub = app.get_subcommands().empty() ? nullptr : app.get_subcommands().back()) {
        std::fprintf(stderr, "'car %s --help' shows its usage\n", sub->get_name().c_str());
      }
    }
    return 2;
  } catch (const car::tools::CommandFailed& e) {
    return e.exit_code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "car: %s\n", e.what());
    return 1;
  }
  return 0;
}

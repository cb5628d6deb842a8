// Parse errors of the command lines (car, car-inferenced) worded for people: CLI11 lists unexpected
// arguments in reverse order and suggests nothing. describe_parse_error lists them in the order typed and
// names the known flag or command nearest to each mistyped one ("--temprature: did you mean
// --temperature?"). Header-only (CLI11 is).
#pragma once

// CLI11 2.1's inlined string helpers trip GCC 12's -Wnull-dereference (a false positive in a system header).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wnull-dereference"
#endif
#include <CLI/CLI.hpp>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#include <map>
#include <string>
#include <vector>

#include "core/util/suggest.h"

namespace car::config {

/// The subcommand the parser was in: the deepest one given on the command line (or `app` itself).
inline const CLI::App* parsed_command(const CLI::App& app) {
  const CLI::App* at = &app;
  for (;;) {
    const auto subs = at->get_subcommands();
    if (subs.empty()) return at;
    at = subs.back();
  }
}

/// The long and short flags `command` accepts (with their dashes), its parents' too.
inline std::vector<std::string> known_flags(const CLI::App* command) {
  std::vector<std::string> out;
  for (const CLI::App* at = command; at != nullptr; at = at->get_parent()) {
    for (const CLI::Option* o : at->get_options()) {
      for (const auto& l : o->get_lnames()) out.push_back("--" + l);
      for (const auto& s : o->get_snames()) out.push_back("-" + s);
    }
  }
  return out;
}

/// The names of `command`'s subcommands.
inline std::vector<std::string> known_commands(const CLI::App* command) {
  std::vector<std::string> out;
  for (const CLI::App* sub : command->get_subcommands([](const CLI::App*) { return true; })) {
    out.push_back(sub->get_name());
  }
  return out;
}

/// " (did you mean X?)" for `word` among `names`, or "".
inline std::string did_you_mean(const std::string& word, const std::vector<std::string>& names) {
  const std::string best = closest_name(word, names);
  return best.empty() ? std::string() : " (did you mean " + best + "?)";
}

/// The message for a parse error: for unexpected arguments, each in the order typed, a mistyped flag
/// with the nearest known one; otherwise CLI11's own message.
inline std::string describe_parse_error(const CLI::App& app, const CLI::ParseError& e, int argc,
                                        const char* const* argv) {
  const std::string what = e.what();
  std::string marker = "The following arguments were not expected: ";
  auto at = what.find(marker);
  if (at == std::string::npos) {
    marker = "The following argument was not expected: ";
    at = what.find(marker);
  }
  if (at == std::string::npos) return what;
  // CLI11's list, in some order; put back in the order of argv (an argument with a space cannot be told
  // apart from two: then CLI11's message as it is).
  std::map<std::string, int> left;
  size_t count = 0;
  {
    std::string rest = what.substr(at + marker.size());
    size_t i = 0;
    while (i < rest.size()) {
      const size_t j = rest.find(' ', i);
      const std::string word = rest.substr(i, j == std::string::npos ? std::string::npos : j - i);
      if (!word.empty()) {
        ++left[word];
        ++count;
      }
      if (j == std::string::npos) break;
      i = j + 1;
    }
  }
  std::vector<std::string> typed;
  for (int k = 1; k < argc && argv[k] != nullptr; ++k) {
    auto it = left.find(argv[k]);
    if (it != left.end() && it->second > 0) {
      --it->second;
      typed.push_back(argv[k]);
    }
  }
  if (typed.size() != count) return what;
  const CLI::App* command = parsed_command(app);
  const std::vector<std::string> flags = known_flags(command);
  const std::vector<std::string> commands = known_commands(command);
  std::string out = "unexpected argument" + std::string(typed.size() > 1 ? "s" : "") + ":";
  for (size_t k = 0; k < typed.size(); ++k) {
    const std::string& arg = typed[k];
    out += (k == 0 ? " " : ", ") + arg;
    if (arg.size() > 1 && arg[0] == '-') {
      out += did_you_mean(arg.substr(0, arg.find('=')), flags);
    } else if (!commands.empty()) {
      out += did_you_mean(arg, commands);
    }
  }
  return out;
}

}  // namespace car::config

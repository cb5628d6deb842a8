// Did-you-mean suggestions (core/util/suggest.h) and the command lines' parse errors (config/cli_errors.h):
// unexpected arguments in the order typed, a mistyped flag or command with the nearest known one, and
// the `car` binary saying so with exit code 2.
#include "config/cli_errors.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/util/suggest.h"
#include "tests/test_support.h"

namespace car::config {
namespace {

TEST(Suggest, NearestNameWithinAThirdOfItsLength) {
  const std::vector<std::string> names = {"temperature", "top_k", "top_p", "seed"};
  EXPECT_EQ(closest_name("tempreature", names), "temperature");
  EXPECT_EQ(closest_name("top-k", names), "top_k");
  EXPECT_EQ(closest_name("sed", names), "seed");
  EXPECT_EQ(closest_name("colour", names), "");  // nothing plausible
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

std::string parse_error(CLI::App& app, std::vector<std::string> args) {
  std::vector<const char*> argv = {"prog"};
  for (const auto& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    return describe_parse_error(app, e, static_cast<int>(argv.size()), argv.data());
  }
  return "parsed";
}

TEST(CliErrors, UnexpectedArgumentsInTheOrderTypedWithTheNearestFlag) {
  CLI::App app("test");
  auto* infer = app.add_subcommand("infer", "");
  double temperature = 0;
  int top_k = 0;
  std::string model;
  infer->add_option("--temperature", temperature);
  infer->add_option("-k,--top-k", top_k);
  infer->add_option("model", model)->required();
  EXPECT_EQ(parse_error(app, {"infer", "m", "--temprature=1", "extra", "--zzz", "--top_k", "3"}),
            "unexpected arguments: --temprature=1 (did you mean --temperature?), extra, --zzz, --top_k (did you "
            "mean --top-k?), 3");
  CLI::App one("test");
  one.add_option("--socket", model);
  EXPECT_EQ(parse_error(one, {"--sockt", "/x"}), "unexpected arguments: --sockt (did you mean --socket?), /x");
  EXPECT_EQ(parse_error(one, {"stray"}), "unexpected argument: stray");
}

TEST(CliErrors, CarSuggestsTheCommandAndFlagAndExits2) {
  testing::TempDir tmp;
  const std::string car = testing::car_binary().string();
  auto r = testing::run_shell(car + " infr model hi", tmp);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown command 'infr' (did you mean infer?)"), std::string::npos) << r.err;
  r = testing::run_shell(car + " infer model hi --temprature 0.5", tmp);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--temprature (did you mean --temperature?), 0.5"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace car::config

// What the architecture CLI suites (qwen2, gemma3, gpt-oss, ...) share: a command's JSON output, and the check
// that `car run` gives the same tokens and logprobs with the experts resident and streamed.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_support.h"

namespace car::testing {

/// The JSON a successful car command printed (a discarded value, which fails the comparisons, when it did not
/// exit 0 or printed no JSON).
inline nlohmann::json parse_json_output(const CommandResult& o) {
  EXPECT_EQ(o.exit_code, 0) << o.out;
  return nlohmann::json::parse(o.out, nullptr, false);
}

/// `car run MODEL ARGS` with the experts resident and then streamed through a budget of one slot gives the same
/// `n` tokens and the same top logprobs (ARGS must ask for `-n n --json` and logprobs).
inline void expect_streamed_equals_resident(const std::string& model, const std::string& args, size_t n) {
  const auto resident = parse_json_output(run_car("run " + model + args + " --stream-experts off"));
  const auto streamed = parse_json_output(run_car("run " + model + args + " --stream-experts on --expert-ram-gb 0.0001"));
  EXPECT_EQ(resident.at("experts").at("mode"), "resident");
  EXPECT_EQ(streamed.at("experts").at("mode"), "streamed");
  ASSERT_EQ(resident.at("tokens").size(), n);
  EXPECT_EQ(resident.at("tokens"), streamed.at("tokens"));
  EXPECT_EQ(resident.at("top_logprobs"), streamed.at("top_logprobs"));
}

}  // namespace car::testing

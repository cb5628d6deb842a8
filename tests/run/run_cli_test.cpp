// `car run --json` and `car bench --json` on a tiny model written by `car gguf synth`: the CONTRACT.md fields,
// greedy consistency with top_logprobs, seeded reproducibility, exit codes for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <sys/wait.h>

#include "tests/test_support.h"

namespace {

struct Output {
  int status = -1;
  std::string out;
};

/// Run the car binary with `args` (a shell-quoted string), capturing stdout; stderr is discarded.
Output car(const std::string& args) {
  const std::string cmd = std::string(CAR_BINARY_DIR) + "/tools/car " + args + " 2>/dev/null";
  Output o;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) o.out.append(buf, n);
  const int st = pclose(p);
  o.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return o;
}

class RunCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new car::testing::TempDir();
    model_ = (dir_->path() / "tiny.gguf").string();
    const auto o = car("gguf synth --arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128 --vocab 300 "
                       "--ctx 256 --type f32 --seed 3 -o " + model_);
    ASSERT_EQ(o.status, 0) << "car gguf synth failed";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static car::testing::TempDir* dir_;
  static std::string model_;
};
car::testing::TempDir* RunCli::dir_ = nullptr;
std::string RunCli::model_;

TEST_F(RunCli, JsonHasTheContractFieldsAndGreedyMatchesTopLogprobs) {
  const auto o = car("run " + model_ + " --prompt-ids 1,5,7,9 --max-tokens 6 --temperature 0 --top-logprobs 3 "
                     "--threads 1 --json");
  ASSERT_EQ(o.status, 0);
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j.at("prompt_tokens"), (nlohmann::json{1, 5, 7, 9}));
  const auto& tokens = j.at("tokens");
  const std::string finish = j.at("finish_reason");
  EXPECT_TRUE(finish == "length" || finish == "eos") << finish;
  if (finish == "length") {
    EXPECT_EQ(tokens.size(), 6u);
  }
  EXPECT_TRUE(j.at("text").is_string());
  EXPECT_TRUE(j.at("experts").is_null()) << "a dense model has no expert source";
  for (const char* key : {"load_ms", "prompt_ms", "decode_ms", "prompt_tokens_per_s", "decode_tokens_per_s"}) {
    EXPECT_TRUE(j.at("timings").at(key).is_number()) << key;
    EXPECT_GE(j.at("timings").at(key).get<double>(), 0.0) << key;
  }
  const auto& top = j.at("top_logprobs");
  ASSERT_EQ(top.size(), tokens.size());
  for (size_t i = 0; i < top.size(); ++i) {
    ASSERT_EQ(top[i].size(), 3u);
    EXPECT_EQ(top[i][0].at("token"), tokens[i]) << "greedy picks the most likely id at position " << i;
    for (size_t k = 0; k < 3; ++k) {
      EXPECT_LE(top[i][k].at("logprob").get<double>(), 0.0);
      if (k > 0) {
        EXPECT_LE(top[i][k].at("logprob").get<double>(), top[i][k - 1].at("logprob").get<double>());
      }
    }
  }
}

TEST_F(RunCli, SeededSamplingIsReproducible) {
  const std::string args = "run " + model_ + " --prompt-ids 1,2,3 --max-tokens 8 --temperature 1.0 --top-k 0 "
                           "--top-p 1 --min-p 0 --seed 11 --threads 1 --json";
  const auto a = car(args);
  const auto b = car(args);
  ASSERT_EQ(a.status, 0);
  ASSERT_EQ(b.status, 0);
  EXPECT_EQ(nlohmann::json::parse(a.out).at("tokens"), nlohmann::json::parse(b.out).at("tokens"));
}

TEST_F(RunCli, TextPromptAndHumanMode) {
  const auto o = car("run " + model_ + " --prompt 'hello world' --max-tokens 3 --temperature 0 --threads 1");
  EXPECT_EQ(o.status, 0);
}

TEST_F(RunCli, BadInputExitCodes) {
  EXPECT_EQ(car("run " + model_ + " --prompt-ids 1,x --threads 1").status, 2);
  EXPECT_NE(car("run " + model_ + " --prompt hi --top-p 7").status, 0);  // CLI11 range check: its own code
  EXPECT_EQ(car("run " + model_).status, 2);  // neither --prompt nor --prompt-ids
  EXPECT_EQ(car("run " + (dir_->path() / "missing.gguf").string() + " --prompt hi").status, 1);
  EXPECT_EQ(car("run " + model_ + " --prompt-ids 1,299999 --threads 1").status, 1);  // id outside the vocabulary
}

TEST_F(RunCli, EnvironmentSettingsAreValidated) {
  const std::string cmd = std::string(CAR_BINARY_DIR) + "/tools/car run " + model_ + " --prompt hi >/dev/null 2>&1";
  EXPECT_NE(std::system(("CAR_INFERENCE_THREADS=lots " + cmd).c_str()), 0);
  EXPECT_NE(std::system(("CAR_INFERENCE_ISA=mmx " + cmd).c_str()), 0);
  EXPECT_EQ(std::system(("CAR_INFERENCE_ISA=scalar CAR_INFERENCE_THREADS=1 " + cmd).c_str()), 0);
}

TEST_F(RunCli, SettingsFollowTheDaemonsRules) {
  // The daemon's rows decide: CAR_INFERENCE_THREADS is 1-1024 and EXPERT_RAM_GB positive, for the
  // environment and for the flags that set the same thing; the message is the daemon's.
  const std::string run = std::string(CAR_BINARY_DIR) + "/tools/car run " + model_ + " --prompt hi --max-tokens 1";
  auto output_of = [](const std::string& cmd, int* status) {
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    if (p == nullptr) return out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    const int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
  };
  int status = 0;
  std::string out = output_of("CAR_INFERENCE_THREADS=0 " + run, &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("CAR_INFERENCE_THREADS=0: out of range (1 to 1024) (from environment)"), std::string::npos)
      << out;
  out = output_of("CAR_INFERENCE_EXPERT_RAM_GB=0 " + run, &status);
  EXPECT_EQ(status, 2) << out;
  EXPECT_NE(out.find("CAR_INFERENCE_EXPERT_RAM_GB=0: not a positive number of GB"), std::string::npos) << out;
  out = output_of(run + " --threads 0", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("out of range (1 to 1024)"), std::string::npos) << out;
  out = output_of(run + " --expert-ram-gb 0", &status);
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("not a positive number of GB"), std::string::npos) << out;
  out = output_of(run + " --threads 1025", &status);
  EXPECT_NE(status, 0) << out;
  // Accepted spellings are the daemon's too (any case for the mode), and the flag beats the environment.
  out = output_of("CAR_INFERENCE_THREADS=0 " + run + " --threads 1 --stream-experts OFF", &status);
  EXPECT_EQ(status, 0) << out;
}

TEST_F(RunCli, BenchJson) {
  const auto o = car("bench " + model_ + " -p 8 -n 4 -r 2 --threads 1 --json");
  ASSERT_EQ(o.status, 0);
  const auto j = nlohmann::json::parse(o.out);
  ASSERT_EQ(j.at("pp").at("samples").size(), 2u);
  ASSERT_EQ(j.at("tg").at("samples").size(), 2u);
  EXPECT_GT(j.at("pp").at("tokens_per_s").at("mean").get<double>(), 0.0);
  EXPECT_GT(j.at("tg").at("tokens_per_s").at("mean").get<double>(), 0.0);
  const auto per_token = j.at("weight_bytes_per_token").get<double>();
  EXPECT_GT(per_token, 0.0);
  EXPECT_LT(per_token, j.at("tensor_bytes").get<double>());  // token_embd counts one row
  EXPECT_GT(j.at("decode_bound_tokens_per_s").get<double>(), 0.0);
  EXPECT_GT(j.at("peak_rss_bytes").get<double>(), 0.0);
}

}  // namespace

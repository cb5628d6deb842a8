// `car run --json` and `car bench --json` on a tiny model written by `car gguf synth`: the CONTRACT.md
// fields, greedy consistency with top_logprobs, seeded reproducibility, exit codes for bad input.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_support.h"

namespace {

using car::testing::CommandResult;
using car::testing::run_car;

class RunCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new car::testing::TempDir();
    model_ = (dir_->path() / "tiny.gguf").string();
    const auto o =
        run_car("gguf synth --arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128 --vocab 300 "
            "--ctx 256 --type f32 --seed 3 -o " +
            model_);
    ASSERT_EQ(o.exit_code, 0) << "car gguf synth failed";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  /// A tiny MoE model (8 experts, 2 used, Q8_0) written by car gguf synth under `name`; "" if that failed.
  static std::string write_tiny_moe(const std::string& name) {
    const std::string path = (dir_->path() / name).string();
    const auto o = run_car(
        "gguf synth --arch llama --layers 2 --embd 64 --heads 4 --kv-heads 2 --ff 128 --vocab 300 "
        "--ctx 256 --experts 8 --experts-used 2 --type q8_0 --seed 4 -o " +
        path);
    return o.exit_code == 0 ? path : std::string();
  }
  static car::testing::TempDir* dir_;
  static std::string model_;
};
car::testing::TempDir* RunCli::dir_ = nullptr;
std::string RunCli::model_;

TEST_F(RunCli, JsonHasTheContractFieldsAndGreedyMatchesTopLogprobs) {
  const auto o = run_car("run " + model_ +
                     " --prompt-ids 1,5,7,9 --max-tokens 6 --temperature 0 --top-logprobs 3 "
                     "--threads 1 --json");
  ASSERT_EQ(o.exit_code, 0);
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
  for (const char* key :
       {"load_ms", "prompt_ms", "decode_ms", "prompt_tokens_per_s", "decode_tokens_per_s"}) {
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
  const std::string args = "run " + model_ +
                           " --prompt-ids 1,2,3 --max-tokens 8 --temperature 1.0 --top-k 0 "
                           "--top-p 1 --min-p 0 --seed 11 --threads 1 --json";
  const auto a = run_car(args);
  const auto b = run_car(args);
  ASSERT_EQ(a.exit_code, 0);
  ASSERT_EQ(b.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(a.out).at("tokens"), nlohmann::json::parse(b.out).at("tokens"));
}

TEST_F(RunCli, TextPromptAndHumanMode) {
  const auto o = run_car("run " + model_ + " --prompt 'hello world' --max-tokens 3 --temperature 0 --threads 1");
  EXPECT_EQ(o.exit_code, 0);
}

TEST_F(RunCli, BadInputExitCodes) {
  EXPECT_EQ(run_car("run " + model_ + " --prompt-ids 1,x --threads 1").exit_code, 2);
  EXPECT_NE(run_car("run " + model_ + " --prompt hi --top-p 7").exit_code, 0);  // CLI11 range check: its own code
  EXPECT_EQ(run_car("run " + model_).exit_code, 2);                             // neither --prompt nor --prompt-ids
  // A path that names no file (nor a model id) is bad input, as for car show and bench.
  EXPECT_EQ(run_car("run " + (dir_->path() / "missing.gguf").string() + " --prompt hi").exit_code, 2);
  std::ofstream(dir_->path() / "garbage.gguf") << "not a GGUF file";
  EXPECT_EQ(run_car("run " + (dir_->path() / "garbage.gguf").string() + " --prompt hi").exit_code, 1);  // not GGUF
  EXPECT_EQ(run_car("run " + model_ + " --prompt-ids 1,299999 --threads 1").exit_code,
            1);  // id outside the vocabulary
}

TEST_F(RunCli, EnvironmentSettingsAreValidated) {
  const std::string cmd =
      std::string(CAR_BINARY_DIR) + "/tools/car run " + model_ + " --prompt hi >/dev/null 2>&1";
  EXPECT_NE(std::system(("CAR_INFERENCE_THREADS=lots " + cmd).c_str()), 0);
  EXPECT_NE(std::system(("CAR_INFERENCE_ISA=mmx " + cmd).c_str()), 0);
  EXPECT_EQ(std::system(("CAR_INFERENCE_ISA=scalar CAR_INFERENCE_THREADS=1 " + cmd).c_str()), 0);
}

TEST_F(RunCli, PromptIsPositionalWithFlagAliasAndStdin) {
  const std::string common = " --max-tokens 4 --temperature 0 --threads 1 --json";
  const auto positional = run_car("run " + model_ + " 'hello world'" + common);
  const auto flag = run_car("run " + model_ + " --prompt 'hello world'" + common);
  ASSERT_EQ(positional.exit_code, 0);
  ASSERT_EQ(flag.exit_code, 0);
  const auto a = nlohmann::json::parse(positional.out), b = nlohmann::json::parse(flag.out);
  EXPECT_EQ(a.at("prompt_tokens"), b.at("prompt_tokens"));
  EXPECT_EQ(a.at("tokens"), b.at("tokens"));
  // popen runs /bin/sh, which has no process substitution: pipe through printf instead.
  const CommandResult p = car::testing::run_shell_stdout("printf 'hello world' | " +
                                                         car::testing::car_binary().string() + " run " +
                                                         model_ + " -" + common + " 2>/dev/null");
  ASSERT_EQ(p.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(p.out).at("prompt_tokens"), a.at("prompt_tokens"));
  EXPECT_EQ(run_car("run " + model_ + " 'hello' --prompt 'hello' --threads 1").exit_code, 2);  // the prompt twice
  EXPECT_EQ(run_car("run " + model_ + " - --threads 1 < /dev/null").exit_code, 2);             // empty stdin
}

TEST_F(RunCli, UsageErrorsExitTwoAndPlainCarListsTheCommands) {
  const auto plain = run_car("");
  EXPECT_EQ(plain.exit_code, 0);
  for (const char* command : {"run", "infer", "show", "bench", "tokenize", "gguf", "health"}) {
    EXPECT_NE(plain.out.find(command), std::string::npos) << command;
  }
  EXPECT_EQ(run_car("frobnicate").exit_code, 2);
  EXPECT_EQ(run_car("run").exit_code, 2);                                   // FILE missing
  EXPECT_EQ(run_car("run " + model_ + " hi --top-p 7").exit_code, 2);       // out of range
  EXPECT_EQ(run_car("run " + model_ + " hi --no-such-flag").exit_code, 2);  // unknown flag
  EXPECT_EQ(run_car("--help").exit_code, 0);
  EXPECT_NE(run_car("run --help").out.find("128"), std::string::npos) << "defaults are shown (--max-tokens 128)";
}

TEST_F(RunCli, ShowDescribesTheModelByFileOrId) {
  const auto inspect = run_car("gguf inspect " + model_ + " --json");
  ASSERT_EQ(inspect.exit_code, 0);
  const auto file = nlohmann::json::parse(inspect.out);
  const auto by_file = run_car("show " + model_ + " --json");
  ASSERT_EQ(by_file.exit_code, 0);
  const auto j = nlohmann::json::parse(by_file.out);
  EXPECT_EQ(j.at("architecture"), "llama");
  EXPECT_EQ(j.at("parameters"), file.at("totals").at("elements"));
  EXPECT_EQ(j.at("quantization"), "F32");
  EXPECT_EQ(j.at("context_length"), 256);
  EXPECT_EQ(j.at("vocab_size"), 300);
  EXPECT_EQ(j.at("block_count"), 2);
  EXPECT_EQ(j.at("chat_template"), false);
  EXPECT_TRUE(j.at("expert_count").is_null());
  EXPECT_EQ(j.at("file_bytes"), file.at("file_size"));
  const auto& mem = j.at("memory");
  EXPECT_EQ(mem.at("total_bytes").get<uint64_t>(),
            mem.at("weights").get<uint64_t>() + mem.at("kv_cache").get<uint64_t>() +
                mem.at("scratch").get<uint64_t>() + mem.at("logits").get<uint64_t>());
  EXPECT_GT(mem.at("kv_cache").get<uint64_t>(), 0u);
  // By id in a models directory, with or without the .gguf suffix; a missing id is a usage error.
  const std::string dir = " --models-dir " + dir_->path().string();
  const auto by_id = run_car("show tiny --json" + dir);
  ASSERT_EQ(by_id.exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(by_id.out).at("parameters"), j.at("parameters"));
  EXPECT_EQ(run_car("show tiny.gguf --json" + dir).exit_code, 0);
  EXPECT_EQ(run_car("show no-such-model" + dir).exit_code, 2);
  const auto human = run_car("show " + model_);
  ASSERT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("quantization    F32"), std::string::npos) << human.out;
}

TEST_F(RunCli, InspectDecodesFileTypeAndTokenTypes) {
  const std::string q8 = (dir_->path() / "tiny-q8.gguf").string();
  ASSERT_EQ(run_car("gguf synth --arch llama --layers 1 --embd 64 --heads 4 --kv-heads 2 --ff 128 --vocab 300 "
                "--ctx 64 --type q8_0 --seed 4 -o " +
                q8)
                .exit_code,
            0);
  const auto o = run_car("gguf inspect " + q8 + " --json");
  ASSERT_EQ(o.exit_code, 0);
  const auto j = nlohmann::json::parse(o.out);
  EXPECT_EQ(j.at("metadata").at("general.file_type"), 7);
  EXPECT_EQ(j.at("decoded").at("file_type"), "Q8_0");
  uint64_t counted = 0;
  for (const auto& [name, n] : j.at("decoded").at("token_types").items()) counted += n.get<uint64_t>();
  EXPECT_EQ(counted, 300u);
  EXPECT_EQ(j.at("decoded").at("token_types").at("byte"), 256);
  const auto human = run_car("gguf inspect " + q8);
  EXPECT_NE(human.out.find("7 (Q8_0)"), std::string::npos);
  EXPECT_EQ(run_car("show " + q8 + " --json").exit_code, 0);
  EXPECT_EQ(nlohmann::json::parse(run_car("show " + q8 + " --json").out).at("quantization"), "Q8_0");
}

TEST_F(RunCli, BenchPrintsRowsAndMeasuresBandwidthUnlessGiven) {
  const auto human = run_car("bench " + model_ + " -p 8 -n 4 -r 1 --threads 1");
  ASSERT_EQ(human.exit_code, 0);
  EXPECT_NE(human.out.find("| pp8 |"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("| tg4 |"), std::string::npos) << human.out;
  EXPECT_EQ(human.out.find("MiB"), std::string::npos) << "one unit system (decimal): " << human.out;
  const auto measured =
      nlohmann::json::parse(run_car("bench " + model_ + " -p 0 -n 2 -r 1 --threads 1 --json").out);
  EXPECT_EQ(measured.at("bandwidth_source"), "measured");
  EXPECT_GT(measured.at("bandwidth_gbs").get<double>(), 0.0);
  const auto given = nlohmann::json::parse(
      run_car("bench " + model_ + " -p 0 -n 2 -r 1 --threads 1 --json --bandwidth-gbs 12.5").out);
  EXPECT_EQ(given.at("bandwidth_source"), "given");
  EXPECT_DOUBLE_EQ(given.at("bandwidth_gbs").get<double>(), 12.5);
}

TEST_F(RunCli, SettingsFollowTheDaemonsRules) {
  // The daemon's rows decide: CAR_INFERENCE_THREADS is 1-1024 and EXPERT_RAM_GB positive, for the
  // environment and for the flags that set the same thing; the message is the daemon's.
  const std::string run = std::string(CAR_BINARY_DIR) + "/tools/car run " + model_ + " --prompt hi --max-tokens 1";
  auto output_of = [](const std::string& cmd, int* status) {
    const CommandResult r = car::testing::run_shell_stdout(cmd + " 2>&1");
    *status = r.exit_code;
    return r.out;
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
  const auto o = run_car("bench " + model_ + " -p 8 -n 4 -r 2 --threads 1 --json");
  ASSERT_EQ(o.exit_code, 0);
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

// The batched steps' weight bytes: one sequence's step reads what one decoded token does (its chosen
// experts' share of the banks); eight sequences' steps read more of the banks, never more than all of them,
// over the steps the scheduler really ran (CI's loaded machine starts them in several steps).
TEST_F(RunCli, BenchParallelCountsTheExpertsEachStepRead) {
  const std::string moe = write_tiny_moe("moe.gguf");
  ASSERT_FALSE(moe.empty());
  const auto o =
      run_car("bench " + moe + " -p 0 -n 6 -r 2 --threads 1 --parallel 1,8 --bandwidth-gbs 10 --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  const auto& par = j.at("parallel");
  ASSERT_EQ(par.size(), 2u);
  const double per_token = j.at("weight_bytes_per_token").get<double>();
  const double x1 = par.at(0).at("weight_bytes_per_step").get<double>();
  const double x8 = par.at(1).at("weight_bytes_per_step").get<double>();
  EXPECT_NEAR(x1, per_token, 2.0);  // the same bytes, up to rounding
  EXPECT_NEAR(par.at(0).at("expert_banks_read_per_step").get<double>(), 2.0 / 8.0, 1e-9);
  const double share8 = par.at(1).at("expert_banks_read_per_step").get<double>();
  EXPECT_GT(share8, 2.0 / 8.0);
  EXPECT_LE(share8, 1.0);
  EXPECT_GT(x8, x1);
  // One sequence: one token a step. Eight: at most eight (fewer when they did not all start together).
  EXPECT_DOUBLE_EQ(par.at(0).at("tokens_per_step").get<double>(), 1.0);
  const double tokens8 = par.at(1).at("tokens_per_step").get<double>();
  EXPECT_GT(tokens8, 1.0);
  EXPECT_LE(tokens8, 8.0);
  // bound = tokens per step x bandwidth / bytes per step
  EXPECT_NEAR(par.at(1).at("bound_tokens_per_s").get<double>(), tokens8 * 10e9 / x8,
              1e-6 * tokens8 * 10e9 / x8);
}

// --phases: each test's steps, per phase, in the JSON (seconds a step) and as tables in the human output.
TEST_F(RunCli, BenchPhases) {
  const std::string moe = write_tiny_moe("moe-phases.gguf");
  ASSERT_FALSE(moe.empty());
  const std::string args = " -p 8 -n 4 -r 2 --threads 1 --parallel 4 --bandwidth-gbs 10 --phases";
  const auto o = run_car("bench " + moe + args + " --json");
  ASSERT_EQ(o.exit_code, 0) << o.err;
  const auto j = nlohmann::json::parse(o.out);
  const auto& pp = j.at("pp").at("phases");
  EXPECT_EQ(pp.at("steps").get<int>(), 2);  // one step per 8-token prompt
  EXPECT_EQ(j.at("tg").at("phases").at("steps").get<int>(), 2 * 4);
  const auto& x4 = j.at("parallel").at(0).at("phases");
  EXPECT_GE(x4.at("steps").get<int>(), 4);  // 4 tokens each: at least 4 steps a run
  for (const auto* phase : {"attn_proj", "attention", "route", "ffn_gate_up", "ffn_down", "output"}) {
    EXPECT_GT(pp.at(phase).get<double>(), 0.0) << phase;
    EXPECT_GT(x4.at(phase).get<double>(), 0.0) << phase;
  }
  EXPECT_GE(x4.at("outside").get<double>(), 0.0);
  const auto human = run_car("bench " + moe + args);
  ASSERT_EQ(human.exit_code, 0) << human.err;
  EXPECT_NE(human.out.find("phases of tg4 x4:"), std::string::npos) << human.out;
  EXPECT_NE(human.out.find("| ffn_gate_up |"), std::string::npos) << human.out;
  // Without the flag, no phases.
  const auto plain =
      nlohmann::json::parse(run_car("bench " + moe + " -p 8 -n 4 -r 1 --threads 1 --json").out);
  EXPECT_FALSE(plain.at("pp").contains("phases"));
}

}  // namespace

// The car binary on gpt-oss files written by `car gguf synth` (issue #27): `car gguf inspect` and `car show`
// name the architecture, its sliding window, YaRN keys and MXFP4 expert banks; `car run` loads and generates
// with the experts resident and streamed, the same tokens and logprobs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/run/cli_support.h"
#include "tests/test_support.h"

namespace {

using car::testing::parse_json_output;
using car::testing::run_car;

using car::testing::expect_streamed_equals_resident;

class GptOssCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new car::testing::TempDir();
    path_ = (dir_->path() / "gpt-oss.gguf").string();
    ASSERT_EQ(run_car("gguf synth --arch gpt-oss --layers 2 --embd 64 --ff 64 --ff-expert 64 --heads 4 --kv-heads 2 "
                  "--head-dim 16 --experts 8 --experts-used 2 --vocab 300 --ctx 256 --sliding-window 4 "
                  "--type mxfp4_moe --seed 5 -o " + path_)
                  .exit_code,
              0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static car::testing::TempDir* dir_;
  static std::string path_;
};
car::testing::TempDir* GptOssCli::dir_ = nullptr;
std::string GptOssCli::path_;

TEST_F(GptOssCli, InspectAndShowNameTheArchitecture) {
  const auto ins = parse_json_output(run_car("gguf inspect " + path_ + " --json"));
  const auto& md = ins.at("metadata");
  EXPECT_EQ(md.at("general.architecture"), "gpt-oss");
  EXPECT_EQ(md.at("gpt-oss.attention.sliding_window"), 4);
  EXPECT_EQ(md.at("gpt-oss.rope.scaling.type"), "yarn");
  EXPECT_EQ(md.at("gpt-oss.rope.scaling.original_context_length"), 4096);
  EXPECT_EQ(ins.at("decoded").at("file_type"), "MXFP4_MOE");
  // The expert banks are MXFP4; the attention Q8_0.
  bool mxfp4_bank = false;
  for (const auto& b : ins.at("expert_banks")) mxfp4_bank = mxfp4_bank || b.at("type") == "MXFP4";
  EXPECT_TRUE(mxfp4_bank);
  const auto show = parse_json_output(run_car("show " + path_ + " --json"));
  EXPECT_EQ(show.at("architecture"), "gpt-oss");
  EXPECT_EQ(show.at("expert_count"), 8);
  const auto human = run_car("show " + path_);
  EXPECT_NE(human.out.find("architecture    gpt-oss"), std::string::npos) << human.out;
}

TEST_F(GptOssCli, RunGeneratesTheSameResidentAndStreamed) {
  const std::string args = " --prompt-ids 1,5,7,9,11,13,15 -n 8 --temperature 0 --top-logprobs 2 --threads 1 --json";
  expect_streamed_equals_resident(path_, args, 8);
}

}  // namespace

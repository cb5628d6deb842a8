// The car binary on deepseek2 files written by `car gguf synth` (issue #27): `car gguf inspect` and `car
// show` name the architecture and its MLA / router keys and IQ expert banks; `car run` loads and generates
// with the experts resident and streamed, the same tokens and logprobs; `--chat` renders the shared
// DeepSeek-V3 template (the chat conformance set's deepseek_v3.jinja) into the prompt.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run/cli_support.h"
#include "tests/test_support.h"

namespace {

using car::testing::expect_streamed_equals_resident;
using car::testing::parse_json_output;
using car::testing::run_car;

const std::string kShape =
    "gguf synth --arch deepseek2 --layers 3 --embd 256 --ff 256 --ff-expert 256 --heads 4 --head-dim 64 "
    "--rope-dim 32 --kv-lora-rank 256 --q-lora-rank 256 --v-head-dim 64 --experts 8 --experts-used 2 "
    "--expert-groups 4 --expert-groups-used 2 --vocab 300 --ctx 256 ";

TEST(Deepseek2Cli, InspectShowAndRunResidentAndStreamed) {
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "deepseek2.gguf").string();
  ASSERT_EQ(run_car(kShape + "--type iq4_xs --seed 5 -o " + path).exit_code, 0);
  const auto ins = parse_json_output(run_car("gguf inspect " + path + " --json"));
  const auto& md = ins.at("metadata");
  EXPECT_EQ(md.at("general.architecture"), "deepseek2");
  EXPECT_EQ(md.at("deepseek2.attention.kv_lora_rank"), 256);
  EXPECT_EQ(md.at("deepseek2.attention.key_length"), 288);
  EXPECT_EQ(md.at("deepseek2.attention.key_length_mla"), 64);
  EXPECT_EQ(md.at("deepseek2.leading_dense_block_count"), 1);
  EXPECT_EQ(md.at("deepseek2.expert_gating_func"), 2);
  EXPECT_EQ(md.at("deepseek2.expert_group_count"), 4);
  bool iq4_bank = false;
  for (const auto& b : ins.at("expert_banks")) iq4_bank = iq4_bank || b.at("type") == "IQ4_XS";
  EXPECT_TRUE(iq4_bank);
  const auto show = parse_json_output(run_car("show " + path + " --json"));
  EXPECT_EQ(show.at("architecture"), "deepseek2");
  EXPECT_EQ(show.at("expert_count"), 8);
  const auto human = run_car("show " + path);
  EXPECT_NE(human.out.find("architecture    deepseek2"), std::string::npos) << human.out;

  const std::string args =
      " --prompt-ids 1,5,7,9,11,13,15 -n 8 --temperature 0 --top-logprobs 2 --threads 1 --json";
  expect_streamed_equals_resident(path, args, 8);
}

// DeepSeek-V3's template in a synthetic deepseek2 file: `car run --chat` renders {{ bos_token }}<｜User｜>...
// <｜Assistant｜> and the prompt is that text tokenized (the synthetic vocabulary has no DeepSeek specials:
// plain text either way; its "<s>" BOS is parsed as the BOS).
TEST(Deepseek2Cli, ChatWithTheDeepseekTemplate) {
  CAR_CONFORMANCE_DIR_OR_SKIP(conf);
  const auto tmpl = conf / "chat" / "templates" / "deepseek_v3.jinja";
  ASSERT_TRUE(car::testing::read_fixture(tmpl)) << tmpl;
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "deepseek2-chat.gguf").string();
  ASSERT_EQ(
      run_car(kShape + "--type q8_0 --seed 8 --chat-template '" + tmpl.string() + "' -o " + path).exit_code,
      0);
  EXPECT_EQ(parse_json_output(run_car("show " + path + " --json")).at("chat_template"), true);
  const auto chat =
      parse_json_output(run_car("run " + path + " --chat 'Hello there' -n 2 --temperature 0 --threads 1 --json"));
  const std::string rendered = (dir.path() / "rendered.txt").string();
  std::ofstream(rendered, std::ios::binary) << "<\xEF\xBD\x9CUser\xEF\xBD\x9C>Hello there<\xEF\xBD\x9C"
                                               "Assistant\xEF\xBD\x9C>";
  const auto plain =
      parse_json_output(run_car("run " + path + " - -n 2 --temperature 0 --threads 1 --json < " + rendered));
  EXPECT_EQ(chat.at("prompt_tokens"), plain.at("prompt_tokens"));
  EXPECT_EQ(chat.at("prompt_tokens").at(0), 1);  // one BOS, not two
  EXPECT_NE(chat.at("prompt_tokens").at(1), 1);
  EXPECT_EQ(chat.at("tokens"), plain.at("tokens"));
}

}  // namespace

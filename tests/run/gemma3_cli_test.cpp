// The car binary on gemma3 files written by `car gguf synth` (issue #27): `car gguf inspect` and `car show`
// name the architecture and its Gemma keys, `car run` loads and generates past the sliding window, and
// `--chat` renders Gemma 3's own template (the shared chat conformance set) into the prompt.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run/cli_support.h"
#include "tests/test_support.h"

namespace {

using car::testing::parse_json_output;
using car::testing::run_car;

const std::string kShape =
    "gguf synth --arch gemma3 --layers 7 --embd 64 --ff 128 --heads 4 --kv-heads 2 --head-dim 16 --vocab 300 "
    "--ctx 256 --sliding-window 4 ";

TEST(Gemma3Cli, InspectShowAndRun) {
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "gemma3.gguf").string();
  ASSERT_EQ(run_car(kShape + "--type q8_0 --seed 5 --final-softcap 30 -o " + path).exit_code, 0);
  const auto ins = parse_json_output(run_car("gguf inspect " + path + " --json"));
  EXPECT_EQ(ins.at("metadata").at("general.architecture"), "gemma3");
  EXPECT_EQ(ins.at("metadata").at("gemma3.attention.sliding_window"), 4);
  EXPECT_EQ(ins.at("metadata").at("gemma3.final_logit_softcapping"), 30.0);
  EXPECT_EQ(ins.at("metadata").at("tokenizer.ggml.add_space_prefix"), false);
  const auto show = parse_json_output(run_car("show " + path + " --json"));
  EXPECT_EQ(show.at("architecture"), "gemma3");
  EXPECT_EQ(show.at("block_count"), 7);
  const auto human = run_car("show " + path);
  EXPECT_NE(human.out.find("architecture    gemma3"), std::string::npos) << human.out;
  // 12 prompt tokens + 10 generated: well past the window of 4.
  const auto run = parse_json_output(run_car("run " + path +
                             " --prompt-ids 1,5,7,9,11,13,15,17,19,21,23,25 -n 10 --temperature 0 --top-logprobs 2 "
                             "--threads 1 --json"));
  EXPECT_EQ(run.at("tokens").size(), 10u);
  EXPECT_EQ(run.at("finish_reason"), "length");
  // Two threads, same tokens and logprobs.
  const auto run2 = parse_json_output(run_car("run " + path +
                              " --prompt-ids 1,5,7,9,11,13,15,17,19,21,23,25 -n 10 --temperature 0 --top-logprobs 2 "
                              "--threads 2 --json"));
  EXPECT_EQ(run.at("tokens"), run2.at("tokens"));
  EXPECT_EQ(run.at("top_logprobs"), run2.at("top_logprobs"));
}

// gemma2 (tied, both soft-caps): named by inspect and show, served by car run.
TEST(Gemma3Cli, Gemma2InspectShowAndRun) {
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "gemma2.gguf").string();
  ASSERT_EQ(run_car("gguf synth --arch gemma2 --tied --layers 4 --embd 64 --ff 128 --heads 4 --kv-heads 2 --head-dim 16 "
                "--vocab 300 --ctx 256 --sliding-window 4 --attn-softcap 50 --final-softcap 30 --type q8_0 --seed 6 -o " +
                path)
                .exit_code,
            0);
  // No --tied: refused, as llama.cpp refuses a gemma2 file with output.weight.
  EXPECT_NE(run_car("gguf synth --arch gemma2 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --vocab 300 -o " +
                (dir.path() / "untied.gguf").string())
                .exit_code,
            0);
  const auto ins = parse_json_output(run_car("gguf inspect " + path + " --json"));
  EXPECT_EQ(ins.at("metadata").at("general.architecture"), "gemma2");
  EXPECT_EQ(ins.at("metadata").at("gemma2.attn_logit_softcapping"), 50.0);
  EXPECT_EQ(parse_json_output(run_car("show " + path + " --json")).at("architecture"), "gemma2");
  const auto run = parse_json_output(run_car("run " + path + " --prompt-ids 1,5,7,9,11,13,15,17 -n 6 --temperature 0 --threads 2 --json"));
  EXPECT_EQ(run.at("tokens").size(), 6u);
}

// Gemma 3's template in a synthetic gemma3 file: `car run --chat` renders it ({{ bos_token }}, then
// <start_of_turn>user ... <start_of_turn>model) and the prompt is that text tokenized (the synthetic
// vocabulary has no <start_of_turn> token: plain text either way; its "<s>" BOS is parsed as the BOS).
TEST(Gemma3Cli, ChatWithGemma3sOwnTemplate) {
  CAR_CONFORMANCE_DIR_OR_SKIP(conf);
  const auto tmpl = conf / "chat" / "templates" / "gemma3.jinja";
  ASSERT_TRUE(car::testing::read_fixture(tmpl)) << tmpl;
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "gemma3-chat.gguf").string();
  ASSERT_EQ(run_car(kShape + "--type q8_0 --seed 8 --chat-template '" + tmpl.string() + "' -o " + path).exit_code, 0);
  EXPECT_EQ(parse_json_output(run_car("show " + path + " --json")).at("chat_template"), true);
  const auto chat = parse_json_output(run_car("run " + path + " --chat 'Hello there' -n 2 --temperature 0 --threads 1 --json"));
  const std::string rendered = (dir.path() / "rendered.txt").string();
  std::ofstream(rendered, std::ios::binary) << "<start_of_turn>user\nHello there<end_of_turn>\n<start_of_turn>model\n";
  const auto plain = parse_json_output(run_car("run " + path + " - -n 2 --temperature 0 --threads 1 --json < " + rendered));
  EXPECT_EQ(chat.at("prompt_tokens"), plain.at("prompt_tokens"));
  EXPECT_EQ(chat.at("prompt_tokens").at(0), 1);  // one BOS, not two
  EXPECT_NE(chat.at("prompt_tokens").at(1), 1);
  EXPECT_EQ(chat.at("tokens"), plain.at("tokens"));
}

}  // namespace

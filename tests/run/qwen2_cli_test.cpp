// The car binary on qwen2 / qwen2moe files written by `car gguf synth` (issue #27): `car gguf inspect` and
// `car show` name the architecture and its shape, `car run` loads and generates (experts resident and
// streamed, the same tokens and logprobs), and `--chat` renders the file's ChatML template (Qwen2's form)
// into the prompt.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/run/cli_support.h"
#include "tests/test_support.h"

namespace {

using car::testing::parse_json_output;
using car::testing::run_car;

using car::testing::expect_streamed_equals_resident;

constexpr const char* kChatMl =
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- endif %}";

class Qwen2Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new car::testing::TempDir();
    const std::string tmpl = (dir_->path() / "chatml.jinja").string();
    std::ofstream(tmpl) << kChatMl;
    moe_ = (dir_->path() / "qwen2moe.gguf").string();
    dense_ = (dir_->path() / "qwen2.gguf").string();
    ASSERT_EQ(run_car("gguf synth --arch qwen2moe --layers 2 --embd 64 --ff 128 --ff-expert 64 --ff-shared 96 "
                  "--heads 4 --kv-heads 2 --experts 8 --experts-used 2 --vocab 300 --ctx 256 --type q8_0 "
                  "--seed 5 --chat-template " + tmpl + " -o " + moe_)
                  .exit_code,
              0);
    ASSERT_EQ(run_car("gguf synth --arch qwen2 --layers 2 --embd 64 --ff 128 --heads 4 --kv-heads 2 --vocab 300 "
                  "--ctx 256 --type f32 --seed 6 -o " + dense_)
                  .exit_code,
              0);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static car::testing::TempDir* dir_;
  static std::string moe_, dense_;
};
car::testing::TempDir* Qwen2Cli::dir_ = nullptr;
std::string Qwen2Cli::moe_;
std::string Qwen2Cli::dense_;

TEST_F(Qwen2Cli, InspectAndShowNameTheArchitecture) {
  const auto ins = parse_json_output(run_car("gguf inspect " + moe_ + " --json"));
  EXPECT_EQ(ins.at("metadata").at("general.architecture"), "qwen2moe");
  EXPECT_EQ(ins.at("metadata").at("qwen2moe.expert_shared_feed_forward_length"), 96);
  EXPECT_EQ(ins.at("metadata").at("qwen2moe.expert_feed_forward_length"), 64);
  const auto show = parse_json_output(run_car("show " + moe_ + " --json"));
  EXPECT_EQ(show.at("architecture"), "qwen2moe");
  EXPECT_EQ(show.at("expert_count"), 8);
  EXPECT_EQ(show.at("chat_template"), true);
  EXPECT_GT(show.at("memory").at("total_bytes").get<uint64_t>(), 0u);
  EXPECT_EQ(parse_json_output(run_car("show " + dense_ + " --json")).at("architecture"), "qwen2");
  const auto human = run_car("show " + dense_);
  EXPECT_NE(human.out.find("architecture    qwen2"), std::string::npos) << human.out;
}

TEST_F(Qwen2Cli, RunGeneratesTheSameResidentAndStreamed) {
  const std::string args = " --prompt-ids 1,5,7,9,11 -n 8 --temperature 0 --top-logprobs 2 --threads 1 --json";
  expect_streamed_equals_resident(moe_, args, 8);
  const auto dense = parse_json_output(run_car("run " + dense_ + args));
  EXPECT_EQ(dense.at("tokens").size(), 8u);
}

TEST_F(Qwen2Cli, ChatRendersTheChatMlTemplate) {
  const auto chat = parse_json_output(run_car("run " + moe_ + " --chat 'Hello there' -n 2 --temperature 0 --threads 1 --json"));
  // The same prompt written out as the template renders it, tokenized as text (the synthetic vocabulary has
  // no <|im_start|> token, so the markers are plain text either way).
  const std::string rendered = (dir_->path() / "rendered.txt").string();
  std::ofstream(rendered, std::ios::binary) << "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n";
  const auto plain =
      parse_json_output(run_car("run " + moe_ + " - -n 2 --temperature 0 --threads 1 --json < " + rendered));
  EXPECT_EQ(chat.at("prompt_tokens"), plain.at("prompt_tokens"));
  EXPECT_GT(chat.at("prompt_tokens").size(), 20u);
  EXPECT_EQ(chat.at("tokens"), plain.at("tokens"));
}

// Qwen2.5-Instruct's own template (the shared chat conformance set) in a synthetic qwen2 file: `car run
// --chat` renders it (its default system message included) and generates.
TEST_F(Qwen2Cli, ChatWithQwen25sOwnTemplate) {
  CAR_CONFORMANCE_DIR_OR_SKIP(conf);
  const auto tmpl = conf / "chat" / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja";
  ASSERT_TRUE(car::testing::read_fixture(tmpl)) << tmpl;
  const std::string path = (dir_->path() / "qwen25.gguf").string();
  ASSERT_EQ(run_car("gguf synth --arch qwen2 --layers 1 --embd 64 --ff 128 --heads 4 --kv-heads 2 --vocab 300 "
                "--ctx 512 --type q8_0 --seed 8 --chat-template '" + tmpl.string() + "' -o " + path)
                .exit_code,
            0);
  const auto chat = parse_json_output(run_car("run " + path + " --chat 'Hi' -n 2 --temperature 0 --threads 1 --json"));
  EXPECT_EQ(chat.at("tokens").size(), 2u);
  // "You are Qwen, created by Alibaba Cloud..." is in the rendered prompt: far more than the message's tokens.
  EXPECT_GT(chat.at("prompt_tokens").size(), 60u);
}

}  // namespace

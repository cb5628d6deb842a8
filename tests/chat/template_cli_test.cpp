// `car template render` and `car template FILE.gguf`: the binary writes exactly the rendered text (no
// newline added), and reports template errors on stderr with a non-zero exit.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/test_support.h"

namespace {

using car::testing::run_shell;
using car::testing::TempDir;

std::string car_cmd() {
  return car::testing::car_binary().string();
}

void write(const std::filesystem::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

TEST(TemplateCli, RenderWritesExactlyTheOutput) {
  TempDir tmp;
  write(tmp / "t.jinja",
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content | trim }}\n{% endfor %}"
        "{% if add_generation_prompt %}[assistant]{% endif %}\n");
  write(tmp / "c.json",
        R"({"bos_token": "<s>", "add_generation_prompt": true,
            "messages": [{"role": "user", "content": "  hi  "}, {"role": "assistant", "content": "yo"}]})");
  const auto r = run_shell(car_cmd() + " template render " + (tmp / "t.jinja").string() + " --context " +
                               (tmp / "c.json").string(),
                           tmp);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s>[user] hi\n[assistant] yo\n[assistant]");  // the template's final newline is dropped
  EXPECT_EQ(r.err, "");
}

// SOURCE_DATE_EPOCH fixes the clock strftime_now reads (in UTC), so a rendering reproduces byte for byte;
// a value that is not a whole number of seconds is an error, not the system clock.
TEST(TemplateCli, SourceDateEpochFixesTheClock) {
  TempDir tmp;
  write(tmp / "t.jinja", "{{ strftime_now('%Y-%m-%d %H:%M %d %b %Y') }}");
  write(tmp / "c.json", "{}");
  const std::string cmd =
      " template render " + (tmp / "t.jinja").string() + " --context " + (tmp / "c.json").string();
  auto r = run_shell("SOURCE_DATE_EPOCH=1768435200 TZ=Asia/Tokyo " + car_cmd() + cmd, tmp);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "2026-01-15 00:00 15 Jan 2026");
  r = run_shell("SOURCE_DATE_EPOCH=yesterday " + car_cmd() + cmd, tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("SOURCE_DATE_EPOCH"), std::string::npos) << r.err;
}

TEST(TemplateCli, TemplateErrorsGoToStderrWithAFailingExit) {
  TempDir tmp;
  write(tmp / "c.json", R"({"messages": [{"role": "user", "content": "x"}]})");
  write(tmp / "raise.jinja", "partial{{ raise_exception('System role not supported') }}");
  auto r = run_shell(car_cmd() + " template render " + (tmp / "raise.jinja").string() + " --context " +
                         (tmp / "c.json").string(),
                     tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("System role not supported"), std::string::npos) << r.err;

  write(tmp / "bad.jinja", "ok\n{% for m in messages %}{{ m.content }}");
  r = run_shell(car_cmd() + " template render " + (tmp / "bad.jinja").string() + " --context " +
                    (tmp / "c.json").string(),
                tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("missing 'else' or 'endfor'"), std::string::npos) << r.err;

  write(tmp / "notjson.json", "{nope");
  r = run_shell(car_cmd() + " template render " + (tmp / "raise.jinja").string() + " --context " +
                    (tmp / "notjson.json").string(),
                tmp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("not JSON"), std::string::npos) << r.err;
}

// Issue #23: the offline command takes the same bounds as the daemon - a chain too long and a context too
// deep are errors on stderr, not a crash.
TEST(TemplateCli, HostileTemplatesAndContextsAreErrors) {
  TempDir tmp;
  write(tmp / "c.json", R"({"x": 1})");
  std::string chain = "{{ x";
  for (int i = 0; i < 30000; ++i) chain += "|e";
  write(tmp / "chain.jinja", chain + " }}");
  auto r = run_shell(car_cmd() + " template render " + (tmp / "chain.jinja").string() + " --context " +
                         (tmp / "c.json").string(),
                     tmp);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("nests deeper than 256"), std::string::npos) << r.err;

  write(tmp / "x.jinja", "{{ x }}");
  write(tmp / "deep.json", R"({"x": )" + std::string(30000, '[') + std::string(30000, ']') + "}");
  r = run_shell(car_cmd() + " template render " + (tmp / "x.jinja").string() + " --context " +
                    (tmp / "deep.json").string(),
                tmp);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("nests deeper than 128"), std::string::npos) << r.err;
}

TEST(TemplateCli, GgufTemplateWithItsOwnSpecialTokens) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  TempDir tmp;
  const std::string msgs = R"('[{"role":"user","content":"Hi"}]')";
  // Phi-3's template starts with bos_token, which comes from the vocabulary.
  const auto phi = dir / "tokenizer" / "ggml-vocab-phi-3.gguf";
  ASSERT_TRUE(std::filesystem::exists(phi)) << phi;
  auto r = run_shell(car_cmd() + " template " + phi.string() + " --messages " + msgs, tmp);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s><|user|>\nHi<|end|>\n<|assistant|>\n");
  // Qwen's ChatML, with and without the generation prompt.
  const auto qwen = dir / "tokenizer" / "ggml-vocab-qwen2.gguf";
  ASSERT_TRUE(std::filesystem::exists(qwen)) << qwen;
  r = run_shell(car_cmd() + " template " + qwen.string() + " --messages " + msgs, tmp);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  r = run_shell(car_cmd() + " template " + qwen.string() + " --no-generation-prompt --messages " + msgs, tmp);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<|im_start|>user\nHi<|im_end|>\n");
  // A model without a template: a clear error.
  const auto bert = dir / "tokenizer" / "ggml-vocab-bert-bge.gguf";
  if (std::filesystem::exists(bert)) {
    r = run_shell(car_cmd() + " template " + bert.string(), tmp);
    EXPECT_NE(r.exit_code, 0);
    EXPECT_NE(r.err.find("no tokenizer.chat_template"), std::string::npos) << r.err;
  }
}

// `car run --chat`: the message goes through the template, special-token text becomes special tokens, and
// BOS is there exactly once whether or not the template writes it.
TEST(TemplateCli, RunChatRendersTheTemplateWithOneBos) {
  TempDir tmp;
  const std::string model = (tmp / "m.gguf").string();
  auto r = run_shell(
      car_cmd() +
          " gguf synth --arch llama --layers 1 --embd 32 --heads 2 --kv-heads 1 --ff 64 --vocab 300 "
          "--ctx 128 --type f32 --seed 3 -o " +
          model,
      tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // What the rendered prompt tokenizes to, BOS text parsed as the BOS token, nothing added.
  r = run_shell(car_cmd() + " tokenize " + model + " '<s>[U]hi[A]' --parse-special --no-bos --json", tmp);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto want = nlohmann::json::parse(r.out).at("ids");
  ASSERT_GE(want.size(), 2u);
  ASSERT_EQ(want[0], 1) << "the synthetic vocabulary's BOS is id 1";
  ASSERT_NE(want[1], 1);
  write(tmp / "with_bos.jinja", "{{ bos_token }}[U]{{ messages[0].content }}[A]");
  write(tmp / "without_bos.jinja",
        "[U]{{ messages[0].content }}{% if add_generation_prompt %}[A]{% endif %}");
  for (const char* t : {"with_bos.jinja", "without_bos.jinja"}) {
    r = run_shell(car_cmd() + " run " + model + " --chat hi --chat-template " + (tmp / t).string() +
                      " --json -n 2 --temperature 0 --threads 1",
                  tmp);
    ASSERT_EQ(r.exit_code, 0) << t << ": " << r.err;
    EXPECT_EQ(nlohmann::json::parse(r.out).at("prompt_tokens"), want) << t;
  }
  // No template in the model and none given: a clear error, not a raw prompt.
  r = run_shell(car_cmd() + " run " + model + " --chat hi -n 1", tmp);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no chat template (tokenizer.chat_template): give one with --chat-template FILE"),
            std::string::npos)
      << r.err;
}

}  // namespace

// `car tokenize FILE -` end to end through the built binary (skipped when it is absent): standard input is
// read whole and exactly, and a closed standard input or a directory fails instead of tokenizing something
// else (with descriptor 0 closed, the model file used to be opened as descriptor 0 and read as the text);
// the human output escapes pieces that are not printable text.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/spm_vocab.h"
#include "tests/test_support.h"

namespace car::tokenizer {
namespace {

namespace fs = std::filesystem;
using car::testing::run_shell;

class TokenizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(car::testing::car_binary())) << car::testing::car_binary() << " is not built";
    // A small SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens, then a few pieces.
    gguf::GgufWriter w;
    std::vector<car::testing::VocabToken> tokens = car::testing::spm_byte_fallback_tokens();
    const std::string sp = "\xE2\x96\x81";
    for (const std::string& t :
         {sp, std::string("a"), std::string("b"), sp + "a", sp + "ab", std::string("ab")}) {
      tokens.push_back({t, -1, car::testing::kTokNormal});
    }
    w.set_string("general.architecture", "llama");
    w.set_string("tokenizer.ggml.model", "llama");
    car::testing::set_vocab_tokens(w, tokens);
    w.set_u32("tokenizer.ggml.bos_token_id", 1);
    w.set_u32("tokenizer.ggml.eos_token_id", 2);
    model_ = (tmp_ / "vocab.gguf").string();
    ASSERT_TRUE(w.write(model_).ok());
    auto f = gguf::GgufFile::open(model_);
    ASSERT_TRUE(f.ok());
    auto t = Tokenizer::from_gguf(**f);
    ASSERT_TRUE(t.ok());
    tok_ = *t;
  }

  std::string car_cmd(const std::string& args) const {
    return ::car::testing::car_binary().string() + " " + args;
  }
  std::vector<int32_t> ids_of(const std::string& json_out) const {
    return nlohmann::json::parse(json_out).at("ids").get<std::vector<int32_t>>();
  }

  car::testing::TempDir tmp_;
  std::string model_;
  std::shared_ptr<const Tokenizer> tok_;
};

TEST_F(TokenizeCli, ReadsAllOfStandardInput) {
  // More than one read() worth, with bytes that are not UTF-8 and a NUL.
  std::string text;
  for (int i = 0; i < 30000; ++i) text += i % 7 == 0 ? std::string("ab\n", 3) : std::string("a b\xFF", 4);
  text += std::string("\0a", 2);
  std::ofstream(tmp_ / "in.txt", std::ios::binary) << text;
  const auto r = run_shell(car_cmd("tokenize --json " + model_ + " - < " + (tmp_ / "in.txt").string()), tmp_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ids_of(r.out), tok_->encode(text, true, false));
  const auto empty = run_shell(car_cmd("tokenize --json " + model_ + " - < /dev/null"), tmp_);
  ASSERT_EQ(empty.exit_code, 0) << empty.err;
  EXPECT_EQ(ids_of(empty.out), (std::vector<int32_t>{1}));
  const auto piped =
      run_shell("printf 'ab a' | " + car_cmd("tokenize --json --no-bos " + model_ + " -"), tmp_);
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  EXPECT_EQ(ids_of(piped.out), tok_->encode("ab a", false, false));
}

TEST_F(TokenizeCli, HumanOutputEscapesPiecesThatAreNotPrintableText) {
  // Byte-fallback pieces: 0xE9 alone is not UTF-8 and 0x01 is a control; neither may reach the terminal raw.
  std::ofstream(tmp_ / "in.txt", std::ios::binary) << std::string("a\xE9\x01", 3);
  const auto r =
      run_shell(car_cmd("tokenize --no-bos " + model_ + " - < " + (tmp_ / "in.txt").string()), tmp_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\t\\xe9\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\t\\x01\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\xE9'), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x01'), std::string::npos) << r.out;
}

TEST_F(TokenizeCli, ClosedStandardInputFails) {
  const auto r = run_shell(car_cmd("tokenize --json " + model_ + " - <&-"), tmp_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("standard input"), std::string::npos) << r.err;
}

TEST_F(TokenizeCli, DirectoryAsStandardInputFails) {
  const auto r = run_shell(car_cmd("tokenize --json " + model_ + " - < " + tmp_.path().string()), tmp_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(r.out, "");
  EXPECT_NE(r.err.find("standard input"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("directory"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace car::tokenizer

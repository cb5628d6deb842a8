// `car gguf inspect` / `car gguf synth` end to end, through the built binary (skipped when it is absent).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <map>
#include <string>

#include "core/gguf/gguf_writer.h"
#include "tests/test_support.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using CliRun = car::testing::CommandResult;
using car::testing::car_binary;

/// Runs this build's car with `args`, standard error captured through a file in `tmp`.
CliRun run(const std::string& args, const car::testing::TempDir& tmp) {
  return car::testing::run_shell(car_binary().string() + " " + args, tmp);
}

class GgufCli : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(fs::exists(car_binary())) << car_binary() << " is not built"; }
  car::testing::TempDir tmp_;
};

TEST_F(GgufCli, SynthThenInspectJson) {
  const std::string file = (tmp_ / "moe.gguf").string();
  CliRun w = run("gguf synth --arch llama --layers 3 --embd 64 --ff 96 --experts 4 --experts-used 2 --vocab 300 "
              "--seed 5 -o " + file, tmp_);
  ASSERT_EQ(w.exit_code, 0) << w.err;
  EXPECT_NE(w.out.find("wrote " + file), std::string::npos);
  CliRun r = run("gguf inspect --json " + file, tmp_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json j = json::parse(r.out);
  EXPECT_EQ(j["version"], 3);
  EXPECT_EQ(j["alignment"], 32);
  EXPECT_EQ(j["metadata"]["general.architecture"], "llama");
  EXPECT_EQ(j["metadata"]["llama.expert_count"], 4);
  EXPECT_EQ(j["metadata"]["llama.block_count"], 3);
  // Long arrays are summarized: element type, count and the first items.
  const auto& tokens = j["metadata"]["tokenizer.ggml.tokens"];
  EXPECT_EQ(tokens["array"], "string");
  EXPECT_EQ(tokens["count"], 300);
  EXPECT_EQ(tokens["first"][1], "<s>");
  // 1 + 3 * (6 + 4) + 2 tensors, each with the contract's fields.
  ASSERT_EQ(j["tensors"].size(), 33u);
  uint64_t sum = 0;
  for (const auto& t : j["tensors"]) {
    for (const char* k : {"name", "type", "shape", "offset", "bytes"}) EXPECT_TRUE(t.contains(k)) << k;
    sum += t["bytes"].get<uint64_t>();
  }
  EXPECT_EQ(j["totals"]["bytes"], sum);
  EXPECT_EQ(j["tensors"][0]["name"], "token_embd.weight");
  EXPECT_EQ(j["tensors"][0]["shape"], json::array({64, 300}));
  ASSERT_EQ(j["expert_banks"].size(), 9u);
  const auto& down = j["expert_banks"][2];
  EXPECT_EQ(down["kind"], "down");
  EXPECT_EQ(down["layer"], 0);
  EXPECT_EQ(down["n_expert"], 4);
  EXPECT_EQ(down["bytes_per_expert"], 96 * 64 * 4);

  CliRun h = run("gguf inspect " + file, tmp_);
  ASSERT_EQ(h.exit_code, 0) << h.err;
  EXPECT_NE(h.out.find("GGUF version 3"), std::string::npos);
  EXPECT_NE(h.out.find("blk.2.ffn_down_exps.weight"), std::string::npos);
  EXPECT_NE(h.out.find("expert banks (9)"), std::string::npos);
  EXPECT_NE(h.out.find("(300 items)"), std::string::npos);
}

// `--type` takes the 4-bit table formats, the codebook and the ternary types (issue #27): their tensors and
// llama.cpp's file type name show in `inspect`; rows shorter than a 256-element super-block fall back as
// llama-quantize does (IQ4_XS, the IQ2 / IQ3 / IQ1 types: IQ4_NL; TQ1_0 / TQ2_0: Q4_0).
TEST_F(GgufCli, SynthWritesTheIq4AndMxfp4Types) {
  struct Want {
    const char* flag;
    const char* type;
    const char* file_type;
  };
  for (const Want& w : {Want{"iq4_nl", "IQ4_NL", "IQ4_NL"}, Want{"iq4_xs", "IQ4_XS", "IQ4_XS"},
                        Want{"mxfp4", "MXFP4", "MXFP4_MOE"}, Want{"iq2_xxs", "IQ2_XXS", "IQ2_XXS"},
                        Want{"iq3_xxs", "IQ3_XXS", "IQ3_XXS"}, Want{"iq3_s", "IQ3_S", "IQ3_S"},
                        Want{"iq2_xs", "IQ2_XS", "IQ2_XS"}, Want{"iq2_s", "IQ2_S", "IQ2_S"},
                        Want{"iq1_m", "IQ1_M", "IQ1_M"}, Want{"tq1_0", "TQ1_0", "TQ1_0"},
                        Want{"tq2_0", "TQ2_0", "TQ2_0"}, Want{"iq1_s", "IQ1_S", "IQ1_S"}}) {
    SCOPED_TRACE(w.flag);
    const std::string file = (tmp_ / (std::string(w.flag) + ".gguf")).string();
    CliRun s = run(std::string("gguf synth --arch llama --layers 1 --embd 256 --ff 96 --vocab 300 --seed 3 ") +
                       "--type " + w.flag + " -o " + file,
                   tmp_);
    ASSERT_EQ(s.exit_code, 0) << s.err;
    CliRun r = run("gguf inspect --json " + file, tmp_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["decoded"]["file_type"], w.file_type);
    std::map<std::string, std::string> type_of;
    for (const auto& t : j["tensors"]) type_of[t["name"].get<std::string>()] = t["type"].get<std::string>();
    EXPECT_EQ(type_of["blk.0.attn_q.weight"], w.type);
    EXPECT_EQ(type_of["blk.0.ffn_gate.weight"], w.type);
    // ffn_down's rows are 96 long: whole IQ4_NL / MXFP4 blocks, not whole IQ4_XS super-blocks.
    const bool super_block = std::string(w.type) != "IQ4_NL" && std::string(w.type) != "MXFP4";
    const bool ternary = w.type[0] == 'T';  // llama-quantize's fallback for TQ1_0 / TQ2_0 is Q4_0
    EXPECT_EQ(type_of["blk.0.ffn_down.weight"], ternary ? "Q4_0" : super_block ? "IQ4_NL" : w.type);
  }
  // A type with no dot product (I8) has no quantizer: a clear refusal naming it, no file.
  const std::string file = (tmp_ / "i8.gguf").string();
  CliRun s = run("gguf synth --arch llama --layers 1 --embd 256 --ff 256 --vocab 300 --type i8 -o " + file, tmp_);
  EXPECT_NE(s.exit_code, 0);
  EXPECT_NE(s.err.find("I8"), std::string::npos) << s.err;
  EXPECT_FALSE(fs::exists(file));
}

TEST_F(GgufCli, ErrorsGoToStderrWithNonZeroExit) {
  const fs::path bad = tmp_ / "bad.gguf";
  {
    const std::string header("GGUF\x01\x00\x00\x00", 8);
    std::ofstream(bad, std::ios::binary) << header;
  }
  CliRun r = run("gguf inspect " + bad.string(), tmp_);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("version 1"), std::string::npos) << r.err;
  CliRun m = run("gguf inspect " + (tmp_ / "missing.gguf").string(), tmp_);
  EXPECT_NE(m.exit_code, 0);
  EXPECT_NE(m.err.find("missing.gguf"), std::string::npos) << m.err;
  CliRun s = run("gguf synth --arch qwen3moe -o " + (tmp_ / "x.gguf").string(), tmp_);
  EXPECT_NE(s.exit_code, 0);
  EXPECT_NE(s.err.find("experts"), std::string::npos) << s.err;
  EXPECT_FALSE(fs::exists(tmp_ / "x.gguf"));
}

// `inspect --json` on every shared fixture reports what llama.cpp's manifest says.
TEST_F(GgufCli, InspectsEveryFixture) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto text = car::testing::read_fixture(dir / "models" / "manifest.json");
  ASSERT_TRUE(text) << "conformance fixture missing or unreadable: " << dir / "models" / "manifest.json";
  const json manifest = json::parse(*text);
  ASSERT_FALSE(manifest["files"].empty());
  for (const auto& e : manifest["files"]) {
    SCOPED_TRACE(e["file"].get<std::string>());
    CliRun r = run("gguf inspect --json " + (dir / "models" / e["file"].get<std::string>()).string(), tmp_);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json j = json::parse(r.out);
    EXPECT_EQ(j["version"], e["gguf_version"]);
    EXPECT_EQ(j["data_offset"], e["data_offset"]);
    ASSERT_EQ(j["tensors"].size(), e["tensors"].size());
    for (size_t i = 0; i < e["tensors"].size(); ++i) {
      for (const char* k : {"name", "type", "shape", "offset", "bytes"}) {
        EXPECT_EQ(j["tensors"][i][k], e["tensors"][i][k]) << k;
      }
    }
    for (const auto& [key, want] : e["metadata"].items()) {
      if (want.is_number_float()) {
        EXPECT_NEAR(j["metadata"][key].get<double>(), want.get<double>(), 1e-6 * std::abs(want.get<double>())) << key;
      } else {
        EXPECT_EQ(j["metadata"][key], want) << key;
      }
    }
  }
}

// Keys, strings and tensor names are the file's bytes: human output escapes control characters (C0, DEL, C1)
// and bytes that are not UTF-8 so a crafted file cannot drive the terminal; --json stays valid JSON with the
// values intact (invalid UTF-8 replaced by U+FFFD).
TEST_F(GgufCli, InspectEscapesControlBytes) {
  const std::string key = "evil.\x1b]0;title\x07";
  const std::string value = "a\x1b[2Jb\xc2\x9b\xff\"\\c\nd\xe2\x82\xac";  // ESC, C1 CSI, a stray byte, a euro
  const std::string tensor = "t.\x1b[31mred";
  car::gguf::GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_u32(key, 1);
  w.set_string("str", value);
  ASSERT_TRUE(w.add_tensor(tensor, car::GgmlType::F32, {4}, std::vector<uint8_t>(16, 0)).ok());
  const std::string file = (tmp_ / "evil.gguf").string();
  ASSERT_TRUE(w.write(file).ok());

  CliRun r = run("gguf inspect " + file, tmp_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (size_t i = 0; i < r.out.size(); ++i) {
    const auto c = static_cast<unsigned char>(r.out[i]);
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f) || c >= 0x80) << "raw byte " << int(c) << " at " << i;
    if (c == 0xc2 && i + 1 < r.out.size()) {
      ASSERT_GT(static_cast<unsigned char>(r.out[i + 1]), 0x9f) << "raw C1 control at " << i;
    }
  }
  EXPECT_EQ(r.out.find('\xff'), std::string::npos);
  EXPECT_NE(r.out.find(R"(evil.\x1b]0;title\x07)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(R"("a\x1b[2Jb\u009b\xff\"\\c\nd)"
                       "\xe2\x82\xac\""),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find(R"(t.\x1b[31mred)"), std::string::npos) << r.out;

  CliRun j = run("gguf inspect --json " + file, tmp_);
  ASSERT_EQ(j.exit_code, 0) << j.err;
  EXPECT_EQ(j.out.find('\x1b'), std::string::npos);
  const json parsed = json::parse(j.out);
  EXPECT_EQ(parsed["metadata"][key], 1);
  EXPECT_EQ(parsed["metadata"]["str"], "a\x1b[2Jb\xc2\x9b\xef\xbf\xbd\"\\c\nd\xe2\x82\xac");
  EXPECT_EQ(parsed["tensors"][0]["name"], tensor);

  // An error naming a path with control characters is escaped too.
  CliRun e = run("gguf inspect \"$(printf 'miss\\033[2Jing.gguf')\"", tmp_);
  EXPECT_NE(e.exit_code, 0);
  EXPECT_EQ(e.err.find('\x1b'), std::string::npos) << e.err;
  EXPECT_NE(e.err.find(R"(miss\x1b[2Jing.gguf)"), std::string::npos) << e.err;
}

}  // namespace

// llama.cpp's tokenizer test vocabularies (../shared/conformance/tokenizer): every .inp case must encode to
// the ids in .out (add_special = false, parse_special = false), decoding must give the text back where
// llama.cpp's does, and stories260K's prompts must tokenize as in models/manifest.json. Skipped only when no
// conformance folder is configured; a missing or unreadable fixture fails (tests/test_support.h).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/tokenizer/spm.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/test_support.h"

namespace car::tokenizer {
namespace {

// A fixture's bytes; a missing or unreadable file fails the test (and reads as "").
std::string read_all(const std::filesystem::path& p) {
  auto text = car::testing::read_fixture(p);
  if (!text) {
    ADD_FAILURE() << "conformance fixture missing or unreadable: " << p;
    return {};
  }
  return std::move(*text);
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// .inp: strings each followed by "\n__ggml_vocab_test__\n"; .out: one line of space-separated ids each.
std::vector<Case> read_cases(const std::filesystem::path& inp, const std::filesystem::path& out) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  const std::string text = read_all(inp);
  std::vector<Case> cases;
  for (size_t pos = 0;;) {
    const size_t end = text.find(sep, pos);
    if (end == std::string::npos) break;
    cases.push_back(Case{text.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream in(read_all(out));
  std::string line;
  for (size_t i = 0; std::getline(in, line); ++i) {
    if (i >= cases.size()) {
      ADD_FAILURE() << out << ": more lines than cases";
      break;
    }
    std::istringstream ls(line);
    int64_t id = 0;
    while (ls >> id) cases[i].ids.push_back(static_cast<int32_t>(id));
  }
  return cases;
}

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

// Where llama.cpp's detokenizer returns the input unchanged for this vocabulary.
bool expect_roundtrip(const Tokenizer& tok, const std::string& text) {
  if (tok.type() == VocabType::wpm) return text.empty();  // lower-cases, strips accents, re-spaces words
  if (tok.vocab().clean_spaces) {
    // The clean-up rewrites " ." " ," " !" " ?" " ' " " 's" " 'm" " 're" " 've".
    for (const char* pat : {" .", " ,", " !", " ?", " '"}) {
      if (text.find(pat) != std::string::npos) return false;
    }
  }
  return true;
}

class VocabConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(VocabConformance, EncodesEveryCaseExactlyAndRoundTrips) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto base = dir / "tokenizer" / ("ggml-vocab-" + GetParam() + ".gguf");
  auto file = gguf::GgufFile::open(base.string());
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto tok = Tokenizer::from_gguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.error().message;
  const auto cases = read_cases(base.string() + ".inp", base.string() + ".out");
  ASSERT_EQ(cases.size(), 46u);
  int pass = 0;
  int roundtrips = 0;
  for (const Case& c : cases) {
    const auto ids = (*tok)->encode(c.text, false, false);
    if (ids == c.ids) {
      ++pass;
    } else {
      ADD_FAILURE() << GetParam() << ": '" << c.text << "'\n  expected" << ids_str(c.ids) << "\n  got     "
                    << ids_str(ids);
    }
    if (expect_roundtrip(**tok, c.text)) {
      EXPECT_EQ((*tok)->decode(ids), c.text) << GetParam();
      ++roundtrips;
    }
  }
  RecordProperty("passed", pass);
  RecordProperty("roundtrips", roundtrips);
  std::printf("[ %s ] %d/%zu cases exact, %d round trips checked\n", GetParam().c_str(), pass, cases.size(),
              roundtrips);
}

INSTANTIATE_TEST_SUITE_P(Vocabs, VocabConformance,
                         ::testing::Values("bert-bge", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2",
                                           "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "refact",
                                           "starcoder"),
                         [](const ::testing::TestParamInfo<std::string>& param_info) {
                           std::string n = param_info.param;
                           for (char& ch : n) {
                             if (ch == '-') ch = '_';
                           }
                           return n;
                         });

TEST(VocabConformance, ManifestMetadataMatches) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto manifest = nlohmann::json::parse(read_all(dir / "tokenizer" / "manifest.json"));
  ASSERT_FALSE(manifest.at("vocabs").empty());
  for (const auto& v : manifest.at("vocabs")) {
    auto file = gguf::GgufFile::open((dir / "tokenizer" / v.at("file").get<std::string>()).string());
    ASSERT_TRUE(file.ok());
    auto tok = Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    EXPECT_EQ((*tok)->n_vocab(), v.at("n_vocab").get<int>()) << v.at("vocab");
    EXPECT_EQ((*tok)->model_name(), v.at("tokenizer_model").get<std::string>());
    if (!v.at("bos").is_null()) {
      EXPECT_EQ((*tok)->bos(), v.at("bos").get<int>()) << v.at("vocab");
    }
    if (!v.at("eos").is_null()) {
      EXPECT_EQ((*tok)->eos(), v.at("eos").get<int>()) << v.at("vocab");
    }
    if (!v.at("add_bos").is_null()) {
      EXPECT_EQ((*tok)->add_bos(), v.at("add_bos").get<bool>()) << v.at("vocab");
    }
  }
}

TEST(ModelConformance, Stories260KPromptIdsMatchManifest) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto manifest = nlohmann::json::parse(read_all(dir / "models" / "manifest.json"));
  int checked = 0;
  for (const auto& f : manifest.at("files")) {
    if (f.at("file") != "stories260K.gguf") continue;
    auto file = gguf::GgufFile::open((dir / "models" / "stories260K.gguf").string());
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto tok = Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.ok()) << tok.error().message;
    EXPECT_EQ((*tok)->type(), VocabType::spm);
    for (const auto& c : f.at("cases")) {
      const auto prompt = c.at("prompt").get<std::string>();
      const auto expected = c.at("prompt_ids").get<std::vector<int32_t>>();
      EXPECT_EQ((*tok)->encode(prompt, true, true), expected) << prompt;
      // The generated ids decode to the recorded hex (pieces with special = true).
      std::string text;
      for (int32_t id : c.at("generated_ids").get<std::vector<int32_t>>())
        text += (*tok)->token_to_piece(id, true);
      std::string hex;
      for (unsigned char ch : text) {
        static constexpr char kHex[] = "0123456789abcdef";
        hex.push_back(kHex[ch >> 4]);
        hex.push_back(kHex[ch & 15]);
      }
      EXPECT_EQ(hex, c.at("generated_text_hex").get<std::string>()) << prompt;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace car::tokenizer

namespace car::tokenizer {
namespace {

// spm.cpp cuts text before U+2581 when the vocabulary allows it; the ids must equal an uncut merge.
TEST(SpmSplitOptimisation, GivesTheSameIdsAsOneMerge) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  for (const char* name : {"llama-spm", "phi-3"}) {
    const auto base = dir / "tokenizer" / (std::string("ggml-vocab-") + name + ".gguf");
    auto file = gguf::GgufFile::open(base.string());
    ASSERT_TRUE(file.ok());
    auto tok = Tokenizer::from_gguf(**file);
    ASSERT_TRUE(tok.ok());
    ASSERT_TRUE((*tok)->vocab().spm_split_at_spaces) << name;
    Vocab uncut = (*tok)->vocab();
    uncut.spm_split_at_spaces = false;
    std::string text;
    for (const Case& c : read_cases(base.string() + ".inp", base.string() + ".out")) text += c.text + "\n";
    text +=
        "a\xE2\x96\x81\xE2\x96\x81 b\xF0\xE2\x96\x81x";  // literal U+2581 runs; one hidden in a bad sequence
    std::string escaped = "\xE2\x96\x81";
    for (char ch : text) escaped += ch == ' ' ? std::string("\xE2\x96\x81") : std::string(1, ch);
    std::vector<int32_t> cut_ids, uncut_ids;
    spm_encode((*tok)->vocab(), escaped, cut_ids);
    spm_encode(uncut, escaped, uncut_ids);
    EXPECT_EQ(cut_ids, uncut_ids) << name;
    EXPECT_GT(cut_ids.size(), 400u);
  }
}

// Held-out classes on the real vocabularies (the .inp files have no such case): BERT input with combining
// marks tokenizes as its precomposed spelling, and a control token's text is ordinary text in phi-3 and
// llama-spm when special-token parsing is off.
std::shared_ptr<const Tokenizer> shared_vocab(const std::filesystem::path& dir, const std::string& name) {
  auto file = gguf::GgufFile::open((dir / "tokenizer" / ("ggml-vocab-" + name + ".gguf")).string());
  EXPECT_TRUE(file.ok()) << name << ": " << (file.ok() ? "" : file.error().message);
  if (!file.ok()) return nullptr;
  auto tok = Tokenizer::from_gguf(**file);
  EXPECT_TRUE(tok.ok()) << name;
  return tok.ok() ? *tok : nullptr;
}

TEST(HeldOutConformance, BertDecomposedAccentsEqualPrecomposed) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  auto tok = shared_vocab(dir, "bert-bge");
  ASSERT_TRUE(tok);
  const std::pair<const char*, const char*> pairs[] = {
      {"caf\xC3\xA9", "cafe\xCC\x81"},  // e + COMBINING ACUTE
      {"\xC3\x9C"
       "ber",
       "U\xCC\x88"
       "ber"},  // U + COMBINING DIAERESIS
      {"na\xC3\xAFve r\xC3\xA9sum\xC3\xA9", "nai\xCC\x88ve re\xCC\x81sume\xCC\x81"},
      {"cr\xC3\xA8me br\xC3\xBBl\xC3\xA9"
       "e",
       "cre\xCC\x80me bru\xCC\x82le\xCC\x81"
       "e"},
      {"\xC3\x85ngstr\xC3\xB6m", "A\xCC\x8Angstro\xCC\x88m"},
  };
  for (const auto& [pre, dec] : pairs) {
    SCOPED_TRACE(pre);
    const auto want = tok->encode(pre, false, false);
    EXPECT_EQ(tok->encode(dec, false, false), want);
    for (int32_t id : want) EXPECT_NE(id, tok->unk());
  }
}

TEST(HeldOutConformance, SpmControlTextIsTextWithoutParseSpecial) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  for (const char* name : {"phi-3", "llama-spm"}) {
    SCOPED_TRACE(name);
    auto tok = shared_vocab(dir, name);
    ASSERT_TRUE(tok);
    const int32_t eos_text = tok->find_token("</s>");
    ASSERT_NE(eos_text, kNoToken);
    EXPECT_TRUE(tok->is_control(eos_text));
    for (const char* text : {"</s>", "a</s>b", "Hello </s> world", "<s>x</s>"}) {
      SCOPED_TRACE(text);
      for (int32_t id : tok->encode(text, false, false)) EXPECT_FALSE(tok->is_control(id)) << id;
      EXPECT_EQ(tok->decode(tok->encode(text, false, false)), text);
    }
    EXPECT_EQ(tok->encode("</s>", false, true), (std::vector<int32_t>{eos_text}));
  }
}

}  // namespace
}  // namespace car::tokenizer

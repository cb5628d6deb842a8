// Every shared conformance fixture parses, and what the reader reports equals llama.cpp's manifest.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/gguf/gguf_file.h"
#include "tests/test_support.h"

namespace car::gguf {
namespace {

namespace fs = std::filesystem;

// The manifest, or a null value after a test failure when it is missing or unreadable.
nlohmann::json load_manifest(const fs::path& p) {
  const auto text = car::testing::read_fixture(p);
  if (!text) {
    ADD_FAILURE() << "conformance fixture missing or unreadable: " << p;
    return nullptr;
  }
  return nlohmann::json::parse(*text);
}

TEST(GgufConformance, EveryModelFixtureMatchesManifest) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto manifest = load_manifest(dir / "models" / "manifest.json");
  ASSERT_TRUE(manifest.is_object());
  ASSERT_FALSE(manifest["files"].empty());
  for (const auto& entry : manifest["files"]) {
    const std::string file = entry["file"];
    SCOPED_TRACE(file);
    auto g = GgufFile::open((dir / "models" / file).string());
    ASSERT_TRUE(g.ok()) << g.error().code << ": " << g.error().message;
    const GgufFile& f = **g;
    EXPECT_EQ(f.file_size(), entry["size"].get<uint64_t>());
    EXPECT_EQ(f.version(), entry["gguf_version"].get<uint32_t>());
    EXPECT_EQ(f.alignment(), entry["alignment"].get<uint64_t>());
    EXPECT_EQ(f.data_offset(), entry["data_offset"].get<uint64_t>());
    EXPECT_EQ(f.get_string("general.architecture").value(), entry["arch"].get<std::string>());

    std::vector<std::string> keys;
    for (const auto& kv : f.metadata()) keys.push_back(kv.key);
    EXPECT_EQ(keys, entry["metadata_keys"].get<std::vector<std::string>>());

    const auto& tensors = entry["tensors"];
    ASSERT_EQ(f.tensors().size(), entry["tensor_count"].get<size_t>());
    ASSERT_EQ(f.tensors().size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const TensorInfo& t = f.tensors()[i];
      SCOPED_TRACE(t.name);
      EXPECT_EQ(t.name, tensors[i]["name"].get<std::string>());
      EXPECT_EQ(std::string(ggml_type_name(t.type)), tensors[i]["type"].get<std::string>());
      auto shape = tensors[i]["shape"].get<std::vector<uint64_t>>();
      ASSERT_EQ(t.n_dims, shape.size());
      for (size_t d = 0; d < shape.size(); ++d) EXPECT_EQ(t.ne[d], shape[d]);
      EXPECT_EQ(t.offset, tensors[i]["offset"].get<uint64_t>());
      EXPECT_EQ(t.n_bytes, tensors[i]["bytes"].get<uint64_t>());
      EXPECT_EQ(f.find_tensor(t.name), &t);
      EXPECT_EQ(f.tensor_data(t).size(), t.n_bytes);
    }
    // Scalar metadata values equal the manifest's (tokenizer arrays are left out of it).
    for (const auto& [key, want] : entry["metadata"].items()) {
      SCOPED_TRACE(key);
      const Value* v = f.find(key);
      ASSERT_NE(v, nullptr);
      if (want.is_string()) {
        EXPECT_EQ(f.get_string(key).value(), want.get<std::string>());
      } else if (want.is_boolean()) {
        EXPECT_EQ(f.get_bool(key).value(), want.get<bool>());
      } else if (want.is_number_integer()) {
        EXPECT_EQ(f.get_int(key).value(), want.get<int64_t>());
      } else if (want.is_number_float()) {
        EXPECT_NEAR(f.get_float(key).value(), want.get<double>(), 1e-12 * std::abs(want.get<double>()));
      }
    }
    const uint64_t n_vocab = entry["n_vocab"].get<uint64_t>();
    auto tokens = f.get_array("tokenizer.ggml.tokens", ValueType::STRING);
    ASSERT_TRUE(tokens.ok()) << tokens.error().message;
    EXPECT_EQ((*tokens)->items.size(), n_vocab);
  }
}

TEST(GgufConformance, EveryTokenizerFixtureParses) {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const auto manifest = load_manifest(dir / "tokenizer" / "manifest.json");
  ASSERT_TRUE(manifest.is_object());
  ASSERT_FALSE(manifest["vocabs"].empty());
  for (const auto& entry : manifest["vocabs"]) {
    const std::string file = entry["file"];
    SCOPED_TRACE(file);
    auto g = GgufFile::open((dir / "tokenizer" / file).string());
    ASSERT_TRUE(g.ok()) << g.error().code << ": " << g.error().message;
    EXPECT_EQ((*g)->file_size(), entry["size"].get<uint64_t>());
    EXPECT_EQ((*g)->get_string("tokenizer.ggml.model").value(), entry["tokenizer_model"].get<std::string>());
    auto tokens = (*g)->get_array("tokenizer.ggml.tokens", ValueType::STRING);
    ASSERT_TRUE(tokens.ok()) << tokens.error().message;
    EXPECT_EQ((*tokens)->items.size(), entry["n_vocab"].get<size_t>());
    if (entry["bos"].is_number()) {
      EXPECT_EQ((*g)->get_uint("tokenizer.ggml.bos_token_id").value(), entry["bos"].get<uint64_t>());
    }
  }
}

}  // namespace
}  // namespace car::gguf

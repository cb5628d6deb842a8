// ModelCatalog (daemon/model_catalog.h): a file's header is read once per file version. Reads are counted
// through an injected reader that reports the file's first line as its "architecture", so a rewrite with a
// different header is visible in the answer as well as in the count.
#include "daemon/model_catalog.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/test_support.h"

namespace car::daemon {
namespace {

class ModelCatalogTest : public ::testing::Test {
 protected:
  ModelCatalogTest()
      : catalog_([this](const std::filesystem::path& path) -> std::optional<gguf::ModelInfo> {
          ++reader_calls_;
          std::ifstream in(path);
          std::string first;
          if (!std::getline(in, first) || first == "not gguf") return std::nullopt;
          gguf::ModelInfo info;
          info.architecture = first;
          return info;
        }) {}

  std::filesystem::path write(const std::string& name, const std::string& text) {
    const auto path = tmp_ / name;
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }

  std::string arch(const std::filesystem::path& path) {
    auto info = catalog_.describe(path);
    return info ? info->architecture : "(none)";
  }

  testing::TempDir tmp_;
  int reader_calls_ = 0;
  ModelCatalog catalog_;
};

TEST_F(ModelCatalogTest, UnchangedFilesAreNotReadAgain) {
  const auto a = write("a.gguf", "llama\n");
  const auto b = write("b.gguf", "not gguf\n");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(arch(a), "llama");
    EXPECT_EQ(arch(b), "(none)");  // a file that is not GGUF is remembered as such too
  }
  EXPECT_EQ(reader_calls_, 2);
  EXPECT_EQ(catalog_.reads(), 2u);
}

TEST_F(ModelCatalogTest, AFileRewrittenInPlaceIsReadAgain) {
  const auto a = write("a.gguf", "llama\n");
  EXPECT_EQ(arch(a), "llama");
  // In place (same inode), a different size.
  write("a.gguf", "qwen2moe\n");
  EXPECT_EQ(arch(a), "qwen2moe");
  EXPECT_EQ(reader_calls_, 2);
  // In place, the same size: the mtime tells them apart (set explicitly, so the test does not depend on
  // the file system's timestamp granularity).
  const auto before = std::filesystem::last_write_time(a);
  write("a.gguf", "gemma3ab\n");
  std::filesystem::last_write_time(a, before + std::chrono::seconds(1));
  EXPECT_EQ(arch(a), "gemma3ab");
  EXPECT_EQ(reader_calls_, 3);
  EXPECT_EQ(arch(a), "gemma3ab");
  EXPECT_EQ(reader_calls_, 3);
}

TEST_F(ModelCatalogTest, AFileRenamedOverIsReadAgainAndAMissingFileIsNull) {
  const auto a = write("a.gguf", "llama\n");
  EXPECT_EQ(arch(a), "llama");
  const auto next = write("next.tmp", "phi3\n");
  std::filesystem::rename(next, a);  // a new inode
  EXPECT_EQ(arch(a), "phi3");
  EXPECT_EQ(reader_calls_, 2);
  std::filesystem::remove(a);
  EXPECT_EQ(catalog_.describe(a), nullptr);
  EXPECT_EQ(reader_calls_, 2);  // a file that cannot be stat'ed is not read
}

TEST_F(ModelCatalogTest, TheProductionReaderDescribesNothingForANonGgufFile) {
  EXPECT_FALSE(ModelCatalog::read_header(write("x.gguf", "this is not a GGUF file")).has_value());
}

}  // namespace
}  // namespace car::daemon

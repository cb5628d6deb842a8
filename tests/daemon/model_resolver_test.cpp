// daemon/model_resolver.h: model ids resolved inside the models directory, never outside it, and listed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/model_resolver.h"
#include "tests/test_support.h"

namespace car {
namespace {

class DaemonResolver : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_ / "models";
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "tiny.gguf") << "0123456789";
    std::ofstream(tmp_ / "secret.gguf") << "x";
    std::filesystem::create_symlink(tmp_ / "secret.gguf", dir_ / "leak.gguf");
    std::filesystem::create_symlink(dir_ / "tiny.gguf", dir_ / "alias.gguf");
    std::filesystem::create_directories(dir_ / "dir.gguf");
  }
  car::testing::TempDir tmp_;
  std::filesystem::path dir_;
};

TEST_F(DaemonResolver, ResolvesIdsInsideTheModelsDirectory) {
  auto r = daemon::resolve_model(dir_, "tiny");
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->file_bytes, 10u);
  EXPECT_EQ(r->path, std::filesystem::canonical(dir_ / "tiny.gguf"));
  // A symlink that stays inside is fine.
  auto alias = daemon::resolve_model(dir_, "alias");
  ASSERT_TRUE(alias.ok());
  EXPECT_EQ(alias->path, r->path);
}

TEST_F(DaemonResolver, ForbidsIdsThatCouldEscape) {
  for (const std::string& id : std::vector<std::string>{"",
                                                        "../secret",
                                                        "a/b",
                                                        "/etc/passwd",
                                                        "..",
                                                        ".",
                                                        ".hidden",
                                                        std::string("ti\0ny", 5),
                                                        "a\\b",
                                                        "tab\there",
                                                        std::string(256, 'a'),
                                                        "leak",
                                                        "del\x7f",
                                                        "nel\xc2\x85",
                                                        "csi\xc2\x9b",
                                                        "line\xe2\x80\xa8sep",
                                                        "para\xe2\x80\xa9",
                                                        "rlo\xe2\x80\xae",
                                                        "lre\xe2\x80\xaa",
                                                        "lri\xe2\x81\xa6",
                                                        "pdi\xe2\x81\xa9",
                                                        "rlm\xe2\x80\x8f",
                                                        "zw\xe2\x80\x8bsp",
                                                        "bom\xef\xbb\xbf",
                                                        "bad\xff",
                                                        "overlong\xc0\xaf",
                                                        "cut\xe2\x80"}) {
    auto r = daemon::resolve_model(dir_, id);
    ASSERT_FALSE(r.ok()) << id;
    EXPECT_EQ(r.error().code, "forbidden") << id << ": " << r.error().message;
  }
}

TEST_F(DaemonResolver, AcceptsNonAsciiTextIds) {
  std::ofstream(dir_ / "mod\xc3\xa8le-\xe6\xa8\xa1\xe5\x9e\x8b.gguf") << "x";
  auto r = daemon::resolve_model(dir_, "mod\xc3\xa8le-\xe6\xa8\xa1\xe5\x9e\x8b");
  EXPECT_TRUE(r.ok()) << r.error().message;
  auto c1 = daemon::check_model_id("x\xc2\x85y");
  ASSERT_FALSE(c1.ok());
  EXPECT_EQ(c1.error().message,
            "model id rejected: U+0085 at offset 1 is a control or invisible formatting character");
}

TEST_F(DaemonResolver, MissingFilesAreNotFound) {
  for (const char* id : {"absent", "dir"}) {
    auto r = daemon::resolve_model(dir_, id);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, "not_found") << id;
  }
  auto gone = daemon::resolve_model(tmp_ / "no-such-dir", "tiny");
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.error().code, "not_found");
}

TEST_F(DaemonResolver, ListsOnlyResolvableModels) {
  auto l = daemon::list_models(dir_);
  ASSERT_TRUE(l.ok());
  std::vector<std::string> ids;
  for (const auto& m : *l) ids.push_back(m.id);
  EXPECT_EQ(ids, (std::vector<std::string>{"alias", "tiny"}));
  auto none = daemon::list_models(tmp_ / "missing");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace car

// A model whose file changes under it: generate() answers io_error (never results computed from zeros or
// from two files) when the file is truncated or rewritten in place after load, with the fault guard
// installed as the daemon and `car` install it; model_check_file() tells a caller that the path now names
// another file.
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

#include "core/engine/engine.h"
#include "core/util/fault_guard.h"
#include "core/util/file_identity.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

class ModelFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fault_guard::install().ok());
    path_ = (dir_ / "m.gguf").string();
    testing::TinySpec spec;
    spec.n_layer = 2;
    testing::write_tiny_model(path_, spec);
    LoadOptions o;
    o.threads = 2;
    o.context_length = 64;
    auto m = load_model(path_, o);
    ASSERT_TRUE(m.ok()) << m.error().message;
    model_ = *m;
  }
  static GenerateRequest greedy(int n) {
    GenerateRequest r;
    r.prompt_ids = {1, 40, 41, 42};
    r.max_tokens = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  }
  testing::TempDir dir_;
  std::string path_;
  std::shared_ptr<LoadedModel> model_;
};

TEST_F(ModelFileTest, TruncatedAfterLoadIsAnIoErrorNotACrash) {
  ASSERT_TRUE(generate(*model_, greedy(4), nullptr, nullptr).ok());
  EXPECT_TRUE(model_check_file(*model_, path_).ok());
  ASSERT_EQ(::truncate(path_.c_str(), 0), 0);
  auto r = generate(*model_, greedy(4), nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "io_error");
  EXPECT_NE(r.error().message.find("atomic rename"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("faulted"), std::string::npos) << r.error().message;
  // The mapping stays flagged: every later request fails the same way until the model is dropped.
  EXPECT_EQ(generate(*model_, greedy(1), nullptr, nullptr).error().code, "io_error");
  EXPECT_FALSE(model_check_file(*model_, path_).ok());
}

TEST_F(ModelFileTest, TruncatedDuringGenerationStopsAtTheNextToken) {
  int seen = 0;
  auto r = generate(
      *model_, greedy(20),
      [&](const TokenEvent&) {
        if (++seen == 3) {
          ASSERT_EQ(::truncate(path_.c_str(), 0), 0);
        }
      },
      nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "io_error");
  EXPECT_EQ(seen, 3);  // the evaluation after the third token faulted; nothing sampled from zeros
}

TEST_F(ModelFileTest, RewrittenInPlaceIsAnIoError) {
  // A larger model copied over the file through the same inode (as cp does): every old offset is still in
  // the file, so nothing faults, but the weights are now another model's - the open descriptor's size and
  // mtime tell.
  const auto inode = FileIdentity::of_path(path_)->inode;
  testing::TinySpec spec;
  spec.n_layer = 3;
  spec.seed = 9;
  testing::write_tiny_model((dir_ / "other.gguf").string(), spec);
  ASSERT_GT(std::filesystem::file_size(dir_ / "other.gguf"), std::filesystem::file_size(path_));
  std::filesystem::copy_file(dir_ / "other.gguf", path_, std::filesystem::copy_options::overwrite_existing);
  ASSERT_EQ(FileIdentity::of_path(path_)->inode, inode);
  auto r = generate(*model_, greedy(2), nullptr, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "io_error") << r.error().message;
  EXPECT_NE(r.error().message.find("modified in place"), std::string::npos) << r.error().message;
  EXPECT_FALSE(model_check_file(*model_, path_).ok());
}

TEST_F(ModelFileTest, AtomicRenameLeavesTheLoadedModelWorkingButNotCurrent) {
  auto first = generate(*model_, greedy(4), nullptr, nullptr);
  ASSERT_TRUE(first.ok());
  testing::TinySpec spec;
  spec.seed = 5;
  testing::write_tiny_model((dir_ / "new.gguf").string(), spec);
  std::filesystem::rename(dir_ / "new.gguf", path_);
  // The old inode is still mapped and intact: the loaded model keeps working and answers the same.
  auto again = generate(*model_, greedy(4), nullptr, nullptr);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->tokens, first->tokens);
  auto current = model_check_file(*model_, path_);
  ASSERT_FALSE(current.ok());
  EXPECT_NE(current.error().message.find("changed on disk"), std::string::npos) << current.error().message;
}

}  // namespace
}  // namespace car::engine

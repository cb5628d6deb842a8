// tests/test_support.h: where the conformance data is looked for, when its absence skips a test and when it
// fails one, and how fixtures are read.
#include "tests/test_support.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace car::testing {
namespace {

namespace fs = std::filesystem;

TEST(LocateConformance, UnsetAndNoDefaultFolderMeansNoData) {
  TempDir tmp;
  for (const char* env : {static_cast<const char*>(nullptr), ""}) {
    const ConformanceLookup r = locate_conformance(env, tmp / "absent");
    EXPECT_FALSE(r.dir);
    EXPECT_EQ(r.error, "");
  }
}

TEST(LocateConformance, UnsetUsesTheDefaultFolderWhenItExists) {
  TempDir tmp;
  const ConformanceLookup r = locate_conformance(nullptr, tmp.path());
  ASSERT_TRUE(r.dir);
  EXPECT_EQ(*r.dir, tmp.path());
  EXPECT_EQ(r.error, "");
  // Something that is not a directory at the default path is an error, not "no data".
  std::ofstream(tmp / "file") << "x";
  const ConformanceLookup f = locate_conformance(nullptr, tmp / "file");
  EXPECT_FALSE(f.dir);
  EXPECT_NE(f.error.find("not a directory"), std::string::npos) << f.error;
}

TEST(LocateConformance, TheVariableWinsAndMustNameADirectory) {
  TempDir tmp, other;
  const ConformanceLookup r = locate_conformance(tmp.path().c_str(), tmp / "absent");
  ASSERT_TRUE(r.dir);
  EXPECT_EQ(*r.dir, tmp.path());
  const ConformanceLookup both = locate_conformance(tmp.path().c_str(), other.path());
  ASSERT_TRUE(both.dir);
  EXPECT_EQ(*both.dir, tmp.path());
  // Set to something missing: an error naming it, even though the default folder exists.
  const std::string missing = (tmp / "missing").string();
  const ConformanceLookup m = locate_conformance(missing.c_str(), other.path());
  EXPECT_FALSE(m.dir);
  EXPECT_NE(m.error.find("CAR_CONFORMANCE_DIR=" + missing), std::string::npos) << m.error;
  std::ofstream(tmp / "file") << "x";
  const std::string file = (tmp / "file").string();
  EXPECT_FALSE(locate_conformance(file.c_str(), other.path()).error.empty());
}

TEST(ReadFixture, MissingUnreadableOrNotAFileIsNullopt) {
  TempDir tmp;
  EXPECT_FALSE(read_fixture(tmp / "absent"));
  EXPECT_FALSE(read_fixture(tmp.path()));
  std::ofstream(tmp / "f", std::ios::binary) << std::string("a\0b\n", 4);
  const auto text = read_fixture(tmp / "f");
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, std::string("a\0b\n", 4));
  std::ofstream(tmp / "empty").flush();
  EXPECT_EQ(read_fixture(tmp / "empty"), std::string());
  if (geteuid() != 0) {  // root reads files whatever their mode
    ASSERT_EQ(::chmod((tmp / "f").c_str(), 0), 0);
    EXPECT_FALSE(read_fixture(tmp / "f"));
  }
}

// The macro's failure path, with the real environment variable.
class ScopedConformanceEnv {
 public:
  explicit ScopedConformanceEnv(const std::string& value) {
    if (const char* old = std::getenv("CAR_CONFORMANCE_DIR")) old_ = old;
    ::setenv("CAR_CONFORMANCE_DIR", value.c_str(), 1);
  }
  ~ScopedConformanceEnv() {
    if (old_) {
      ::setenv("CAR_CONFORMANCE_DIR", old_->c_str(), 1);
    } else {
      ::unsetenv("CAR_CONFORMANCE_DIR");
    }
  }
  ScopedConformanceEnv(const ScopedConformanceEnv&) = delete;
  ScopedConformanceEnv& operator=(const ScopedConformanceEnv&) = delete;

 private:
  std::optional<std::string> old_;
};

fs::path g_seen;  // what the macro handed to uses_conformance()

void uses_conformance() {
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  g_seen = dir;
}

TEST(ConformanceMacro, FailsWhenTheVariableNamesNoDirectory) {
  TempDir tmp;
  ScopedConformanceEnv env((tmp / "missing").string());
  EXPECT_FATAL_FAILURE(uses_conformance(), "is not a directory");
}

TEST(ConformanceMacro, GivesTheConfiguredFolder) {
  TempDir tmp;
  ScopedConformanceEnv env(tmp.path().string());
  g_seen.clear();
  uses_conformance();
  EXPECT_EQ(g_seen, tmp.path());
  EXPECT_FALSE(::testing::Test::IsSkipped());
}

}  // namespace
}  // namespace car::testing

// FileIdentity and MappedFile's change detection: a rename over the path, an in-place rewrite and a
// truncation are each told apart from an unchanged file.
#include "core/util/mapped_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/util/file_identity.h"
#include "tests/test_support.h"

namespace car {
namespace {

void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
}

TEST(FileIdentity, PathAndDescriptorAgreeAndNameTheFields) {
  testing::TempDir dir;
  write_file(dir / "a", "hello");
  auto by_path = FileIdentity::of_path((dir / "a").string());
  ASSERT_TRUE(by_path.ok());
  int fd = ::open((dir / "a").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  auto by_fd = FileIdentity::of_fd(fd);
  ::close(fd);
  ASSERT_TRUE(by_fd.ok());
  EXPECT_EQ(*by_path, *by_fd);
  EXPECT_EQ(by_path->size, 5u);
  EXPECT_NE(by_path->describe().find("5 bytes"), std::string::npos) << by_path->describe();

  auto missing = FileIdentity::of_path((dir / "nope").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, "not_found");
  EXPECT_EQ(FileIdentity::of_fd(-1).error().code, "io_error");
}

TEST(MappedFile, UnchangedFileChecksOk) {
  testing::TempDir dir;
  write_file(dir / "m", std::string(10000, 'x'));
  auto f = MappedFile::open((dir / "m").string());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->identity().size, 10000u);
  EXPECT_TRUE(f->check_unchanged().ok());
  EXPECT_TRUE(f->matches((dir / "m").string()).ok());
  EXPECT_FALSE(f->faulted());
}

TEST(MappedFile, RenameOverThePathIsSeenByPathNotByTheMapping) {
  testing::TempDir dir;
  write_file(dir / "m", std::string(10000, 'x'));
  auto f = MappedFile::open((dir / "m").string());
  ASSERT_TRUE(f.ok());
  write_file(dir / "m.new", std::string(10000, 'y'));
  std::filesystem::rename(dir / "m.new", dir / "m");
  // The mapped inode is untouched (it lives on, unlinked): its bytes are still the old ones.
  EXPECT_TRUE(f->check_unchanged().ok());
  EXPECT_EQ(f->bytes()[0], 'x');
  auto m = f->matches((dir / "m").string());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, "io_error");
  EXPECT_NE(m.error().message.find("changed on disk"), std::string::npos) << m.error().message;
  std::filesystem::remove(dir / "m");
  EXPECT_EQ(f->matches((dir / "m").string()).error().code, "not_found");
}

TEST(MappedFile, InPlaceRewriteIsSeenByBoth) {
  testing::TempDir dir;
  write_file(dir / "m", std::string(10000, 'x'));
  auto f = MappedFile::open((dir / "m").string());
  ASSERT_TRUE(f.ok());
  write_file(dir / "m", std::string(12000, 'z'));  // O_TRUNC on the same inode, as cp does
  auto u = f->check_unchanged();
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.error().code, "io_error");
  EXPECT_NE(u.error().message.find("modified in place"), std::string::npos) << u.error().message;
  EXPECT_FALSE(f->matches((dir / "m").string()).ok());
}

TEST(MappedFile, MoveKeepsIdentityAndRegistration) {
  testing::TempDir dir;
  write_file(dir / "m", std::string(5000, 'x'));
  auto f = MappedFile::open((dir / "m").string());
  ASSERT_TRUE(f.ok());
  const FileIdentity id = f->identity();
  MappedFile moved = std::move(*f);
  EXPECT_EQ(moved.identity(), id);
  EXPECT_TRUE(moved.check_unchanged().ok());
  EXPECT_EQ(moved.guarded(), fault_guard::installed());  // registered; guarded once the handler is installed
  MappedFile empty;
  EXPECT_FALSE(empty.guarded());
  EXPECT_TRUE(empty.check_unchanged().ok());
}

}  // namespace
}  // namespace car

// ExpertFile (core/experts/expert_file.h): where a matrix lands in its window, buffered and with O_DIRECT;
// the switch to buffered reads when O_DIRECT is refused mid-run; EINTR; a short file's error in the
// matrix's own bytes. The streamed source's own I/O behaviour (through acquire) is
// streamed_source_test.cpp's.
#include "core/experts/expert_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/test_support.h"

namespace car::experts {
namespace {

constexpr uint64_t kFileBytes = 3 * kDirectAlign + 100;

uint8_t byte_at(uint64_t i) {
  return static_cast<uint8_t>((i * 7 + i / 251) % 251);
}

void write_pattern(const std::string& path) {
  std::string bytes(kFileBytes, '\0');
  for (uint64_t i = 0; i < kFileBytes; ++i) bytes[i] = static_cast<char>(byte_at(i));
  std::ofstream(path, std::ios::binary) << bytes;
}

/// Whether the `bytes` at `offset` sit at their lead in `window`.
bool in_place(const uint8_t* window, uint64_t offset, uint64_t bytes) {
  const uint8_t* m = window + window_lead(offset);
  for (uint64_t i = 0; i < bytes; ++i) {
    if (m[i] != byte_at(offset + i)) return false;
  }
  return true;
}

bool is_direct(int fd) {
  return (::fcntl(fd, F_GETFL) & O_DIRECT) != 0;
}

TEST(ExpertFile, BufferedReadsPutTheMatrixAtItsLeadInTheWindow) {
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "m.bin").string();
  write_pattern(path);
  auto f = ExpertFile::open(path, /*direct_io=*/false, nullptr, nullptr);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_FALSE(f->direct());
  EXPECT_EQ(f->size(), kFileBytes);
  for (const uint64_t offset : {uint64_t{0}, uint64_t{32}, kDirectAlign + 904, uint64_t{8000}}) {
    for (const uint64_t bytes : {uint64_t{100}, uint64_t{3000}}) {
      SCOPED_TRACE(std::to_string(offset) + "+" + std::to_string(bytes));
      auto window = SlotMemory::allocate(window_bytes(bytes));
      ASSERT_TRUE(window.ok());
      uint64_t nread = 0;
      ASSERT_TRUE(f->read(offset, bytes, window->data(), nread, nullptr).ok());
      EXPECT_EQ(nread, bytes) << "buffered reads exactly the matrix";
      EXPECT_TRUE(in_place(window->data(), offset, bytes));
    }
  }
}

TEST(ExpertFile, AShortFileIsAnIoErrorCountedInTheMatrixsOwnBytes) {
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "m.bin").string();
  write_pattern(path);
  auto f = ExpertFile::open(path, false, nullptr, nullptr);
  ASSERT_TRUE(f.ok());
  auto window = SlotMemory::allocate(window_bytes(200));
  ASSERT_TRUE(window.ok());
  uint64_t nread = 0;
  auto r = f->read(kFileBytes - 50, 200, window->data(), nread, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "io_error");
  EXPECT_NE(r.error().message.find("ends 150 bytes short of the 200-byte matrix"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("(50 of its bytes are there"), std::string::npos) << r.error().message;
}

TEST(ExpertFile, AnInterruptedReadIsRetried) {
  car::testing::TempDir dir;
  const std::string path = (dir.path() / "m.bin").string();
  write_pattern(path);
  std::atomic<int> calls{0};
  PreadFn interrupted_once = [&](int fd, void* buf, size_t count, off_t offset) -> ssize_t {
    if (calls++ == 0) {
      errno = EINTR;
      return -1;
    }
    return ::pread(fd, buf, count, offset);
  };
  auto f = ExpertFile::open(path, false, interrupted_once, nullptr);
  ASSERT_TRUE(f.ok());
  auto window = SlotMemory::allocate(window_bytes(1000));
  ASSERT_TRUE(window.ok());
  uint64_t nread = 0;
  ASSERT_TRUE(f->read(5000, 1000, window->data(), nread, nullptr).ok());
  EXPECT_TRUE(in_place(window->data(), 5000, 1000));
  EXPECT_EQ(calls.load(), 2);
}

// O_DIRECT needs a disk filesystem (tmpfs may refuse it): the build directory is on one.
class ExpertFileDirect : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::filesystem::path dir = std::filesystem::path(CAR_BINARY_DIR) / "tests" / "experts";
    std::filesystem::create_directories(dir);
    path_ = (dir / ("expert-file-" + std::to_string(::getpid()) + ".bin")).string();
    write_pattern(path_);
  }
  void TearDown() override { std::filesystem::remove(path_); }
  std::string path_;
};

TEST_F(ExpertFileDirect, ODirectReadsAlignedWindowsAndTheMatrixLandsInTheSamePlace) {
  std::vector<uint64_t> misaligned;
  PreadFn checking = [&](int fd, void* buf, size_t count, off_t offset) -> ssize_t {
    if (is_direct(fd) && (offset % kDirectAlign != 0 || count % kDirectAlign != 0 ||
                          reinterpret_cast<uintptr_t>(buf) % kDirectAlign != 0)) {
      misaligned.push_back(static_cast<uint64_t>(offset));
    }
    return ::pread(fd, buf, count, offset);
  };
  std::string refused;
  auto f = ExpertFile::open(path_, /*direct_io=*/true, checking, &refused);
  ASSERT_TRUE(f.ok()) << f.error().message;
  if (!f->direct()) GTEST_SKIP() << "the build directory refuses O_DIRECT: " << refused;
  for (const uint64_t offset : {uint64_t{32}, kDirectAlign + 904}) {
    auto window = SlotMemory::allocate(window_bytes(3000));
    ASSERT_TRUE(window.ok());
    uint64_t nread = 0;
    ASSERT_TRUE(f->read(offset, 3000, window->data(), nread, nullptr).ok());
    EXPECT_TRUE(in_place(window->data(), offset, 3000));
    EXPECT_EQ(nread % kDirectAlign, 0u) << "whole blocks";
  }
  EXPECT_TRUE(misaligned.empty());
  EXPECT_TRUE(f->direct());
}

TEST_F(ExpertFileDirect, EinvalFromAnODirectReadSwitchesToBufferedOnceAndTellsOnce) {
  PreadFn refusing = [](int fd, void* buf, size_t count, off_t offset) -> ssize_t {
    if (is_direct(fd)) {
      errno = EINVAL;
      return -1;
    }
    return ::pread(fd, buf, count, offset);
  };
  auto f = ExpertFile::open(path_, true, refusing, nullptr);
  ASSERT_TRUE(f.ok());
  if (!f->direct()) GTEST_SKIP() << "the build directory refuses O_DIRECT";
  int told = 0;
  std::string why;
  for (const uint64_t offset : {uint64_t{100}, uint64_t{6000}}) {
    auto window = SlotMemory::allocate(window_bytes(2000));
    ASSERT_TRUE(window.ok());
    uint64_t nread = 0;
    ASSERT_TRUE(f->read(offset, 2000, window->data(), nread, [&](const std::string& w) {
                   ++told;
                   why = w;
                 }).ok());
    EXPECT_TRUE(in_place(window->data(), offset, 2000));
  }
  EXPECT_FALSE(f->direct());
  EXPECT_EQ(told, 1);
  EXPECT_EQ(why, std::strerror(EINVAL));
}

}  // namespace
}  // namespace car::experts

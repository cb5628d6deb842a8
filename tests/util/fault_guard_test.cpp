// fault_guard: a read past the end of a mapped file that shrank reads zeros and flags its mapping instead of
// killing the process; reads before the new end still see the file; an unregistered mapping (or a SIGBUS
// sent by kill) still kills; the table is bounded and slots are reused.
#include "core/util/fault_guard.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/util/mapped_file.h"
#include "tests/test_support.h"

namespace car {
namespace {

const std::size_t kPage = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));

/// A file of `size` bytes where byte i is (i % 251) + 1 (never zero, so a zero read is the guard's).
std::filesystem::path write_pattern(const testing::TempDir& dir, const std::string& name, std::size_t size) {
  std::string bytes(size, '\0');
  for (std::size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i % 251 + 1);
  std::ofstream(dir / name, std::ios::binary) << bytes;
  return dir / name;
}

uint8_t read_byte(const uint8_t* p) {
  return *static_cast<const volatile uint8_t*>(p);
}

class FaultGuardTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(fault_guard::install().ok()); }
  testing::TempDir dir_;
};

TEST_F(FaultGuardTest, ReadPastTheNewEndReadsZerosAndFlagsTheMapping) {
  const std::size_t size = 16 * kPage;
  auto path = write_pattern(dir_, "m", size);
  auto f = MappedFile::open(path.string());
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(f->guarded());
  const uint8_t* p = f->bytes().data();
  EXPECT_EQ(read_byte(p + 5 * kPage), (5 * kPage) % 251 + 1);  // resident before the cut
  EXPECT_FALSE(f->faulted());

  const std::size_t new_size = 2 * kPage + 100;
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(new_size)), 0);
  const uint64_t before = fault_guard::faults_handled();
  EXPECT_EQ(read_byte(p + 5 * kPage), 0);  // past the new end: would have been SIGBUS
  EXPECT_TRUE(f->faulted());
  EXPECT_GT(fault_guard::faults_handled(), before);
  // The rest of the range reads zeros too, the part still in the file reads the file.
  EXPECT_EQ(read_byte(p + size - 1), 0);
  EXPECT_EQ(read_byte(p + 3 * kPage), 0);
  EXPECT_EQ(read_byte(p + 10), 11);
  EXPECT_EQ(read_byte(p + new_size - 1), (new_size - 1) % 251 + 1);
  auto check = f->check_unchanged();
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.error().code, "io_error");
  EXPECT_NE(check.error().message.find("faulted"), std::string::npos) << check.error().message;
}

TEST_F(FaultGuardTest, OnlyTheFaultingMappingIsFlagged) {
  auto a_path = write_pattern(dir_, "a", 8 * kPage);
  auto b_path = write_pattern(dir_, "b", 8 * kPage);
  auto a = MappedFile::open(a_path.string());
  auto b = MappedFile::open(b_path.string());
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(::truncate(a_path.c_str(), 0), 0);
  EXPECT_EQ(read_byte(a->bytes().data() + 7 * kPage), 0);
  EXPECT_EQ(read_byte(b->bytes().data() + 7 * kPage), (7 * kPage) % 251 + 1);
  EXPECT_TRUE(a->faulted());
  EXPECT_FALSE(b->faulted());
}

TEST_F(FaultGuardTest, ManyThreadsFaultingAtOnceAllSurvive) {
  const std::size_t size = 64 * kPage;
  auto path = write_pattern(dir_, "m", size);
  auto f = MappedFile::open(path.string());
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(kPage)), 0);
  std::atomic<uint64_t> nonzero{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      // Each thread walks the pages from a different start, so faults land on several pages concurrently.
      for (std::size_t i = 0; i < size / kPage; ++i) {
        std::size_t page = (i + static_cast<std::size_t>(t) * 16) % (size / kPage);
        if (page >= 1 && read_byte(f->bytes().data() + page * kPage) != 0) nonzero.fetch_add(1);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(nonzero.load(), 0u);
  EXPECT_TRUE(f->faulted());
}

TEST_F(FaultGuardTest, TheTableIsBoundedAndSlotsAreReused) {
  void* mem = ::mmap(nullptr, kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  std::vector<fault_guard::Region> regions;
  for (;;) {
    auto r = fault_guard::Region::add(mem, kPage);
    if (!r.registered()) break;
    regions.push_back(std::move(r));
    ASSERT_LE(regions.size(), fault_guard::kMaxRegions);
  }
  EXPECT_GT(regions.size(), 0u);
  EXPECT_FALSE(fault_guard::Region::add(mem, 0).registered());
  regions.pop_back();  // releases one slot
  auto again = fault_guard::Region::add(mem, kPage);
  EXPECT_TRUE(again.registered());
  EXPECT_FALSE(again.faulted());
  regions.clear();
  again.reset();
  EXPECT_FALSE(again.registered());
  ::munmap(mem, kPage);
}

// Under ASan or TSan the previous SIGBUS handler, which ours passes foreign faults to, is the sanitizer's:
// it reports the fault and exits non-zero (or aborts) rather than dying of the signal.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitizerHandler = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitizerHandler = true;
#else
constexpr bool kSanitizerHandler = false;
#endif
#else
constexpr bool kSanitizerHandler = false;
#endif

bool died_of_sigbus(int status) {
  if (kSanitizerHandler) return WIFEXITED(status) ? WEXITSTATUS(status) != 0 : WIFSIGNALED(status);
  return WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS;
}

using FaultGuardDeathTest = FaultGuardTest;

TEST_F(FaultGuardDeathTest, AnUnregisteredMappingStillCrashes) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto path = write_pattern(dir_, "raw", 4 * kPage);
  EXPECT_EXIT(
      {
        int fd = ::open(path.c_str(), O_RDONLY);
        void* p = ::mmap(nullptr, 4 * kPage, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED || ::ftruncate(::open(path.c_str(), O_WRONLY), 0) != 0) std::_Exit(0);
        std::fprintf(stderr, "read %d\n", read_byte(static_cast<const uint8_t*>(p) + 3 * kPage));
        std::_Exit(0);
      },
      died_of_sigbus, "");
}

TEST_F(FaultGuardDeathTest, ASentSigbusStillKills) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(::raise(SIGBUS), died_of_sigbus, "");
}

TEST_F(FaultGuardTest, InstallIsIdempotent) {
  EXPECT_TRUE(fault_guard::installed());
  EXPECT_TRUE(fault_guard::install().ok());
  EXPECT_TRUE(fault_guard::installed());
}

}  // namespace
}  // namespace car

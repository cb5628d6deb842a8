// ExpertPool: the memory probe (fake /proc and cgroup v1/v2 trees), the budget formula, and one budget
// shared by several streamed sources (caps re-sized when one joins or leaves).
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>

#include "core/experts/streamed_source.h"
#include "tests/experts/bank_file.h"
#include "tests/test_support.h"

namespace car::experts {
namespace {

namespace fs = std::filesystem;
using testing::BankGeometry;

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

class ProbeTest : public ::testing::Test {
 protected:
  fs::path proc() const { return dir_ / "proc"; }
  fs::path cg() const { return dir_ / "cgroup"; }
  void meminfo(uint64_t available_kb) {
    write(proc() / "meminfo", "MemTotal:       32000000 kB\nMemFree:         1000000 kB\nMemAvailable:   " +
                                  std::to_string(available_kb) + " kB\nBuffers:          100 kB\n");
  }
  MemoryProbe probe() const { return probe_memory(proc().string(), cg().string()); }
  testing::TempDir dir_;
};

TEST_F(ProbeTest, MemAvailableAloneWhenThereIsNoCgroup) {
  meminfo(16'000'000);
  const MemoryProbe p = probe();
  EXPECT_EQ(p.mem_available, 16'000'000ull * 1024);
  EXPECT_FALSE(p.cgroup_remaining.has_value());
  EXPECT_EQ(p.cgroup_version, "");
  EXPECT_EQ(p.effective_available, p.mem_available);
}

TEST_F(ProbeTest, CgroupV1LimitMinusUsageOverTheCgroupAndItsAncestors) {
  meminfo(16'000'000);
  write(proc() / "self" / "cgroup", "12:cpu,cpuacct:/job/a\n9:memory:/job/a\n1:name=systemd:/job/a\n");
  write(cg() / "memory/job/a/memory.limit_in_bytes", "4000000000\n");
  write(cg() / "memory/job/a/memory.usage_in_bytes", "1000000000\n");
  write(cg() / "memory/job/memory.limit_in_bytes", "10000000000\n");  // the parent is tighter: 1.5 GB left
  write(cg() / "memory/job/memory.usage_in_bytes", "8500000000\n");
  write(cg() / "memory/memory.limit_in_bytes", "9223372036854771712\n");  // v1's "unlimited"
  write(cg() / "memory/memory.usage_in_bytes", "20000000000\n");
  const MemoryProbe p = probe();
  EXPECT_EQ(p.cgroup_version, "v1");
  ASSERT_TRUE(p.cgroup_remaining.has_value());
  EXPECT_EQ(*p.cgroup_remaining, 1'500'000'000u);
  EXPECT_EQ(p.effective_available, 1'500'000'000u);
}

TEST_F(ProbeTest, CgroupV1UnlimitedIsNoLimit) {
  meminfo(2'000'000);
  write(proc() / "self" / "cgroup", "4:memory:/\n");
  write(cg() / "memory/memory.limit_in_bytes", "9223372036854771712\n");
  write(cg() / "memory/memory.usage_in_bytes", "5000000000\n");
  const MemoryProbe p = probe();
  EXPECT_EQ(p.cgroup_version, "v1");
  EXPECT_FALSE(p.cgroup_remaining.has_value());
  EXPECT_EQ(p.effective_available, 2'000'000ull * 1024);
}

TEST_F(ProbeTest, CgroupV2MaxMinusCurrentAndMaxMeansNoLimit) {
  meminfo(16'000'000);
  write(proc() / "self" / "cgroup", "0::/user.slice/app.service\n");
  write(cg() / "user.slice/app.service/memory.max", "2000000000\n");
  write(cg() / "user.slice/app.service/memory.current", "500000000\n");
  write(cg() / "user.slice/memory.max", "max\n");
  write(cg() / "user.slice/memory.current", "9000000000\n");
  MemoryProbe p = probe();
  EXPECT_EQ(p.cgroup_version, "v2");
  ASSERT_TRUE(p.cgroup_remaining.has_value());
  EXPECT_EQ(*p.cgroup_remaining, 1'500'000'000u);
  EXPECT_EQ(p.effective_available, 1'500'000'000u);

  write(cg() / "user.slice/app.service/memory.max", "max\n");
  p = probe();
  EXPECT_FALSE(p.cgroup_remaining.has_value());
  EXPECT_EQ(p.effective_available, 16'000'000ull * 1024);
}

TEST_F(ProbeTest, UsageAboveTheLimitLeavesNothing) {
  meminfo(16'000'000);
  write(proc() / "self" / "cgroup", "0::/x\n");
  write(cg() / "x/memory.max", "1000\n");
  write(cg() / "x/memory.current", "5000\n");
  EXPECT_EQ(probe().effective_available, 0u);
}

TEST(Budget, SeedFormula) {
  auto gb = [](uint64_t avail) { return static_cast<double>(budget_from_available(avail)) / 1e9; };
  EXPECT_NEAR(gb(64'000'000'000), 52.62, 1e-9);  // 64 GB x 0.88 - 3.7 GB
  EXPECT_NEAR(gb(20'000'000'000), 13.90, 1e-9);  // 20 GB x 0.88 - 3.7 GB
  EXPECT_EQ(budget_from_available(0), 0u);
}

TEST(Budget, ReservesShrinkToAShareOfASmallLimit) {
  // 2.5 GB (a memory cgroup's limit): the fixed 3.7 GB would leave nothing; 30 % of 2.5 GB is reserved.
  auto gb = [](uint64_t avail) { return static_cast<double>(budget_from_available(avail)) / 1e9; };
  EXPECT_NEAR(gb(2'500'000'000), 1.45, 1e-9);   // 2.5 x 0.88 - 0.75
  EXPECT_NEAR(gb(10'000'000'000), 5.80, 1e-9);  // 10 x 0.88 - 3.0
  // The two rules meet at 3.7 / 0.3 = 12.33 GB; the budget grows with the memory on both sides.
  EXPECT_LT(budget_from_available(12'000'000'000), budget_from_available(12'400'000'000));
}

TEST_F(ProbeTest, PoolBudgetComesFromTheProbeUnlessForced) {
  meminfo(20'000'000);  // 20.48 GB available
  write(proc() / "self" / "cgroup", "0::/svc\n");
  write(cg() / "svc/memory.max", "12000000000\n");
  write(cg() / "svc/memory.current", "2000000000\n");  // 10 GB left: the binding limit
  const BankGeometry g;
  testing::BankFile f = testing::make_bank_file((dir_ / "banks.bin").string(), g);
  StreamOptions o;
  o.proc_root = proc().string();
  o.cgroup_root = cg().string();
  o.io_threads = 1;
  auto pool = std::make_shared<ExpertPool>(o);
  o.pool = pool;
  auto src = StreamedExpertSource::open(f.path, f.banks, o);
  ASSERT_TRUE(src.ok()) << src.error().message;
  EXPECT_EQ(pool->budget_bytes(), budget_from_available(10'000'000'000));  // 10 GB x 0.88 - 3.0 GB
  EXPECT_FALSE(pool->layout().forced);
  EXPECT_EQ((*src)->stats().budget_bytes, budget_from_available(10'000'000'000));
  EXPECT_EQ((*src)->stats().cap, g.n_expert);  // 5 GB holds every expert of this small file

  StreamOptions forced = o;
  forced.ram_gb = 0.5;
  forced.pool = nullptr;
  auto own = StreamedExpertSource::open(f.path, f.banks, forced);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ((*own)->stats().budget_bytes, 500'000'000u);
  EXPECT_TRUE((*own)->join_layout().forced);
}

TEST(Pool, ASecondSourceSharesTheBudgetAndCapsAreResized) {
  testing::TempDir dir;
  const BankGeometry g;  // 2 MoE layers of 8 experts
  testing::BankFile a = testing::make_bank_file((dir / "a.bin").string(), g);
  testing::BankFile b = testing::make_bank_file((dir / "b.bin").string(), g);
  // Learn the slot size, then force a budget of exactly 8 slots per bank for one model alone.
  uint64_t slot = 0;
  {
    StreamOptions probe;
    probe.ram_gb = 1e-9;
    probe.io_threads = 1;
    auto s = StreamedExpertSource::open(a.path, a.banks, probe);
    ASSERT_TRUE(s.ok());
    slot = (*s)->join_layout().bytes_per_expert;
    EXPECT_EQ((*s)->stats().cap, 1);  // clamped up to 1 even when the budget holds nothing
  }
  StreamOptions o;
  o.ram_gb = (2.0 * 8 * static_cast<double>(slot) + static_cast<double>(slot) / 2) / 1e9;
  o.io_threads = 2;
  auto pool = std::make_shared<ExpertPool>(o);
  o.pool = pool;
  auto first = StreamedExpertSource::open(a.path, a.banks, o);
  ASSERT_TRUE(first.ok());
  auto& A = *first;
  EXPECT_EQ(A->stats().cap, 8);
  for (int e = 0; e < 8; ++e) ASSERT_TRUE(A->acquire(1, e).ok());
  EXPECT_EQ(A->stats().cached, 8);
  {
    std::vector<ExpertLease> held;  // six of A's experts leased while the budget shrinks under them
    const std::vector<int> six = {0, 1, 2, 3, 4, 5};
    ASSERT_TRUE(A->acquire_many(1, six, held).ok());
    auto second = StreamedExpertSource::open(b.path, b.banks, o);
    ASSERT_TRUE(second.ok());
    EXPECT_EQ(A->stats().cap, 4);
    EXPECT_EQ(A->resident_bytes(), 6 * slot);  // leased slots stay (the 2 unleased went), until released
    for (size_t i = 0; i < held.size(); ++i)
      EXPECT_TRUE(testing::same_expert(held[i].weights(), a.banks[1], six[i]));
    held.clear();
    const PoolLayout L = pool->layout();
    EXPECT_EQ(L.sources, 2);
    EXPECT_EQ(L.banks, 4);
    EXPECT_EQ(L.cap, 4);
    EXPECT_LE(L.cache_bytes, L.budget_bytes);
    EXPECT_NE(L.line().find("4 banks"), std::string::npos) << L.line();
    EXPECT_NE(L.line().find("cap 4/bank"), std::string::npos) << L.line();
    EXPECT_EQ(A->stats().cap, 4);
    EXPECT_EQ((*second)->stats().cap, 4);
    EXPECT_EQ(A->stats().cached, 4);  // the first model gave back what no longer fits
    EXPECT_EQ(A->stats().budget_bytes, (*second)->stats().budget_bytes);
    EXPECT_LE(A->resident_bytes() + (*second)->resident_bytes(), L.budget_bytes);
  }
  EXPECT_EQ(pool->layout().sources, 1);
  EXPECT_EQ(A->stats().cap, 8);  // the second model left: its share returns
}

TEST(Pool, BanksWithFewerExpertsLeaveTheRestToOthers) {
  testing::TempDir dir;
  BankGeometry small;
  small.n_expert = 2;
  BankGeometry big;
  big.n_expert = 16;
  testing::BankFile a = testing::make_bank_file((dir / "a.bin").string(), small);
  testing::BankFile b = testing::make_bank_file((dir / "b.bin").string(), big);
  const uint64_t slot = testing::slot_bytes(a);  // same matrix sizes in both files
  ASSERT_GT(slot, 0u);
  StreamOptions o;
  o.ram_gb = (20.0 * static_cast<double>(slot) + static_cast<double>(slot) / 2) / 1e9;  // 20 slots in all
  o.io_threads = 1;
  o.pool = std::make_shared<ExpertPool>(o);
  auto A = StreamedExpertSource::open(a.path, a.banks, o);
  auto B = StreamedExpertSource::open(b.path, b.banks, o);
  ASSERT_TRUE(A.ok() && B.ok());
  // Small banks take their 2 each (4 slots); the big model's 2 banks share the other 16: 8 each.
  EXPECT_EQ((*A)->stats().cap, 2);
  EXPECT_EQ((*B)->stats().cap, 8);
}

// One budget with the daemon's model cache (issue #23, item 5): the room function limits the pool to the
// floors (one slot per bank) plus the room, and refresh() follows it down - giving back unleased slots -
// and up again.
TEST(Pool, TheRoomLimitsTheBudgetAboveTheFloorsAndRefreshFollowsIt) {
  testing::TempDir dir;
  const BankGeometry g;  // 2 MoE layers of 8 experts
  testing::BankFile a = testing::make_bank_file((dir / "a.bin").string(), g);
  const uint64_t slot = testing::slot_bytes(a);
  ASSERT_GT(slot, 0u);
  StreamOptions o;
  o.ram_gb = 1.0;  // far above the banks: only the room limits
  o.io_threads = 1;
  auto pool = std::make_shared<ExpertPool>(o);
  o.pool = pool;
  auto room = std::make_shared<std::atomic<uint64_t>>(6 * slot);
  pool->set_room([room] { return std::optional<uint64_t>(room->load()); });
  auto A = StreamedExpertSource::open(a.path, a.banks, o);
  ASSERT_TRUE(A.ok());
  // Floors: 2 slots; room: 6 more -> 8 slots over 2 banks, cap 4.
  EXPECT_EQ((*A)->stats().floor_bytes, 2 * slot);
  EXPECT_EQ(pool->layout().floor_bytes, 2 * slot);
  EXPECT_TRUE(pool->layout().roomed);
  EXPECT_EQ(pool->layout().budget_bytes, 8 * slot);
  EXPECT_EQ((*A)->stats().cap, 4);
  for (int e = 0; e < 4; ++e) ASSERT_TRUE((*A)->acquire(1, e).ok());  // layer 0 is dense
  EXPECT_EQ((*A)->resident_bytes(), 4 * slot);
  EXPECT_NE(pool->layout().line().find("room"), std::string::npos) << pool->layout().line();

  // A load takes the room: the caches shrink to their floor and give the memory back at once.
  room->store(0);
  pool->refresh();
  EXPECT_EQ((*A)->stats().cap, 1);
  EXPECT_EQ((*A)->resident_bytes(), 1 * slot);
  EXPECT_EQ(pool->layout().budget_bytes, 2 * slot);

  // The room comes back (a model evicted): the caches may grow again.
  room->store(14 * slot);
  pool->refresh();
  EXPECT_EQ((*A)->stats().cap, 8);

  // Without a room function (or with no limit) the pool's own budget applies.
  pool->set_room([] { return std::optional<uint64_t>(); });
  EXPECT_FALSE(pool->layout().roomed);
  pool->set_room({});
  EXPECT_FALSE(pool->layout().roomed);
  EXPECT_EQ((*A)->stats().cap, 8);
}

}  // namespace
}  // namespace car::experts

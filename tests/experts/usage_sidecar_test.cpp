// The usage sidecar: parsing (seed format, malformed / foreign / torn lines), crash-safe writing, the
// per-model path, and the streamed source's round trip: save, merge, pins applied at the next open.
#include "core/experts/usage_sidecar.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/experts/streamed_source.h"
#include "tests/experts/bank_file.h"
#include "tests/test_support.h"

namespace car::experts {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::vector<int> kExperts = {0, 8, 8};  // layer 0 dense, layers 1-2 with 8 experts

TEST(SidecarParse, SeedFormatLinesAndTheLargestOfTheThreeBanks) {
  const std::string text =
      "# comment\n"
      "blk.1.ffn_gate_exps.weight 3 10\n"
      "blk.1.ffn_up_exps.weight 3 12\n"
      "blk.1.ffn_down_exps.weight 3 11\n"
      "\n"
      "blk.2.ffn_down_exps.weight 7 5\n";
  const SidecarContents c = parse_sidecar(text, kExperts, "f");
  EXPECT_TRUE(c.warnings.empty());
  ASSERT_EQ(c.counts.size(), 2u);
  EXPECT_EQ(c.counts.at({1, 3}), 12u);
  EXPECT_EQ(c.counts.at({2, 7}), 5u);
}

TEST(SidecarParse, MalformedForeignAndTornLinesAreSkippedWithAWarning) {
  const std::string text =
      "blk.1.ffn_gate_exps.weight 1 4\n"                        // good
      "blk.1.ffn_gate_exps.weight 2\n"                          // two fields
      "blk.1.ffn_gate_exps.weight 2 3 4\n"                      // four fields
      "blk.1.attn_q.weight 2 3\n"                               // not an expert bank
      "blk.0.ffn_gate_exps.weight 2 3\n"                        // dense layer in this model
      "blk.9.ffn_gate_exps.weight 2 3\n"                        // no such layer
      "blk.1.ffn_gate_exps.weight 8 3\n"                        // expert out of range
      "blk.1.ffn_gate_exps.weight 2 -3\n"                       // negative count
      "blk.1.ffn_gate_exps.weight 2 99999999999999999999999\n"  // overflows u64
      "blk.1.ffn_gate_exps.weight x 3\n"                        // not a number
      "\x01\x02\xff garbage\n"
      "blk.2.ffn_up_exps.weight 5 77";  // torn: no final newline
  const SidecarContents c = parse_sidecar(text, kExperts, "usage.txt");
  ASSERT_EQ(c.counts.size(), 1u);
  EXPECT_EQ(c.counts.at({1, 1}), 4u);
  ASSERT_EQ(c.warnings.size(), kMaxSidecarWarnings + 1);  // capped, then one summary
  EXPECT_NE(c.warnings[0].find("usage.txt:2"), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings.back().find("3 more"), std::string::npos) << c.warnings.back();
  const SidecarContents torn = parse_sidecar("blk.2.ffn_up_exps.weight 5 77", kExperts, "t");
  EXPECT_TRUE(torn.counts.empty());
  ASSERT_EQ(torn.warnings.size(), 1u);
  EXPECT_NE(torn.warnings[0].find("torn"), std::string::npos);
}

TEST(SidecarFormat, RoundTripsAndWritesTheSeedsThreeNames) {
  const UsageCounts counts = {{{1, 0}, 3}, {{2, 7}, 18446744073709551615ull}};
  const std::string text = format_sidecar(counts);
  EXPECT_NE(text.find("blk.1.ffn_gate_exps.weight 0 3\n"), std::string::npos);
  EXPECT_NE(text.find("blk.1.ffn_up_exps.weight 0 3\n"), std::string::npos);
  EXPECT_NE(text.find("blk.1.ffn_down_exps.weight 0 3\n"), std::string::npos);
  const SidecarContents back = parse_sidecar(text, kExperts, "f");
  EXPECT_TRUE(back.warnings.empty());
  EXPECT_EQ(back.counts, counts);
}

TEST(SidecarWrite, AtomicWriteCreatesTheDirectoryAndLeavesNoTempFile) {
  testing::TempDir dir;
  const fs::path p = dir / "state" / "experts" / "m.usage";
  ASSERT_TRUE(write_file_atomic(p.string(), "one\n").ok());
  ASSERT_TRUE(write_file_atomic(p.string(), "two\n").ok());
  EXPECT_EQ(slurp(p), "two\n");
  int files = 0;
  for (const auto& e : fs::directory_iterator(p.parent_path())) files += e.is_regular_file() ? 1 : 0;
  EXPECT_EQ(files, 1);
  std::ofstream(dir / "file-not-dir") << "x";
  auto bad = write_file_atomic((dir / "file-not-dir" / "x").string(), "z");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, "io_error");
}

TEST(SidecarPath, PerModelAndChangesWithPathOrSize) {
  testing::TempDir dir;
  const fs::path m1 = dir / "My Model.gguf";
  const fs::path m2 = dir / "other.gguf";
  std::ofstream(m1) << "abc";
  std::ofstream(m2) << "abc";
  auto a = sidecar_path("/var/lib/car", m1.string());
  auto again = sidecar_path("/var/lib/car", (dir / "." / "My Model.gguf").string());
  auto b = sidecar_path("/var/lib/car", m2.string());
  ASSERT_TRUE(a.ok() && again.ok() && b.ok());
  EXPECT_EQ(*a, *again);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->rfind("/var/lib/car/experts/My_Model-", 0), 0u) << *a;
  EXPECT_EQ(a->size(), std::string("/var/lib/car/experts/My_Model-").size() + 12 + 6) << *a;
  std::ofstream(m1, std::ios::app) << "more";  // a different file under the same name
  auto grown = sidecar_path("/var/lib/car", m1.string());
  ASSERT_TRUE(grown.ok());
  EXPECT_NE(*grown, *a);
  auto missing = sidecar_path("/var/lib/car", (dir / "none.gguf").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, "not_found");
}

class SidecarSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = testing::make_bank_file((dir_ / "banks.bin").string(), testing::BankGeometry{});
  }
  std::unique_ptr<StreamedExpertSource> open(double ram_gb = 1, testing::FakeReader* reader = nullptr) {
    StreamOptions o;
    o.ram_gb = ram_gb;
    o.io_threads = 2;
    o.sidecar_path = sidecar_.string();
    if (reader != nullptr) o.reader = reader->fn();
    auto s = StreamedExpertSource::open(file_.path, file_.banks, o);
    EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
    return s.ok() ? std::move(s).value() : nullptr;
  }
  SidecarContents on_disk() const { return read_sidecar(sidecar_.string(), kExperts); }
  testing::TempDir dir_;
  testing::BankFile file_;
  fs::path sidecar_ = dir_ / "state" / "experts" / "banks.usage";
};

TEST_F(SidecarSourceTest, SaveMergesWithTheFileAndNeverCountsTwice) {
  {
    auto s = open();
    ASSERT_TRUE(s);
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(s->acquire(1, 2).ok());
    ASSERT_TRUE(s->acquire(2, 6).ok());
    ASSERT_TRUE(s->save_usage().ok());
    EXPECT_EQ(on_disk().counts.at({1, 2}), 5u);
    ASSERT_TRUE(s->acquire(1, 2).ok());
    ASSERT_TRUE(s->save_usage().ok());  // a periodic save adds only what is new
    EXPECT_EQ(on_disk().counts.at({1, 2}), 6u);
    const std::string before = slurp(sidecar_);
    ASSERT_TRUE(s->save_usage().ok());  // nothing new
    EXPECT_EQ(slurp(sidecar_), before);
  }
  {
    auto s = open();  // the next run adds to the last
    ASSERT_TRUE(s);
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(s->acquire(1, 2).ok());
    ASSERT_TRUE(s->save_usage().ok());
  }
  const SidecarContents c = on_disk();
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.counts.at({1, 2}), 10u);
  EXPECT_EQ(c.counts.at({2, 6}), 1u);
  EXPECT_EQ(c.counts.size(), 2u);
}

TEST_F(SidecarSourceTest, HottestExpertsArePinnedAtTheNextOpenAndNeverEvicted) {
  // Counts: layer 1 expert 5 hottest, then 3; layer 2 expert 0.
  ASSERT_TRUE(write_file_atomic(sidecar_.string(),
                                format_sidecar({{{1, 5}, 100}, {{1, 3}, 50}, {{1, 1}, 1}, {{2, 0}, 9}}))
                  .ok());
  // cap 8 per bank -> pin up to 25% = 2 per bank.
  testing::FakeReader reader;
  auto s = open(1, &reader);
  ASSERT_TRUE(s);
  const ExpertStats st = s->stats();
  EXPECT_EQ(st.cap, 8);
  EXPECT_EQ(st.pinned, 3);  // layer 1: 5 and 3; layer 2: 0 (the only one it has)
  EXPECT_EQ(s->join_layout().pinned, 3);
  EXPECT_EQ(s->slots(1), 6);
  EXPECT_EQ(st.misses, 0u);  // pins are read at open, not by demand
  const int reads_at_open = reader.calls();
  EXPECT_GE(reads_at_open, 9);  // three experts, three matrices each
  // Stream every other expert through many times: the pins are never read again.
  for (int round = 0; round < 5; ++round) {
    for (int e = 0; e < 8; ++e) {
      if (e == 5 || e == 3) continue;
      ASSERT_TRUE(s->acquire(1, e).ok());
    }
  }
  auto hot = s->acquire(1, 5);
  ASSERT_TRUE(hot.ok());
  EXPECT_TRUE(testing::same_expert(hot->weights(), file_.banks[1], 5));
  const uint64_t mid5 = file_.banks[1].gate_offset + 5 * file_.expert_bytes(0) + file_.expert_bytes(0) / 2;
  EXPECT_EQ(reader.reads_covering(mid5), 1);
  EXPECT_EQ(s->stats().pinned, 3);
}

TEST_F(SidecarSourceTest, PinsAreCountedInsideASmallCap) {
  ASSERT_TRUE(write_file_atomic(sidecar_.string(), format_sidecar({{{1, 5}, 100}, {{1, 3}, 50}})).ok());
  // A budget of 4 slots per bank: 25% -> one pin per bank, and only layer 1 has counts.
  testing::FakeReader reader;
  StreamOptions probe;
  probe.ram_gb = 1e-9;
  probe.io_threads = 1;
  auto p = StreamedExpertSource::open(file_.path, file_.banks, probe);
  ASSERT_TRUE(p.ok());
  const double slot = static_cast<double>((*p)->join_layout().bytes_per_expert);
  auto s = open((2 * 4 * slot + slot / 2) / 1e9, &reader);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().cap, 4);
  EXPECT_EQ(s->stats().pinned, 1);
  EXPECT_EQ(s->slots(1), 3);
  EXPECT_EQ(s->slots(2), 4);
  for (int e = 0; e < 8; ++e) ASSERT_TRUE(s->acquire(1, e).ok());
  EXPECT_LE(s->resident_bytes(), s->stats().cache_bytes);
}

TEST_F(SidecarSourceTest, TornOrCorruptSidecarWarnsAndTheGoodLinesStillCount) {
  fs::create_directories(sidecar_.parent_path());
  std::ofstream(sidecar_)
      << "blk.1.ffn_gate_exps.weight 4 40\n\x7f\x45LF garbage\nblk.9.ffn_up_exps.weight 1 1\n"
         "blk.1.ffn_up_exps.weight 6 9";  // torn last line
  auto s = open();
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stats().pinned, 1);  // expert 4 of layer 1 from the good line
  const auto warnings = s->take_warnings();
  EXPECT_EQ(warnings.size(), 3u);
  EXPECT_TRUE(s->take_warnings().empty());
  ASSERT_TRUE(s->acquire(2, 1).ok());
  ASSERT_TRUE(s->save_usage().ok());
  const SidecarContents c = on_disk();  // rewritten clean: only well-formed records
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(c.counts.at({1, 4}), 40u);
  EXPECT_EQ(c.counts.at({2, 1}), 1u);
  EXPECT_EQ(c.counts.size(), 2u);
}

TEST_F(SidecarSourceTest, NoSidecarPathMeansNoFileAndNoPins) {
  StreamOptions o;
  o.ram_gb = 1;
  o.io_threads = 1;
  auto s = StreamedExpertSource::open(file_.path, file_.banks, o);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->acquire(1, 1).ok());
  EXPECT_TRUE((*s)->save_usage().ok());
  EXPECT_FALSE(fs::exists(sidecar_));
  EXPECT_EQ((*s)->stats().pinned, 0);
}

}  // namespace
}  // namespace car::experts

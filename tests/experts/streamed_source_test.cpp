// StreamedExpertSource: streamed leases are the resident bytes at every cap; LRU order and eviction; pins;
// in-flight de-duplication; read errors; O_DIRECT and the buffered fallback; prefetch priority and recall.
#include "core/experts/streamed_source.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "core/experts/resident_source.h"
#include "tests/experts/bank_file.h"
#include "tests/test_support.h"

namespace car::experts {
namespace {

using testing::BankFile;
using testing::BankGeometry;
using testing::FakeReader;

using testing::slot_bytes;

int moe_banks(const BankFile& f) {
  int n = 0;
  for (const auto& b : f.banks) n += b.n_expert > 0 ? 1 : 0;
  return n;
}

/// A budget giving `cap` slots per bank for this file alone.
double ram_gb_for(const BankFile& f, int cap) {
  const uint64_t slot = slot_bytes(f);
  return (static_cast<double>(cap) * moe_banks(f) * static_cast<double>(slot) +
          static_cast<double>(slot) / 2) /
         1e9;
}

std::unique_ptr<StreamedExpertSource> open_ok(const BankFile& f, StreamOptions o) {
  auto s = StreamedExpertSource::open(f.path, f.banks, std::move(o));
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().message);
  return s.ok() ? std::move(s).value() : nullptr;
}

/// File offset of the middle of expert e's gate matrix in layer `layer`: only reads of that expert cover it
/// (a neighbour's aligned O_DIRECT window reaches at most 4095 bytes into it).
uint64_t gate_mid(const BankFile& f, int layer, int e) {
  return f.banks[static_cast<size_t>(layer)].gate_offset + static_cast<uint64_t>(e) * f.expert_bytes(0) +
         f.expert_bytes(0) / 2;
}

class StreamedTest : public ::testing::Test {
 protected:
  void SetUp() override { file_ = testing::make_bank_file((dir_ / "banks.bin").string(), geometry_); }
  /// A source over file_ with room for `cap` experts that reads through `reader`.
  /// `min_precision` is the prefetch gate's (0: every guess is read ahead, as the prefetch tests want).
  std::unique_ptr<StreamedExpertSource> open_reading(FakeReader& reader, int cap, double min_precision = 0) {
    StreamOptions o;
    o.ram_gb = ram_gb_for(file_, cap);
    o.reader = reader.fn();
    o.prefetch_min_precision = min_precision;
    return open_ok(file_, o);
  }
  testing::TempDir dir_;
  BankGeometry geometry_;
  BankFile file_;
};

TEST_F(StreamedTest, LeaseBytesEqualResidentSlicesAtEveryCap) {
  const int n = geometry_.n_expert;
  for (int cap : {1, n / 2, n}) {
    SCOPED_TRACE("cap " + std::to_string(cap));
    StreamOptions o;
    o.ram_gb = ram_gb_for(file_, cap);
    auto src = open_ok(file_, o);
    ASSERT_TRUE(src);
    EXPECT_EQ(src->stats().cap, cap);
    EXPECT_EQ(src->slots(1), cap);
    EXPECT_EQ(src->n_expert(0), 0);
    std::mt19937 rng(3);
    for (int round = 0; round < 3; ++round) {
      for (int l = 1; l < geometry_.layers; ++l) {
        for (int i = 0; i < n; ++i) {
          const int e = static_cast<int>(rng() % static_cast<unsigned>(n));
          auto lease = src->acquire(l, e);
          ASSERT_TRUE(lease.ok()) << lease.error().message;
          EXPECT_TRUE(testing::same_expert(lease->weights(), file_.banks[static_cast<size_t>(l)], e))
              << l << "/" << e;
        }
        // A whole wave of slots(layer) experts at once.
        std::vector<int> wave;
        for (int i = 0; i < src->slots(l); ++i) wave.push_back((i * 3 + round) % n);
        std::vector<ExpertLease> leases;
        ASSERT_TRUE(src->acquire_many(l, wave, leases).ok());
        ASSERT_EQ(leases.size(), wave.size());
        for (size_t i = 0; i < wave.size(); ++i) {
          EXPECT_EQ(leases[i].expert(), wave[i]);
          EXPECT_TRUE(
              testing::same_expert(leases[i].weights(), file_.banks[static_cast<size_t>(l)], wave[i]));
        }
      }
    }
    const ExpertStats st = src->stats();
    EXPECT_EQ(st.mode, "streamed");
    EXPECT_EQ(st.banks, geometry_.layers - 1);
    EXPECT_LE(st.cached, cap * st.banks);  // no leases held: within the cap
    EXPECT_EQ(st.resident_bytes, src->resident_bytes());
    EXPECT_LE(st.resident_bytes, st.cache_bytes);
    EXPECT_GT(st.misses, 0u);
    EXPECT_GT(st.bytes_read, 0u);
    EXPECT_GT(st.read_p50_us, 0);
    EXPECT_GE(st.read_p99_us, st.read_p50_us);
    if (cap == n) {
      EXPECT_EQ(st.misses, static_cast<uint64_t>(st.cached)) << "at full cap every expert is read once";
    }
  }
}

TEST_F(StreamedTest, LeastRecentlyUsedIsEvictedAndHitsDoNotRead) {
  FakeReader reader;
  auto src = open_reading(reader, 3);
  ASSERT_TRUE(src);
  auto use = [&](int e) {
    auto l = src->acquire(1, e);
    ASSERT_TRUE(l.ok());
  };
  auto reads = [&](int e) { return reader.reads_covering(gate_mid(file_, 1, e)); };
  use(0);
  use(1);
  use(2);  // cache: 0 1 2 (LRU first)
  EXPECT_EQ(reads(0) + reads(1) + reads(2), 3);
  use(0);  // hit, refreshes 0: 1 2 0
  EXPECT_EQ(reads(0), 1);
  use(3);  // evicts 1: 2 0 3
  use(2);  // hit: 0 3 2
  EXPECT_EQ(reads(2), 1);
  use(1);  // miss (was evicted), evicts 0: 3 2 1
  EXPECT_EQ(reads(1), 2);
  use(3);  // hit
  EXPECT_EQ(reads(3), 1);
  use(0);  // miss: 0 was the least recently used
  EXPECT_EQ(reads(0), 2);
  const ExpertStats st = src->stats();
  EXPECT_EQ(st.hits, 3u);
  EXPECT_EQ(st.misses, 6u);
  EXPECT_EQ(st.cached, 3);
  EXPECT_NEAR(st.hit_rate, 3.0 / 9.0, 1e-9);
  EXPECT_EQ(src->use_count(1, 0), 3u);
  EXPECT_EQ(src->use_count(1, 5), 0u);
}

// One acquire_many leases its hits before its misses take slots: a miss never evicts an expert the same
// call is about to use (here 0, the least recently used, asked for after the miss 2).
TEST_F(StreamedTest, AcquireManyLeasesItsHitsBeforeItsMissesEvict) {
  FakeReader reader;
  auto src = open_reading(reader, 2);
  ASSERT_TRUE(src);
  ASSERT_TRUE(src->acquire(1, 0).ok());
  ASSERT_TRUE(src->acquire(1, 1).ok());  // cache: 0 1 (LRU first)
  std::vector<ExpertLease> leases;
  const std::vector<int> want = {2, 0};
  ASSERT_TRUE(src->acquire_many(1, want, leases).ok());
  ASSERT_EQ(leases.size(), 2u);
  EXPECT_TRUE(testing::same_expert(leases[0].weights(), file_.banks[1], 2));
  EXPECT_TRUE(testing::same_expert(leases[1].weights(), file_.banks[1], 0));
  leases.clear();
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 1, 0)), 1) << "0 was evicted by the miss of its own call";
  EXPECT_EQ(src->stats().hits, 1u);
  EXPECT_EQ(src->stats().misses, 3u);
}

// A read ahead evicts only experts outside its guess: the guessed experts already held are kept (moved to the
// LRU's back), and a guess with nothing else to evict reads nothing.
TEST_F(StreamedTest, PrefetchNeverEvictsAnExpertOfItsOwnGuess) {
  FakeReader reader;
  auto src = open_reading(reader, 2);  // no gate: every guess is read ahead
  ASSERT_TRUE(src);
  ASSERT_TRUE(src->acquire(1, 0).ok());
  ASSERT_TRUE(src->acquire(1, 1).ok());  // cache: 0 1 (LRU first)
  const std::vector<int> guess = {0, 2};
  src->prefetch(1, guess);  // must evict 1, not 0
  EXPECT_EQ(src->stats().prefetch_issued, 1u);
  std::vector<ExpertLease> leases;
  ASSERT_TRUE(src->acquire_many(1, guess, leases).ok());
  leases.clear();
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 1, 0)), 1);
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 1, 1)), 1);
  EXPECT_EQ(src->stats().misses, 2u) << "only the first two uses missed";
  const std::vector<int> all_held_and_one = {0, 2, 3};
  src->prefetch(1, all_held_and_one);  // 0 and 2 held and guessed: nothing to evict for 3
  EXPECT_EQ(src->stats().prefetch_issued, 1u);
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 1, 3)), 0);
}

TEST_F(StreamedTest, LeasedExpertsAreNeverEvictedAndOverCommitIsGivenBack) {
  StreamOptions o;
  o.ram_gb = ram_gb_for(file_, 2);
  auto src = open_ok(file_, o);
  ASSERT_TRUE(src);
  const uint64_t slot = src->join_layout().bytes_per_expert;
  std::vector<ExpertLease> held;
  const std::vector<int> four = {0, 1, 2, 3};  // twice the cap, all leased at once
  ASSERT_TRUE(src->acquire_many(1, four, held).ok());
  EXPECT_EQ(src->resident_bytes(), 4 * slot);  // over-committed while leased
  for (size_t i = 0; i < held.size(); ++i)
    EXPECT_TRUE(testing::same_expert(held[i].weights(), file_.banks[1], four[i]));
  // Other traffic does not disturb leased bytes.
  for (int e = 4; e < 8; ++e) ASSERT_TRUE(src->acquire(1, e).ok());
  for (size_t i = 0; i < held.size(); ++i)
    EXPECT_TRUE(testing::same_expert(held[i].weights(), file_.banks[1], four[i]));
  held.clear();
  EXPECT_EQ(src->resident_bytes(), 2 * slot);  // back within the cap once the leases end
}

TEST_F(StreamedTest, DuplicateExpertsInOneRequestAreReadOnce) {
  FakeReader reader;
  auto src = open_reading(reader, 4);
  ASSERT_TRUE(src);
  std::vector<ExpertLease> leases;
  const std::vector<int> want = {5, 2, 5, 5};
  ASSERT_TRUE(src->acquire_many(2, want, leases).ok());
  ASSERT_EQ(leases.size(), 4u);
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 2, 5)), 1);
  EXPECT_EQ(leases[0].weights().gate.data, leases[3].weights().gate.data);
  EXPECT_TRUE(testing::same_expert(leases[2].weights(), file_.banks[2], 5));
  EXPECT_EQ(src->use_count(2, 5), 3u);
}

TEST_F(StreamedTest, TwoThreadsWantingTheSameMissingExpertReadItOnce) {
  FakeReader reader;
  auto src = open_reading(reader, 4);
  ASSERT_TRUE(src);
  const uint64_t at = gate_mid(file_, 1, 6);
  reader.gate_at(at);
  auto first = std::async(std::launch::async, [&] { return src->acquire(1, 6).ok(); });
  reader.wait_blocked(1);  // the first request's read is in flight
  auto second = std::async(std::launch::async, [&] { return src->acquire(1, 6).ok(); });
  while (src->stats().hits < 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // second is waiting
  reader.open_gate();
  EXPECT_TRUE(first.get());
  EXPECT_TRUE(second.get());
  EXPECT_EQ(reader.reads_covering(at), 1);
  EXPECT_EQ(src->stats().misses, 1u);
  EXPECT_EQ(src->stats().hits, 1u);
}

TEST_F(StreamedTest, ReadErrorFailsTheRequestAndEveryWaiterThenTheNextFetchWorks) {
  FakeReader reader;
  auto src = open_reading(reader, 4);
  ASSERT_TRUE(src);
  // The up matrix fails, so gate was read first: the slot must not be admitted half-filled.
  const uint64_t up_at = file_.banks[2].up_offset + 3 * file_.expert_bytes(1) + file_.expert_bytes(1) / 2;
  reader.fail_at(up_at, EIO);
  reader.gate_at(gate_mid(file_, 2, 3));
  auto first = std::async(std::launch::async, [&] { return src->acquire(2, 3); });
  reader.wait_blocked(1);
  auto second = std::async(std::launch::async, [&] { return src->acquire(2, 3); });
  while (src->stats().hits < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  reader.open_gate();
  for (auto* f : {&first, &second}) {
    auto r = f->get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, "io_error");
    EXPECT_NE(r.error().message.find(file_.path), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("blk.2.ffn_up_exps.weight"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("offset"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find(std::strerror(EIO)), std::string::npos) << r.error().message;
  }
  EXPECT_EQ(src->stats().cached, 0);
  EXPECT_EQ(src->resident_bytes(), 0u);
  // A many-expert request with one bad expert fails whole and holds nothing.
  std::vector<ExpertLease> leases;
  const std::vector<int> mixed = {1, 3};
  EXPECT_FALSE(src->acquire_many(2, mixed, leases).ok());
  EXPECT_TRUE(leases.empty());
  reader.clear_failures();
  auto ok = src->acquire(2, 3);
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(testing::same_expert(ok->weights(), file_.banks[2], 3));
  EXPECT_TRUE(src->acquire(2, 1).ok());  // expert 1 was admitted by the failed request
}

TEST_F(StreamedTest, FileTruncatedAfterOpenIsAnIoErrorBothWithAndWithoutODirect) {
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
    file_ = testing::make_bank_file((dir_ / "banks.bin").string(), geometry_);
    StreamOptions o;
    o.ram_gb = ram_gb_for(file_, 4);
    o.direct_io = direct;
    auto src = open_ok(file_, o);
    ASSERT_TRUE(src);
    const int last = geometry_.layers - 1;
    const uint64_t cut = file_.banks[static_cast<size_t>(last)].down_offset + 6 * file_.expert_bytes(2);
    ASSERT_EQ(::truncate(file_.path.c_str(), static_cast<off_t>(cut)), 0);
    auto r = src->acquire(last, 7);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, "io_error");
    EXPECT_NE(r.error().message.find("truncated"), std::string::npos) << r.error().message;
    // The sizes it names are the matrix's own (issue #23: the O_DIRECT lead once made the shortfall larger
    // than the matrix): expert 7 lies wholly past the cut, so all of its bytes are missing.
    const uint64_t matrix = file_.expert_bytes(2);
    EXPECT_NE(r.error().message.find("ends " + std::to_string(matrix) + " bytes short of the " +
                                     std::to_string(matrix) + "-byte matrix"),
              std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find("(0 of its bytes are there"), std::string::npos) << r.error().message;
    auto fine = src->acquire(last, 2);  // before the cut: still served
    ASSERT_TRUE(fine.ok()) << fine.error().message;
  }
}

TEST(StreamedIo, ODirectReadsAlignedWindowsOnARealFilesystem) {
  // tmpfs may refuse O_DIRECT; the build directory is on a disk filesystem.
  const std::filesystem::path dir = std::filesystem::path(CAR_BINARY_DIR) / "tests" / "experts";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / ("odirect-" + std::to_string(::getpid()) + ".bin")).string();
  BankGeometry g;
  BankFile f = testing::make_bank_file(path, g);
  FakeReader reader;
  StreamOptions o;
  o.ram_gb = 1;
  o.reader = reader.fn();
  auto src = open_ok(f, o);
  ASSERT_TRUE(src);
  if (!src->direct_io()) {
    std::filesystem::remove(path);
    GTEST_SKIP() << dir << " refuses O_DIRECT";
  }
  for (int l = 1; l < g.layers; ++l) {
    for (int e = 0; e < g.n_expert; ++e) {
      auto lease = src->acquire(l, e);
      ASSERT_TRUE(lease.ok()) << lease.error().message;
      EXPECT_TRUE(testing::same_expert(lease->weights(), f.banks[static_cast<size_t>(l)], e));
    }
  }
  EXPECT_EQ(reader.direct_calls(), reader.calls());
  EXPECT_TRUE(reader.direct_calls_aligned());
  EXPECT_TRUE(src->direct_io());
  std::filesystem::remove(path);
}

TEST_F(StreamedTest, ODirectRefusedAtReadFallsBackToBufferedReads) {
  FakeReader reader;
  reader.refuse_direct(true);
  StreamOptions o;
  o.ram_gb = 1;
  o.reader = reader.fn();
  auto src = open_ok(file_, o);
  ASSERT_TRUE(src);
  const bool started_direct = src->direct_io();
  for (int e = 0; e < geometry_.n_expert; ++e) {
    auto lease = src->acquire(1, e);
    ASSERT_TRUE(lease.ok()) << lease.error().message;
    EXPECT_TRUE(testing::same_expert(lease->weights(), file_.banks[1], e));
  }
  EXPECT_FALSE(src->direct_io());
  if (started_direct) {
    EXPECT_EQ(reader.direct_calls(), 1);  // the one refused read; every later read is buffered
    bool warned = false;
    for (const auto& w : src->take_warnings()) warned |= w.find("O_DIRECT") != std::string::npos;
    EXPECT_TRUE(warned);
  }
  EXPECT_GT(reader.calls(), reader.direct_calls());
}

TEST_F(StreamedTest, BufferedModeNeverUsesODirect) {
  FakeReader reader;
  StreamOptions o;
  o.ram_gb = 1;
  o.direct_io = false;
  o.reader = reader.fn();
  auto src = open_ok(file_, o);
  ASSERT_TRUE(src);
  EXPECT_FALSE(src->direct_io());
  for (int e = 0; e < geometry_.n_expert; ++e) {
    auto lease = src->acquire(2, e);
    ASSERT_TRUE(lease.ok());
    EXPECT_TRUE(testing::same_expert(lease->weights(), file_.banks[2], e));
  }
  EXPECT_EQ(reader.direct_calls(), 0);
  EXPECT_EQ(reader.calls(), 3 * geometry_.n_expert);  // exactly the three matrices, once each
}

TEST_F(StreamedTest, PrefetchedExpertsAreHitsAndCountForRecall) {
  FakeReader reader;
  auto src = open_reading(reader, 4);
  ASSERT_TRUE(src);
  const std::vector<int> next = {1, 2};
  src->prefetch(1, next);
  while (src->stats().cached < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto a = src->acquire(1, 1);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(testing::same_expert(a->weights(), file_.banks[1], 1));
  auto b = src->acquire(1, 5);  // not prefetched: a miss
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 1, 1)), 1);
  ExpertStats st = src->stats();
  EXPECT_EQ(st.prefetch_issued, 2u);
  EXPECT_EQ(st.prefetch_used, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.hits, 1u);
  EXPECT_NEAR(st.prefetch_recall, 0.5, 1e-9);  // one of the two reads demand needed was prefetched
  src->prefetch(1, next);                      // already cached: nothing issued
  EXPECT_EQ(src->stats().prefetch_issued, 2u);
}

TEST_F(StreamedTest, PrefetchNeverDelaysADemandRead) {
  FakeReader reader;
  StreamOptions o;
  o.ram_gb = ram_gb_for(file_, 8);
  o.io_threads = 2;  // one reader may serve prefetches, the other stays free for demand
  o.reader = reader.fn();
  o.prefetch_min_precision = 0;  // no gate: every guess is read ahead
  auto src = open_ok(file_, o);
  ASSERT_TRUE(src);
  reader.gate_at(gate_mid(file_, 1, 4));
  const std::vector<int> pf = {4, 5};
  src->prefetch(1, pf);
  reader.wait_blocked(1);  // prefetch of 4 is in flight and stuck; 5 is queued behind it
  // A demand read of an expert nobody prefetched goes straight through, and so does a demand for the queued
  // prefetch (5), promoted to the demand queue. (Both would wait for the gate if demand queued behind
  // prefetch: the bounded wait turns that into a failure rather than a hang.)
  auto demands = std::async(std::launch::async, [&] {
    auto d = src->acquire(1, 6);
    auto p = src->acquire(1, 5);
    return d.ok() && p.ok() && testing::same_expert(p->weights(), file_.banks[1], 5);
  });
  const bool through = demands.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
  EXPECT_TRUE(through) << "demand reads waited behind a stuck prefetch";
  if (!through) reader.open_gate();
  EXPECT_TRUE(demands.get());
  // A demand for the one being read (4) waits for that read rather than issuing another.
  auto w = std::async(std::launch::async, [&] { return src->acquire(1, 4).ok(); });
  while (src->stats().prefetch_used < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  reader.open_gate();
  EXPECT_TRUE(w.get());
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 1, 4)), 1);
  EXPECT_EQ(reader.reads_covering(gate_mid(file_, 1, 5)), 1);  // the queued prefetch job skipped
  EXPECT_EQ(src->stats().prefetch_used, 2u);
}

// ---- the prefetch gate ----------------------------------------------------------------------------------

/// One step of a deterministic "router": two distinct experts of 8 for layer 1.
std::vector<int> step_demand(std::mt19937& rng) {
  const int a = static_cast<int>(rng() % 8);
  const int b = (a + 1 + static_cast<int>(rng() % 7)) % 8;
  return {a, b};
}

/// A guess that misses the step entirely: two experts the step does not use.
std::vector<int> bad_guess(const std::vector<int>& demand) {
  std::vector<int> g;
  for (int e = 0; e < 8 && g.size() < 2; ++e) {
    if (std::find(demand.begin(), demand.end(), e) == demand.end()) g.push_back(e);
  }
  return g;
}

/// `steps` steps of layer 1: guess (prefetch), then lease the step's experts; every lease's bytes checked.
void run_steps(StreamedExpertSource& src, std::mt19937& rng, int steps, bool guess, bool good,
               const testing::BankFile& file) {
  std::vector<ExpertLease> leases;
  for (int i = 0; i < steps; ++i) {
    const std::vector<int> demand = step_demand(rng);
    if (guess) src.prefetch(1, good ? demand : bad_guess(demand));
    ASSERT_TRUE(src.acquire_many(1, demand, leases).ok());
    for (size_t k = 0; k < leases.size(); ++k) {
      ASSERT_TRUE(testing::same_expert(leases[k].weights(), file.banks[1], demand[k]));
    }
    leases.clear();
  }
}

// Guesses that never match: the gate never opens, so not one prefetch read is made and the bytes read are
// exactly those without prefetch (the same demand leaves the same cache); the guesses are still scored.
TEST_F(StreamedTest, PrefetchGateStaysClosedForBadGuessesAndReadsNoMoreThanWithout) {
  FakeReader r_off, r_bad;
  auto off = open_reading(r_off, 3, 0.5);
  auto bad = open_reading(r_bad, 3, 0.5);
  ASSERT_TRUE(off && bad);
  std::mt19937 rng_off(42), rng_bad(42);
  run_steps(*off, rng_off, 60, false, false, file_);
  run_steps(*bad, rng_bad, 60, true, false, file_);
  const ExpertStats so = off->stats();
  const ExpertStats sb = bad->stats();
  EXPECT_EQ(sb.prefetch_issued, 0u);
  EXPECT_EQ(sb.bytes_read, so.bytes_read);
  EXPECT_EQ(sb.misses, so.misses);
  EXPECT_GT(sb.prefetch_scored, 0u);
  EXPECT_EQ(sb.prefetch_precision, 0.0);
  EXPECT_EQ(sb.prefetch_layers_on, 0);
  // Without the gate the same bad guesses are read, and the reads are wasted.
  FakeReader r_ungated;
  auto ungated = open_reading(r_ungated, 3, 0);
  ASSERT_TRUE(ungated);
  std::mt19937 rng_ungated(42);
  run_steps(*ungated, rng_ungated, 60, true, false, file_);
  EXPECT_GT(ungated->stats().prefetch_issued, 0u);
  EXPECT_GT(ungated->stats().bytes_read, so.bytes_read);
}

// Guesses that match open the gate after a few steps and keep it open; when they turn bad it closes (no
// more reads ahead), and the probes it keeps scoring open it again once they are good again.
TEST_F(StreamedTest, PrefetchGateOpensForGoodGuessesClosesForBadAndReopens) {
  FakeReader reader;
  auto src = open_reading(reader, 3, 0.5);
  ASSERT_TRUE(src);
  std::mt19937 rng(7);
  run_steps(*src, rng, 30, true, true, file_);
  ExpertStats st = src->stats();
  EXPECT_GT(st.prefetch_issued, 0u);
  EXPECT_GT(st.prefetch_used, 0u);
  EXPECT_EQ(st.prefetch_layers_on, 1);
  EXPECT_EQ(st.prefetch_precision, 1.0);

  run_steps(*src, rng, 30, true, false, file_);
  st = src->stats();
  EXPECT_EQ(st.prefetch_layers_on, 0);
  EXPECT_LT(st.prefetch_precision, 0.5);
  const uint64_t issued = st.prefetch_issued;
  run_steps(*src, rng, 10, true, false, file_);
  EXPECT_EQ(src->stats().prefetch_issued, issued) << "a closed gate reads nothing ahead";

  run_steps(*src, rng, 30, true, true, file_);
  st = src->stats();
  EXPECT_EQ(st.prefetch_layers_on, 1);
  EXPECT_GT(st.prefetch_issued, issued);
}

TEST_F(StreamedTest, BankGeometryPastTheEndOfTheFileIsALoadError) {
  auto banks = file_.banks;
  banks[2].down_offset = file_.map.size() - 10;
  auto r = StreamedExpertSource::open(file_.path, banks, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "load_failed");
  EXPECT_NE(r.error().message.find("blk.2.ffn_down_exps.weight"), std::string::npos) << r.error().message;
  auto missing = StreamedExpertSource::open((dir_ / "nope.gguf").string(), file_.banks, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, "io_error");
}

TEST_F(StreamedTest, ConcurrentTrafficKeepsBytesRightAndTheCacheBounded) {
  StreamOptions o;
  o.ram_gb = ram_gb_for(file_, 3);
  o.prefetch_min_precision = 0;  // prefetches really read, concurrently with demand
  auto src = open_ok(file_, o);
  ASSERT_TRUE(src);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t));
      std::vector<ExpertLease> leases;
      for (int i = 0; i < 150; ++i) {
        const int l = 1 + static_cast<int>(rng() % 2);
        std::vector<int> want = {static_cast<int>(rng() % 8), static_cast<int>(rng() % 8)};
        if (i % 3 == 0) src->prefetch(l, want);
        if (!src->acquire_many(l, want, leases).ok()) ++bad;
        for (size_t k = 0; k < leases.size(); ++k) {
          if (!testing::same_expert(leases[k].weights(), file_.banks[static_cast<size_t>(l)], want[k])) ++bad;
        }
        leases.clear();
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  // Settle the prefetches still in flight, then every bank is back within its cap.
  for (int i = 0; i < 2000 && src->resident_bytes() > src->stats().cache_bytes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_LE(src->resident_bytes(), src->stats().cache_bytes);
}

/// RssAnon of this process, bytes (anonymous resident memory: the slots; not the mapping, not page cache).
uint64_t rss_anon() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("RssAnon:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  }
  return 0;
}

TEST(StreamedRss, ResidentMemoryStaysWithinTheCacheWhileStreamingEveryExpert) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "sanitizer shadow memory makes RSS meaningless";
#endif
  if (rss_anon() == 0) GTEST_SKIP() << "no RssAnon in /proc/self/status";
  testing::TempDir dir;
  BankGeometry g;
  g.n_expert = 16;
  g.n_embd = 256;
  g.n_ff = 256;  // 768 KiB per expert, 12 MiB per bank, 24 MiB of experts
  BankFile f = testing::make_bank_file((dir / "big.bin").string(), g);
  StreamOptions o;
  o.ram_gb = ram_gb_for(f, 2);
  auto src = open_ok(f, o);
  ASSERT_TRUE(src);
  const uint64_t cache = src->stats().cache_bytes;
  const uint64_t experts_total = 2ull * 16 * 3 * f.expert_bytes(0);
  const uint64_t slack = 4ull << 20;  // allocator and thread-stack noise
  ASSERT_LT(cache + slack, experts_total / 2) << "the bound would not show anything";
  const uint64_t base = rss_anon();
  uint64_t peak = base;
  for (int round = 0; round < 3; ++round) {
    for (int l = 1; l < g.layers; ++l) {
      for (int e = 0; e < g.n_expert; ++e) {
        auto lease = src->acquire(l, e);
        ASSERT_TRUE(lease.ok());
        ASSERT_TRUE(testing::same_expert(lease->weights(), f.banks[static_cast<size_t>(l)], e));
        peak = std::max(peak, rss_anon());
      }
    }
  }
  EXPECT_EQ(src->stats().misses, 3u * 2 * 16);  // everything was really streamed, three times over
  EXPECT_LE(peak - base, cache + slack) << "cache " << cache << ", experts " << experts_total;
  src.reset();
  EXPECT_LE(rss_anon(), base + slack);  // slots are returned to the system, not kept by the allocator
}

}  // namespace
}  // namespace car::experts

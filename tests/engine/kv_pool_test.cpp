// KvCache's memory (core/engine/kv_cache.h): the mapping holds only the pages of the rows written, shrink()
// gives back the whole pages past a kept prefix, and resident_bytes() - the pages counted from the rows -
// equals what the kernel reports for the mapping (mincore), on a layout whose regions are whole pages and
// on one whose regions straddle pages. The scheduler's pool over these caches is tested in
// scheduler_test.cpp (KvPool*).
#include "core/engine/kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/util/error_codes.h"

namespace car::engine {
namespace {

struct Shape {
  int64_t n_layer, n_ctx, n_head_kv, dk, dv;
};

/// Write rows [from, to) of every region with a pattern that depends on (region, row, column).
void write_rows(KvCache& kv, const Shape& s, int64_t from, int64_t to) {
  for (int64_t l = 0; l < s.n_layer; ++l) {
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      for (int64_t p = from; p < to; ++p) {
        for (int64_t d = 0; d < s.dk; ++d) kv.k(l, h)[p * s.dk + d] = static_cast<uint16_t>(1 + l * 7 + h * 5 + p + d);
        for (int64_t d = 0; d < s.dv; ++d) kv.v(l, h)[p * s.dv + d] = static_cast<uint16_t>(2 + l * 3 + h * 11 + p + d);
      }
    }
  }
}

bool rows_hold_pattern(const KvCache& kv, const Shape& s, int64_t from, int64_t to) {
  for (int64_t l = 0; l < s.n_layer; ++l) {
    for (int64_t h = 0; h < s.n_head_kv; ++h) {
      for (int64_t p = from; p < to; ++p) {
        for (int64_t d = 0; d < s.dk; ++d) {
          if (kv.k(l, h)[p * s.dk + d] != static_cast<uint16_t>(1 + l * 7 + h * 5 + p + d)) return false;
        }
        for (int64_t d = 0; d < s.dv; ++d) {
          if (kv.v(l, h)[p * s.dv + d] != static_cast<uint16_t>(2 + l * 3 + h * 11 + p + d)) return false;
        }
      }
    }
  }
  return true;
}

class KvCacheMemoryTest : public ::testing::TestWithParam<Shape> {};

TEST_P(KvCacheMemoryTest, PagesFollowTheRowsWrittenAndGoBackOnShrink) {
  const Shape s = GetParam();
  auto made = KvCache::create(s.n_layer, s.n_ctx, s.n_head_kv, s.dk, s.dv);
  ASSERT_TRUE(made.ok()) << made.error().message;
  KvCache& kv = *made;
  const uint64_t page = KvMapping::page_size();
  const uint64_t regions = static_cast<uint64_t>(s.n_layer * s.n_head_kv);
  // Nothing is written at creation: nothing is resident, however large the context.
  EXPECT_EQ(kv.mapping().resident_bytes(), 0u);
  EXPECT_EQ(kv.resident_bytes(), 0u);
  EXPECT_GE(kv.mapping().size(), kv.size_bytes());

  // Rows written: the pages of the first rows of each region, and no more than a page per region over them.
  const int64_t n1 = s.n_ctx / 2 + 3;
  write_rows(kv, s, 0, n1);
  kv.advance(n1);
  EXPECT_EQ(kv.touched(), n1);
  const uint64_t r1 = kv.mapping().resident_bytes();
  EXPECT_EQ(r1, kv.resident_bytes());
  const uint64_t rows_bytes = static_cast<uint64_t>(n1) * regions * static_cast<uint64_t>(s.dk + s.dv) * 2;
  EXPECT_GE(r1, rows_bytes);
  EXPECT_LE(r1, rows_bytes + 4 * regions * page);
  EXPECT_LT(r1, kv.size_bytes()) << "half a context holds less than the whole";

  // A prefix kept: the pages wholly past it go back, the kept rows are intact.
  const int64_t keep = 5;
  kv.shrink(keep);
  EXPECT_EQ(kv.n_past(), keep);
  const uint64_t r2 = kv.mapping().resident_bytes();
  EXPECT_EQ(r2, kv.resident_bytes());
  EXPECT_EQ(r2, kv.resident_bytes(keep));
  EXPECT_LT(r2, r1);
  EXPECT_TRUE(rows_hold_pattern(kv, s, 0, keep));

  // Writing on from the prefix brings pages back; a shrink to where nothing was written since is a no-op.
  write_rows(kv, s, keep, n1);
  kv.advance(n1 - keep);
  EXPECT_EQ(kv.mapping().resident_bytes(), r1);
  kv.shrink(n1);
  EXPECT_EQ(kv.mapping().resident_bytes(), r1);
  EXPECT_TRUE(rows_hold_pattern(kv, s, 0, n1));

  // Rows written but never advanced over (a failed step) are given back once touch() names them.
  write_rows(kv, s, n1, s.n_ctx);
  EXPECT_GT(kv.mapping().resident_bytes(), r1);
  kv.touch(s.n_ctx);
  kv.shrink(n1);
  EXPECT_EQ(kv.mapping().resident_bytes(), r1);

  // A prefix kept with its successor's rows retained (a request admitted to write up to `retain`): n_past
  // is the prefix, the pages up to `retain` stay - those of the rows past it go back - and a later shrink
  // still gives the retained ones back.
  write_rows(kv, s, n1, s.n_ctx);
  kv.touch(s.n_ctx);
  const int64_t retain = n1 + (s.n_ctx - n1) / 2;
  kv.shrink(keep, retain);
  EXPECT_EQ(kv.n_past(), keep);
  EXPECT_EQ(kv.touched(), retain);
  EXPECT_EQ(kv.mapping().resident_bytes(), kv.resident_bytes(retain));
  EXPECT_GT(kv.mapping().resident_bytes(), r1);
  EXPECT_TRUE(rows_hold_pattern(kv, s, 0, retain)) << "the retained rows were not given back";
  kv.shrink(keep, retain - 100000);  // a retain below the prefix is the prefix
  EXPECT_EQ(kv.mapping().resident_bytes(), r2);
  EXPECT_EQ(kv.touched(), keep);

  // Everything dropped: nothing resident, and the rows read as zero again.
  kv.shrink(0);
  EXPECT_EQ(kv.mapping().resident_bytes(), 0u);
  EXPECT_EQ(kv.resident_bytes(), 0u);
  EXPECT_EQ(kv.k(0, 0)[0], 0u);
  EXPECT_EQ(kv.v(s.n_layer - 1, s.n_head_kv - 1)[s.dv - 1], 0u);
}

// prepare(end) makes resident exactly the pages that writing rows up to `end` would (whatever the kernel
// supports: populated now, or at first write), marks them touched so a shrink gives them back, and never
// changes a row already written.
TEST_P(KvCacheMemoryTest, PrepareHoldsThePagesWritingWouldAndShrinkGivesThemBack) {
  const Shape s = GetParam();
  auto made = KvCache::create(s.n_layer, s.n_ctx, s.n_head_kv, s.dk, s.dv);
  ASSERT_TRUE(made.ok()) << made.error().message;
  KvCache& kv = *made;
  const int64_t n1 = s.n_ctx / 3 + 1;
  kv.prepare(n1);
  EXPECT_EQ(kv.touched(), n1);
  EXPECT_EQ(kv.n_past(), 0);
  EXPECT_LE(kv.mapping().resident_bytes(), kv.resident_bytes(n1));
  write_rows(kv, s, 0, n1);
  kv.advance(n1);
  EXPECT_EQ(kv.mapping().resident_bytes(), kv.resident_bytes(n1));
  // Row by row, as decode prepares: the resident pages follow the rows, the written rows stay.
  for (int64_t end = n1 + 1; end <= s.n_ctx / 2 + 7; ++end) {
    kv.prepare(end);
    write_rows(kv, s, end - 1, end);
    kv.advance(1);
    ASSERT_EQ(kv.mapping().resident_bytes(), kv.resident_bytes(end)) << end;
  }
  EXPECT_TRUE(rows_hold_pattern(kv, s, 0, kv.n_past()));
  // Prepared past the rows written (a step that then failed): a shrink still gives every page back.
  kv.prepare(s.n_ctx);
  EXPECT_EQ(kv.touched(), s.n_ctx);
  EXPECT_TRUE(rows_hold_pattern(kv, s, 0, kv.n_past()));
  kv.shrink(5);
  EXPECT_EQ(kv.mapping().resident_bytes(), kv.resident_bytes(5));
  EXPECT_TRUE(rows_hold_pattern(kv, s, 0, 5));
  // After the shrink, prepare brings the pages back (it does not trust what it populated before).
  kv.prepare(s.n_ctx / 2);
  write_rows(kv, s, 5, s.n_ctx / 2);
  kv.advance(s.n_ctx / 2 - 5);
  EXPECT_EQ(kv.mapping().resident_bytes(), kv.resident_bytes(s.n_ctx / 2));
  EXPECT_TRUE(rows_hold_pattern(kv, s, 0, s.n_ctx / 2));
  kv.shrink(0);
  EXPECT_EQ(kv.mapping().resident_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Layouts, KvCacheMemoryTest,
                         ::testing::Values(Shape{2, 256, 2, 64, 64},   // regions of 8 whole pages
                                           Shape{3, 100, 2, 48, 40},   // regions that straddle pages
                                           Shape{1, 1000, 1, 80, 64}),  // one head, K and V of other widths
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           const Shape& s = i.param;
                           return "l" + std::to_string(s.n_layer) + "_ctx" + std::to_string(s.n_ctx) + "_h" +
                                  std::to_string(s.n_head_kv) + "_k" + std::to_string(s.dk) + "_v" +
                                  std::to_string(s.dv);
                         });

TEST(KvMapping, ARefusedMappingIsAnErrorNotACrash) {
  auto m = KvMapping::map(size_t{1} << 62);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, errc::kInternal);
  EXPECT_NE(m.error().message.find("KV cache: cannot map"), std::string::npos) << m.error().message;
}

TEST(KvMapping, MovesOwnership) {
  auto m = KvMapping::map(3 * KvMapping::page_size() + 1);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->size(), 4 * KvMapping::page_size());
  std::memset(m->data(), 1, 10);
  KvMapping other = std::move(*m);
  EXPECT_EQ(m->data(), nullptr);
  EXPECT_EQ(other.resident_bytes(), KvMapping::page_size());
  other.release(0, other.size());
  EXPECT_EQ(other.resident_bytes(), 0u);
}

}  // namespace
}  // namespace car::engine

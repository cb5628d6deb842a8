// LineFramer (daemon/protocol/framing.h): lines cut across chunks, an over-long line reported once and the
// framing kept.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "daemon/protocol.h"

namespace car {
namespace {

using nlohmann::json;
using protocol::LineFramer;

TEST(DaemonProtocol, FramerSaysWhetherALineIsOpen) {
  LineFramer f(4);
  std::vector<LineFramer::Item> out;
  EXPECT_FALSE(f.in_line());
  f.feed("ab", out);
  EXPECT_TRUE(f.in_line());
  f.feed("\n", out);
  EXPECT_FALSE(f.in_line());
  f.feed("123456", out);  // over-long, being discarded: still an open line
  EXPECT_EQ(f.buffered(), 0u);
  EXPECT_TRUE(f.in_line());
  f.feed("\n", out);
  EXPECT_FALSE(f.in_line());
}

TEST(DaemonProtocol, FramerSplitsLinesAcrossChunks) {
  LineFramer f(16);
  std::vector<LineFramer::Item> out;
  f.feed("ab", out);
  f.feed("c\nde\n\nf", out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].line, "abc");
  EXPECT_EQ(out[1].line, "de");
  EXPECT_EQ(out[2].line, "");
  EXPECT_EQ(f.buffered(), 1u);
  f.feed("g\n", out);
  EXPECT_EQ(out.back().line, "fg");
}

TEST(DaemonProtocol, FramerReportsAnOversizedLineOnceAndResynchronizes) {
  LineFramer f(8);
  std::vector<LineFramer::Item> out;
  f.feed("12345678\n", out);  // exactly the limit: fine
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, LineFramer::Item::Kind::kLine);
  out.clear();
  f.feed("1234", out);
  f.feed("56789", out);  // over the limit, no newline yet
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].kind, LineFramer::Item::Kind::kOversized);
  EXPECT_EQ(f.buffered(), 0u);  // nothing of it is kept
  f.feed(std::string(1000, 'z'), out);
  EXPECT_EQ(out.size(), 1u);
  f.feed("zz\nok\n", out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[1].line, "ok");
  out.clear();
  f.feed("123456789\nnext\n", out);  // oversized and complete in one chunk
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].kind, LineFramer::Item::Kind::kOversized);
  EXPECT_EQ(out[1].line, "next");
}

}  // namespace
}  // namespace car

// daemon/safe_text.h: log_quote and log_id, which keep what a client sent from forging or hiding a log field.
#include <gtest/gtest.h>

#include "daemon/safe_text.h"

namespace car {
namespace {

TEST(DaemonSafeText, LogQuoteEscapesEverythingThatCouldForgeOrHideAField) {
  using daemon::log_quote;
  EXPECT_EQ(log_quote("tiny"), "\"tiny\"");
  EXPECT_EQ(log_quote(""), "\"\"");
  EXPECT_EQ(log_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(log_quote("x\nconn=1 outcome=ok"), "\"x\\u000Aconn=1 outcome=ok\"");
  EXPECT_EQ(log_quote("\r\t\x1b[31m\x7f"), "\"\\u000D\\u0009\\u001B[31m\\u007F\"");
  EXPECT_EQ(log_quote("\xc2\x85"), "\"\\u0085\"");      // C1 NEL
  EXPECT_EQ(log_quote("\xe2\x80\xa8"), "\"\\u2028\"");  // line separator
  EXPECT_EQ(log_quote("a\xe2\x80\xae"
                      "b"),
            "\"a\\u202Eb\"");                           // right-to-left override
  EXPECT_EQ(log_quote("\xe2\x81\xa6"), "\"\\u2066\"");  // left-to-right isolate
  EXPECT_EQ(log_quote("\xef\xbb\xbf"), "\"\\uFEFF\"");
  EXPECT_EQ(log_quote("caf\xc3\xa9 \xe6\xa8\xa1\xe5\x9e\x8b"), "\"caf\xc3\xa9 \xe6\xa8\xa1\xe5\x9e\x8b\"")
      << "text stays";
  EXPECT_EQ(log_quote("\xff\xc3"), "\"\\xFF\\xC3\"");           // not UTF-8
  EXPECT_EQ(log_quote("\xc0\xaf"), "\"\\xC0\\xAF\"");           // overlong '/'
  EXPECT_EQ(log_quote("\xed\xa0\x80"), "\"\\xED\\xA0\\x80\"");  // a surrogate
  EXPECT_EQ(daemon::log_id(nullptr), "-");
  EXPECT_EQ(daemon::log_id(7), "7");
  EXPECT_EQ(daemon::log_id(true), "true");
  EXPECT_EQ(daemon::log_id("a b\n"), "\"a b\\u000A\"");
}

}  // namespace
}  // namespace car

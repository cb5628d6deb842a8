// parse_env_file: the systemd EnvironmentFile= syntax the config file shares with the service unit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/env_file.h"

namespace car::config {
namespace {

std::vector<EnvAssignment> parse_ok(std::string_view text) {
  auto r = parse_env_file(text, "test.env");
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
  return r.ok() ? r.value() : std::vector<EnvAssignment>{};
}

std::string value_of(std::string_view text) {
  auto a = parse_ok(text);
  EXPECT_EQ(a.size(), 1u);
  return a.empty() ? std::string("<none>") : a[0].value;
}

TEST(SettingsEnvFileTest, CommentsBlankLinesAndLeadingWhitespace) {
  auto a = parse_ok("# a comment\n; another comment\n\n   \n  KEY=1\n\tOTHER=two\n");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].key, "KEY");
  EXPECT_EQ(a[0].value, "1");
  EXPECT_EQ(a[0].line, 5);
  EXPECT_EQ(a[1].key, "OTHER");
  EXPECT_EQ(a[1].value, "two");
  EXPECT_EQ(a[1].line, 6);
}

TEST(SettingsEnvFileTest, UnquotedValuesTrimOutsideButKeepInteriorWhitespace) {
  EXPECT_EQ(value_of("K=  a  b  \n"), "a  b");
  EXPECT_EQ(value_of("K = v\n"), "v") << "whitespace around the key is dropped";
  EXPECT_EQ(value_of("K=v # not a comment\n"), "v # not a comment");
  EXPECT_EQ(value_of("K=a\"b'c\n"), "a\"b'c") << "quotes after the first character are literal";
  EXPECT_EQ(value_of("K=a=b\n"), "a=b");
  EXPECT_EQ(value_of("K=\n"), "");
  EXPECT_EQ(value_of("K=last"), "last") << "no final newline";
}

TEST(SettingsEnvFileTest, CarriageReturnsAreWhitespace) {
  auto a = parse_ok("A=1\r\nB=two words\r\n");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].value, "1");
  EXPECT_EQ(a[1].value, "two words");
}

TEST(SettingsEnvFileTest, SingleQuotesAreVerbatim) {
  EXPECT_EQ(value_of("K='a \\n \"b\" $c'\n"), "a \\n \"b\" $c");
  EXPECT_EQ(value_of("K='  padded  '\n"), "  padded  ");
  EXPECT_EQ(value_of("K=  'x'  \n"), "x") << "whitespace outside the quotes is dropped";
}

TEST(SettingsEnvFileTest, DoubleQuotesHonourShellEscapes) {
  EXPECT_EQ(value_of("K=\"a \\\"q\\\" \\\\ \\$HOME \\`x\\`\"\n"), "a \"q\" \\ $HOME `x`");
  EXPECT_EQ(value_of("K=\"keep \\n as is\"\n"), "keep \\n as is") << "unknown escapes keep the backslash";
  EXPECT_EQ(value_of("K=\"  spaces  \"\n"), "  spaces  ");
}

TEST(SettingsEnvFileTest, QuotedPiecesConcatenate) {
  EXPECT_EQ(value_of("K='a'\"b\"c\n"), "abc");
}

TEST(SettingsEnvFileTest, QuotedValuesSpanLinesAndLineNumbersFollow) {
  auto a = parse_ok("A='one\ntwo'\nB=\"x\ny\"\nC=3\n");
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a[0].value, "one\ntwo");
  EXPECT_EQ(a[0].line, 1);
  EXPECT_EQ(a[1].value, "x\ny");
  EXPECT_EQ(a[1].line, 3);
  EXPECT_EQ(a[2].line, 5);
}

TEST(SettingsEnvFileTest, BackslashContinuesLinesAndEscapesCharacters) {
  EXPECT_EQ(value_of("K=abc\\\ndef\n"), "abcdef");
  EXPECT_EQ(value_of("K=\"abc\\\ndef\"\n"), "abcdef");
  EXPECT_EQ(value_of("K=a\\ b\\\\c\n"), "a b\\c");
  EXPECT_EQ(value_of("K=trailing\\ \n"), "trailing ") << "an escaped space is not trimmed";
}

TEST(SettingsEnvFileTest, LinesWithoutEqualsAreIgnored) {
  auto a = parse_ok("just words\nK=1\n");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].key, "K");
  EXPECT_EQ(a[0].line, 2);
}

TEST(SettingsEnvFileTest, ByteOrderMarkIsSkipped) {
  auto a = parse_ok("\xEF\xBB\xBFK=1\n");
  ASSERT_EQ(a.size(), 1u);
  EXPECT_EQ(a[0].key, "K");
}

TEST(SettingsEnvFileTest, DuplicateKeysAreAllReturnedInOrder) {
  auto a = parse_ok("K=1\nK=2\n");
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[1].value, "2");
}

TEST(SettingsEnvFileTest, Errors) {
  struct Case {
    std::string text;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"1KEY=x\n", "test.env:1: '1KEY' is not a valid variable name"},
      {"A=1\nexport B=2\n", "test.env:2: 'export B' is not a valid variable name"},
      {"=value\n", "test.env:1: '' is not a valid variable name"},
      {"A=1\nK='open\n", "test.env:2: unterminated ' quote"},
      {"K=\"open\n\n", "test.env:1: unterminated \" quote"},
      {"K=\"open\\", "test.env:1: unterminated \" quote"},
      {"K=end\\", "test.env:1: backslash at end of file"},
      {std::string("A=1\nK=a\0b\n", 10), "test.env:2: NUL byte in config file"},
  };
  for (const Case& c : cases) {
    auto r = parse_env_file(c.text, "test.env");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.error().code, "config_file");
    EXPECT_EQ(r.error().message, c.message) << c.text;
  }
}

}  // namespace
}  // namespace car::config

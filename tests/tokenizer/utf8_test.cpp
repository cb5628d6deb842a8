#include "core/tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace car::tokenizer {
namespace {

TEST(Utf8, LenientDecodeMatchesLlamaCpp) {
  EXPECT_EQ(decode_lenient("a\xC3\xA9"), (std::vector<uint32_t>{'a', 0xE9}));
  // A stray continuation byte and a truncated sequence each become one U+FFFD per byte.
  EXPECT_EQ(decode_lenient("\x80"
                           "b"),
            (std::vector<uint32_t>{kReplacementChar, 'b'}));
  EXPECT_EQ(decode_lenient("\xE2\x82"), (std::vector<uint32_t>{kReplacementChar, kReplacementChar}));
  // Overlong forms and surrogates are accepted, as llama.cpp's decoder does.
  EXPECT_EQ(decode_lenient("\xC0\x80"), (std::vector<uint32_t>{0}));
  EXPECT_EQ(decode_lenient("\xED\xA0\x80"), (std::vector<uint32_t>{0xD800}));
  // Beyond U+10FFFF: replaced.
  EXPECT_EQ(decode_lenient("\xF7\xBF\xBF\xBF"), (std::vector<uint32_t>{kReplacementChar}));
}

TEST(Utf8, EncodeAndStrictChecks) {
  std::string s;
  for (uint32_t c : {0x24u, 0xA2u, 0x20ACu, 0x10348u}) append_utf8(s, c);
  EXPECT_EQ(s, "$\xC2\xA2\xE2\x82\xAC\xF0\x90\x8D\x88");
  EXPECT_EQ(valid_utf8_prefix(s), s.size());
  EXPECT_EQ(valid_utf8_prefix("ab\xE2\x82"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xE2\x82"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("ab\xF0"), 1u);
  EXPECT_EQ(incomplete_utf8_tail("ab\x80"), 0u);      // can never complete
  EXPECT_EQ(incomplete_utf8_tail("ab\xED\xA0"), 0u);  // would be a surrogate
  EXPECT_EQ(incomplete_utf8_tail("ab"), 0u);
  EXPECT_EQ(sanitize_utf8("a\x80"
                          "b\xE2\x82"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xC0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(Utf8, ByteToUnicodeIsABijection) {
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");   // U+0120 'Ġ'
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // U+010A 'Ċ'
  EXPECT_EQ(byte_to_unicode('A'), "A");
  for (int b = 0; b < 256; ++b) {
    const auto cpts = decode_lenient(byte_to_unicode(static_cast<uint8_t>(b)));
    ASSERT_EQ(cpts.size(), 1u);
    EXPECT_EQ(unicode_to_byte(cpts[0]), b);
  }
  EXPECT_EQ(unicode_to_byte(0x4E00), -1);
}

}  // namespace
}  // namespace car::tokenizer

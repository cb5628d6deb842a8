// Tokenizer behaviour on small vocabularies built here with GgufWriter, so the suite needs no fixtures:
// SentencePiece merges by score, byte fallback, space prefix and special-token partitioning; byte-level BPE
// merges by rank and pre-tokenizer splits; WordPiece normalisation; decoding and streaming; load errors.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/pretokenizer.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"
#include "core/tokenizer/wordpiece.h"
#include "tests/spm_vocab.h"

namespace car::tokenizer {
namespace {

using gguf::ArrayValue;
using gguf::GgufWriter;
using gguf::Value;
using gguf::ValueType;

// The token types, short (tests/spm_vocab.h).
constexpr int32_t kNormal = testing::kTokNormal, kUnknown = testing::kTokUnknown,
                  kControl = testing::kTokControl, kUserDefined = testing::kTokUserDefined;

using Tok = testing::VocabToken;
using testing::set_vocab_tokens;

ArrayValue strings(const std::vector<std::string>& v) {
  ArrayValue a{ValueType::STRING, {}};
  for (const auto& s : v) a.items.push_back(Value{s});
  return a;
}

Result<std::shared_ptr<const Tokenizer>> build(const GgufWriter& w) {
  const std::vector<uint8_t> bytes = w.to_bytes();
  auto file = gguf::GgufFile::parse(bytes);
  if (!file) return file.error();
  return Tokenizer::from_gguf(**file);  // copies what it needs: `bytes` may go away afterwards
}

// ---- SentencePiece -------------------------------------------------------------------------------------

const std::string kSp = "\xE2\x96\x81";  // U+2581

std::vector<Tok> spm_tokens() {
  std::vector<Tok> t = testing::spm_byte_fallback_tokens();
  // ids 259...
  for (const Tok& x : std::vector<Tok>{{kSp, -5, kNormal},             // 259
                                       {"a", -6, kNormal},             // 260
                                       {"b", -6, kNormal},             // 261
                                       {"c", -6, kNormal},             // 262
                                       {kSp + "a", -1, kNormal},       // 263
                                       {"ab", -2, kNormal},            // 264
                                       {kSp + "ab", -0.5f, kNormal},   // 265
                                       {kSp + "abc", -0.1f, kNormal},  // 266
                                       {"bc", -3, kNormal},            // 267
                                       {"<tool>", 0, kUserDefined},    // 268
                                       {"<|im_end|>", 0, kNormal},     // 269: control-looking, forced CONTROL
                                       {"ba", -0.2f, kNormal}}) {      // 270
    t.push_back(x);
  }
  return t;
}

std::shared_ptr<const Tokenizer> spm(const std::vector<Tok>& tokens = spm_tokens()) {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_string("tokenizer.ggml.model", "llama");
  set_vocab_tokens(w, tokens);
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);  // unset, as llama.cpp writes it
  auto t = build(w);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return t.ok() ? *t : nullptr;
}

using Ids = std::vector<int32_t>;
int32_t byte_id(uint8_t b) {
  return 3 + b;
}

TEST(SpmTokenizer, MergesHighestScoreFirst) {
  auto t = spm();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->type(), VocabType::spm);
  // "▁abc": ▁a (-1) beats ab (-2) and bc (-3); then ▁ab (-0.5), then ▁abc (-0.1).
  EXPECT_EQ(t->encode("abc", false, false), (Ids{266}));
  // "▁ab" then "▁" "c"? no: "ab c" -> "▁ab▁c": ▁ab, then ▁ and c have no merge.
  EXPECT_EQ(t->encode("ab c", false, false), (Ids{265, 259, 262}));
  // "ba" (-0.2) is preferred over ▁b (absent) and a... : "▁ba" -> ▁ + ba.
  EXPECT_EQ(t->encode("ba", false, false), (Ids{259, 270}));
}

TEST(SpmTokenizer, ByteFallbackAndSpecialTokens) {
  auto t = spm();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("\xC3\xA9", false, false), (Ids{259, byte_id(0xC3), byte_id(0xA9)}));
  EXPECT_EQ(t->encode("", false, false), Ids{});
  EXPECT_EQ(t->encode("", true, false), (Ids{1}));
  EXPECT_EQ(t->encode("a", true, false), (Ids{1, 263}));
  // CONTROL text is plain text unless parse_special; after a special token the text gets a space prefix.
  EXPECT_EQ(t->encode("<s>a", false, true), (Ids{1, 263}));
  const Ids plain = t->encode("<s>a", false, false);
  EXPECT_EQ(plain.front(), 259);
  EXPECT_EQ(plain[1], byte_id('<'));
  // USER_DEFINED tokens are matched even without parse_special.
  EXPECT_EQ(t->encode("a<tool>a", false, false), (Ids{263, 268, 263}));
  // A control-looking token stored as NORMAL becomes CONTROL and end-of-generation.
  EXPECT_TRUE(t->is_control(269));
  EXPECT_TRUE(t->is_eog(269));
  EXPECT_TRUE(t->is_eog(2));
  EXPECT_FALSE(t->is_eog(263));
  EXPECT_EQ(t->encode("<|im_end|>", false, true), (Ids{269}));
  EXPECT_NE(t->encode("<|im_end|>", false, false), (Ids{269}));
  EXPECT_EQ(t->pad(), kNoToken);  // 0xFFFFFFFF means unset
}

// phi-3 stores "</s>" as USER_DEFINED; llama.cpp adds CONTROL to it (its text is on the end-of-generation
// list), so without parse_special the text is ordinary text, not the token.
TEST(SpmTokenizer, ControlLookingUserDefinedTokenIsTextWithoutParseSpecial) {
  std::vector<Tok> toks = spm_tokens();
  toks[2].type = kUserDefined;  // "</s>"
  auto t = spm(toks);
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->is_control(2));
  EXPECT_TRUE(t->is_eog(2));
  EXPECT_NE(t->token_attr(2) & kAttrUserDefined, 0u);
  const Ids as_text{259, byte_id('<'), byte_id('/'), byte_id('s'), byte_id('>')};
  EXPECT_EQ(t->encode("</s>", false, false), as_text);
  EXPECT_EQ(t->encode("a</s>", false, false),
            (Ids{263, byte_id('<'), byte_id('/'), byte_id('s'), byte_id('>')}));
  EXPECT_EQ(t->encode("</s>", false, true), (Ids{2}));
  EXPECT_EQ(t->encode("a</s>a", false, true), (Ids{263, 2, 263}));
  EXPECT_EQ(t->token_to_piece(2, false), "");
  EXPECT_EQ(t->token_to_piece(2, true), "</s>");
  // A user-defined token that looks like nothing special is still matched without parse_special.
  EXPECT_EQ(t->encode("a<tool>a", false, false), (Ids{263, 268, 263}));
}

// The two exceptions llama.cpp makes to its end-of-generation list, by the vocabulary's other tokens.
TEST(SpmTokenizer, EndOfGenerationExceptions) {
  std::vector<Tok> toks = spm_tokens();
  toks[2].type = kUserDefined;                        // "</s>"
  toks.push_back({"<|tool_response>", 0, kControl});  // 271: gemma4: "</s>" is ordinary text
  toks.push_back({"<|return|>", 0, kControl});        // 272: o200k_harmony: <|end|> is no EOG
  toks.push_back({"<|call|>", 0, kControl});          // 273
  toks.push_back({"<|end|>", 0, kControl});           // 274
  auto t = spm(toks);
  ASSERT_TRUE(t);
  EXPECT_FALSE(t->is_eog(2));
  EXPECT_EQ(t->token_attr(2), kAttrNormal);
  EXPECT_TRUE(t->is_eog(271));
  EXPECT_TRUE(t->is_eog(272));
  EXPECT_TRUE(t->is_eog(273));
  EXPECT_FALSE(t->is_eog(274));
  EXPECT_EQ(t->token_attr(274), kAttrUserDefined);
  EXPECT_EQ(t->encode("a<|end|>", false, false), (Ids{263, 274}));  // user-defined: always matched
  // Without <|tool_response>, "</s>" stays end-of-generation even if the file calls it NORMAL.
  std::vector<Tok> plain = spm_tokens();
  plain[2].type = kNormal;
  auto u = spm(plain);
  ASSERT_TRUE(u);
  EXPECT_TRUE(u->is_eog(2));
  EXPECT_EQ(u->token_attr(2), kAttrNormal | kAttrControl);
}

TEST(SpmTokenizer, DecodeRemovesTheSpacePrefix) {
  auto t = spm();
  ASSERT_TRUE(t);
  for (std::string s : {"abc", "ab c", " a", "\xC3\xA9 b"}) {
    EXPECT_EQ(t->decode(t->encode(s, false, false)), s);
  }
  EXPECT_EQ(t->token_to_piece(265, false), " ab");
  EXPECT_EQ(t->token_to_piece(byte_id(0x0A), false), "\n");
  EXPECT_EQ(t->token_to_piece(1, false), "");
  EXPECT_EQ(t->token_to_piece(1, true), "<s>");
  EXPECT_EQ(t->token_to_piece(268, false), "<tool>");
  EXPECT_EQ(t->token_to_piece(-1, true), "");
  EXPECT_EQ(t->token_to_piece(100000, true), "");
  // With BOS first, llama.cpp keeps the first piece's space.
  EXPECT_EQ(t->decode(Ids{1, 263}), " a");
  EXPECT_EQ(t->decode(Ids{1, 263}, true), " a");
  EXPECT_EQ(t->decode(Ids{1, 263}, false, true), "<s> a");
}

TEST(StreamDecoder, HoldsBackSplitCharactersAndReplacesInvalidBytes) {
  auto t = spm();
  ASSERT_TRUE(t);
  StreamDecoder d(t);
  EXPECT_EQ(d.push(263), " a");
  EXPECT_EQ(d.push(byte_id(0xE2)), "");
  EXPECT_EQ(d.pending(), 1u);
  EXPECT_EQ(d.push(byte_id(0x82)), "");
  EXPECT_EQ(d.push(byte_id(0xAC)), "\xE2\x82\xAC");
  EXPECT_EQ(d.push(byte_id(0xFF)), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(byte_id(0xC3)), "");
  EXPECT_EQ(d.push(262),
            "\xEF\xBF\xBD"
            "c");  // the held byte can no longer complete
  EXPECT_EQ(d.push(byte_id(0xF0)), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.pending(), 0u);
  EXPECT_EQ(d.push(1), "");  // control token, special = false
  StreamDecoder s(t, true);
  EXPECT_EQ(s.push(1), "<s>");
}

// ---- Byte-level BPE ------------------------------------------------------------------------------------

std::shared_ptr<const Tokenizer> bpe(const std::string& pre = "gpt-2", bool with_merges = true) {
  std::vector<Tok> toks;
  for (int b = 0; b < 256; ++b) toks.push_back({byte_to_unicode(static_cast<uint8_t>(b)), 0, kNormal});
  const std::string G = byte_to_unicode(' ');
  for (const std::string& s : {std::string("he"), std::string("ll"), std::string("hell"), G + "w", G + "wo",
                               std::string("<|endoftext|>"), std::string("<tool>")}) {
    toks.push_back({s, 0, kNormal});  // ids 256..262
  }
  toks[261].type = kControl;
  toks[262].type = kUserDefined;
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  if (!pre.empty()) w.set_string("tokenizer.ggml.pre", pre);
  set_vocab_tokens(w, toks);
  if (with_merges)
    w.set_array("tokenizer.ggml.merges", strings({"h e", "l l", "he ll", G + " w", G + "w o"}));
  w.set_u32("tokenizer.ggml.bos_token_id", 261);
  w.set_u32("tokenizer.ggml.eos_token_id", 261);
  auto t = build(w);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return t.ok() ? *t : nullptr;
}

TEST(BpeTokenizer, MergesByRankWithinWords) {
  auto t = bpe();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->type(), VocabType::bpe);
  EXPECT_FALSE(t->add_bos());
  // "hello" -> h e l l o: he (0), ll (1), he+ll (2) -> hell, o.
  EXPECT_EQ(t->encode("hello", false, false), (Ids{258, 'o'}));
  // " world" is its own word: Ġw (3), Ġw+o (4), then r l d.
  EXPECT_EQ(t->encode("hello world", false, false), (Ids{258, 'o', 260, 'r', 'l', 'd'}));
  // Words never merge across the split: "he" + "llo" from "he llo".
  EXPECT_EQ(t->encode("he llo", false, false), (Ids{256, ' ', 257, 'o'}));
  // Every byte has a token, so any text round-trips.
  for (std::string s : {"hello world", "h\xC3\xA9llo\n\tw\xC3\xB6rld", "  x  ", "\xF0\x9F\x98\x81!"}) {
    EXPECT_EQ(t->decode(t->encode(s, false, false)), s);
  }
  // Invalid UTF-8 is read as llama.cpp reads it: each bad byte is U+FFFD.
  EXPECT_EQ(t->decode(t->encode("a\xFF"
                                "b",
                                false, false)),
            "a\xEF\xBF\xBD"
            "b");
}

TEST(BpeTokenizer, SpecialTokensAndCleanUp) {
  auto t = bpe();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello<|endoftext|>", false, true), (Ids{258, 'o', 261}));
  EXPECT_NE(t->encode("hello<|endoftext|>", false, false).back(), 261);
  EXPECT_EQ(t->encode("<tool>", false, false), (Ids{262}));
  EXPECT_TRUE(t->is_eog(261));
  // gpt-2 cleans " ." " ," " 's" when decoding, like llama.cpp.
  EXPECT_EQ(t->decode(t->encode("a . b , c 's d 't", false, false)), "a. b, c's d 't");
}

TEST(BpeTokenizer, LoadErrorsNameTheProblem) {
  {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "no-such-pre");
    set_vocab_tokens(w, {{"a", 0, kNormal}});
    w.set_array("tokenizer.ggml.merges", strings({}));
    auto t = build(w);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, "tokenizer_unknown_pre");
    EXPECT_NE(t.error().message.find("no-such-pre"), std::string::npos);
  }
  {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "sentencepiece-v9");
    set_vocab_tokens(w, {{"a", 0, kNormal}});
    auto t = build(w);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, "tokenizer_unknown_model");
    EXPECT_NE(t.error().message.find("sentencepiece-v9"), std::string::npos);
  }
  {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "gpt2");
    set_vocab_tokens(w, {{"a", 0, kNormal}});
    auto t = build(w);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, "tokenizer_missing_key");
    EXPECT_NE(t.error().message.find("merges"), std::string::npos);
  }
  {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_array("tokenizer.ggml.tokens", strings({"a", "b"}));
    w.set_array("tokenizer.ggml.scores", ArrayValue{ValueType::FLOAT32, {Value{0.0f}}});
    auto t = build(w);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, "tokenizer_bad_value");
    EXPECT_NE(t.error().message.find("tokenizer.ggml.scores"), std::string::npos);
  }
  {
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    auto t = build(w);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.error().code, "tokenizer_missing_key");
  }
  {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_u32("tokenizer.ggml.tokens", 7);  // wrong type
    auto t = build(w);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("tokenizer.ggml.tokens"), std::string::npos);
  }
}

TEST(BpeTokenizer, MissingPreMeansDefault) {
  auto t = bpe("");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello", false, false), (Ids{258, 'o'}));
}

// ---- Pre-tokenizer regexes -----------------------------------------------------------------------------

std::vector<std::string> split(const std::string& pre, const std::string& text) {
  auto info = pre_type_from_name(pre);
  EXPECT_TRUE(info.ok()) << pre;
  auto p = Pretokenizer::create(pre_type_regexes(info->type));
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.error().message);
  return (*p)->split(text);
}

using Words = std::vector<std::string>;

TEST(Pretokenizer, Gpt2KeepsTheLastSpaceWithTheNextWord) {
  EXPECT_EQ(split("gpt-2", "Hello world's  x\n"), (Words{"Hello", " world", "'s", " ", " x", "\n"}));
  EXPECT_EQ(split("gpt-2", "a\nb"), (Words{"a", "\n", "b"}));
  EXPECT_EQ(split("gpt-2", "x = 1234 !!"), (Words{"x", " =", " 1234", " !!"}));
}

TEST(Pretokenizer, DigitGroupingDiffersByFamily) {
  EXPECT_EQ(split("llama-bpe", "1234567"), (Words{"123", "456", "7"}));
  EXPECT_EQ(split("qwen2", "12345"), (Words{"1", "2", "3", "4", "5"}));
  EXPECT_EQ(split("starcoder", "x123"), (Words{"x", "1", "2", "3"}));
  EXPECT_EQ(split("falcon", "1234567"), (Words{"123", "456", "7"}));
  EXPECT_EQ(split("llama-bpe", "I'M here\n\n  ok"), (Words{"I", "'M", " here", "\n\n", " ", " ok"}));
}

TEST(Pretokenizer, DeepseekLlmRegexesApplyInSequence) {
  // "[\r\n]" isolates newlines; the letter class keeps one leading space; "\s+$" takes trailing spaces.
  EXPECT_EQ(split("deepseek-llm", "Hello\nworld  "), (Words{"Hello", "\n", "world", "  "}));
  EXPECT_EQ(split("deepseek-llm", "abc 123"), (Words{"abc", " ", "123"}));
}

TEST(Pretokenizer, EveryKnownFamilyCompiles) {
  for (const char* name :
       {"default",      "llama3",    "llama-bpe", "deepseek-llm", "deepseek-coder", "falcon",
        "mpt",          "starcoder", "gpt-2",     "gpt-neox",     "refact",         "qwen2",
        "command-r",    "stablelm2", "olmo",      "dbrx",         "smaug-bpe",      "poro-chat",
        "viking",       "jais",      "tekken",    "smollm",       "codeshell",      "bloom",
        "gpt3-finnish", "exaone",    "chameleon", "minerva-7b",   "gpt-4o",         "chatglm-bpe"}) {
    const Words w = split(name, "Hello, World! 123 \xE4\xBD\xA0\xE5\xA5\xBD\n");
    std::string joined;
    for (const auto& s : w) joined += s;
    EXPECT_EQ(joined, "Hello, World! 123 \xE4\xBD\xA0\xE5\xA5\xBD\n") << name;
  }
}

// ---- WordPiece -----------------------------------------------------------------------------------------

std::shared_ptr<const Tokenizer> wpm(const std::function<void(GgufWriter&)>& extra = {}) {
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "bert");
  w.set_string("tokenizer.ggml.pre", "bert-bge");
  set_vocab_tokens(w, {{"[PAD]", 0, kControl},
                       {"[UNK]", 0, kUnknown},
                       {"[CLS]", 0, kControl},
                       {"[SEP]", 0, kControl},
                       {kSp + "hello", 0, kNormal},
                       {kSp + "world", 0, kNormal},
                       {kSp + "un", 0, kNormal},
                       {"aff", 0, kNormal},
                       {"able", 0, kNormal},
                       {kSp + ",", 0, kNormal},
                       {kSp + "!", 0, kNormal},
                       {kSp + "\xE4\xBD\xA0", 0, kNormal}});
  w.set_u32("tokenizer.ggml.bos_token_id", 2);
  w.set_u32("tokenizer.ggml.seperator_token_id", 3);
  w.set_u32("tokenizer.ggml.unknown_token_id", 1);
  w.set_u32("tokenizer.ggml.padding_token_id", 0);
  if (extra) extra(w);
  auto t = build(w);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  return t.ok() ? *t : nullptr;
}

TEST(WordPieceTokenizer, NormalisesAndMatchesLongestPieces) {
  auto t = wpm();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->type(), VocabType::wpm);
  EXPECT_EQ(t->encode("Hello, WORLD!", false, false), (Ids{4, 9, 5, 10}));
  EXPECT_EQ(t->encode("unaffable", false, false), (Ids{6, 7, 8}));
  EXPECT_EQ(t->encode("H\xC3\xA9llo", false, false), (Ids{4}));  // accents dropped (NFD first code point)
  EXPECT_EQ(t->encode("xyz hello", false, false), (Ids{1, 4}));
  EXPECT_EQ(t->encode("\xE4\xBD\xA0hello", false, false), (Ids{11, 4}));  // CJK ideographs stand alone
  EXPECT_EQ(t->encode("hello", true, false), (Ids{2, 4, 3}));
  EXPECT_EQ(wordpiece_words("A\tb\xC2\xA0"
                            "c"),
            (Words{"a", "b", "c"}));
  EXPECT_EQ(t->decode(Ids{4, 5}), " hello world");
}

// Combining marks typed after the letter ("e" + U+0301, "u" + U+0308) are stripped as the precomposed
// letter's accent is: both spellings give the same tokens, not [UNK].
TEST(WordPieceTokenizer, DecomposedAccentsEqualPrecomposed) {
  auto t = wpm();
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("He\xCC\x81llo", false, false), (Ids{4}));  // e + COMBINING ACUTE
  EXPECT_EQ(t->encode("W\xC3\xB6rld", false, false), (Ids{5}));   // precomposed o-umlaut
  EXPECT_EQ(t->encode("Wo\xCC\x88rld", false, false), (Ids{5}));  // o + COMBINING DIAERESIS
  EXPECT_EQ(t->encode("he\xCC\x81\xCC\x88llo wo\xCC\xA3rld", false, false), (Ids{4, 5}));  // stacked marks
  EXPECT_EQ(t->encode("\xCC\x81hello", false, false), (Ids{4}));      // a mark with no base letter
  EXPECT_EQ(t->encode("hello\xE2\x83\x9D", false, false), (Ids{4}));  // enclosing mark (Me)
  EXPECT_EQ(wordpiece_words("Cafe\xCC\x81 U\xCC\x88"
                            "ber na\xC3\xAFve"),
            (Words{"cafe", "uber", "naive"}));
  EXPECT_EQ(wordpiece_words("Caf\xC3\xA9"), wordpiece_words("Cafe\xCC\x81"));
  // Without accent stripping nothing is decomposed or dropped; without lower-casing the case stays.
  EXPECT_EQ(wordpiece_words("Caf\xC3\xA9 Cafe\xCC\x81", {.lowercase = true, .strip_accents = false}),
            (Words{"caf\xC3\xA9", "cafe\xCC\x81"}));
  EXPECT_EQ(wordpiece_words("Cafe\xCC\x81", {.lowercase = false, .strip_accents = true}), (Words{"Cafe"}));
  EXPECT_EQ(wordpiece_words("Caf\xC3\xA9", {.lowercase = false, .strip_accents = false}),
            (Words{"Caf\xC3\xA9"}));
}

TEST(WordPieceTokenizer, NormalizerOptionsComeFromTheVocabulary) {
  auto t = wpm();
  ASSERT_TRUE(t);
  EXPECT_TRUE(t->vocab().wpm.lowercase);
  EXPECT_TRUE(t->vocab().wpm.strip_accents);
  // lowercase = false alone turns accent stripping off too (Hugging Face's BertNormalizer default).
  auto cased = wpm([](GgufWriter& w) { w.set_bool("tokenizer.ggml.normalizer.lowercase", false); });
  ASSERT_TRUE(cased);
  EXPECT_FALSE(cased->vocab().wpm.lowercase);
  EXPECT_FALSE(cased->vocab().wpm.strip_accents);
  EXPECT_EQ(cased->encode("hello Hello h\xC3\xA9llo", false, false), (Ids{4, 1, 1}));
  auto strip = wpm([](GgufWriter& w) {
    w.set_bool("tokenizer.ggml.normalizer.lowercase", false);
    w.set_bool("tokenizer.ggml.normalizer.strip_accents", true);
  });
  ASSERT_TRUE(strip);
  EXPECT_EQ(strip->encode("he\xCC\x81llo Hello", false, false), (Ids{4, 1}));
  auto bad = [] {
    GgufWriter w;
    w.set_string("tokenizer.ggml.model", "bert");
    set_vocab_tokens(w, {{"[UNK]", 0, kUnknown}});
    w.set_u32("tokenizer.ggml.normalizer.lowercase", 1);
    return build(w);
  }();
  EXPECT_FALSE(bad.ok());
}

}  // namespace
}  // namespace car::tokenizer

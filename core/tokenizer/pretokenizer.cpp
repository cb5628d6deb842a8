#include "core/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <utility>

#include "core/tokenizer/utf8.h"
#include "core/util/error_codes.h"

namespace car::tokenizer {

// The regexes below are llama.cpp's (llm_tokenizer_bpe), which in turn are the Hugging Face tokenizer.json
// Split patterns with `(?i:...)` contractions spelled out. They are written for PCRE2 syntax, which accepts
// them unchanged.
namespace {

constexpr const char* kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
constexpr const char* kLlama3 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr const char* kQwen2 =
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}|"
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
// deepseek-llm's cased-letter class, written with escapes: several of its code points (U+1F7D, U+2126,
// U+212A, ...) are canonical singletons that text tools silently normalise into other letters.
constexpr const char* kDeepseekLlmLetters =
    "\\s?["
    "A-Za-z\\x{B5}\\x{C0}-\\x{D6}\\x{D8}-\\x{F6}\\x{F8}-\\x{1BA}\\x{1BC}-\\x{1BF}\\x{1C4}-\\x{293}\\x{295}-"
    "\\x{2AF}"
    "\\x{370}-\\x{373}\\x{376}\\x{377}\\x{37B}-\\x{37D}\\x{37F}\\x{386}\\x{388}-\\x{38A}\\x{38C}\\x{38E}-\\x{"
    "3A1}"
    "\\x{3A3}-\\x{3F5}\\x{3F7}-\\x{481}\\x{48A}-\\x{52F}\\x{531}-\\x{556}\\x{10A0}-\\x{10C5}\\x{13A0}-\\x{"
    "13F5}"
    "\\x{13F8}-\\x{13FD}\\x{1C90}-\\x{1CBA}\\x{1CBD}-\\x{1CBF}\\x{1D00}-\\x{1D2B}\\x{1D6B}-\\x{1D77}\\x{1D79}"
    "-\\x{1D9A}"
    "\\x{1E00}-\\x{1F15}\\x{1F18}-\\x{1F1D}\\x{1F20}-\\x{1F45}\\x{1F48}-\\x{1F4D}\\x{1F50}-\\x{1F57}\\x{1F59}"
    "\\x{1F5B}"
    "\\x{1F5D}\\x{1F5F}-\\x{1F7D}\\x{1F80}-\\x{1FB4}\\x{1FB6}-\\x{1FBC}\\x{1FBE}\\x{1FC2}-\\x{1FC4}\\x{1FC6}-"
    "\\x{1FCC}"
    "\\x{1FD0}-\\x{1FD3}\\x{1FD6}-\\x{1FDB}\\x{1FE0}-\\x{1FEC}\\x{1FF2}-\\x{1FF4}\\x{1FF6}-\\x{1FFC}\\x{2102}"
    "\\x{2107}"
    "\\x{210A}-\\x{2113}\\x{2115}\\x{2119}-\\x{211D}\\x{2124}\\x{2126}\\x{2128}\\x{212A}-\\x{212D}\\x{212F}-"
    "\\x{2134}"
    "\\x{2139}\\x{213C}-\\x{213F}\\x{2145}-\\x{2149}\\x{214E}\\x{2183}\\x{2184}\\x{2C00}-\\x{2C7B}\\x{2C7E}-"
    "\\x{2CE4}"
    "\\x{2CEB}-\\x{2CEE}\\x{2CF2}\\x{2CF3}\\x{A640}-\\x{A66D}\\x{A680}-\\x{A69B}\\x{A722}-\\x{A76F}\\x{A771}-"
    "\\x{A787}"
    "\\x{A78B}-\\x{A78E}\\x{AB70}-\\x{ABBF}\\x{FB00}-\\x{FB06}\\x{FB13}-\\x{FB17}\\x{FF21}-\\x{FF3A}\\x{FF41}"
    "-\\x{FF5A}"
    "\\x{10400}-\\x{1044F}\\x{104B0}-\\x{104D3}\\x{104D8}-\\x{104FB}\\x{10C80}-\\x{10CB2}\\x{10CC0}-\\x{"
    "10CF2}"
    "\\x{118A0}-\\x{118DF}\\x{1E900}-\\x{1E943}"
    "]+";
constexpr const char* kCjk = "[\\x{4E00}-\\x{9FA5}\\x{0800}-\\x{4E00}\\x{AC00}-\\x{D7FF}]+";
constexpr const char* kViking = " ?[^(\\s|.,!?…。，、।۔،)]+";

struct NameEntry {
  const char* name;
  PreTypeInfo info;
};

PreTypeInfo info(PreType t, bool clean = true, bool ignore_merges = false, bool add_bos = false) {
  return PreTypeInfo{t, clean, ignore_merges, add_bos};
}

}  // namespace

Result<PreTypeInfo> pre_type_from_name(std::string_view name) {
  using P = PreType;
  static const std::vector<NameEntry> kNames = {
      {"default", info(P::default_pre)},
      {"llama3", info(P::llama3, true, true, true)},
      {"llama-v3", info(P::llama3, true, true, true)},
      {"llama-bpe", info(P::llama3, true, true, true)},
      {"falcon3", info(P::llama3, true, true, true)},
      {"falcon-h1", info(P::llama3, true, true, true)},
      {"pixtral", info(P::llama3, true, true, true)},
      {"midm-2.0", info(P::llama3, true, true, true)},
      {"lfm2", info(P::llama3, true, true, true)},
      {"deepseek-llm", info(P::deepseek_llm, false)},
      {"deepseek-coder", info(P::deepseek_coder, false)},
      {"falcon", info(P::falcon)},
      {"mpt", info(P::mpt)},
      {"starcoder", info(P::starcoder)},
      {"gpt-2", info(P::gpt2)},
      {"gpt-neox", info(P::gpt2)},  // GPT-NeoX's tokenizer.json uses the GPT-2 byte-level split
      {"phi-2", info(P::gpt2)},
      {"jina-es", info(P::gpt2)},
      {"jina-de", info(P::gpt2)},
      {"gigachat", info(P::gpt2)},
      {"jina-v1-en", info(P::gpt2)},
      {"jina-v2-es", info(P::gpt2)},
      {"jina-v2-de", info(P::gpt2)},
      {"jina-v2-code", info(P::gpt2)},
      {"roberta-bpe", info(P::gpt2)},
      {"refact", info(P::refact)},
      {"command-r", info(P::command_r, false)},
      {"qwen2", info(P::qwen2, false)},
      {"deepseek-r1-qwen", info(P::qwen2, false)},
      {"megrez", info(P::qwen2, false)},
      {"stablelm2", info(P::stablelm2)},
      {"olmo", info(P::olmo)},
      {"dbrx", info(P::dbrx)},
      {"smaug-bpe", info(P::smaug)},
      {"poro-chat", info(P::poro, false)},
      {"viking", info(P::viking, false)},
      {"jais", info(P::jais)},
      {"tekken", info(P::tekken, false, true, true)},
      {"smollm", info(P::smollm, false)},
      {"codeshell", info(P::codeshell)},
      {"bloom", info(P::bloom)},
      {"gpt3-finnish", info(P::gpt3_finnish)},
      {"exaone", info(P::exaone)},
      {"chameleon", info(P::chameleon, false, false, true)},
      {"minerva-7b", info(P::minerva)},
      {"chatglm-bpe", info(P::chatglm4)},
      {"glm4", info(P::chatglm4)},
      {"gpt-4o", info(P::gpt4o, false)},
      {"llama4", info(P::gpt4o, false)},
      {"trillion", info(P::trillion, false)},
      {"granite-docling", info(P::granite_docling, false)},
  };
  if (name.empty()) return info(P::default_pre);
  for (const auto& e : kNames) {
    if (name == e.name) return e.info;
  }
  return make_error(errc::kTokenizerUnknownPre,
                    "unknown pre-tokenizer type '" + std::string(name) + "' (tokenizer.ggml.pre)");
}

std::vector<std::string> pre_type_regexes(PreType type) {
  using P = PreType;
  switch (type) {
    case P::llama3:
    case P::dbrx:
    case P::smaug:
    case P::chatglm4:
      return {kLlama3};
    case P::deepseek_llm:
      return {"[\r\n]",
              kDeepseekLlmLetters,
              "\\s?[!-/:-~\\x{FF01}-\\x{FF0F}\\x{FF1A}-\\x{FF5E}\\x{2018}-\\x{201F}\\x{3000}-\\x{3002}]+",
              "\\s+$",
              kCjk,
              "\\p{N}+"};
    case P::deepseek_coder:
      return {"[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", kCjk, "\\p{N}"};
    case P::falcon:
      return {"[\\p{P}\\$\\+<=>\\^~\\|`]+", kGpt2, "[0-9][0-9][0-9]"};
    case P::starcoder:
    case P::refact:
    case P::command_r:
    case P::smollm:
    case P::codeshell:
    case P::exaone:
    case P::minerva:
      return {"\\p{N}", kGpt2};
    case P::gpt2:
    case P::mpt:
    case P::olmo:
    case P::jais:
    case P::trillion:
    case P::granite_docling:
      return {kGpt2};
    case P::stablelm2:
    case P::qwen2:
      return {kQwen2};
    case P::poro:
    case P::bloom:
    case P::gpt3_finnish:
      return {kViking};
    case P::viking:
      return {kViking, "\\p{N}"};
    case P::tekken:
      return {
          "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
          "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
          " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case P::chameleon:
      return {"<sentinel:[0-9]+>",      "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
              "([\\t\\n]|    |  )",     "\\p{N}",
              "[\\p{P}!-/:-@\\[-`{-~]", kGpt2};
    case P::gpt4o:
      return {
          "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
          "(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
          "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\\p{N}{1,3}|"
          " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
    case P::default_pre:
      break;
  }
  return {"[\\p{P}\\$\\+<=>\\^~\\|]+", kGpt2, "\\p{N}+", "[0-9][0-9][0-9]"};
}

struct Pretokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Pretokenizer::~Pretokenizer() = default;

Result<std::shared_ptr<const Pretokenizer>> Pretokenizer::create(const std::vector<std::string>& patterns) {
  std::shared_ptr<Pretokenizer> p(new Pretokenizer());
  for (const auto& pat : patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    auto re = std::make_unique<Regex>();
    re->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pat.data()), pat.size(),
                             PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (re->code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return make_error(errc::kTokenizerBadRegex, "pre-tokenizer regex '" + pat + "' at offset " +
                                                      std::to_string(err_off) + ": " +
                                                      reinterpret_cast<const char*>(msg));
    }
    // JIT is an optimisation: when unavailable pcre2_match interprets the pattern.
    (void)pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE);
    p->regexes_.push_back(std::move(re));
  }
  return std::shared_ptr<const Pretokenizer>(std::move(p));
}

namespace {

struct MatchData {
  explicit MatchData(const pcre2_code* code) : md(pcre2_match_data_create_from_pattern(code, nullptr)) {
    CAR_CHECK(md != nullptr);
  }
  ~MatchData() { pcre2_match_data_free(md); }
  MatchData(const MatchData&) = delete;
  MatchData& operator=(const MatchData&) = delete;
  pcre2_match_data* md;
};

using Span = std::pair<size_t, size_t>;  // [begin, end) byte offsets into the subject

// Splits subject[begin, end) by one regex, appending matches and the stretches between them to `out`.
void split_span(const pcre2_code* code, pcre2_match_data* md, const std::string& subject, Span span,
                std::vector<Span>& out) {
  const auto* sub = reinterpret_cast<PCRE2_SPTR>(subject.data() + span.first);
  const size_t len = span.second - span.first;
  size_t pos = 0;
  size_t last = 0;
  while (pos < len) {
    int rc = pcre2_match(code, sub, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, sub, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) break;  // no further match (or a resource limit): the rest is one stretch
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t ms = ov[0];
    const size_t me = ov[1];
    if (me <= ms) {  // an empty match splits nothing; step over one character
      pos = ms + 1;
      while (pos < len && (subject[span.first + pos] & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (ms > last) out.emplace_back(span.first + last, span.first + ms);
    out.emplace_back(span.first + ms, span.first + me);
    last = pos = me;
  }
  if (last < len) out.emplace_back(span.first + last, span.second);
}

}  // namespace

std::vector<std::string> Pretokenizer::split(std::string_view text) const {
  // Re-encode leniently decoded text (llama.cpp's view of it). Surrogates are encodable but not valid for
  // PCRE2, so the regexes see U+FFFD (same length, 3 bytes) in their place.
  std::string reencoded;
  reencoded.reserve(text.size());
  bool has_surrogate = false;
  for (uint32_t cpt : decode_lenient(text)) {
    if (cpt >= 0xD800 && cpt <= 0xDFFF) has_surrogate = true;
    append_utf8(reencoded, cpt);
  }
  std::string sanitized;
  const std::string* subject = &reencoded;
  if (has_surrogate) {
    for (uint32_t cpt : decode_lenient(reencoded)) {
      append_utf8(sanitized, cpt >= 0xD800 && cpt <= 0xDFFF ? kReplacementChar : cpt);
    }
    subject = &sanitized;
  }

  std::vector<Span> spans;
  if (!subject->empty()) spans.emplace_back(0, subject->size());
  std::vector<Span> next;
  for (const auto& re : regexes_) {
    MatchData md(re->code);
    next.clear();
    next.reserve(spans.size() * 2);
    for (const Span& s : spans) split_span(re->code, md.md, *subject, s, next);
    spans.swap(next);
  }
  std::vector<std::string> words;
  words.reserve(spans.size());
  for (const Span& s : spans) words.emplace_back(reencoded.substr(s.first, s.second - s.first));
  return words;
}

}  // namespace car::tokenizer

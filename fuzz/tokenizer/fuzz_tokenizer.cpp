// libFuzzer target: Tokenizer::encode on arbitrary bytes (valid and invalid UTF-8), with and without special
// tokens, must never crash, hang or hit UB, for every tokenizer model. The first input byte picks the
// tokenizer and the flags; the rest is the text. Checked properties:
//   - every id is in [0, n_vocab);
//   - StreamDecoder output over the ids is valid UTF-8, and so is its finish();
//   - on the byte-complete synthetic vocabularies, valid UTF-8 round-trips: decode(encode(x)) == x (BPE
//     without clean-up; SPM when no special token was cut out and the text has no literal U+2581);
//   - SPM: merging the text in pieces cut before U+2581 (spm.cpp's optimisation) gives the uncut ids.
// Tokenizers: small synthetic SPM, BPE (several pre-tokenizers) and WordPiece vocabularies built in memory,
// plus the real llama.cpp test vocabularies when the conformance folder exists ($CAR_CONFORMANCE_DIR, else
// ../shared/conformance beside the checkout).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/gguf/gguf_file.h"
#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/spm.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"

namespace {

using car::gguf::ArrayValue;
using car::gguf::GgufWriter;
using car::gguf::Value;
using car::gguf::ValueType;
using car::tokenizer::Tokenizer;

struct Entry {
  std::shared_ptr<const Tokenizer> tok;
  bool roundtrip;  // byte-complete synthetic vocabulary: valid UTF-8 must round-trip
  std::shared_ptr<const car::tokenizer::Vocab> uncut =
      nullptr;  // SPM: the vocabulary with the cut-at-U+2581 optimisation off
};

Entry spm_entry(std::shared_ptr<const Tokenizer> tok, bool roundtrip) {
  auto uncut = std::make_shared<car::tokenizer::Vocab>(tok->vocab());
  uncut->spm_split_at_spaces = false;
  return Entry{std::move(tok), roundtrip, std::move(uncut)};
}

std::shared_ptr<const Tokenizer> build(const GgufWriter& w) {
  const std::vector<uint8_t> bytes = w.to_bytes();
  auto file = car::gguf::GgufFile::parse(bytes);
  if (!file) std::abort();
  auto tok = Tokenizer::from_gguf(**file);
  if (!tok) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", tok.error().message.c_str());
    std::abort();
  }
  return *tok;
}

void set_tokens(GgufWriter& w, const std::vector<std::string>& texts, const std::vector<int32_t>& types,
                const std::vector<float>& scores) {
  ArrayValue t{ValueType::STRING, {}}, ty{ValueType::INT32, {}}, sc{ValueType::FLOAT32, {}};
  for (size_t i = 0; i < texts.size(); ++i) {
    t.items.push_back(Value{texts[i]});
    ty.items.push_back(Value{types[i]});
    sc.items.push_back(Value{scores[i]});
  }
  w.set_array("tokenizer.ggml.tokens", std::move(t));
  w.set_array("tokenizer.ggml.token_type", std::move(ty));
  w.set_array("tokenizer.ggml.scores", std::move(sc));
}

const std::vector<std::string> kWords = {"a",    "b", "c",  "ab",  "bc", "abc",      "he",           "ll",
                                         "hell", "o", "lo", "wor", "ld", "\xC3\xA9", "\xE4\xBD\xA0", "<s>",
                                         "</s>"};

std::shared_ptr<const Tokenizer> synthetic_spm() {
  std::vector<std::string> texts = {"<unk>", "<s>", "</s>", "<tool>", "<|im_end|>"};
  std::vector<int32_t> types = {2, 3, 3, 4, 1};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    texts.push_back(buf);
    types.push_back(6);
  }
  const std::string sp = "\xE2\x96\x81";
  for (const auto& wd : kWords) {
    texts.push_back(wd);
    texts.push_back(sp + wd);
    types.push_back(1);
    types.push_back(1);
  }
  texts.push_back(sp);
  types.push_back(1);
  std::vector<float> scores;
  for (size_t i = 0; i < texts.size(); ++i) scores.push_back(-static_cast<float>(i % 7));
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");
  set_tokens(w, texts, types, scores);
  return build(w);
}

std::shared_ptr<const Tokenizer> synthetic_bpe(const std::string& pre) {
  std::vector<std::string> texts;
  std::vector<int32_t> types;
  for (int b = 0; b < 256; ++b) {
    texts.push_back(car::tokenizer::byte_to_unicode(static_cast<uint8_t>(b)));
    types.push_back(1);
  }
  ArrayValue merges{ValueType::STRING, {}};
  for (const auto& wd : kWords) {
    const std::string enc = car::tokenizer::byte_encode(wd);
    const auto cpts = car::tokenizer::decode_lenient(enc);
    if (cpts.size() < 2) continue;
    // merge the first character with the rest, one step at a time
    std::string left;
    car::tokenizer::append_utf8(left, cpts[0]);
    for (size_t i = 1; i < cpts.size(); ++i) {
      std::string right;
      car::tokenizer::append_utf8(right, cpts[i]);
      merges.items.push_back(Value{left + " " + right});
      left += right;
      texts.push_back(left);
      types.push_back(1);
    }
  }
  texts.push_back("<|endoftext|>");
  types.push_back(3);
  texts.push_back("<tool>");
  types.push_back(4);
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  set_tokens(w, texts, types, std::vector<float>(texts.size(), 0.0f));
  w.set_array("tokenizer.ggml.merges", std::move(merges));
  w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(texts.size() - 2));
  w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(texts.size() - 2));
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  return build(w);
}

std::shared_ptr<const Tokenizer> synthetic_wpm() {
  std::vector<std::string> texts = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
  for (const auto& wd : kWords) {
    texts.push_back(wd);
    texts.push_back("\xE2\x96\x81" + wd);
  }
  std::vector<int32_t> types(texts.size(), 1);
  types[0] = types[2] = types[3] = types[4] = 3;
  types[1] = 2;
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "bert");
  set_tokens(w, texts, types, std::vector<float>(texts.size(), 0.0f));
  w.set_u32("tokenizer.ggml.bos_token_id", 2);
  w.set_u32("tokenizer.ggml.seperator_token_id", 3);
  w.set_u32("tokenizer.ggml.unknown_token_id", 1);
  return build(w);
}

std::vector<Entry> make_tokenizers() {
  std::vector<Entry> all;
  all.push_back(spm_entry(synthetic_spm(), true));
  all.push_back({synthetic_bpe("qwen2"), true});  // no clean-up: exact round trip
  all.push_back({synthetic_bpe("gpt-2"), false});
  all.push_back({synthetic_bpe("llama-bpe"), false});
  all.push_back({synthetic_bpe("deepseek-llm"), true});
  all.push_back({synthetic_bpe("deepseek-coder"), true});
  all.push_back({synthetic_bpe("falcon"), false});
  all.push_back({synthetic_wpm(), false});
  std::filesystem::path dir = CAR_DEFAULT_CONFORMANCE_DIR;
  if (const char* env = std::getenv("CAR_CONFORMANCE_DIR"); env != nullptr && *env != '\0') dir = env;
  for (const char* name : {"llama-spm", "gpt-2", "llama-bpe", "deepseek-llm", "bert-bge", "phi-3"}) {
    const auto path = dir / "tokenizer" / (std::string("ggml-vocab-") + name + ".gguf");
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;
    auto file = car::gguf::GgufFile::open(path.string());
    if (!file) continue;
    auto tok = Tokenizer::from_gguf(**file);
    if (!tok) std::abort();  // the shared vocabularies must load
    all.push_back((*tok)->type() == car::tokenizer::VocabType::spm ? spm_entry(*tok, false)
                                                                   : Entry{*tok, false});
  }
  return all;
}

const std::vector<Entry>& tokenizers() {
  static const std::vector<Entry> all = make_tokenizers();
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  (void)tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto& all = tokenizers();
  const uint8_t sel = data[0];
  const Entry& e = all[(sel >> 2) % all.size()];
  const bool add_special = (sel & 1) != 0;
  const bool parse_special = (sel & 2) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const Tokenizer& tok = *e.tok;

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  bool has_special = false;
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.n_vocab()) std::abort();
    if (tok.token_attr(id) &
        (car::tokenizer::kAttrControl | car::tokenizer::kAttrUserDefined | car::tokenizer::kAttrUnknown)) {
      has_special = true;
    }
  }

  car::tokenizer::StreamDecoder stream(e.tok, (sel & 16) != 0);
  for (int32_t id : ids) {
    const std::string piece = stream.push(id);
    if (car::tokenizer::valid_utf8_prefix(piece) != piece.size()) std::abort();
  }
  const std::string tail = stream.finish();
  if (car::tokenizer::valid_utf8_prefix(tail) != tail.size()) std::abort();

  if (e.uncut && e.tok->vocab().spm_split_at_spaces) {
    // Cutting the merge before U+2581 must not change the ids.
    std::string escaped = "\xE2\x96\x81";
    for (char c : text) escaped += c == ' ' ? std::string("\xE2\x96\x81") : std::string(1, c);
    std::vector<int32_t> cut, whole;
    car::tokenizer::spm_encode(e.tok->vocab(), escaped, cut);
    car::tokenizer::spm_encode(*e.uncut, escaped, whole);
    if (cut != whole) std::abort();
  }

  const std::string decoded = tok.decode(ids, false, true);
  if (e.roundtrip && !add_special && car::tokenizer::valid_utf8_prefix(text) == text.size()) {
    // SentencePiece cannot tell a literal U+2581 from an escaped space, and a special token changes where
    // the space prefix goes: llama.cpp does not round-trip those either.
    const bool spm = tok.type() == car::tokenizer::VocabType::spm;
    const bool spm_exempt = spm && (has_special || text.find("\xE2\x96\x81") != std::string_view::npos);
    if (!spm_exempt && decoded != text) {
      std::fprintf(stderr, "round trip failed: %zu bytes in, %zu out\n", text.size(), decoded.size());
      std::abort();
    }
  }
  return 0;
}

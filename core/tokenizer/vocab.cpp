#include "core/tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <initializer_list>

#include "core/util/error_codes.h"

namespace car::tokenizer {
namespace {

using gguf::GgufFile;
using gguf::ValueType;

Error bad_value(const std::string& key, const std::string& what) {
  return make_error(errc::kTokenizerBadValue, "tokenizer key '" + key + "': " + what);
}

// llama.cpp's token types (tokenizer.ggml.token_type) -> attributes.
uint32_t attr_from_type(int64_t type) {
  switch (type) {
    case 1:
      return kAttrNormal;
    case 2:
      return kAttrUnknown;
    case 3:
      return kAttrControl;
    case 4:
      return kAttrUserDefined;
    case 5:
      return kAttrUnused;
    case 6:
      return kAttrByte;
    default:
      return kAttrUndefined;
  }
}

bool is_one_of(std::string_view s, std::initializer_list<std::string_view> options) {
  return std::find(options.begin(), options.end(), s) != options.end();
}

Result<void> read_tokens(const GgufFile& f, Vocab& v) {
  auto tokens = f.get_array("tokenizer.ggml.tokens", ValueType::STRING);
  if (!tokens) {
    if (!f.has("tokenizer.ggml.tokens")) {
      return make_error(errc::kTokenizerMissingKey,
                        "no tokenizer.ggml.tokens in the file: it has no vocabulary");
    }
    return tokens.error();
  }
  const auto& items = (*tokens)->items;
  const size_t n = items.size();
  if (n == 0) return bad_value("tokenizer.ggml.tokens", "the vocabulary is empty");
  if (n > static_cast<size_t>(INT32_MAX)) return bad_value("tokenizer.ggml.tokens", "too many tokens");

  const gguf::ArrayValue* scores = nullptr;
  if (f.has("tokenizer.ggml.scores")) {
    auto s = f.get_array("tokenizer.ggml.scores");
    if (!s) return s.error();
    scores = *s;
    if (scores->items.size() != n) {
      return bad_value("tokenizer.ggml.scores",
                       std::to_string(scores->items.size()) + " scores for " + std::to_string(n) + " tokens");
    }
  }
  const gguf::ArrayValue* types = nullptr;
  if (f.has("tokenizer.ggml.token_type")) {
    auto t = f.get_array("tokenizer.ggml.token_type");
    if (!t) return t.error();
    types = *t;
    if (types->items.size() != n) {
      return bad_value("tokenizer.ggml.token_type",
                       std::to_string(types->items.size()) + " types for " + std::to_string(n) + " tokens");
    }
  }

  v.tokens.resize(n);
  size_t total_bytes = 0;
  for (const auto& item : items) {
    if (const auto* str = item.get_if<std::string>()) total_bytes += str->size();
  }
  v.token_to_id.reserve(n, total_bytes);
  for (size_t i = 0; i < n; ++i) {
    TokenData& t = v.tokens[i];
    const std::string* text = items[i].get_if<std::string>();
    if (text == nullptr)
      return bad_value("tokenizer.ggml.tokens", "element " + std::to_string(i) + " is not a string");
    t.text = *text;
    if (t.text.empty()) t.text = "[EMPTY_" + std::to_string(i) + "]";
    if (scores != nullptr) {
      auto d = scores->items[i].as_double();
      if (!d) return bad_value("tokenizer.ggml.scores", "element " + std::to_string(i) + " is not a number");
      t.score = static_cast<float>(*d);
    }
    if (types != nullptr) {
      auto ty = types->items[i].as_int();
      if (!ty)
        return bad_value("tokenizer.ggml.token_type", "element " + std::to_string(i) + " is not an integer");
      t.attr = attr_from_type(*ty);
    }
    if (!v.token_to_id.assign(t.text, static_cast<int32_t>(i))) {  // duplicates: the last id wins
      return bad_value("tokenizer.ggml.tokens", "vocabulary too large to index");
    }
    v.max_token_len = std::max(v.max_token_len, t.text.size());
  }
  return {};
}

Result<void> read_merges(const GgufFile& f, Vocab& v) {
  if (!f.has("tokenizer.ggml.merges")) {
    return make_error(errc::kTokenizerMissingKey,
                      "tokenizer.ggml.model is gpt2 but the file has no tokenizer.ggml.merges");
  }
  auto merges = f.get_array("tokenizer.ggml.merges", ValueType::STRING);
  if (!merges) return merges.error();
  const auto& items = (*merges)->items;
  if (items.size() > static_cast<size_t>(INT32_MAX))
    return bad_value("tokenizer.ggml.merges", "too many merges");
  size_t total_bytes = 0;
  for (const auto& item : items) {
    if (const auto* str = item.get_if<std::string>()) total_bytes += str->size();
  }
  v.merge_rank.reserve(items.size(), total_bytes);
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string* mp = items[i].get_if<std::string>();
    if (mp == nullptr)
      return bad_value("tokenizer.ggml.merges", "element " + std::to_string(i) + " is not a string");
    const std::string& m = *mp;
    // "left right", split at the first space after the first byte; a line without one merges nothing.
    if (m.size() < 2 || m.find(' ', 1) == std::string::npos) continue;
    if (!v.merge_rank.insert_first(m, static_cast<int32_t>(i))) {
      return bad_value("tokenizer.ggml.merges", "too many merges to index");
    }
  }
  return {};
}

// A special id from the file replaces the default when it names a token; anything else keeps the default.
Result<void> read_special_id(const GgufFile& f, const char* key, int32_t& id, size_t n_tokens) {
  const gguf::Value* val = f.find(key);
  if (val == nullptr) return {};
  auto x = val->as_int();
  if (!x) return bad_value(key, "not an integer");
  if (*x >= 0 && static_cast<uint64_t>(*x) < n_tokens) id = static_cast<int32_t>(*x);
  return {};
}

Result<void> read_flag(const GgufFile& f, const char* key, bool& flag) {
  if (!f.has(key)) return {};
  auto b = f.get_bool(key);
  if (!b) return b.error();
  flag = *b;
  return {};
}

// llama.cpp adds CONTROL to a control-looking token stored as another type (a user-defined "</s>" keeps its
// user-defined bit too, but with parse_special off its text is then ordinary text).
void force_control(Vocab& v, int32_t id) {
  v.tokens[static_cast<size_t>(id)].attr |= kAttrControl;
}

// llama.cpp finds some special tokens by their text and makes them CONTROL; it also keeps the list of
// end-of-generation tokens, found by text too, with two model-family exceptions.
void detect_special_by_text(Vocab& v) {
  struct Rule {
    int32_t* slot;
    std::initializer_list<std::string_view> texts;
  };
  const Rule rules[] = {
      {&v.eot,
       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
        "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"}},
      {&v.eom, {"<|eom_id|>"}},
      {&v.fim_pre,
       {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>"}},
      {&v.fim_suf,
       {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>"}},
      {&v.fim_mid,
       {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>"}},
      {&v.fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
      {&v.fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
      {&v.fim_sep, {"<|file_sep|>"}},
  };
  for (const Rule& r : rules) {
    if (*r.slot != kNoToken) continue;
    for (size_t id = 0; id < v.tokens.size() && *r.slot == kNoToken; ++id) {
      const auto& text = v.tokens[id].text;
      if (is_one_of(text, r.texts) && v.find(text) == static_cast<int32_t>(id)) {
        *r.slot = static_cast<int32_t>(id);
        force_control(v, *r.slot);
      }
    }
  }

  std::vector<int32_t> eog;
  for (int32_t id : {v.fim_pad, v.fim_rep, v.fim_sep}) {
    if (id != kNoToken) eog.push_back(id);
  }
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const auto& text = v.tokens[id].text;
    if (is_one_of(text, {"<|eot_id|>",
                         "<|im_end|>",
                         "<|end|>",
                         "<|return|>",
                         "<|call|>",
                         "<|flush|>",
                         "<|calls|>",
                         "<end_of_turn>",
                         "<|endoftext|>",
                         "</s>",
                         "<|eom_id|>",
                         "<EOT>",
                         "_<EOT>",
                         "[EOT]",
                         "[EOS]",
                         "<|end_of_text|>",
                         "<end_of_utterance>",
                         "<eos>",
                         "<turn|>",
                         "<|tool_response>",
                         "<｜end▁of▁sentence｜>",
                         "[e~["}) &&
        v.find(text) == static_cast<int32_t>(id)) {
      eog.push_back(static_cast<int32_t>(id));
      force_control(v, static_cast<int32_t>(id));
    }
  }
  // gpt-oss: these are always rendered and matched, whatever the file says.
  for (std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    const int32_t id = v.find(text);
    if (id != kNoToken) v.tokens[static_cast<size_t>(id)].attr = kAttrUserDefined;
  }
  for (int32_t id : {v.eos, v.eot, v.eom}) {
    if (id != kNoToken) eog.push_back(id);
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());

  auto eog_with_text = [&](std::string_view text) {
    for (int32_t id : eog) {
      if (v.tokens[static_cast<size_t>(id)].text == text) return id;
    }
    return kNoToken;
  };
  auto drop_eog = [&](int32_t id, uint32_t attr) {
    eog.erase(std::find(eog.begin(), eog.end(), id));
    v.tokens[static_cast<size_t>(id)].attr = attr;
  };
  // o200k_harmony (<|return|> + <|call|>) and solar-open (<|calls|> + <|flush|>): <|end|> ends a message,
  // not the generation, and is user-defined.
  const bool has_call = eog_with_text("<|call|>") != kNoToken || eog_with_text("<|calls|>") != kNoToken;
  if (const int32_t end = eog_with_text("<|end|>");
      end != kNoToken && has_call &&
      (eog_with_text("<|return|>") != kNoToken || eog_with_text("<|flush|>") != kNoToken)) {
    drop_eog(end, kAttrUserDefined);
  }
  // gemma4: "</s>" is ordinary text when the vocabulary has <|tool_response>.
  if (const int32_t s = eog_with_text("</s>");
      s != kNoToken && eog_with_text("<|tool_response>") != kNoToken) {
    drop_eog(s, kAttrNormal);
  }
  v.eog_ids = std::move(eog);
}

void set_attr(Vocab& v, std::string_view text, uint32_t bit, bool on) {
  const int32_t id = v.find(text);
  if (id == kNoToken) return;
  uint32_t& a = v.tokens[static_cast<size_t>(id)].attr;
  a = on ? (a | bit) : (a & ~bit);
}

}  // namespace

Result<Vocab> Vocab::load(const GgufFile& f) {
  Vocab v;
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model) {
    if (!f.has("tokenizer.ggml.model")) {
      return make_error(errc::kTokenizerMissingKey,
                        "no tokenizer.ggml.model in the file: it has no tokenizer");
    }
    return model.error();
  }
  v.model_name = *model;
  auto pre = f.get_string_or("tokenizer.ggml.pre", "");
  if (!pre) return pre.error();
  v.pre_name = *pre;

  if (v.model_name == "llama") {
    v.type = VocabType::spm;
    v.bos = 1, v.eos = 2, v.unk = 0;
    v.add_space_prefix = true, v.clean_spaces = false, v.add_bos = true, v.add_eos = false;
  } else if (v.model_name == "gpt2") {
    v.type = VocabType::bpe;
    v.bos = 11, v.eos = 11;
    auto info = pre_type_from_name(v.pre_name);
    if (!info) return info.error();
    v.pre = *info;
    v.add_space_prefix = false;
    v.clean_spaces = v.pre.clean_spaces;
    v.ignore_merges = v.pre.ignore_merges;
    v.add_bos = v.pre.force_add_bos;
  } else if (v.model_name == "bert") {
    v.type = VocabType::wpm;
    v.bos = 101, v.unk = 100, v.sep = 102, v.pad = 0, v.mask = 103;
    v.add_space_prefix = false, v.clean_spaces = true, v.add_bos = true, v.add_eos = false, v.add_sep = true;
  } else {
    return make_error(errc::kTokenizerUnknownModel,
                      "unknown tokenizer model '" + v.model_name +
                          "' (tokenizer.ggml.model; supported: llama, gpt2, bert)");
  }
  if (auto r = read_flag(f, "tokenizer.ggml.add_space_prefix", v.add_space_prefix); !r) return r.error();

  if (auto r = read_tokens(f, v); !r) return r.error();
  if (v.type == VocabType::bpe) {
    if (auto r = read_merges(f, v); !r) return r.error();
  }
  const size_t n = v.tokens.size();
  // Defaults that name no token of this (possibly tiny) vocabulary are unset.
  for (int32_t* id : {&v.bos, &v.eos, &v.unk, &v.sep, &v.pad, &v.mask}) {
    if (!v.valid(*id)) *id = kNoToken;
  }
  const std::pair<const char*, int32_t*> ids[] = {
      {"tokenizer.ggml.bos_token_id", &v.bos},         {"tokenizer.ggml.eos_token_id", &v.eos},
      {"tokenizer.ggml.eot_token_id", &v.eot},         {"tokenizer.ggml.eom_token_id", &v.eom},
      {"tokenizer.ggml.unknown_token_id", &v.unk},     {"tokenizer.ggml.seperator_token_id", &v.sep},
      {"tokenizer.ggml.padding_token_id", &v.pad},     {"tokenizer.ggml.mask_token_id", &v.mask},
      {"tokenizer.ggml.fim_pre_token_id", &v.fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &v.fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &v.fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &v.fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &v.fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &v.fim_sep},
      {"tokenizer.ggml.prefix_token_id", &v.fim_pre},  {"tokenizer.ggml.suffix_token_id", &v.fim_suf},
      {"tokenizer.ggml.middle_token_id", &v.fim_mid},
  };
  for (const auto& [key, slot] : ids) {
    if (auto r = read_special_id(f, key, *slot, n); !r) return r.error();
  }
  if (auto r = read_flag(f, "tokenizer.ggml.add_bos_token", v.add_bos); !r) return r.error();
  if (auto r = read_flag(f, "tokenizer.ggml.add_eos_token", v.add_eos); !r) return r.error();
  if (auto r = read_flag(f, "tokenizer.ggml.add_sep_token", v.add_sep); !r) return r.error();
  if (auto r = read_flag(f, "tokenizer.ggml.normalizer.lowercase", v.wpm.lowercase); !r) return r.error();
  v.wpm.strip_accents = v.wpm.lowercase;
  if (auto r = read_flag(f, "tokenizer.ggml.normalizer.strip_accents", v.wpm.strip_accents); !r)
    return r.error();

  detect_special_by_text(v);

  for (size_t id = 0; id < n; ++id) {
    if (v.tokens[id].attr & (kAttrControl | kAttrUserDefined | kAttrUnknown)) {
      v.special_tokens.push_back(static_cast<int32_t>(id));
    }
  }
  std::stable_sort(v.special_tokens.begin(), v.special_tokens.end(), [&](int32_t a, int32_t b) {
    return v.tokens[static_cast<size_t>(a)].text.size() > v.tokens[static_cast<size_t>(b)].text.size();
  });

  // Per-model attribute fixes llama.cpp applies by name.
  std::string name;
  if (auto g = f.get_string_or("general.name", ""); g) name = *g;
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  std::string arch;
  if (auto a = f.get_string_or("general.architecture", ""); a) arch = *a;
  auto contains_any = [](const std::string& s, std::initializer_list<std::string_view> subs) {
    for (auto sub : subs) {
      if (s.find(sub) != std::string::npos) return true;
    }
    return false;
  };
  if (contains_any(v.pre_name, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains_any(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
    set_attr(v, "<mask>", kAttrLstrip, true);
  } else if (contains_any(name, {"phi-3", "phi3"})) {
    for (int32_t id : v.special_tokens) v.tokens[static_cast<size_t>(id)].attr |= kAttrRstrip;
    set_attr(v, "</s>", kAttrRstrip, true);
    for (const char* t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(v, t, kAttrRstrip, false);
  }

  if (v.type == VocabType::spm) {
    const std::string_view sp = "\xE2\x96\x81";
    v.spm_split_at_spaces = true;
    for (const TokenData& t : v.tokens) {
      for (size_t p = t.text.find(sp, 1); p != std::string::npos; p = t.text.find(sp, p + 1)) {
        if (p < sp.size() || std::string_view(t.text).substr(p - sp.size(), sp.size()) != sp) {
          v.spm_split_at_spaces = false;
          break;
        }
      }
      if (!v.spm_split_at_spaces) break;
    }
  }

  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    int32_t id = v.find(hex);
    if (id == kNoToken) id = v.find(std::string(1, static_cast<char>(b)));
    v.byte_token[b] = id;
  }
  return v;
}

}  // namespace car::tokenizer

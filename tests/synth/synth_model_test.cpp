// Synthetic models: every architecture writes a file the reader accepts, with llama.cpp's key names,
// tensor names, shapes and (for quantized schemes) per-tensor types - checked against the conformance
// fixtures made by llama.cpp (skipped only when no conformance folder is configured).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "core/gguf/gguf_file.h"
#include "core/synth/synth_model.h"
#include "tests/test_support.h"

namespace car::synth {
namespace {

namespace fs = std::filesystem;
using gguf::GgufFile;
using gguf::ValueType;

std::shared_ptr<const GgufFile> build_and_parse(const SynthSpec& spec, std::vector<uint8_t>& storage) {
  auto w = build_synth_model(spec);
  EXPECT_TRUE(w.ok()) << w.error().message;
  if (!w.ok()) return nullptr;
  storage = w->to_bytes();
  auto f = GgufFile::parse(storage);
  EXPECT_TRUE(f.ok()) << f.error().message;
  return f.ok() ? *f : nullptr;
}

std::vector<uint64_t> shape_of(const gguf::TensorInfo& t) { return {t.ne.begin(), t.ne.begin() + t.n_dims}; }

// The conformance models' manifest; null after a test failure when it is missing or unreadable.
nlohmann::json fixture_manifest(const fs::path& dir) {
  const auto text = car::testing::read_fixture(dir / "models" / "manifest.json");
  if (!text) {
    ADD_FAILURE() << "conformance fixture missing or unreadable: " << dir / "models" / "manifest.json";
    return nullptr;
  }
  return nlohmann::json::parse(*text);
}

// The manifest's entry for `file`; fails the test when the manifest lacks it.
std::optional<nlohmann::json> fixture_entry(const nlohmann::json& manifest, const std::string& file) {
  if (manifest.is_object()) {
    for (const auto& e : manifest["files"]) {
      if (e["file"] == file) return e;
    }
  }
  ADD_FAILURE() << "no entry for " << file << " in the conformance manifest";
  return std::nullopt;
}

TEST(Synth, TinyFlavoursHaveTheExpectedLayout) {
  for (const char* flavour : {"llama", "llama-moe", "qwen3", "qwen3moe"}) {
    SCOPED_TRACE(flavour);
    const SynthSpec s = tiny_spec(flavour);
    std::vector<uint8_t> bytes;
    auto f = build_and_parse(s, bytes);
    ASSERT_NE(f, nullptr);
    const std::string a = s.arch;
    EXPECT_EQ(f->get_string("general.architecture").value(), a);
    EXPECT_EQ(f->get_uint(a + ".block_count").value(), s.n_layer);
    EXPECT_EQ(f->get_uint(a + ".embedding_length").value(), s.n_embd);
    EXPECT_EQ(f->get_uint(a + ".attention.head_count").value(), s.n_head);
    EXPECT_EQ(f->get_uint(a + ".attention.head_count_kv").value(), s.n_head_kv);
    EXPECT_EQ(f->get_uint(a + ".vocab_size").value(), s.n_vocab);
    EXPECT_EQ(f->get_uint(a + ".context_length").value(), s.n_ctx);
    const uint64_t hd = s.head_dim != 0 ? s.head_dim : s.n_embd / s.n_head;
    EXPECT_EQ(f->get_uint(a + ".rope.dimension_count").value(), hd);
    EXPECT_GT(f->get_float(a + ".attention.layer_norm_rms_epsilon").value(), 0.0);
    const bool moe = s.n_expert > 0;
    EXPECT_EQ(f->has(a + ".expert_count"), moe);
    if (moe) {
      EXPECT_EQ(f->get_uint(a + ".expert_count").value(), s.n_expert);
      EXPECT_EQ(f->get_uint(a + ".expert_used_count").value(), s.n_expert_used);
    }
    const uint64_t d = s.n_embd;
    const uint64_t q = hd * s.n_head;
    const uint64_t kv = hd * s.n_head_kv;
    std::map<std::string, std::vector<uint64_t>> want{
        {"token_embd.weight", {d, s.n_vocab}}, {"output_norm.weight", {d}}, {"output.weight", {d, s.n_vocab}}};
    for (uint32_t l = 0; l < s.n_layer; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      want[p + "attn_norm.weight"] = {d};
      want[p + "attn_q.weight"] = {d, q};
      want[p + "attn_k.weight"] = {d, kv};
      want[p + "attn_v.weight"] = {d, kv};
      want[p + "attn_output.weight"] = {q, d};
      want[p + "ffn_norm.weight"] = {d};
      if (a != "llama") {
        want[p + "attn_q_norm.weight"] = {hd};
        want[p + "attn_k_norm.weight"] = {hd};
      }
      if (moe) {
        const uint64_t ff = s.n_ff_expert;
        want[p + "ffn_gate_inp.weight"] = {d, s.n_expert};
        want[p + "ffn_gate_exps.weight"] = {d, ff, s.n_expert};
        want[p + "ffn_up_exps.weight"] = {d, ff, s.n_expert};
        want[p + "ffn_down_exps.weight"] = {ff, d, s.n_expert};
      } else {
        want[p + "ffn_gate.weight"] = {d, s.n_ff};
        want[p + "ffn_up.weight"] = {d, s.n_ff};
        want[p + "ffn_down.weight"] = {s.n_ff, d};
      }
    }
    ASSERT_EQ(f->tensors().size(), want.size());
    for (const auto& [name, shape] : want) {
      const auto* t = f->find_tensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(shape_of(*t), shape) << name;
      EXPECT_EQ(t->type, GgmlType::F32) << name;
    }
  }
}

// Build each F32 fixture's shape and compare key names (in order) and tensors (names, order, shapes, types).
TEST(Synth, MatchesLlamaCppFixtureLayouts) {
  struct Pair {
    const char* file;
    SynthSpec spec;
  };
  std::vector<Pair> pairs;
  {
    SynthSpec s;  // llama-tied-f32: n_embd 128, 2 layers, 4 heads x 32, 2 kv heads, n_ff 384, tied
    s.n_embd = 128;
    s.n_ff = 384;
    s.tied_embeddings = true;
    pairs.push_back({"llama-tied-f32.gguf", s});
  }
  {
    SynthSpec s;  // moe-llama-small-f32: n_embd 256, 4 heads x 64, 8 experts top-2, expert n_ff 32
    s.n_ff = 32;
    s.n_expert = 8;
    s.n_expert_used = 2;
    pairs.push_back({"moe-llama-small-f32.gguf", s});
  }
  {
    SynthSpec s;  // qwen3-f32: 8 heads x 64 (q 512 wide), n_ff 256
    s.arch = "qwen3";
    s.n_head = 8;
    s.head_dim = 64;
    s.n_ff = 256;
    pairs.push_back({"qwen3-f32.gguf", s});
  }
  {
    SynthSpec s;  // moe-qwen3-small-f32: feed_forward_length 64, expert 32
    s.arch = "qwen3moe";
    s.head_dim = 64;
    s.n_ff = 64;
    s.n_ff_expert = 32;
    s.n_expert = 8;
    s.n_expert_used = 2;
    pairs.push_back({"moe-qwen3-small-f32.gguf", s});
  }
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const nlohmann::json manifest = fixture_manifest(dir);
  ASSERT_TRUE(manifest.is_object());
  size_t compared = 0;
  for (const auto& [file, spec] : pairs) {
    SCOPED_TRACE(file);
    auto entry = fixture_entry(manifest, file);
    if (!entry) continue;
    std::vector<uint8_t> bytes;
    auto f = build_and_parse(spec, bytes);
    ASSERT_NE(f, nullptr);
    std::vector<std::string> keys;
    for (const auto& kv : f->metadata()) keys.push_back(kv.key);
    EXPECT_EQ(keys, (*entry)["metadata_keys"].get<std::vector<std::string>>());
    // Same value types as llama.cpp wrote, and same values for the shape keys.
    for (const auto& [key, want] : (*entry)["metadata"].items()) {
      if (key == "general.name") continue;
      SCOPED_TRACE(key);
      const auto* v = f->find(key);
      ASSERT_NE(v, nullptr);
      if (want.is_number_integer()) {
        EXPECT_EQ(v->type(), ValueType::UINT32);
        EXPECT_EQ(v->as_int(), want.get<int64_t>());
      } else if (want.is_number_float()) {
        EXPECT_EQ(v->type(), ValueType::FLOAT32);
        EXPECT_FLOAT_EQ(static_cast<float>(*v->as_double()), want.get<float>());
      } else if (want.is_string()) {
        EXPECT_EQ(f->get_string(key).value(), want.get<std::string>());
      }
    }
    const auto& tensors = (*entry)["tensors"];
    ASSERT_EQ(f->tensors().size(), tensors.size());
    for (size_t i = 0; i < tensors.size(); ++i) {
      const auto& t = f->tensors()[i];
      EXPECT_EQ(t.name, tensors[i]["name"].get<std::string>());
      EXPECT_EQ(shape_of(t), tensors[i]["shape"].get<std::vector<uint64_t>>()) << t.name;
      EXPECT_EQ(std::string(ggml_type_name(t.type)), tensors[i]["type"].get<std::string>()) << t.name;
      EXPECT_EQ(t.offset, tensors[i]["offset"].get<uint64_t>()) << t.name;
    }
    // Tokenizer arrays have llama.cpp's types and the vocabulary's size.
    EXPECT_TRUE(f->get_array("tokenizer.ggml.tokens", ValueType::STRING).ok());
    EXPECT_TRUE(f->get_array("tokenizer.ggml.scores", ValueType::FLOAT32).ok());
    EXPECT_TRUE(f->get_array("tokenizer.ggml.token_type", ValueType::INT32).ok());
    ++compared;
  }
  EXPECT_EQ(compared, pairs.size());
}

TensorRole role_of(const std::string& name) {
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  if (name == "token_embd.weight") return TensorRole::token_embd;
  if (name == "output.weight") return TensorRole::output;
  if (has("norm")) return TensorRole::norm;
  if (has("ffn_gate_inp")) return TensorRole::router;
  if (has("attn_q.")) return TensorRole::attn_q;
  if (has("attn_k.")) return TensorRole::attn_k;
  if (has("attn_v.")) return TensorRole::attn_v;
  if (has("attn_output")) return TensorRole::attn_output;
  if (has("ffn_gate")) return TensorRole::ffn_gate;
  if (has("ffn_up")) return TensorRole::ffn_up;
  return TensorRole::ffn_down;
}

// The per-tensor type rules reproduce llama-quantize's choice for every quantized fixture.
TEST(Synth, TypeRulesMatchLlamaQuantize) {
  const std::pair<const char*, const char*> files[] = {
      {"moe-llama-q8_0.gguf", "q8_0"},     {"moe-llama-q4_0.gguf", "q4_0"},
      {"moe-llama-q4_k_m.gguf", "q4_k_m"}, {"moe-llama-q6_k.gguf", "q6_k"},
      {"moe-llama-q5_k_m.gguf", "q5_k_m"}, {"moe-qwen3-q8_0.gguf", "q8_0"},
      {"moe-qwen3-q4_k_m.gguf", "q4_k_m"}, {"qwen3-q4_k_m.gguf", "q4_k_m"},
      {"moe-stories-q8_0.gguf", "q8_0"},   {"moe-stories-q4_k_m.gguf", "q4_k_m"},
      {"moe-stories-f16.gguf", "f16"},     {"moe-llama-bf16.gguf", "bf16"},
  };
  CAR_CONFORMANCE_DIR_OR_SKIP(dir);
  const nlohmann::json manifest = fixture_manifest(dir);
  ASSERT_TRUE(manifest.is_object());
  size_t compared = 0;
  for (const auto& [file, scheme] : files) {
    SCOPED_TRACE(file);
    auto entry = fixture_entry(manifest, file);
    if (!entry) continue;
    SynthSpec s;
    s.weight_type = scheme;
    s.n_layer = (*entry)["hparams"]["block_count"].get<uint32_t>();
    s.n_expert = (*entry)["hparams"].value("expert_count", 0u);
    for (const auto& t : (*entry)["tensors"]) {
      const std::string name = t["name"];
      uint32_t layer = 0;
      if (name.rfind("blk.", 0) == 0) layer = static_cast<uint32_t>(std::stoul(name.substr(4)));
      auto got = resolve_tensor_type(s, role_of(name), layer, t["shape"][0].get<uint64_t>());
      ASSERT_TRUE(got.ok()) << got.error().message;
      EXPECT_EQ(std::string(ggml_type_name(*got)), t["type"].get<std::string>()) << name;
    }
    ++compared;
  }
  EXPECT_EQ(compared, std::size(files));
}

TEST(Synth, SameSeedSameBytesOtherSeedOtherWeights) {
  SynthSpec s = tiny_spec("llama-moe");
  auto a = build_synth_model(s);
  auto b = build_synth_model(s);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->to_bytes(), b->to_bytes());
  s.seed = 43;
  auto c = build_synth_model(s);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->to_bytes(), c->to_bytes());
}

TEST(Synth, WeightStatistics) {
  SynthSpec s = tiny_spec("llama");
  s.n_vocab = 2000;
  std::vector<uint8_t> bytes;
  auto f = build_and_parse(s, bytes);
  ASSERT_NE(f, nullptr);
  auto stats = [&](const std::string& name) {
    const auto* t = f->find_tensor(name);
    EXPECT_NE(t, nullptr) << name;
    if (t == nullptr) return std::pair<double, double>{0, 0};
    auto data = f->tensor_data(*t);
    std::vector<float> v(t->n_elements);
    std::memcpy(v.data(), data.data(), data.size());
    double sum = 0, sq = 0;
    for (float x : v) sum += x;
    const double mean = sum / static_cast<double>(v.size());
    for (float x : v) sq += (x - mean) * (x - mean);
    return std::pair<double, double>{mean, std::sqrt(sq / static_cast<double>(v.size()))};
  };
  auto [em, es] = stats("token_embd.weight");  // 64000 samples of N(0, 1)
  EXPECT_NEAR(em, 0.0, 0.02);
  EXPECT_NEAR(es, 1.0, 0.02);
  auto [om, os] = stats("output.weight");  // N(0, 0.15)
  EXPECT_NEAR(om, 0.0, 0.01);
  EXPECT_NEAR(os, 0.15, 0.005);
  auto [nm, ns] = stats("blk.0.attn_norm.weight");  // 1 + 0.1 N(0, 1), 32 samples
  EXPECT_NEAR(nm, 1.0, 0.06);
  EXPECT_GT(ns, 0.03);
  EXPECT_LT(ns, 0.2);
}

TEST(Synth, Float16AndBf16Weights) {
  for (const char* wt : {"f16", "bf16"}) {
    SCOPED_TRACE(wt);
    SynthSpec s = tiny_spec("qwen3moe");
    s.weight_type = wt;
    std::vector<uint8_t> bytes;
    auto f = build_and_parse(s, bytes);
    ASSERT_NE(f, nullptr);
    const GgmlType want = std::string(wt) == "f16" ? GgmlType::F16 : GgmlType::BF16;
    EXPECT_EQ(f->get_uint("general.file_type").value(), std::string(wt) == "f16" ? 1u : 32u);
    EXPECT_FALSE(f->has("general.quantization_version"));
    for (const auto& t : f->tensors()) {
      const bool f32 = t.name.find("norm") != std::string::npos || t.name.find("ffn_gate_inp") != std::string::npos;
      EXPECT_EQ(t.type, f32 ? GgmlType::F32 : want) << t.name;
    }
    // Decoded 16-bit embeddings look like N(0, 1): |x| < 6 and not all equal.
    const auto* e = f->find_tensor("token_embd.weight");
    ASSERT_NE(e, nullptr);
    auto data = f->tensor_data(*e);
    std::set<uint16_t> distinct;
    for (size_t i = 0; i + 1 < data.size(); i += 2) {
      uint16_t h;
      std::memcpy(&h, data.data() + i, 2);
      distinct.insert(h);
      const uint32_t exp = want == GgmlType::F16 ? (h >> 10) & 0x1f : (h >> 7) & 0xff;
      EXPECT_NE(exp, want == GgmlType::F16 ? 0x1fu : 0xffu);  // never inf/NaN
    }
    EXPECT_GT(distinct.size(), 1000u);
  }
}

TEST(Synth, QuantizedWhenTheKernelsCan) {
  SynthSpec s = tiny_spec("llama-moe");
  s.n_embd = 256;  // K-quant rows need 256
  s.n_ff_expert = 256;
  s.weight_type = "q4_k_m";
  auto w = build_synth_model(s);
  if (!w.ok()) {
    ASSERT_EQ(w.error().code, "unsupported_type") << w.error().message;
    GTEST_SKIP() << "no quantizers in this build: " << w.error().message;
  }
  const auto bytes = w->to_bytes();
  auto f = GgufFile::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->get_uint("general.file_type").value(), 15u);
  EXPECT_EQ((*f)->get_uint("general.quantization_version").value(), 2u);
  EXPECT_EQ((*f)->find_tensor("output.weight")->type, GgmlType::Q6_K);
  EXPECT_EQ((*f)->find_tensor("token_embd.weight")->type, GgmlType::Q4_K);
  EXPECT_EQ((*f)->find_tensor("blk.1.ffn_down_exps.weight")->type, GgmlType::Q6_K);
  EXPECT_EQ((*f)->find_tensor("blk.0.ffn_gate_exps.weight")->type, GgmlType::Q4_K);
  EXPECT_EQ((*f)->find_tensor("blk.0.ffn_gate_inp.weight")->type, GgmlType::F32);
}

TEST(Synth, VocabularyLayout) {
  for (uint32_t n : {260u, 512u, 5000u, 40000u}) {
    SCOPED_TRACE(n);
    SynthVocab v = make_synth_vocab(n);
    ASSERT_EQ(v.tokens.size(), n);
    ASSERT_EQ(v.scores.size(), n);
    ASSERT_EQ(v.token_types.size(), n);
    EXPECT_EQ(v.tokens[0], "<unk>");
    EXPECT_EQ(v.token_types[0], 2);
    EXPECT_EQ(v.tokens[1], "<s>");
    EXPECT_EQ(v.token_types[1], 3);
    EXPECT_EQ(v.tokens[2], "</s>");
    EXPECT_EQ(v.token_types[2], 3);
    EXPECT_EQ(v.tokens[3], "<0x00>");
    EXPECT_EQ(v.tokens[3 + 0x41], "<0x41>");
    EXPECT_EQ(v.tokens[258], "<0xFF>");
    for (int i = 3; i < 259; ++i) EXPECT_EQ(v.token_types[i], 6);
    EXPECT_EQ(v.tokens[259], "\xe2\x96\x81");
    std::set<std::string> unique(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(unique.size(), n);
    for (uint32_t i = 260; i < n; ++i) {
      EXPECT_EQ(v.token_types[i], 1);
      EXPECT_LT(v.scores[i], v.scores[i - 1]);
    }
  }
  SynthVocab big = make_synth_vocab(512);
  std::set<std::string> pieces(big.tokens.begin(), big.tokens.end());
  // Common words and every prefix on the way to them are pieces.
  for (const char* p : {"\xe2\x96\x81t", "\xe2\x96\x81th", "\xe2\x96\x81the", "\xe2\x96\x81" "a", "e", "Z", "7"}) {
    EXPECT_TRUE(pieces.count(p)) << p;
  }
}

TEST(Synth, RejectsBadSpecs) {
  auto code = [](SynthSpec s) {
    auto r = validate(s);
    return r.ok() ? std::string("ok") : r.error().code;
  };
  SynthSpec s;
  EXPECT_EQ(code(s), "ok");
  SynthSpec bad = s;
  bad.arch = "gpt2";
  EXPECT_EQ(code(bad), "bad_spec");
  bad = s;
  bad.n_layer = 0;
  EXPECT_EQ(code(bad), "bad_spec");
  bad = s;
  bad.n_head_kv = 3;
  EXPECT_EQ(code(bad), "bad_spec");
  bad = s;
  bad.n_vocab = 100;
  EXPECT_EQ(code(bad), "bad_spec");
  bad = s;
  bad.arch = "qwen3moe";
  EXPECT_EQ(code(bad), "bad_spec");  // no experts
  bad = s;
  bad.n_expert = 4;
  bad.n_expert_used = 5;
  EXPECT_EQ(code(bad), "bad_spec");
  bad = s;
  bad.weight_type = "q9_z";
  EXPECT_EQ(code(bad), "bad_weight_type");
  bad = s;
  bad.n_embd = 250;  // not a multiple of 4 heads... 250 / 4
  EXPECT_EQ(code(bad), "bad_spec");
  EXPECT_FALSE(build_synth_model(bad).ok());
}

TEST(Synth, WritesAFile) {
  car::testing::TempDir dir;
  const auto path = (dir / "tiny.gguf").string();
  ASSERT_TRUE(write_synth_model(tiny_spec("qwen3"), path).ok());
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ((*f)->get_string("general.architecture").value(), "qwen3");
  EXPECT_EQ((*f)->get_string("tokenizer.ggml.model").value(), "llama");
  EXPECT_EQ((*f)->get_uint("tokenizer.ggml.bos_token_id").value(), 1u);
}

}  // namespace
}  // namespace car::synth

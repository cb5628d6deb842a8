// Synthetic models: every architecture writes a file the reader accepts, with llama.cpp's key names,
// tensor names, shapes and (for quantized schemes) per-tensor types - checked against the conformance
// fixtures made by llama.cpp (skipped only when no conformance folder is configured).
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
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
  ASSERT_TRUE(w.ok()) << w.error().message;
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

// The bytes of the tiny flavours in several weight types, as the writer made them when every tensor was
// generated whole in memory (FNV-1a 64 of the file; mt19937_64 and IEEE arithmetic fix them; a libm whose
// log/sin/cos round differently would change them). Streaming the weights in chunks of rows, on any
// number of threads, must give exactly these files.
struct Golden {
  const char* flavour;
  const char* type;
  size_t size;
  uint64_t fnv;
};
constexpr Golden kGolden[] = {
    {"llama", "f32", 159776, 0xba2a3d68f54aad8aull},
    {"llama", "f16", 84512, 0x3af03ac5c5dc8b63ull},
    {"llama", "bf16", 84512, 0x843db635d7c8247dull},
    {"llama", "q8_0", 49280, 0x428c5c8c1cda309full},
    {"llama", "q4_k_m", 825792, 0x570c6f19cf940775ull},
    {"llama", "q5_k_m", 962368, 0xcfacb435155a3e6aull},
    {"llama-moe", "f32", 210240, 0x4214fc4bbcc6a304ull},
    {"llama-moe", "f16", 110400, 0xece48a49e8a5a349ull},
    {"llama-moe", "bf16", 110400, 0x0ff9eec9c21bdc87ull},
    {"llama-moe", "q8_0", 63648, 0x60f1e5d7502695a7ull},
    {"llama-moe", "q4_k_m", 1310400, 0x8ed631ff3fff52bdull},
    {"llama-moe", "q5_k_m", 1528896, 0xbf09b5d8c183289eull},
    {"qwen3", "f32", 184928, 0xc0ed27a93267b022ull},
    {"qwen3", "f16", 97376, 0x631e360f1d0745fcull},
    {"qwen3", "bf16", 97376, 0xea3e06f0a72e500bull},
    {"qwen3", "q8_0", 56384, 0xeb0a915a5a35c475ull},
    {"qwen3", "q4_k_m", 827104, 0xe593d763cceaa50eull},
    {"qwen3", "q5_k_m", 963680, 0x9d9b2205f4dc0004ull},
    {"qwen3moe", "f32", 210784, 0x74b94914cbcf84baull},
    {"qwen3moe", "f16", 110944, 0xfafcc8dabdc4f504ull},
    {"qwen3moe", "bf16", 110944, 0xc3df6b5409b8e2d3ull},
    {"qwen3moe", "q8_0", 64192, 0x79ce57b1a2da62ddull},
    {"qwen3moe", "q4_k_m", 1311840, 0x90a37720adf700e3ull},
    {"qwen3moe", "q5_k_m", 1530336, 0x03010cfe11e8168cull},
    // Odd-sized tensors (n_embd 33, n_ff 65): the Box-Muller pair's second value crosses tensors and, with
    // one-row chunks, chunks. `car gguf synth --arch qwen3 --embd 33 --head-dim 8 --ff 65 --vocab 301
    // --ctx 128 --seed 5 --type f32|f16`.
    {"qwen3-odd", "f32", 166336, 0x26ade937a993aa66ull},
    {"qwen3-odd", "f16", 88192, 0x89c4ab57afbbede2ull},
};

SynthSpec golden_spec(const Golden& g) {
  SynthSpec s = tiny_spec(g.flavour);
  if (std::string(g.flavour) == "qwen3-odd") {
    s = SynthSpec{};  // the CLI's defaults, then its flags
    s.arch = "qwen3";
    s.n_embd = 33;
    s.head_dim = 8;
    s.n_ff = 65;
    s.n_vocab = 301;
    s.n_ctx = 128;
    s.seed = 5;
  }
  s.weight_type = g.type;
  const std::string t = g.type;
  if (t == "q4_k_m" || t == "q5_k_m") {  // K-quant rows need 256 columns
    s.n_embd = 256;
    s.head_dim = s.arch == "llama" ? 0 : 64;
    if (s.n_expert != 0) s.n_ff_expert = 256;
    s.n_ff = 512;
  }
  return s;
}

uint64_t fnv1a(const std::vector<uint8_t>& b) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : b) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

TEST(Synth, StreamedBytesEqualTheWholeTensorWriter) {
  struct Plan {
    uint64_t chunk_values;
    uint32_t threads;
  };
  // One row per chunk, a few rows (chunks end mid-tensor), chunks of 64 Ki values split over two threads,
  // and the default (whole tiny tensors).
  const Plan plans[] = {{1, 1}, {700, 1}, {65536, 2}, {0, 1}};
  for (const Golden& g : kGolden) {
    const bool k_mix = std::string(g.type).ends_with("_k_m");
    for (const Plan& p : plans) {
      // The K-quant mixes are the slow ones to quantize: two plans (one row, and threaded chunks) do.
      if (k_mix && p.chunk_values != 1 && p.chunk_values != 65536) continue;
      SCOPED_TRACE(std::string(g.flavour) + " " + g.type + " chunk " + std::to_string(p.chunk_values) +
                   " threads " + std::to_string(p.threads));
      SynthSpec s = golden_spec(g);
      s.chunk_values = p.chunk_values;
      s.threads = p.threads;
      auto w = build_synth_model(s);
      ASSERT_TRUE(w.ok()) << w.error().message;
      const auto bytes = w->to_bytes();
      EXPECT_EQ(bytes.size(), g.size);
      EXPECT_EQ(fnv1a(bytes), g.fnv);
      EXPECT_EQ(w->to_bytes(), bytes);  // a second serialization restarts the weights
    }
  }
}

TEST(Synth, FileEqualsBytes) {
  car::testing::TempDir dir;
  SynthSpec s = tiny_spec("llama-moe");
  s.chunk_values = 100;
  auto w = build_synth_model(s);
  ASSERT_TRUE(w.ok());
  const auto path = (dir / "m.gguf").string();
  ASSERT_TRUE(write_synth_model(s, path).ok());
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(file, w->to_bytes());
}

// Writing a model much larger than the chunk keeps the writer's memory bounded: a ~200 MB model written in
// a child process peaks (ru_maxrss: the child's high-water RSS, including what it shares with this
// process) far below the model's size. The old writer held the whole model, and peaked above it.
TEST(Synth, WritingALargeModelUsesBoundedMemory) {
  car::testing::TempDir dir;
  const auto path = (dir / "large.gguf").string();
  SynthSpec s;
  s.n_layer = 4;
  s.n_embd = 512;
  s.n_head = 8;
  s.n_head_kv = 4;
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_ff_expert = 1024;
  s.n_vocab = 1000;
  s.weight_type = "f32";  // the quickest to generate: the test is about memory, not quantizers
  s.threads = 2;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(write_synth_model(s, path).ok() ? 0 : 1);
  int status = 0;
  struct rusage ru {};
  ASSERT_EQ(::wait4(pid, &status, 0, &ru), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const auto size = fs::file_size(path);
  EXPECT_GT(size, uint64_t{200} << 20);
  const uint64_t peak = static_cast<uint64_t>(ru.ru_maxrss) * 1024;  // ru_maxrss is in KiB
  EXPECT_LT(peak, uint64_t{64} << 20)
      << "peak RSS " << (peak >> 20) << " MiB writing " << (size >> 20) << " MiB";
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

// The new quant types (IQ4_NL, IQ4_XS, MXFP4, IQ2_XXS; and IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_M from
// tests/data/reference/iq27; issue #27) against llama.cpp: small synthetic models
// in each type, written again here from the specs in tests/data/reference/quant27/goldens.json (synth is
// deterministic; the file's size and FNV-1a hash are checked first, so a changed synth says so instead of
// failing on logits), then, as the shared conformance test does, for every ISA this CPU has:
//   - teacher-forced on prompt + golden ids in one batch, every golden top-5 log-probability within the
//     file's tolerance of llama.cpp's;
//   - free-running greedy decoding reproduces the golden ids (up to a position whose top-1 margin is below
//     2e-4; none is in these goldens, so every id).
// The goldens are llama.cpp de3ff81 via tests/reference/golden.mjs (make_goldens.py regenerates them); every
// file's tolerance is issue #27's 1e-4. The IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XS and MoE IQ2_S models held that only
// once the engine took llama.cpp's IQ panel order (ggml-cpu/iqp.cpp; core/tensor/iq_panel.h) for batches of 8
// or more vectors - they deviated 5e-3 to 3e-2 in ggml_vec_dot's order alone. The same models run by llama.cpp
// with its panel off (GGML_NO_IQ_PANEL=1; tests/data/reference/iq_panel_off) are checked with ours off too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/engine/forward.h"
#include "core/experts/resident_source.h"
#include "core/synth/synth_model.h"
#include "core/tensor/kernels.h"
#include "tests/engine/golden_case.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using nlohmann::json;

constexpr double kGreedyBound = 1e-4;

std::filesystem::path goldens_path(const char* dir) {
  return std::filesystem::path(CAR_SOURCE_DIR) / "tests" / "data" / "reference" / dir / "goldens.json";
}

/// The SynthSpec of `car gguf synth` with these options (the script's FIXTURES entry).
synth::SynthSpec spec_of(const json& o) {
  synth::SynthSpec s;
  auto u32 = [&](const char* k, uint32_t& field) {
    if (o.contains(k)) field = o.at(k).get<uint32_t>();
  };
  s.arch = o.at("arch").get<std::string>();
  s.weight_type = o.at("type").get<std::string>();
  s.seed = o.at("seed").get<uint64_t>();
  u32("layers", s.n_layer);
  u32("embd", s.n_embd);
  u32("ff", s.n_ff);
  u32("ff-expert", s.n_ff_expert);
  u32("heads", s.n_head);
  u32("kv-heads", s.n_head_kv);
  u32("head-dim", s.head_dim);
  u32("experts", s.n_expert);
  u32("experts-used", s.n_expert_used);
  u32("vocab", s.n_vocab);
  for (const auto& [k, v] : o.items()) {
    static const char* known[] = {"arch",    "type",         "seed",  "layers",   "embd",
                                  "ff",      "ff-expert",    "heads", "kv-heads", "head-dim",
                                  "experts", "experts-used", "vocab"};
    EXPECT_NE(std::find_if(std::begin(known), std::end(known), [&](const char* n) { return k == n; }),
              std::end(known))
        << "synth option '" << k << "' is not mapped by this test";
  }
  return s;
}

std::string fnv1a64(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  uint64_t h = 0xcbf29ce484222325ull;
  char buf[1 << 16];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    for (std::streamsize i = 0; i < in.gcount(); ++i) {
      h = (h ^ static_cast<uint8_t>(buf[i])) * 0x100000001b3ull;
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}


using FileResult = golden::GoldenDeviation;

/// One file's cases with the current ISA.
FileResult check_file(const std::shared_ptr<const model::Model>& model, const json& entry, ThreadPool* pool) {
  const std::string name = entry.at("file").get<std::string>();
  const double tol = entry.at("tolerance").get<double>();
  std::unique_ptr<experts::ResidentExpertSource> src;
  if (model->hparams().is_moe()) src = std::make_unique<experts::ResidentExpertSource>(model->expert_banks());
  ForwardPass fp(model, src.get(), pool, 64);
  const int64_t V = model->hparams().n_vocab;
  EXPECT_EQ(V, entry.at("n_vocab").get<int64_t>()) << name;
  FileResult res;
  for (const json& c : entry.at("cases")) {
    // Greedy ids up to a margin below twice issue #27's 1e-4 (not the file's looser tolerance: a deviation of
    // a few 1e-2 in the low logprobs has not moved any argmax of these goldens, and the ids are the
    // contract).
    golden::check_golden_case(fp, V, c, tol, kGreedyBound, name, res);
  }
  return res;
}

/// Every file of tests/data/reference/<dir>/goldens.json, written again and checked with every ISA.
void check_goldens(const char* dir) {
  const auto text = testing::read_fixture(goldens_path(dir));
  ASSERT_TRUE(text) << "missing " << goldens_path(dir);
  const json doc = json::parse(*text);
  ASSERT_FALSE(doc.at("files").empty());
  testing::TempDir tmp;
  ThreadPool pool(2);
  const tensor::Isa saved = tensor::current_isa();
  for (const json& entry : doc.at("files")) {
    const std::string name = entry.at("file").get<std::string>();
    SCOPED_TRACE(name);
    const auto path = tmp / name;
    ASSERT_TRUE(synth::write_synth_model(spec_of(entry.at("synth")), path.string()).ok());
    ASSERT_EQ(std::filesystem::file_size(path), entry.at("size").get<uint64_t>()) << "synth's output changed";
    ASSERT_EQ(fnv1a64(path), entry.at("fnv1a64").get<std::string>()) << "synth's output changed";
    auto f = gguf::GgufFile::open(path.string());
    ASSERT_TRUE(f.ok()) << f.error().message;
    auto m = model::Model::load(*f);
    ASSERT_TRUE(m.ok()) << m.error().message;
    for (tensor::Isa isa : {tensor::Isa::scalar, tensor::Isa::avx2, tensor::Isa::avx512}) {
      tensor::set_isa(isa);
      if (tensor::current_isa() != isa) continue;  // the CPU lacks it
      const FileResult r = check_file(*m, entry, &pool);
      std::printf("quant goldens %-21s %-6s max |dlogprob| %.3g (tolerance %.3g), greedy %d/%d\n",
                  name.c_str(), std::string(tensor::isa_name(isa)).c_str(), r.max_dev,
                  entry.at("tolerance").get<double>(), r.greedy_checked, r.greedy_total);
    }
  }
  tensor::set_isa(saved);
}

TEST(QuantGoldens, Iq4AndMxfp4ModelsMatchLlamaCpp) {
  check_goldens("quant27");
}

// The second slice of codebook types (IQ3_XXS, IQ3_S, IQ2_XS, IQ2_S, IQ1_M) and TQ1_0 / TQ2_0: one llama model each, tolerances
// per file (tests/data/reference/iq27/make_goldens.py).
TEST(QuantGoldens, CodebookSlice2ModelsMatchLlamaCpp) {
  check_goldens("iq27");
}

// The models above that deviated by 5e-3 to 3e-2 before the engine took the IQ panel order, against llama.cpp
// with its IQ panel gemm off (tests/data/reference/iq_panel_off/make_goldens.py) and ours off too: within 1e-4
// - the dot order alone is llama.cpp's as well.
TEST(QuantGoldens, IqModelsMatchLlamaCppWithItsIqPanelOff) {
  tensor::set_iq_panel_enabled(false);
  check_goldens("iq_panel_off");
  tensor::set_iq_panel_enabled(true);
}

}  // namespace
}  // namespace car::engine

// engine::estimate_memory (from the GGUF header, before loading) against model_memory (after loading): the
// daemon charges the estimate before the load and the measurement after it, so they must agree. For
// resident models they are equal term by term - the tolerance is zero - on dense and MoE synthetic models,
// with the default context and with an explicit one.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "core/engine/engine.h"
#include "core/synth/synth_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

struct Case {
  const char* flavour;
  std::string weight_type;
  int context_length;
};

class MemoryEstimateTest : public ::testing::TestWithParam<Case> {};

TEST_P(MemoryEstimateTest, EstimateEqualsWhatTheLoadedModelReports) {
  const Case& c = GetParam();
  car::testing::TempDir dir;
  synth::SynthSpec spec = synth::tiny_spec(c.flavour);
  spec.weight_type = c.weight_type;
  spec.n_ctx = 512;
  const std::string path = (dir.path() / "m.gguf").string();
  ASSERT_TRUE(synth::write_synth_model(spec, path).ok());

  LoadOptions options;
  options.threads = 1;
  options.context_length = c.context_length;
  auto estimate = estimate_memory(path, options);
  ASSERT_TRUE(estimate.ok()) << estimate.error().message;
  auto model = load_model(path, options);
  ASSERT_TRUE(model.ok()) << model.error().message;
  const MemoryBreakdown actual = model_memory(**model);

  EXPECT_EQ(estimate->weights, actual.weights);
  EXPECT_EQ(estimate->kv_cache, actual.kv_cache);
  EXPECT_EQ(estimate->scratch, actual.scratch);
  EXPECT_EQ(estimate->logits, actual.logits);
  EXPECT_EQ(estimate->experts, actual.experts);
  EXPECT_EQ(estimate->total(), model_memory_bytes(**model));
  // Every term is really there: the context and the batch size it implies show in the KV cache and scratch.
  const int64_t n_ctx = c.context_length > 0 ? c.context_length : spec.n_ctx;
  if (spec.arch == "deepseek2") {
    // MLA: one row of latent + rope key, and the latent as value, per position and layer (fp16).
    EXPECT_EQ(actual.kv_cache, static_cast<uint64_t>(spec.n_layer) * static_cast<uint64_t>(n_ctx) *
                                   (2 * spec.kv_lora_rank + spec.rope_dim) * 2);
  } else {
    EXPECT_EQ(actual.kv_cache, static_cast<uint64_t>(spec.n_layer) * spec.n_head_kv *
                                   static_cast<uint64_t>(n_ctx) * 2 *
                                   (spec.head_dim > 0 ? spec.head_dim : spec.n_embd / spec.n_head) * 2);
  }
  EXPECT_GT(actual.scratch, 0u);
  EXPECT_EQ(actual.logits, static_cast<uint64_t>(spec.n_vocab) * 4);
  EXPECT_GT(actual.total(), std::filesystem::file_size(path)) << "the file size alone undercharges";

  // A generation does not change what the model holds.
  GenerateRequest req;
  req.prompt = "hello";
  req.max_tokens = 4;
  ASSERT_TRUE(generate(**model, req, nullptr, nullptr).ok());
  EXPECT_EQ(model_memory_bytes(**model), estimate->total());
}

// A streamed model is charged its expert cache at the floor (one slot per bank), whatever the pool's budget:
// the estimate made before loading gives that charge exactly, so a cache that makes room for the estimate
// never finds the loaded model larger and refuses it after evicting others (issue #23, item 5).
TEST(MemoryEstimate, StreamedChargeIsEstimatedExactlyAtEveryBudget) {
  car::testing::TempDir dir;
  synth::SynthSpec spec = synth::tiny_spec("qwen3moe");
  spec.n_ctx = 256;
  const std::string path = (dir.path() / "moe.gguf").string();
  ASSERT_TRUE(synth::write_synth_model(spec, path).ok());
  // From a budget below one slot per bank (cap 1) to one above the banks (every expert).
  for (const double ram_gb : {1e-9, 1e-4, 1e-3, 10.0}) {
    SCOPED_TRACE(ram_gb);
    LoadOptions options;
    options.threads = 1;
    options.stream_experts = StreamExperts::on;
    options.expert_ram_gb = ram_gb;
    auto estimate = estimate_memory(path, options);
    ASSERT_TRUE(estimate.ok()) << estimate.error().message;
    auto model = load_model(path, options);
    ASSERT_TRUE(model.ok()) << model.error().message;
    ASSERT_TRUE(model_streams_experts(**model));
    const MemoryBreakdown actual = model_memory(**model);
    EXPECT_EQ(estimate->experts_floor, actual.experts_floor);
    EXPECT_EQ(estimate->charged(), model_memory_bytes(**model));
    EXPECT_GT(actual.experts_floor, 0u);
    EXPECT_GE(actual.experts, actual.experts_floor);
    EXPECT_EQ(actual.experts_floor, model_expert_stats(**model)->floor_bytes);
    GenerateRequest req;
    req.prompt = "hello";
    req.max_tokens = 4;
    ASSERT_TRUE(generate(**model, req, nullptr, nullptr).ok());
    EXPECT_EQ(model_memory_bytes(**model), estimate->charged()) << "a generation does not change the charge";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, MemoryEstimateTest,
                         ::testing::Values(Case{"llama", "f32", 0}, Case{"llama", "q4_k_m", 300},
                                           Case{"qwen3", "q8_0", 0}, Case{"llama-moe", "f32", 0},
                                           Case{"llama-moe", "q4_0", 100}, Case{"qwen3moe", "f16", 16},
                                           Case{"qwen2", "q8_0", 0}, Case{"qwen2moe", "f32", 0},
                                           Case{"qwen2moe", "q8_0", 64}, Case{"gemma3", "q8_0", 0},
                                           Case{"gemma2", "f32", 0}, Case{"gpt-oss", "f32", 0},
                                           Case{"gpt-oss", "q8_0", 64}, Case{"deepseek2", "f32", 0},
                                           Case{"deepseek2", "q8_0", 64}));

TEST(MemoryEstimateErrorsTest, MissingAndCorruptFilesAndBadOptions) {
  car::testing::TempDir dir;
  auto missing = estimate_memory((dir.path() / "absent.gguf").string(), LoadOptions{});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, "not_found");

  const auto junk = dir.path() / "junk.gguf";
  std::ofstream(junk) << "GGUF but not really a gguf file";
  auto corrupt = estimate_memory(junk.string(), LoadOptions{});
  ASSERT_FALSE(corrupt.ok());
  EXPECT_EQ(corrupt.error().code, "load_failed");
  EXPECT_NE(corrupt.error().message.find("junk.gguf"), std::string::npos) << corrupt.error().message;

  const std::string path = (dir.path() / "m.gguf").string();
  ASSERT_TRUE(synth::write_synth_model(synth::tiny_spec("llama"), path).ok());
  LoadOptions bad;
  bad.context_length = -1;
  auto r = estimate_memory(path, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, "load_failed");
}

}  // namespace
}  // namespace car::engine

// deepseek2 in the engine (issue #27): the V3 router's selection (select_experts_deepseek2) on hand-made
// logits, and ForwardPass on deepseek2 files written by synth - MLA attention over the cached latent, the
// leading dense layer, sigmoid routing with exp_probs_b and expert groups, the shared expert - so that
//   - a prompt evaluated in one batch gives bit for bit the logits of token-by-token decode (F32, Q8_0,
//     IQ4_XS), and chunking or a second thread changes nothing;
//   - a sequence's logits are the same alone and in a step with another sequence;
//   - the KV cache is MLA's: one row of latent + rope key (and the latent as value) per position and layer,
//     whatever the head count, and make_cache allocates what kv_cache_bytes_for says;
//   - the router's options are live: the selection bias and the groups change the logits;
//   - a latent too wide for one attention head is a load error (load_failed), not an abort.
// Agreement with llama.cpp itself is engine_reference_conformance_test's (deepseek2-* fixtures).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/engine/deepseek2_ops.h"
#include "core/engine/engine.h"
#include "core/engine/forward.h"
#include "core/synth/synth_model.h"
#include "core/util/thread_pool.h"
#include "tests/engine/forward_support.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using namespace forward_testing;  // NOLINT(google-build-using-namespace): the shared test helpers

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

TEST(Deepseek2Router, SigmoidBiasGroupsNormAndScale) {
  // 8 experts in 4 groups of 2; keep 2 groups, choose 2 experts.
  const float logits[8] = {2.0f, 1.9f, 2.5f, 3.0f, 0.5f, 0.4f, 1.0f, 1.1f};
  const float bias[8] = {0.0f, 0.0f, 0.0f, -2.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  Deepseek2Routing r;
  r.sigmoid = true;
  r.bias = bias;
  r.n_groups = 4;
  r.n_group_used = 2;
  r.norm = true;
  r.scale = 2.5f;
  float probs[8], sel[8], w[2];
  int32_t ids[2];
  select_experts_deepseek2(logits, 8, 2, r, probs, sel, ids, w);
  // Group scores (sum of the two selection values): g0 = s(2) + s(1.9) = 1.75, g1 = s(2.5) + s(3) - 2 = -0.12
  // (the bias demotes expert 3), g2 = s(.5) + s(.4) = 1.22, g3 = s(1) + s(1.1) = 1.48: groups 0 and 3 are
  // kept, so neither expert 3 (the largest logit) nor 2 is chosen.
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[1], 1);
  const float p0 = sigmoid(2.0f), p1 = sigmoid(1.9f);
  const float sum = static_cast<float>(static_cast<double>(p0) + static_cast<double>(p1));
  EXPECT_EQ(w[0], p0 / sum * 2.5f);
  EXPECT_EQ(w[1], p1 / sum * 2.5f);
  EXPECT_EQ(probs[3], sigmoid(3.0f));  // probs stay unbiased

  // Without the bias group 1 (1.88) wins: experts 3 and 2; without groups (bias kept) the top two overall:
  // 2 (0.92), then 0 (0.88), expert 3 at -1.05.
  r.bias = nullptr;
  select_experts_deepseek2(logits, 8, 2, r, probs, sel, ids, w);
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 2);
  r.n_groups = 0;
  r.bias = bias;
  select_experts_deepseek2(logits, 8, 2, r, probs, sel, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 0);
  // Softmax gating, no norm, scale 1: the chosen softmax probabilities as they are.
  r = Deepseek2Routing{};
  select_experts_deepseek2(logits, 8, 2, r, probs, sel, ids, w);
  EXPECT_EQ(ids[0], 3);
  EXPECT_EQ(ids[1], 2);
  EXPECT_EQ(w[0], probs[3]);
  EXPECT_LT(w[0] + w[1], 1.0f);
}

synth::SynthSpec spec_of(const std::string& type) {
  synth::SynthSpec s = synth::tiny_spec("deepseek2");
  s.n_embd = 256;  // rows the quantized types take
  s.n_head = 4;
  s.head_dim = 64;
  s.rope_dim = 32;
  s.kv_lora_rank = 256;
  s.q_lora_rank = 256;
  s.v_head_dim = 64;
  s.n_ff = 256;
  s.n_ff_expert = 256;
  s.n_expert = 8;
  s.n_expert_used = 3;
  s.n_vocab = 320;
  s.weight_type = type;
  s.seed = 79;
  return s;
}

TEST(Deepseek2Forward, BatchEqualsDecodeAndChunkingAndThreadsChangeNothing) {
  testing::TempDir dir;
  ThreadPool pool(2);
  for (const char* type : {"f32", "q8_0", "iq4_xs"}) {
    SCOPED_TRACE(type);
    Loaded l = load(write(dir, spec_of(type)));
    ASSERT_TRUE(l.model);
    expect_batch_equals_decode(l, &pool);
  }
}

TEST(Deepseek2Forward, SequenceAloneEqualsInCompany) {
  testing::TempDir dir;
  ThreadPool pool(2);
  Loaded l = load(write(dir, spec_of("q8_0")));
  ASSERT_TRUE(l.model);
  expect_alone_equals_in_company(l, &pool, 7);
}

TEST(Deepseek2Forward, CacheHoldsTheLatentNotPerHeadKeys) {
  testing::TempDir dir;
  Loaded l = load(write(dir, spec_of("f32")));
  ASSERT_TRUE(l.model);
  const model::Hparams& h = l.model->hparams();
  ForwardPass fp(l.model, l.experts.get(), nullptr, 8);
  KvCache kv = fp.make_cache(64);
  // One head of 256 + 32 keys and 256 values per position and layer, fp16.
  EXPECT_EQ(kv.size_bytes(), static_cast<uint64_t>(3 * 64 * (288 + 256) * 2));
  EXPECT_EQ(kv.size_bytes(), ForwardPass::kv_cache_bytes_for(h, 64));
  // A full multi-head cache of the same model would hold n_head x (64 + 64) per position and layer.
  EXPECT_EQ(h.n_head * (h.head_dim_k + h.head_dim_v), 512);
  EXPECT_EQ(ForwardPass::scratch_bytes_for(h, 8), fp.scratch_bytes());
}

TEST(Deepseek2Forward, SelectionBiasAndGroupsAreLive) {
  testing::TempDir dir;
  ThreadPool pool(2);
  synth::SynthSpec s = spec_of("f32");
  const auto base = [&] {
    Loaded l = load(write(dir, s, "-base"));
    return batch_logits(l, tokens(9, 320), &pool, 64);
  }();
  synth::SynthSpec no_groups = s;
  no_groups.n_expert_groups = 0;
  no_groups.n_group_used = 0;
  Loaded lg = load(write(dir, no_groups, "-nogroups"));
  const auto ng = batch_logits(lg, tokens(9, 320), &pool, 64);
  EXPECT_NE(0, std::memcmp(base.data(), ng.data(), base.size() * sizeof(float))) << "groups change nothing";
  // The same file without its exp_probs_b tensors routes by the unbiased scores.
  const std::string path = write(dir, s, "-bias");
  auto f = gguf::GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  std::vector<float> zero(static_cast<size_t>(s.n_expert), 0.0f);
  gguf::GgufWriter w;
  for (const auto& kv : (*f)->metadata()) w.set(kv.key, kv.value);
  for (const auto& t : (*f)->tensors()) {
    if (t.name.find("exp_probs_b") != std::string::npos) continue;
    auto bytes = (*f)->tensor_data(t);
    std::vector<uint64_t> shape(t.ne.begin(), t.ne.begin() + t.n_dims);
    ASSERT_TRUE(w.add_tensor(t.name, t.type, shape, std::vector<uint8_t>(bytes.begin(), bytes.end())).ok());
  }
  ASSERT_TRUE(w.write(path + ".nobias.gguf").ok());
  Loaded lb = load(path + ".nobias.gguf");
  ASSERT_TRUE(lb.model);
  EXPECT_EQ(lb.model->layers()[1].exp_probs_b, nullptr);
  const auto nb = batch_logits(lb, tokens(9, 320), &pool, 64);
  EXPECT_NE(0, std::memcmp(base.data(), nb.data(), base.size() * sizeof(float)))
      << "the bias changes nothing";
}

}  // namespace
}  // namespace car::engine

namespace car::engine {
namespace {

// A latent too wide for the attention kernels' one head (kv_lora_rank + rope > kMaxHeadDim) is a named
// load error, not an abort in the forward pass.
TEST(Deepseek2Forward, TooWideLatentIsALoadError) {
  testing::TempDir dir;
  synth::SynthSpec s = synth::tiny_spec("deepseek2");
  s.kv_lora_rank = 1024;
  const std::string path = forward_testing::write(dir, s, "-wide");
  auto m = load_model(path, LoadOptions{});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code, "load_failed");
  EXPECT_NE(m.error().message.find("kv_lora_rank + rope = 1032"), std::string::npos) << m.error().message;
}

}  // namespace
}  // namespace car::engine

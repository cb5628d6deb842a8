// Model::load for gemma3 (issue #27) on files `car gguf synth` writes: the hyperparameters llama.cpp derives
// (five windowed layers then a global one, the windowed layers' RoPE base 10000, Q's scale, the optional
// final soft-cap), the post norms, and load_failed errors naming a missing post norm or a bad key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/gguf/gguf_writer.h"
#include "core/model/architecture.h"
#include "core/model/model.h"
#include "core/synth/synth_model.h"
#include "tests/model/load_test_support.h"
#include "tests/model/synth_load_test.h"
#include "tests/test_support.h"

namespace car::model {
namespace {

class Gemma3LoadTest : public testing::SynthLoadTest {};

TEST_F(Gemma3LoadTest, HparamsAsLlamaCppDerivesThem) {
  const synth::SynthSpec s = synth::tiny_spec("gemma3");  // 7 layers, head dim 16, window 4
  auto m = load(write(s));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_EQ(h.traits, &gemma3_traits());
  EXPECT_EQ(h.rope_type, RopeType::neox);
  EXPECT_EQ(h.swa_window, (std::vector<int64_t>{4, 4, 4, 4, 4, 0, 4}));
  EXPECT_EQ(h.rope_freq_base, 1e6f);
  EXPECT_EQ(h.rope_freq_base_swa, 10000.0f);
  EXPECT_EQ(h.rope_freq_scale_swa, 1.0f);
  EXPECT_TRUE(h.swa_rope(0));
  EXPECT_FALSE(h.swa_rope(5));
  EXPECT_EQ(h.attn_scale, 1.0f / std::sqrt(16.0f));
  EXPECT_EQ(h.final_logit_softcap, 0.0f);
  EXPECT_EQ(h.rms_eps, 1e-6f);
  for (const LayerWeights& L : (*m)->layers()) {
    EXPECT_NE(L.attn_post_norm, nullptr);
    EXPECT_NE(L.ffn_post_norm, nullptr);
    EXPECT_NE(L.q_norm, nullptr);
    EXPECT_NE(L.k_norm, nullptr);
  }
}

TEST_F(Gemma3LoadTest, NoWindowKeyMeansEveryLayerGlobal) {
  synth::SynthSpec s = synth::tiny_spec("gemma3");
  s.sliding_window = 0;
  auto m = load(write(s));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE((*m)->hparams().swa_window.empty());
  EXPECT_EQ((*m)->hparams().rope_freq_base_swa, 0.0f);
  EXPECT_FALSE((*m)->hparams().swa_rope(0));
}

TEST_F(Gemma3LoadTest, SoftcapAndThe27BQueryScale) {
  synth::SynthSpec s = synth::tiny_spec("gemma3");
  s.final_logit_softcap = 30.0f;
  auto m = load(write(s));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->hparams().final_logit_softcap, 30.0f);
  // 62 layers is Gemma 3 27B for llama.cpp: Q scaled by 1/sqrt(n_embd / n_head) (32 / 4), not the head dim.
  s.n_layer = 62;
  auto big = load(write(s));
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ((*big)->hparams().attn_scale, 1.0f / std::sqrt(8.0f));
  EXPECT_EQ((*big)->hparams().swa_window[5], 0);
  EXPECT_EQ((*big)->hparams().swa_window[61], 4);  // 61 % 6 = 1
}

TEST_F(Gemma3LoadTest, ErrorsNameTheTensorOrKey) {
  const synth::SynthSpec s = synth::tiny_spec("gemma3");
  for (const char* t : {"blk.3.post_ffw_norm.weight", "blk.0.post_attention_norm.weight", "blk.6.attn_k_norm.weight"}) {
    testing::expect_load_error(load(write(s, t)), t);
  }
  auto m = load(write_with_f32(s, "gemma3.final_logit_softcapping", -1.0f));
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.error().message.find("gemma3.final_logit_softcapping"), std::string::npos) << m.error().message;
}

// gemma2: even layers windowed (4096 when the file has no window key), one RoPE base, no q/k norms, the two
// soft-caps with llama.cpp's defaults (50 for attention scores, 30 for the logits) unless the file says.
TEST_F(Gemma3LoadTest, Gemma2HparamsAndDefaults) {
  synth::SynthSpec s = synth::tiny_spec("gemma2");  // 7 layers, head dim 16, window 4
  auto m = load(write(s));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_EQ(h.traits, &gemma2_traits());
  EXPECT_EQ(h.swa_window, (std::vector<int64_t>{4, 0, 4, 0, 4, 0, 4}));
  EXPECT_EQ(h.rope_freq_base, 10000.0f);
  EXPECT_EQ(h.rope_freq_base_swa, 0.0f);
  EXPECT_EQ(h.attn_scale, 0.25f);
  EXPECT_EQ(h.attn_logit_softcap, 50.0f);
  EXPECT_EQ(h.final_logit_softcap, 30.0f);
  for (const LayerWeights& L : (*m)->layers()) {
    EXPECT_EQ(L.q_norm, nullptr);
    EXPECT_NE(L.attn_post_norm, nullptr);
    EXPECT_NE(L.ffn_post_norm, nullptr);
  }
  s.sliding_window = 0;
  s.attn_logit_softcap = 7.5f;
  s.final_logit_softcap = 12.0f;
  auto d = load(write(s));
  ASSERT_TRUE(d.ok()) << d.error().message;
  EXPECT_EQ(d.value()->hparams().swa_window[0], 4096);
  EXPECT_EQ(d.value()->hparams().attn_logit_softcap, 7.5f);
  EXPECT_EQ(d.value()->hparams().final_logit_softcap, 12.0f);
  // 46 layers is Gemma 2 27B: Q scaled by 1/sqrt(n_embd / n_head).
  s.n_layer = 46;
  auto big = load(write(s));
  ASSERT_TRUE(big.ok()) << big.error().message;
  EXPECT_EQ(big.value()->hparams().attn_scale, 1.0f / std::sqrt(8.0f));
  auto neg = load(write_with_f32(synth::tiny_spec("gemma2"), "gemma2.attn_logit_softcapping", -1.0f));
  ASSERT_FALSE(neg.ok());
  EXPECT_NE(neg.error().message.find("gemma2.attn_logit_softcapping"), std::string::npos) << neg.error().message;
}

TEST(Gemma3Synth, RejectsGemmaKeysElsewhereAndExperts) {
  synth::SynthSpec s = synth::tiny_spec("llama");
  s.sliding_window = 8;
  EXPECT_FALSE(synth::validate(s).ok());
  s = synth::tiny_spec("gemma3");
  s.n_expert = 4;
  EXPECT_FALSE(synth::validate(s).ok());
  s = synth::tiny_spec("gemma3");
  s.final_logit_softcap = -2.0f;
  EXPECT_FALSE(synth::validate(s).ok());
  s = synth::tiny_spec("gemma3");
  s.attn_logit_softcap = 50.0f;  // a gemma2 key
  EXPECT_FALSE(synth::validate(s).ok());
  s = synth::tiny_spec("gemma2");
  s.attn_logit_softcap = 50.0f;
  EXPECT_TRUE(synth::validate(s).ok());
}

}  // namespace
}  // namespace car::model

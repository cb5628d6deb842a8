// Model::load for gpt-oss (issue #27) on files `car gguf synth` writes: the traits, the sliding-window layers
// (pattern 2: even layers windowed), YaRN's terms from the rope.scaling keys, the sinks, the attention output
// bias and the router / expert biases (per-expert rows, kept resident), post_attention_norm as the FFN's
// norm, and load_failed errors that name a missing sink or expert bias and a bias of the wrong shape.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "core/gguf/gguf_writer.h"
#include "core/model/architecture.h"
#include "core/model/model.h"
#include "core/synth/synth_model.h"
#include "tests/model/load_test_support.h"
#include "tests/model/synth_load_test.h"
#include "tests/test_support.h"

namespace car::model {
namespace {

using testing::tensor_values;

using testing::expect_load_error;
using testing::load_model_file;
using testing::rewrite_gguf;

class GptOssLoadTest : public testing::SynthLoadTest {};

void expect_values(const float* got, const std::vector<float>& want, int64_t n, const std::string& what) {
  ASSERT_NE(got, nullptr) << what;
  ASSERT_EQ(static_cast<int64_t>(want.size()), n) << what;
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[static_cast<size_t>(i)]) << what << " " << i;
}

TEST_F(GptOssLoadTest, TraitsWindowsYarnSinksAndBiases) {
  synth::SynthSpec spec = synth::tiny_spec("gpt-oss");
  spec.n_layer = 3;
  const std::string path = write(spec);
  auto m = load_model_file(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_EQ(h.arch, "gpt-oss");
  EXPECT_EQ(h.traits, &gpt_oss_traits());
  EXPECT_EQ(h.rope_type, RopeType::neox);
  EXPECT_FLOAT_EQ(h.rope_freq_base, 150000.0f);
  EXPECT_TRUE(h.is_moe());
  EXPECT_EQ(h.n_ff_exp, 32);
  EXPECT_EQ(h.q_dim(), 64);  // 4 heads x 16: Q wider than n_embd 32
  // llama.cpp's set_swa_pattern(2): layers 0 and 2 windowed, 1 global.
  EXPECT_EQ(h.swa_window, (std::vector<int64_t>{4, 0, 4}));
  // YaRN, factor 32 from 4096: ext_factor 1, freq_scale 1/32, and the magnitude llama.cpp computes.
  EXPECT_FLOAT_EQ(h.rope_freq_scale, 1.0f / 32.0f);
  EXPECT_EQ(h.yarn.ext_factor, 1.0f);
  EXPECT_EQ(h.yarn.n_ctx_orig, 4096);
  EXPECT_EQ(h.yarn.beta_fast, 32.0f);
  EXPECT_EQ(h.yarn.beta_slow, 1.0f);
  EXPECT_NEAR(h.yarn.attn_factor, 1.0f, 1e-6f);
  for (int64_t il = 0; il < h.n_layer; ++il) {
    const LayerWeights& L = (*m)->layers()[static_cast<size_t>(il)];
    const std::string p = "blk." + std::to_string(il) + ".";
    ASSERT_TRUE(L.is_moe);
    expect_values(L.attn_sinks, tensor_values(path, p + "attn_sinks.weight"), h.n_head, p + "attn_sinks");
    expect_values(L.o_bias, tensor_values(path, p + "attn_output.bias"), h.n_embd, p + "attn_output.bias");
    expect_values(L.ffn_norm, tensor_values(path, p + "post_attention_norm.weight"), h.n_embd,
                  p + "post_attention_norm");
    expect_values(L.ffn_gate_inp_bias, tensor_values(path, p + "ffn_gate_inp.bias"), h.n_expert,
                  p + "ffn_gate_inp.bias");
    // Row e of a 2-D expert bias is expert e's (ggml order: ne0 = width, ne1 = expert).
    expect_values(L.ffn_gate_exps_bias, tensor_values(path, p + "ffn_gate_exps.bias"), h.n_expert * h.n_ff_exp,
                  p + "ffn_gate_exps.bias");
    expect_values(L.ffn_up_exps_bias, tensor_values(path, p + "ffn_up_exps.bias"), h.n_expert * h.n_ff_exp,
                  p + "ffn_up_exps.bias");
    expect_values(L.ffn_down_exps_bias, tensor_values(path, p + "ffn_down_exps.bias"), h.n_expert * h.n_embd,
                  p + "ffn_down_exps.bias");
    EXPECT_NE(L.q_bias, nullptr);
    EXPECT_FALSE(L.has_shexp);
  }
}

TEST_F(GptOssLoadTest, RequiredTensorsAreNamed) {
  const synth::SynthSpec spec = synth::tiny_spec("gpt-oss");
  for (const char* t : {"blk.0.attn_sinks.weight", "blk.1.ffn_down_exps.bias", "blk.0.ffn_gate_inp.bias",
                        "blk.1.attn_output.bias", "blk.0.post_attention_norm.weight"}) {
    expect_load_error(load_model_file(write(spec, t)), t);
  }
  // An expert bias of the wrong shape is named with both shapes.
  const std::string bad = write(spec, "blk.0.ffn_up_exps.bias", {}, [](gguf::GgufWriter& w) {
    EXPECT_TRUE(w.add_tensor("blk.0.ffn_up_exps.bias", GgmlType::F32, {32, 3}, std::vector<uint8_t>(384, 0)).ok());
  });
  expect_load_error(load_model_file(bad), "blk.0.ffn_up_exps.bias");
}

TEST_F(GptOssLoadTest, WindowAbsentMeansGlobalAndUnknownScalingIsRefused) {
  const std::string path = write(synth::tiny_spec("gpt-oss"));
  // Without attention.sliding_window every layer is global.
  auto m = load_model_file(rewrite_gguf(path, {}, "gpt-oss.attention.sliding_window"));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_TRUE((*m)->hparams().swa_window.empty());
  // A rope scaling type llama.cpp has and this engine does not compute is refused, naming the key.
  expect_load_error(load_model_file(rewrite_gguf(path, {}, {}, [](gguf::GgufWriter& w) {
                      w.set_string("gpt-oss.rope.scaling.type", "longrope");
                    })),
                    "gpt-oss.rope.scaling.type");
}

}  // namespace
}  // namespace car::model

// Model::load for deepseek2 (issue #27) on files `car gguf synth` writes: the MLA hyperparameters (the cache
// row's key / value lengths, the _mla per-head widths, q / kv lora ranks, the rope part), the router keys
// (sigmoid gating, weights norm and scale, expert groups), the leading dense layers and the shared experts'
// width, llama.cpp's attention scale with and without YaRN's log multiplier, the weights' shapes (attn_k_b /
// attn_v_b one matrix per head), and load_failed errors naming what is wrong: an unsplit attn_kv_b file, a
// missing tensor, a router in a leading dense layer, group counts that do not divide the experts.
#include <gtest/gtest.h>

#include <cmath>
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

using testing::expect_load_error;
using testing::load_model_file;

class Deepseek2LoadTest : public testing::SynthLoadTest {};

TEST_F(Deepseek2LoadTest, MlaHparamsRouterAndLayers) {
  const synth::SynthSpec spec = synth::tiny_spec("deepseek2");
  auto m = load_model_file(write(spec));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_EQ(h.traits, &deepseek2_traits());
  EXPECT_TRUE(h.traits->mla);
  EXPECT_TRUE(h.is_mla());
  EXPECT_EQ(h.n_head_kv, 1);
  EXPECT_EQ(h.head_dim_k, 16);  // key_length_mla: 8 nope + 8 rope
  EXPECT_EQ(h.head_dim_v, 16);  // value_length_mla
  EXPECT_EQ(h.n_rot, 8);
  EXPECT_EQ(h.kv_lora_rank, 32);
  EXPECT_EQ(h.q_lora_rank, 32);
  EXPECT_EQ(h.mla_cache_dim_k(), 40);  // latent + rope key
  EXPECT_EQ(h.mla_cache_dim_v(), 32);
  EXPECT_EQ(h.n_layer_dense_lead, 1);
  EXPECT_EQ(h.n_expert_shared, 1);
  EXPECT_EQ(h.n_ff_shexp, 32);  // expert_shared_count x expert_feed_forward_length
  EXPECT_EQ(h.n_ff, 64);
  EXPECT_TRUE(h.gating_sigmoid);
  EXPECT_TRUE(h.expert_weights_norm);
  EXPECT_FLOAT_EQ(h.expert_weights_scale, 2.5f);
  EXPECT_EQ(h.n_expert_groups, 4);
  EXPECT_EQ(h.n_group_used, 2);
  // No YaRN: kq_scale = 1 / sqrt(key_length_mla).
  EXPECT_FLOAT_EQ(h.mla_kq_scale, 1.0f / std::sqrt(16.0f));

  const auto& layers = (*m)->layers();
  ASSERT_EQ(layers.size(), 3u);
  EXPECT_FALSE(layers[0].is_moe);  // the leading dense layer
  EXPECT_EQ(layers[0].ffn_gate.rows, 64);
  for (size_t il = 1; il < 3; ++il) {
    const LayerWeights& L = layers[il];
    EXPECT_TRUE(L.is_moe);
    EXPECT_TRUE(L.has_shexp);
    EXPECT_EQ(L.ffn_gate_inp_shexp.data, nullptr);  // deepseek2's shared experts have no gate
    EXPECT_NE(L.exp_probs_b, nullptr);
    EXPECT_EQ(L.ffn_gate_shexp.rows, 32);
  }
  const LayerWeights& L = layers[1];
  EXPECT_EQ(L.wq.data, nullptr);  // q_lora_rank > 0: wq_a / wq_b
  EXPECT_EQ(L.wq_a.rows, 32);
  EXPECT_EQ(L.wq_b.rows, 4 * 16);
  EXPECT_NE(L.q_a_norm, nullptr);
  EXPECT_EQ(L.wkv_a_mqa.rows, 40);
  EXPECT_NE(L.kv_a_norm, nullptr);
  EXPECT_EQ(L.wk_b.cols, 8);       // nope
  EXPECT_EQ(L.wk_b.rows, 4 * 32);  // n_head x kv_lora_rank
  EXPECT_EQ(L.wv_b.cols, 32);      // kv_lora_rank
  EXPECT_EQ(L.wv_b.rows, 4 * 16);  // n_head x value_length_mla
  EXPECT_EQ(L.wo.cols, 4 * 16);
  EXPECT_EQ(L.wk_b.order, tensor::ProductOrder::mul_mat_id);
}

TEST_F(Deepseek2LoadTest, PlainQueryAndSoftmaxGating) {
  synth::SynthSpec spec = synth::tiny_spec("deepseek2");
  spec.q_lora_rank = 0;
  spec.sigmoid_gating = false;
  spec.expert_weights_norm = false;
  spec.n_expert_groups = 0;
  spec.n_group_used = 0;
  auto m = load_model_file(write(spec));
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->hparams().q_lora_rank, 0);
  EXPECT_FALSE((*m)->hparams().gating_sigmoid);
  EXPECT_FALSE((*m)->hparams().expert_weights_norm);
  EXPECT_EQ((*m)->hparams().n_expert_groups, 0);
  EXPECT_EQ((*m)->layers()[1].wq.rows, 4 * 16);
  EXPECT_EQ((*m)->layers()[1].wq_a.data, nullptr);
  EXPECT_EQ((*m)->layers()[1].exp_probs_b, nullptr);  // the synth writes the bias with sigmoid gating only
}

TEST_F(Deepseek2LoadTest, YarnLogMultiplierScalesAttention) {
  synth::SynthSpec spec = synth::tiny_spec("deepseek2");
  spec.rope_scaling_factor = 4.0f;
  spec.rope_orig_ctx = 64;
  spec.yarn_log_multiplier = 0.0707f;
  auto m = load_model_file(write(spec));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_FLOAT_EQ(h.rope_yarn_log_mul, 0.707f);
  EXPECT_EQ(h.yarn.ext_factor, 1.0f);
  // llama.cpp: attn_factor = 1 / (1 + 0.1 ln 4) (the mscale ratio is 1 for deepseek2), and the graph's
  // kq_scale = (attn_factor (1 + 0.1 ln 4) (1 + 0.1 * 0.707 ln 4))^2 / sqrt(16).
  const float f = 4.0f;
  const float af = 1.0f / (1.0f + 0.1f * std::log(f));
  EXPECT_FLOAT_EQ(h.yarn.attn_factor, af);
  const float mscale = af * (1.0f + 0.1f * std::log(f)) * (1.0f + 0.1f * 0.707f * std::log(f));
  EXPECT_NEAR(h.mla_kq_scale, mscale * mscale / 4.0f, 1e-7f);
  EXPECT_GT(h.mla_kq_scale, 0.25f * 1.1f);
}

TEST_F(Deepseek2LoadTest, NamedErrors) {
  const synth::SynthSpec spec = synth::tiny_spec("deepseek2");
  for (const char* t : {"blk.1.attn_kv_a_mqa.weight", "blk.2.attn_kv_a_norm.weight",
                        "blk.1.attn_q_a_norm.weight", "blk.2.attn_v_b.weight", "blk.1.ffn_up_shexp.weight"}) {
    expect_load_error(load_model_file(write(spec, t)), t);
  }
  // An older converter's file: no _mla keys, one attn_kv_b.
  expect_load_error(load_model_file(write(spec, {}, "deepseek2.attention.key_length_mla")), "attn_kv_b");
  const std::string legacy = write(spec, "blk.0.attn_k_b.weight", {}, [](gguf::GgufWriter& w) {
    EXPECT_TRUE(w.add_tensor("blk.0.attn_kv_b.weight", GgmlType::F32, {32, 4 * 24},
                             std::vector<uint8_t>(32 * 4 * 24 * 4, 0))
                    .ok());
  });
  expect_load_error(load_model_file(legacy), "blk.0.attn_kv_b.weight");
  // The cache row's widths must be the latent's.
  expect_load_error(
      load_model_file(
          write(spec, {}, {}, [](gguf::GgufWriter& w) { w.set_u32("deepseek2.attention.key_length", 16); })),
      "kv_lora_rank + rope.dimension_count");
  // A MoE layer where the file says dense, and groups that do not divide the experts.
  expect_load_error(
      load_model_file(write(
          spec, {}, {}, [](gguf::GgufWriter& w) { w.set_u32("deepseek2.leading_dense_block_count", 2); })),
      "present in a leading dense layer");
  expect_load_error(
      load_model_file(
          write(spec, {}, {}, [](gguf::GgufWriter& w) { w.set_u32("deepseek2.expert_group_count", 3); })),
      "expert_group_count");
  expect_load_error(
      load_model_file(
          write(spec, {}, {}, [](gguf::GgufWriter& w) { w.set_u32("deepseek2.expert_gating_func", 3); })),
      "expert_gating_func");
}

}  // namespace
}  // namespace car::model

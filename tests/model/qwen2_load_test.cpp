// Model::load for qwen2 and qwen2moe (issue #27), on files `car gguf synth` writes: the traits, the Q/K/V
// biases as views of the file's values, the shared expert's weights and width, and load_failed errors that
// name a missing shared-expert tensor, a bias of the wrong length, or the missing width keys.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <tuple>

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

class Qwen2LoadTest : public testing::SynthLoadTest {};

TEST_F(Qwen2LoadTest, Qwen2HasBiasesNeoxRopeAndNoQkNorm) {
  const synth::SynthSpec spec = synth::tiny_spec("qwen2");
  const std::string path = write(spec);
  auto m = load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_EQ(h.arch, "qwen2");
  EXPECT_EQ(h.traits, &qwen2_traits());
  EXPECT_EQ(h.rope_type, RopeType::neox);
  EXPECT_FLOAT_EQ(h.rope_freq_base, 1e6f);
  EXPECT_FALSE(h.is_moe());
  EXPECT_EQ(h.n_ff_shexp, 0);
  for (size_t il = 0; il < (*m)->layers().size(); ++il) {
    const LayerWeights& L = (*m)->layers()[il];
    EXPECT_EQ(L.q_norm, nullptr);
    EXPECT_FALSE(L.has_shexp);
    const std::string p = "blk." + std::to_string(il) + ".";
    for (auto [bias, name, n] : {std::tuple{L.q_bias, "attn_q.bias", h.q_dim()},
                                 std::tuple{L.k_bias, "attn_k.bias", h.k_dim()},
                                 std::tuple{L.v_bias, "attn_v.bias", h.v_dim()}}) {
      ASSERT_NE(bias, nullptr) << p << name;
      const auto want = tensor_values(path, p + name);
      ASSERT_EQ(static_cast<int64_t>(want.size()), n);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(bias[i], want[static_cast<size_t>(i)]) << p << name << " " << i;
    }
  }
  EXPECT_EQ((*m)->output_bias(), nullptr);
}

TEST_F(Qwen2LoadTest, BiasesAreOptionalAndCheckedForLength) {
  const synth::SynthSpec spec = synth::tiny_spec("qwen2");
  auto m = load(write(spec, "blk.1.attn_k.bias"));
  ASSERT_TRUE(m.ok()) << m.error().message;  // llama.cpp takes them as optional too
  EXPECT_EQ((*m)->layers()[1].k_bias, nullptr);
  EXPECT_NE((*m)->layers()[1].q_bias, nullptr);
  // A bias of the wrong length is named.
  const std::string bad = write(spec, "blk.0.attn_v.bias", {}, [](gguf::GgufWriter& w) {
    EXPECT_TRUE(w.add_tensor("blk.0.attn_v.bias", GgmlType::F32, {8}, std::vector<uint8_t>(32, 0)).ok());
  });
  expect_load_error(load(bad), "blk.0.attn_v.bias");
}

TEST_F(Qwen2LoadTest, Qwen2MoeHasASharedExpertBesideTheRoutedOnes) {
  const synth::SynthSpec spec = synth::tiny_spec("qwen2moe");
  auto m = load(write(spec));
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_EQ(h.traits, &qwen2moe_traits());
  EXPECT_FALSE(h.traits->moe_norm_weights);  // llama.cpp's qwen2moe graph passes norm_w = false
  EXPECT_EQ(h.n_expert, 4);
  EXPECT_EQ(h.n_ff_exp, 32);
  EXPECT_EQ(h.n_ff_shexp, 48);
  for (const LayerWeights& L : (*m)->layers()) {
    EXPECT_TRUE(L.is_moe);
    ASSERT_TRUE(L.has_shexp);
    EXPECT_NE(L.q_bias, nullptr);
    EXPECT_EQ(L.ffn_gate_inp_shexp.rows, 1);
    EXPECT_EQ(L.ffn_gate_inp_shexp.cols, h.n_embd);
    EXPECT_EQ(L.ffn_gate_shexp.rows, 48);
    EXPECT_EQ(L.ffn_up_shexp.rows, 48);
    EXPECT_EQ(L.ffn_down_shexp.rows, h.n_embd);
    EXPECT_EQ(L.ffn_down_shexp.cols, 48);
    // Dense products (mul_mat), not the experts' mul_mat_id order.
    EXPECT_EQ(L.ffn_gate_shexp.order, tensor::ProductOrder::mul_mat);
  }
  EXPECT_EQ((*m)->expert_banks()[0].n_expert, 4);
}

TEST_F(Qwen2LoadTest, Qwen2MoeErrorsNameTheMissingPiece) {
  const synth::SynthSpec spec = synth::tiny_spec("qwen2moe");
  for (const char* t : {"blk.0.ffn_gate_inp_shexp.weight", "blk.1.ffn_down_shexp.weight",
                        "blk.1.ffn_up_shexp.weight", "blk.0.ffn_gate_exps.weight"}) {
    expect_load_error(load(write(spec, t)), t);
  }
  // Without its own key the shared expert's width is feed_forward_length (64 here, not the files' 48):
  // the tensors' shapes then disagree, and the error says so.
  expect_load_error(load(write(spec, {}, "qwen2moe.expert_shared_feed_forward_length")), "ffn_gate_shexp.weight");
  // The routed experts' width has no fallback.
  expect_load_error(load(write(spec, {}, "qwen2moe.expert_feed_forward_length")),
               "qwen2moe.expert_feed_forward_length");
}

TEST_F(Qwen2LoadTest, OutputBiasIsTakenWhenPresent) {
  const synth::SynthSpec spec = synth::tiny_spec("qwen2");
  const std::string path = write(spec, {}, {}, [&](gguf::GgufWriter& w) {
    std::vector<float> b(spec.n_vocab);
    for (size_t i = 0; i < b.size(); ++i) b[i] = 0.01f * static_cast<float>(i);
    std::vector<uint8_t> bytes(b.size() * sizeof(float));
    std::memcpy(bytes.data(), b.data(), bytes.size());
    EXPECT_TRUE(w.add_tensor("output.bias", GgmlType::F32, {spec.n_vocab}, std::move(bytes)).ok());
  });
  auto m = load(path);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_NE((*m)->output_bias(), nullptr);
  EXPECT_FLOAT_EQ((*m)->output_bias()[7], 0.07f);
}

TEST(Qwen2Architectures, Registry) {
  EXPECT_EQ(find_arch("qwen2"), &qwen2_traits());
  EXPECT_EQ(find_arch("qwen2moe"), &qwen2moe_traits());
  EXPECT_TRUE(find_arch("qwen2")->dense_only);
  EXPECT_TRUE(find_arch("qwen2moe")->moe_required);
  EXPECT_TRUE(find_arch("qwen2moe")->shared_expert);
  EXPECT_NE(supported_archs().find("qwen2moe"), std::string_view::npos);
}

}  // namespace
}  // namespace car::model

// Model::load / read_hparams: the hyperparameters each architecture reads, tied embeddings, MoE banks, and a
// load_failed error naming the key or tensor for every missing or inconsistent piece.
#include "core/model/model.h"

#include <gtest/gtest.h>

#include <functional>

#include "core/gguf/gguf_writer.h"
#include "core/model/architecture.h"
#include "tests/engine/tiny_model.h"
#include "tests/model/load_test_support.h"
#include "tests/test_support.h"

namespace car::model {
namespace {

using testing::TinySpec;

using testing::expect_load_error;

class ModelLoadTest : public ::testing::Test {
 protected:
  /// Write `spec`, then re-write its metadata through `edit` (tensors kept), and load it.
  Result<std::shared_ptr<const Model>> load(const TinySpec& spec,
                                            const std::function<void(gguf::GgufWriter&)>& edit = {},
                                            const std::string& drop_key = {}) {
    const std::string p = (dir_ / ("m" + std::to_string(n_++) + ".gguf")).string();
    testing::write_tiny_model(p, spec);
    if (!edit && drop_key.empty()) return testing::load_model_file(p);
    return testing::load_model_file(testing::rewrite_gguf(p, {}, drop_key, edit));
  }
  testing::TempDir dir_;
  int n_ = 0;
};

TEST_F(ModelLoadTest, LlamaDenseHyperparameters) {
  TinySpec s;
  auto m = load(s);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Hparams& h = (*m)->hparams();
  EXPECT_EQ(h.arch, "llama");
  EXPECT_EQ(h.n_embd, s.n_embd);
  EXPECT_EQ(h.n_layer, s.n_layer);
  EXPECT_EQ(h.n_head, s.n_head);
  EXPECT_EQ(h.n_head_kv, s.n_head_kv);
  EXPECT_EQ(h.head_dim_k, s.head_dim);
  EXPECT_EQ(h.n_ff, s.n_ff);
  EXPECT_EQ(h.n_vocab, s.n_vocab);
  EXPECT_EQ(h.n_rot, s.head_dim);
  EXPECT_EQ(h.rope_type, RopeType::norm);
  EXPECT_FLOAT_EQ(h.rope_freq_scale, 1.0f);
  EXPECT_FALSE(h.is_moe());
  EXPECT_FALSE((*m)->tied_embeddings());
  EXPECT_EQ((*m)->layers().size(), size_t(s.n_layer));
  EXPECT_EQ((*m)->layers()[0].wq.rows, s.n_head * s.head_dim);
  EXPECT_EQ((*m)->layers()[0].q_norm, nullptr);
  // The weights are views into the mapping, not copies.
  const auto span = (*m)->file().bytes();
  EXPECT_GE((*m)->layers()[1].ffn_down.data, span.data());
  EXPECT_LT((*m)->layers()[1].ffn_down.data, span.data() + span.size());
}

TEST_F(ModelLoadTest, TiedEmbeddingsUseTokenEmbd) {
  TinySpec s;
  s.tied = true;
  auto m = load(s);
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE((*m)->tied_embeddings());
  EXPECT_EQ((*m)->output().data, (*m)->token_embd().data);
}

TEST_F(ModelLoadTest, Qwen3AndQwen3MoeTraits) {
  TinySpec q;
  q.arch = "qwen3";
  q.n_head = 8;
  auto m = load(q);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ((*m)->hparams().rope_type, RopeType::neox);
  EXPECT_NE((*m)->layers()[0].q_norm, nullptr);
  EXPECT_EQ((*m)->hparams().q_dim(), 8 * q.head_dim);

  TinySpec e;
  e.arch = "qwen3moe";
  e.n_expert = 4;
  e.n_expert_used = 2;
  e.n_ff = 48;
  auto moe = load(e);
  ASSERT_TRUE(moe.ok()) << moe.error().message;
  EXPECT_EQ((*moe)->hparams().n_ff_exp, 48);
  EXPECT_TRUE((*moe)->layers()[1].is_moe);
  const auto& bank = (*moe)->expert_banks()[1];
  EXPECT_EQ(bank.n_expert, 4);
  EXPECT_EQ(bank.gate_bank.rows, 48 * 4);
  EXPECT_EQ(bank.down_bank.rows, e.n_embd * 4);
  EXPECT_EQ(bank.down_bank.cols, 48);
  EXPECT_GT((*moe)->bytes_per_token(), 0u);
}

TEST_F(ModelLoadTest, MissingOrWronglyTypedKeysAreNamed) {
  TinySpec s;
  for (const char* key : {"llama.embedding_length", "llama.block_count", "llama.attention.head_count",
                          "llama.context_length", "llama.feed_forward_length",
                          "llama.attention.layer_norm_rms_epsilon", "general.architecture"}) {
    expect_load_error(load(s, {}, key), key);
    expect_load_error(load(s, [&](gguf::GgufWriter& w) { w.set_string(key, "oops"); }), key);
  }
  TinySpec moe;
  moe.arch = "qwen3moe";
  moe.n_expert = 4;
  moe.n_expert_used = 2;
  expect_load_error(load(moe, {}, "qwen3moe.expert_feed_forward_length"), "qwen3moe.expert_feed_forward_length");
  expect_load_error(load(moe, {}, "qwen3moe.expert_count"), "qwen3moe.expert_count");
}

TEST_F(ModelLoadTest, InconsistentValuesAreNamed) {
  TinySpec s;
  expect_load_error(load(s, [](gguf::GgufWriter& w) { w.set_u32("llama.attention.head_count_kv", 3); }),
               "llama.attention.head_count_kv");
  expect_load_error(load(s, [](gguf::GgufWriter& w) { w.set_u32("llama.rope.dimension_count", 7); }),
               "llama.rope.dimension_count");
  expect_load_error(load(s, [](gguf::GgufWriter& w) { w.set_string("llama.rope.scaling.type", "longrope"); }),
               "llama.rope.scaling.type");
  expect_load_error(load(s, [](gguf::GgufWriter& w) { w.set_string("general.architecture", "gpt2"); }), "gpt2");
  // A shape that no longer matches the hyperparameters names the tensor.
  expect_load_error(load(s, [](gguf::GgufWriter& w) { w.set_u32("llama.feed_forward_length", 100); }),
               "blk.0.ffn_gate.weight");
  expect_load_error(load(s, [](gguf::GgufWriter& w) { w.set_u32("llama.embedding_length", 32); }), "token_embd.weight");
  TinySpec moe;
  moe.n_expert = 4;
  moe.n_expert_used = 2;
  expect_load_error(load(moe, [](gguf::GgufWriter& w) { w.set_u32("llama.expert_used_count", 5); }),
               "llama.expert_used_count");
  expect_load_error(load(moe, [](gguf::GgufWriter& w) { w.set_u32("llama.expert_count", 8); }), "ffn_gate_inp");
}

TEST_F(ModelLoadTest, LinearRopeScalingSetsFrequencyScale) {
  TinySpec s;
  auto m = load(s, [](gguf::GgufWriter& w) {
    w.set_string("llama.rope.scaling.type", "linear");
    w.set_f32("llama.rope.scaling.factor", 4.0f);
  });
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_FLOAT_EQ((*m)->hparams().rope_freq_scale, 0.25f);
}

TEST_F(ModelLoadTest, MissingTensorsAreNamed) {
  for (const char* t : {"output_norm.weight", "blk.0.attn_q.weight", "blk.1.ffn_down.weight", "token_embd.weight"}) {
    TinySpec s;
    s.skip_tensor = t;
    expect_load_error(load(s), t);
  }
  TinySpec moe;
  moe.arch = "qwen3moe";
  moe.n_expert = 4;
  moe.n_expert_used = 2;
  moe.skip_tensor = "blk.0.ffn_up_exps.weight";
  expect_load_error(load(moe), "blk.0.ffn_up_exps.weight");
}

TEST(Architectures, Registry) {
  EXPECT_EQ(find_arch("llama"), &llama_traits());
  EXPECT_EQ(find_arch("qwen3")->rope_type, RopeType::neox);
  EXPECT_TRUE(find_arch("qwen3moe")->moe_required);
  EXPECT_EQ(find_arch("mamba"), nullptr);
}

}  // namespace
}  // namespace car::model

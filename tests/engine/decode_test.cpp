// Decode (one token per eval) runs its products as fused groups split across the pool (matvec_fused): Q/K/V,
// gate/up, every chosen expert's gate/up and then downs. Scheduling must never change a result, so token-by-
// token logits must equal, bit for bit, those of a single-threaded decode and of one batch over the same
// tokens (matmul, the prompt path), for dense and MoE models large enough for the threaded path. (For
// matrices llama.cpp repacks, batches of 4+ rows sum in its gemm order by design; see
// core/tensor/kernel_table.h.)
#include <gtest/gtest.h>

#include <span>
#include <string>

#include "core/engine/forward.h"
#include "tests/engine/loaded_tiny.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using testing::TinySpec;

using Loaded = testing::LoadedTiny;

Loaded load(const testing::TempDir& dir, const TinySpec& spec) {
  return testing::load_tiny_model(dir, spec, "decode-" + std::to_string(spec.seed) + ".gguf");
}

std::vector<float> decode(const Loaded& l, const std::vector<int32_t>& toks, ThreadPool* pool) {
  ForwardPass fp(l.model, l.experts.get(), pool, 64);
  KvCache kv = fp.make_cache(64);
  const size_t V = static_cast<size_t>(l.model->hparams().n_vocab);
  std::vector<float> out(toks.size() * V);
  for (size_t i = 0; i < toks.size(); ++i)
    EXPECT_TRUE(fp.eval(std::span<const int32_t>(&toks[i], 1), kv, out.data() + i * V, false).ok());
  return out;
}

std::vector<float> batch(const Loaded& l, const std::vector<int32_t>& toks, int64_t max_batch) {
  ForwardPass fp(l.model, l.experts.get(), nullptr, max_batch);
  KvCache kv = fp.make_cache(64);
  std::vector<float> out(toks.size() * static_cast<size_t>(l.model->hparams().n_vocab));
  EXPECT_TRUE(fp.eval(toks, kv, out.data(), true).ok());
  return out;
}

TEST(Decode, ThreadedFusedProductsEqualSingleThreadedAndBatchExactly) {
  for (bool moe : {false, true}) {
    for (GgmlType t : {GgmlType::Q8_0, GgmlType::Q4_K}) {
      SCOPED_TRACE(std::string(moe ? "moe " : "dense ") + std::string(ggml_type_name(t)));
      TinySpec s;
      s.n_embd = 512;  // every matrix > 96 KB: the products take the threaded path
      s.n_head = 8;
      s.n_head_kv = 4;
      s.head_dim = 64;
      s.n_ff = 1024;
      s.matrix_type = t;
      s.seed = moe ? 5 : 4;
      if (moe) {
        s.n_expert = 4;
        s.n_expert_used = 2;
      }
      testing::TempDir dir;
      Loaded l = load(dir, s);
      ASSERT_TRUE(l.model);
      std::vector<int32_t> toks;
      for (int i = 0; i < 8; ++i) toks.push_back(static_cast<int32_t>((3 + i * 41) % s.n_vocab));
      ThreadPool pool(2);
      const auto threaded = decode(l, toks, &pool);
      const auto inline_ = decode(l, toks, nullptr);
      // Q4_K matrices are ones llama.cpp repacks: like it, a batch's whole groups of 4 rows take its gemm
      // order and only the rest its gemv (= decode) order, so the batch path is compared in batches of 3.
      const auto all = batch(l, toks, t == GgmlType::Q4_K ? 3 : 64);
      for (size_t i = 0; i < threaded.size(); ++i) {
        ASSERT_EQ(threaded[i], inline_[i]) << i;
        ASSERT_EQ(threaded[i], all[i]) << i;
      }
    }
  }
}

}  // namespace
}  // namespace car::engine

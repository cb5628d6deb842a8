// Sliding-window attention (KvCache windows, llama.cpp's LLAMA_SWA_TYPE_STANDARD mask: a query at p sees the
// keys at p' with p - p' < window) through the forward pass: the mask cuts what a windowed model can see,
// and the prompt path, token-by-token decode and batched steps with company agree bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/engine/forward.h"
#include "tests/engine/loaded_tiny.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using testing::TinySpec;

KvCache windowed_cache(const model::Hparams& hp, int64_t n_ctx, std::vector<int64_t> windows) {
  return KvCache(hp.n_layer, n_ctx, hp.n_head_kv, hp.head_dim_k, hp.head_dim_v, std::move(windows));
}

std::vector<int32_t> tokens(int64_t n, int32_t first, int64_t vocab) {
  std::vector<int32_t> t{first};
  for (int64_t i = 1; i < n; ++i) t.push_back(static_cast<int32_t>((5 + i * 37) % vocab));
  return t;
}

/// Logits of every position, the prompt evaluated in one batch.
std::vector<float> eval_all(const testing::LoadedTiny& l, const std::vector<int32_t>& toks, KvCache kv) {
  ForwardPass fp(l.model, nullptr, nullptr, 64);
  std::vector<float> logits(toks.size() * static_cast<size_t>(l.model->hparams().n_vocab));
  EXPECT_TRUE(fp.eval(toks, kv, logits.data(), true).ok());
  return logits;
}

TEST(KvCacheWindow, FirstVisibleIsTheWindowsFirstKey) {
  KvCache kv(3, 16, 1, 4, 4, {4, 0, 1});
  EXPECT_EQ(kv.window(0), 4);
  EXPECT_EQ(kv.first_visible(0, 0), 0);
  EXPECT_EQ(kv.first_visible(0, 3), 0);   // 3 - 0 < 4: position 0 still visible
  EXPECT_EQ(kv.first_visible(0, 4), 1);   // 4 - 0 = 4: masked
  EXPECT_EQ(kv.first_visible(0, 10), 7);  // sees 7, 8, 9, 10
  EXPECT_EQ(kv.first_visible(1, 10), 0);  // global
  EXPECT_EQ(kv.first_visible(2, 10), 10); // itself only
  KvCache global(2, 8, 1, 4, 4);
  EXPECT_EQ(global.window(1), 0);
  EXPECT_EQ(global.first_visible(1, 7), 0);
}

// With every layer windowed, a position's receptive field is n_layer * (window - 1) + 1 tokens back: the
// last logits of two prompts that differ only before it are bit-identical. Without the mask (global
// layers) they differ.
TEST(SlidingWindow, TokensOutsideTheReceptiveFieldDoNotMatter) {
  TinySpec s;
  s.n_layer = 2;
  testing::TempDir dir;
  testing::LoadedTiny l = testing::load_tiny_model(dir, s, "swa.gguf");
  ASSERT_TRUE(l.model);
  const model::Hparams& hp = l.model->hparams();
  const size_t V = static_cast<size_t>(hp.n_vocab);
  const int64_t W = 4, n = 12;  // receptive field 2 * 3 + 1 = 7 < 12
  const auto a = tokens(n, 1, hp.n_vocab);
  auto b = a;
  b[0] = 7;
  b[3] = 9;
  const auto wa = eval_all(l, a, windowed_cache(hp, 32, {W, W}));
  const auto wb = eval_all(l, b, windowed_cache(hp, 32, {W, W}));
  const size_t last = static_cast<size_t>(n - 1) * V;
  EXPECT_EQ(0, std::memcmp(wa.data() + last, wb.data() + last, V * sizeof(float)));
  const auto ga = eval_all(l, a, windowed_cache(hp, 32, {0, 0}));
  const auto gb = eval_all(l, b, windowed_cache(hp, 32, {0, 0}));
  EXPECT_NE(0, std::memcmp(ga.data() + last, gb.data() + last, V * sizeof(float)));
  // Before any key falls out of the window the mask changes nothing; after, it does.
  EXPECT_EQ(0, std::memcmp(wa.data(), ga.data(), static_cast<size_t>(W) * V * sizeof(float)));
  EXPECT_NE(0, std::memcmp(wa.data() + last, ga.data() + last, V * sizeof(float)));
}

// A mix of windowed and global layers (as gemma's interleaving): one prompt batch, token-by-token decode and
// batched steps beside other sequences at other positions give the same bits.
TEST(SlidingWindow, BatchDecodeAndCompanyAgree) {
  TinySpec s;
  s.n_layer = 3;
  s.matrix_type = GgmlType::Q8_0;
  testing::TempDir dir;
  testing::LoadedTiny l = testing::load_tiny_model(dir, s, "swa-mix.gguf");
  ASSERT_TRUE(l.model);
  const model::Hparams& hp = l.model->hparams();
  const size_t V = static_cast<size_t>(hp.n_vocab);
  const std::vector<int64_t> windows{3, 5, 0};
  const int64_t n = 14;
  const auto toks = tokens(n, 1, hp.n_vocab);
  const auto batch = eval_all(l, toks, windowed_cache(hp, 32, windows));

  ForwardPass fp(l.model, nullptr, nullptr, 64);
  KvCache kv = windowed_cache(hp, 32, windows);
  std::vector<float> one(V);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(fp.eval(std::span<const int32_t>(&toks[static_cast<size_t>(i)], 1), kv, one.data(), false).ok());
    EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + static_cast<size_t>(i) * V, V * sizeof(float)))
        << "position " << i;
  }

  // Batched: the sequence's prompt's first 8 tokens in one step beside a companion's prompt, then each
  // further token as a decode row beside the companion's decode rows (the companion at other positions).
  KvCache mine = windowed_cache(hp, 32, windows);
  KvCache other = windowed_cache(hp, 32, windows);
  const auto other_toks = tokens(n + 6, 3, hp.n_vocab);
  std::vector<float> logits(2 * V);
  {
    const SeqChunk chunks[] = {
        {&other, std::span<const int32_t>(other_toks.data(), 6), SeqChunk::Output::last, -1},
        {&mine, std::span<const int32_t>(toks.data(), 8), SeqChunk::Output::last, -1}};
    ASSERT_TRUE(fp.eval_step(chunks, logits.data()).ok());
    EXPECT_EQ(0, std::memcmp(logits.data() + V, batch.data() + 7 * V, V * sizeof(float)));
  }
  for (int64_t i = 8; i < n; ++i) {
    const SeqChunk chunks[] = {
        {&other, std::span<const int32_t>(other_toks.data() + 6 + (i - 8), 1), SeqChunk::Output::last, -1},
        {&mine, std::span<const int32_t>(toks.data() + i, 1), SeqChunk::Output::last, -1}};
    ASSERT_TRUE(fp.eval_step(chunks, logits.data()).ok());
    EXPECT_EQ(0, std::memcmp(logits.data() + V, batch.data() + static_cast<size_t>(i) * V, V * sizeof(float)))
        << "position " << i;
  }
}

}  // namespace
}  // namespace car::engine

namespace car::model {
namespace {

std::vector<int64_t> pattern(int64_t n_layer, int64_t n_swa, int64_t p, bool dense_first = false) {
  Hparams h;
  h.n_layer = n_layer;
  set_swa_pattern(h, n_swa, p, dense_first);
  return h.swa_window;
}

// llama.cpp's set_swa_pattern: gemma3 (6: five local layers, then a global one), gemma2 / gpt-oss (2: even
// layers local), 0 = all local, a window of 0 = no sliding window at all.
TEST(SwaPattern, AsLlamaCpp) {
  EXPECT_EQ(pattern(8, 16, 6), (std::vector<int64_t>{16, 16, 16, 16, 16, 0, 16, 16}));
  EXPECT_EQ(pattern(4, 8, 2), (std::vector<int64_t>{8, 0, 8, 0}));
  EXPECT_EQ(pattern(3, 8, 0), (std::vector<int64_t>{8, 8, 8}));
  EXPECT_EQ(pattern(3, 8, 1), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(pattern(4, 8, 2, true), (std::vector<int64_t>{0, 8, 0, 8}));
  EXPECT_TRUE(pattern(4, 0, 6).empty());
}

}  // namespace
}  // namespace car::model

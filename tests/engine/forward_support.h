// What the per-architecture forward tests share: a synthetic model written and loaded with its experts
// resident, a fixed token sequence, its logits from one batch and token by token, and a bit-for-bit check.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/engine/forward.h"
#include "core/experts/resident_source.h"
#include "core/gguf/gguf_file.h"
#include "core/model/model.h"
#include "core/synth/synth_model.h"
#include "core/tensor/kernels.h"
#include "core/util/thread_pool.h"
#include "tests/test_support.h"

namespace car::engine::forward_testing {

struct Loaded {
  std::shared_ptr<const model::Model> model;
  std::unique_ptr<experts::ResidentExpertSource> experts;
};

inline Loaded load(const std::string& path) {
  Loaded l;
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << path;
  if (!f.ok()) return l;
  auto m = model::Model::load(*f);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  if (!m.ok()) return l;
  l.model = *m;
  if (l.model->hparams().is_moe()) {
    l.experts = std::make_unique<experts::ResidentExpertSource>(l.model->expert_banks());
  }
  return l;
}

/// Write `s` into `dir` as <arch>-<weight type><tag>.gguf; returns the path.
inline std::string write(const testing::TempDir& dir, const synth::SynthSpec& s,
                         const std::string& tag = {}) {
  const std::string path = (dir / (s.arch + "-" + s.weight_type + tag + ".gguf")).string();
  auto ok = synth::write_synth_model(s, path);
  EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
  return path;
}

inline std::vector<int32_t> tokens(int n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(1 + (5 + i * 97) % (vocab - 1)));
  return t;
}

inline std::vector<float> batch_logits(const Loaded& l, const std::vector<int32_t>& toks, ThreadPool* pool,
                                       int64_t max_batch) {
  ForwardPass fp(l.model, l.experts.get(), pool, max_batch);
  KvCache kv = fp.make_cache(64);
  std::vector<float> out(toks.size() * static_cast<size_t>(l.model->hparams().n_vocab));
  EXPECT_TRUE(fp.eval(toks, kv, out.data(), true).ok());
  return out;
}

inline std::vector<float> decode_logits(const Loaded& l, const std::vector<int32_t>& toks, ThreadPool* pool) {
  ForwardPass fp(l.model, l.experts.get(), pool, 64);
  KvCache kv = fp.make_cache(64);
  const size_t V = static_cast<size_t>(l.model->hparams().n_vocab);
  std::vector<float> out(toks.size() * V);
  for (size_t i = 0; i < toks.size(); ++i) {
    EXPECT_TRUE(fp.eval(std::span<const int32_t>(&toks[i], 1), kv, out.data() + i * V, false).ok());
  }
  return out;
}

inline void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                             const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

/// Batched prefill equals token-by-token decode, and chunks of `chunk` on one thread change no bit; the logits
/// are not all near zero (so the comparison is not vacuous). 13 tokens. A batch of 8 or more multiplies the IQ
/// panel types in llama.cpp's panel order (core/tensor/iq_panel.h), which one-token steps do not take: the
/// batch is compared with decode with the panel off, and with its own chunks with the panel on.
inline void expect_batch_equals_decode(const Loaded& l, ThreadPool* pool, int chunk = 4) {
  const auto toks = tokens(13, l.model->hparams().n_vocab);
  tensor::set_iq_panel_enabled(false);
  const auto dot_order = batch_logits(l, toks, pool, 64);
  tensor::set_iq_panel_enabled(true);
  expect_same_bits(dot_order, decode_logits(l, toks, pool), "batch (IQ panel off) vs token by token");
  const auto batch = batch_logits(l, toks, pool, 64);
  expect_same_bits(batch, batch_logits(l, toks, nullptr, chunk), "chunks, one thread");
  double spread = 0;
  for (float v : batch) spread = std::max(spread, static_cast<double>(std::fabs(v)));
  EXPECT_GT(spread, 0.5);  // not vacuous
}

/// Two prompts (11 and `nb` tokens) in one eval_step give each the last-row logits it gets alone, bit for bit;
/// then the first sequence's next token, decoded in a step beside the second's, gives its logits alone.
inline void expect_alone_equals_in_company(const Loaded& l, ThreadPool* pool, int nb) {
  const size_t V = static_cast<size_t>(l.model->hparams().n_vocab);
  const auto a = tokens(11, static_cast<int64_t>(V));
  auto b = tokens(nb, static_cast<int64_t>(V));
  for (int32_t& t : b) t = static_cast<int32_t>((t * 3 + 1) % static_cast<int32_t>(V));
  const int32_t next = 17;
  ForwardPass fp(l.model, l.experts.get(), pool, 64);
  // Alone: each prompt in its own batch, last row; then a's next token decoded.
  std::vector<float> want_a(V), want_a2(V), want_b(V);
  {
    KvCache kv = fp.make_cache(64);
    ASSERT_TRUE(fp.eval(a, kv, want_a.data(), false).ok());
    ASSERT_TRUE(fp.eval(std::span<const int32_t>(&next, 1), kv, want_a2.data(), false).ok());
    KvCache kv2 = fp.make_cache(64);
    ASSERT_TRUE(fp.eval(b, kv2, want_b.data(), false).ok());
  }
  // Together: one step holding both prompts.
  KvCache ka = fp.make_cache(64), kb = fp.make_cache(64);
  SeqChunk chunks[2];
  chunks[0].kv = &ka;
  chunks[0].tokens = a;
  chunks[0].output = SeqChunk::Output::last;
  chunks[1].kv = &kb;
  chunks[1].tokens = b;
  chunks[1].output = SeqChunk::Output::last;
  std::vector<float> got(2 * V);
  ASSERT_TRUE(fp.eval_step(chunks, got.data()).ok());
  EXPECT_EQ(0, std::memcmp(got.data(), want_a.data(), V * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(got.data() + V, want_b.data(), V * sizeof(float)));
  // a's decode row second in a step with b's next token (b at another position).
  SeqChunk step[2];
  step[0].kv = &kb;
  step[0].tokens = std::span<const int32_t>(&next, 1);
  step[0].output = SeqChunk::Output::last;
  step[1].kv = &ka;
  step[1].tokens = std::span<const int32_t>(&next, 1);
  step[1].output = SeqChunk::Output::last;
  ASSERT_TRUE(fp.eval_step(step, got.data()).ok());
  EXPECT_EQ(0, std::memcmp(got.data() + V, want_a2.data(), V * sizeof(float)));
}

}  // namespace car::engine::forward_testing

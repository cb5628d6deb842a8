// ForwardPass on gemma3 files written by synth (issue #27): sliding-window layers with their own RoPE base,
// post norms, GEGLU, the scaled embeddings and Q, in the prompt path, the decode path and batched steps:
//   - a prompt longer than the window evaluated in one batch gives bit for bit the logits of token-by-token
//     decode (F32, Q8_0), and chunking or a second thread changes nothing;
//   - a sequence's logits are the same alone and in a step with another sequence (Q4_K_M);
//   - final_logit_softcapping c gives exactly c * tanh(logits / c) of the uncapped file's logits.
// Agreement with llama.cpp itself is engine_reference_conformance_test's (gemma3-* goldens).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/engine/forward.h"
#include "core/synth/synth_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

std::shared_ptr<const model::Model> load(const testing::TempDir& dir, const synth::SynthSpec& s, const std::string& name) {
  const std::string path = (dir / name).string();
  auto ok = synth::write_synth_model(s, path);
  EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << path;
  if (!f.ok()) return nullptr;
  auto m = model::Model::load(*f);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  return m.ok() ? *m : nullptr;
}

synth::SynthSpec spec_of(const std::string& type) {
  synth::SynthSpec s = synth::tiny_spec("gemma3");  // 7 layers (layer 5 global), window 4
  s.n_embd = 256;  // K-quant rows
  s.n_ff = 256;
  s.head_dim = 64;
  s.weight_type = type;
  return s;
}

std::vector<int32_t> tokens(int n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(1 + (5 + i * 97) % (vocab - 1)));
  return t;
}

std::vector<float> batch_logits(const std::shared_ptr<const model::Model>& m, const std::vector<int32_t>& toks,
                                ThreadPool* pool, int64_t max_batch) {
  ForwardPass fp(m, nullptr, pool, max_batch);
  KvCache kv = fp.make_cache(64);
  std::vector<float> out(toks.size() * static_cast<size_t>(m->hparams().n_vocab));
  EXPECT_TRUE(fp.eval(toks, kv, out.data(), true).ok());
  return out;
}

std::vector<float> decode_logits(const std::shared_ptr<const model::Model>& m, const std::vector<int32_t>& toks) {
  ForwardPass fp(m, nullptr, nullptr, 64);
  KvCache kv = fp.make_cache(64);
  const size_t V = static_cast<size_t>(m->hparams().n_vocab);
  std::vector<float> out(toks.size() * V);
  for (size_t i = 0; i < toks.size(); ++i) {
    EXPECT_TRUE(fp.eval(std::span<const int32_t>(&toks[i], 1), kv, out.data() + i * V, false).ok());
  }
  return out;
}

TEST(Gemma3Forward, BatchEqualsDecodeAndChunkingAndThreadsChangeNothing) {
  testing::TempDir dir;
  ThreadPool pool(2);
  for (const char* type : {"f32", "q8_0"}) {
    SCOPED_TRACE(type);
    auto m = load(dir, spec_of(type), std::string("g-") + type + ".gguf");
    ASSERT_TRUE(m);
    ASSERT_EQ(m->hparams().window(0), 4);
    const auto toks = tokens(13, m->hparams().n_vocab);  // longer than the window
    const auto batch = batch_logits(m, toks, &pool, 64);
    const auto dec = decode_logits(m, toks);
    ASSERT_EQ(batch.size(), dec.size());
    EXPECT_EQ(0, std::memcmp(batch.data(), dec.data(), batch.size() * sizeof(float))) << "batch vs decode";
    const auto chunked = batch_logits(m, toks, nullptr, 5);
    EXPECT_EQ(0, std::memcmp(batch.data(), chunked.data(), batch.size() * sizeof(float))) << "chunks of 5";
    double spread = 0;
    for (float v : batch) spread = std::max(spread, static_cast<double>(std::fabs(v)));
    EXPECT_GT(spread, 0.5);  // not vacuous
  }
}

// gemma2 (soft-capped attention on the scalar head, windowed even layers): the same agreements.
TEST(Gemma3Forward, Gemma2BatchEqualsDecodeAndCompany) {
  testing::TempDir dir;
  ThreadPool pool(2);
  synth::SynthSpec s = spec_of("q8_0");
  s.arch = "gemma2";
  s.tied_embeddings = true;
  s.attn_logit_softcap = 3.0f;
  s.final_logit_softcap = 8.0f;
  auto m = load(dir, s, "g2.gguf");
  ASSERT_TRUE(m);
  ASSERT_EQ(m->hparams().attn_logit_softcap, 3.0f);
  const auto toks = tokens(13, m->hparams().n_vocab);
  const auto batch = batch_logits(m, toks, &pool, 64);
  const auto dec = decode_logits(m, toks);
  ASSERT_EQ(batch.size(), dec.size());
  EXPECT_EQ(0, std::memcmp(batch.data(), dec.data(), batch.size() * sizeof(float))) << "batch vs decode";
  const size_t V = static_cast<size_t>(m->hparams().n_vocab);
  ForwardPass fp(m, nullptr, &pool, 64);
  KvCache ka = fp.make_cache(64), kb = fp.make_cache(64);
  const auto other = tokens(5, static_cast<int64_t>(V));
  const SeqChunk chunks[] = {{&kb, other, SeqChunk::Output::last, -1}, {&ka, toks, SeqChunk::Output::all, -1}};
  std::vector<float> got((1 + toks.size()) * V);
  ASSERT_TRUE(fp.eval_step(chunks, got.data()).ok());
  EXPECT_EQ(0, std::memcmp(got.data() + V, batch.data(), batch.size() * sizeof(float))) << "in company";
  for (float v : batch) ASSERT_LE(std::fabs(v), 8.0f);
}

TEST(Gemma3Forward, SequenceAloneEqualsInCompanyQ4KM) {
  testing::TempDir dir;
  ThreadPool pool(2);
  auto m = load(dir, spec_of("q4_k_m"), "g-q4km.gguf");
  ASSERT_TRUE(m);
  const size_t V = static_cast<size_t>(m->hparams().n_vocab);
  const auto a = tokens(11, static_cast<int64_t>(V));
  auto b = tokens(6, static_cast<int64_t>(V));
  for (int32_t& t : b) t = static_cast<int32_t>((t * 3 + 1) % static_cast<int32_t>(V));
  ForwardPass fp(m, nullptr, &pool, 64);
  std::vector<float> want_a(V), want_b(V), want_next(V);
  const int32_t next = 17;
  {
    KvCache kv = fp.make_cache(64);
    ASSERT_TRUE(fp.eval(a, kv, want_a.data(), false).ok());
    ASSERT_TRUE(fp.eval(std::span<const int32_t>(&next, 1), kv, want_next.data(), false).ok());
    KvCache kv2 = fp.make_cache(64);
    ASSERT_TRUE(fp.eval(b, kv2, want_b.data(), false).ok());
  }
  KvCache ka = fp.make_cache(64), kb = fp.make_cache(64);
  std::vector<float> got(2 * V);
  {
    const SeqChunk chunks[] = {{&ka, a, SeqChunk::Output::last, -1}, {&kb, b, SeqChunk::Output::last, -1}};
    ASSERT_TRUE(fp.eval_step(chunks, got.data()).ok());
    EXPECT_EQ(0, std::memcmp(got.data(), want_a.data(), V * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(got.data() + V, want_b.data(), V * sizeof(float)));
  }
  {  // a decode row of a beside one of b, at another position
    const int32_t other = 23;
    const SeqChunk chunks[] = {{&kb, std::span<const int32_t>(&other, 1), SeqChunk::Output::last, -1},
                               {&ka, std::span<const int32_t>(&next, 1), SeqChunk::Output::last, -1}};
    ASSERT_TRUE(fp.eval_step(chunks, got.data()).ok());
    EXPECT_EQ(0, std::memcmp(got.data() + V, want_next.data(), V * sizeof(float)));
  }
}

TEST(Gemma3Forward, FinalSoftcapCapsTheLogits) {
  testing::TempDir dir;
  synth::SynthSpec s = spec_of("q8_0");
  auto plain = load(dir, s, "plain.gguf");
  s.final_logit_softcap = 2.0f;  // small, so it bites
  auto capped = load(dir, s, "capped.gguf");
  ASSERT_TRUE(plain && capped);
  const auto toks = tokens(7, s.n_vocab);
  auto want = batch_logits(plain, toks, nullptr, 64);
  const auto got = batch_logits(capped, toks, nullptr, 64);
  float biggest = 0;
  for (float v : want) biggest = std::max(biggest, std::fabs(v));
  EXPECT_GT(biggest, 2.0f);
  softcap(want.data(), 2.0f, static_cast<int64_t>(want.size()));
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)));
}

}  // namespace
}  // namespace car::engine

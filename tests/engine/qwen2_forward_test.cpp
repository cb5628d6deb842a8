// ForwardPass on qwen2 / qwen2moe files written by synth (issue #27): the Q/K/V biases and the shared expert
// run in the prompt path, the decode path and batched steps alike, so
//   - a prompt evaluated in one batch gives bit for bit the logits of token-by-token decode (F32 and Q8_0:
//     no repacked order), and chunking or a second thread changes nothing;
//   - a sequence's logits are the same alone and in a step with another sequence (Q4_K_M, whose repacked
//     Q4_K products are the only order a batch could change);
//   - output.bias, when present, is added to the logits (exactly: logits + bias in float).
// Agreement with llama.cpp itself is engine_reference_conformance_test's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/engine/forward.h"
#include "core/experts/resident_source.h"
#include "core/gguf/gguf_writer.h"
#include "core/synth/synth_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

struct Loaded {
  std::shared_ptr<const model::Model> model;
  std::unique_ptr<experts::ResidentExpertSource> experts;
};

Loaded load(const std::string& path) {
  Loaded l;
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok()) << path;
  if (!f.ok()) return l;
  auto m = model::Model::load(*f);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
  if (!m.ok()) return l;
  l.model = *m;
  if (l.model->hparams().is_moe()) l.experts = std::make_unique<experts::ResidentExpertSource>(l.model->expert_banks());
  return l;
}

synth::SynthSpec spec_of(const std::string& arch, const std::string& type) {
  synth::SynthSpec s = synth::tiny_spec(arch);
  s.n_embd = 256;  // K-quant rows
  s.n_head = 4;
  s.n_head_kv = 2;
  s.n_ff = 256;
  s.n_ff_expert = 256;
  s.n_ff_shared = arch == "qwen2moe" ? 512 : 0;
  s.n_vocab = 320;
  s.weight_type = type;
  s.seed = 77;
  return s;
}

std::string write(const testing::TempDir& dir, const synth::SynthSpec& s) {
  const std::string path = (dir / (s.arch + "-" + s.weight_type + ".gguf")).string();
  auto ok = synth::write_synth_model(s, path);
  EXPECT_TRUE(ok.ok()) << (ok.ok() ? "" : ok.error().message);
  return path;
}

std::vector<int32_t> tokens(int n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(1 + (5 + i * 97) % (vocab - 1)));
  return t;
}

std::vector<float> batch_logits(const Loaded& l, const std::vector<int32_t>& toks, ThreadPool* pool, int64_t max_batch) {
  ForwardPass fp(l.model, l.experts.get(), pool, max_batch);
  KvCache kv = fp.make_cache(64);
  std::vector<float> out(toks.size() * static_cast<size_t>(l.model->hparams().n_vocab));
  EXPECT_TRUE(fp.eval(toks, kv, out.data(), true).ok());
  return out;
}

std::vector<float> decode_logits(const Loaded& l, const std::vector<int32_t>& toks, ThreadPool* pool) {
  ForwardPass fp(l.model, l.experts.get(), pool, 64);
  KvCache kv = fp.make_cache(64);
  const size_t V = static_cast<size_t>(l.model->hparams().n_vocab);
  std::vector<float> out(toks.size() * V);
  for (size_t i = 0; i < toks.size(); ++i) {
    EXPECT_TRUE(fp.eval(std::span<const int32_t>(&toks[i], 1), kv, out.data() + i * V, false).ok());
  }
  return out;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << what;
}

TEST(Qwen2Forward, BatchEqualsDecodeAndChunkingAndThreadsChangeNothing) {
  testing::TempDir dir;
  ThreadPool pool(2);
  for (const char* arch : {"qwen2", "qwen2moe"}) {
    for (const char* type : {"f32", "q8_0"}) {
      SCOPED_TRACE(std::string(arch) + " " + type);
      Loaded l = load(write(dir, spec_of(arch, type)));
      ASSERT_TRUE(l.model);
      const auto toks = tokens(13, l.model->hparams().n_vocab);
      const auto batch = batch_logits(l, toks, &pool, 64);
      expect_same_bits(batch, decode_logits(l, toks, &pool), "batch vs token by token");
      expect_same_bits(batch, batch_logits(l, toks, nullptr, 5), "chunks of 5, one thread");
      double spread = 0;
      for (float v : batch) spread = std::max(spread, static_cast<double>(std::fabs(v)));
      EXPECT_GT(spread, 0.5);  // not vacuous
    }
  }
}

TEST(Qwen2Forward, SequenceAloneEqualsInCompanyQ4KM) {
  testing::TempDir dir;
  ThreadPool pool(2);
  for (const char* arch : {"qwen2", "qwen2moe"}) {
    SCOPED_TRACE(arch);
    Loaded l = load(write(dir, spec_of(arch, "q4_k_m")));
    ASSERT_TRUE(l.model);
    const size_t V = static_cast<size_t>(l.model->hparams().n_vocab);
    const auto a = tokens(11, static_cast<int64_t>(V));
    auto b = tokens(6, static_cast<int64_t>(V));
    for (int32_t& t : b) t = static_cast<int32_t>((t * 3 + 1) % static_cast<int32_t>(V));
    // Alone: each prompt in its own batch, last row.
    ForwardPass fp(l.model, l.experts.get(), &pool, 64);
    std::vector<float> want_a(V), want_b(V);
    {
      KvCache kv = fp.make_cache(64);
      ASSERT_TRUE(fp.eval(a, kv, want_a.data(), false).ok());
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
  }
}

TEST(Qwen2Forward, OutputBiasIsAddedToTheLogits) {
  testing::TempDir dir;
  const synth::SynthSpec s = spec_of("qwen2", "f32");
  const std::string plain = write(dir, s);
  std::vector<float> bias(s.n_vocab);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * static_cast<float>(i % 7) - 0.5f;
  // The same file with output.bias appended.
  std::string biased = (dir / "biased.gguf").string();
  {
    auto f = gguf::GgufFile::open(plain);
    ASSERT_TRUE(f.ok());
    gguf::GgufWriter w;
    for (const auto& kv : (*f)->metadata()) w.set(kv.key, kv.value);
    for (const auto& t : (*f)->tensors()) {
      auto bytes = (*f)->tensor_data(t);
      std::vector<uint64_t> shape(t.ne.begin(), t.ne.begin() + t.n_dims);
      ASSERT_TRUE(w.add_tensor(t.name, t.type, shape, std::vector<uint8_t>(bytes.begin(), bytes.end())).ok());
    }
    std::vector<uint8_t> bytes(bias.size() * sizeof(float));
    std::memcpy(bytes.data(), bias.data(), bytes.size());
    ASSERT_TRUE(w.add_tensor("output.bias", GgmlType::F32, {s.n_vocab}, std::move(bytes)).ok());
    ASSERT_TRUE(w.write(biased).ok());
  }
  Loaded a = load(plain), b = load(biased);
  ASSERT_TRUE(a.model && b.model);
  const auto toks = tokens(5, s.n_vocab);
  const auto la = batch_logits(a, toks, nullptr, 64);
  const auto lb = batch_logits(b, toks, nullptr, 64);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) {
    ASSERT_EQ(lb[i], la[i] + bias[i % bias.size()]) << i;
  }
}

}  // namespace
}  // namespace car::engine

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
#include "tests/engine/forward_support.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using namespace forward_testing;  // NOLINT(google-build-using-namespace): the shared test helpers

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

TEST(Qwen2Forward, BatchEqualsDecodeAndChunkingAndThreadsChangeNothing) {
  testing::TempDir dir;
  ThreadPool pool(2);
  for (const char* arch : {"qwen2", "qwen2moe"}) {
    for (const char* type : {"f32", "q8_0"}) {
      SCOPED_TRACE(std::string(arch) + " " + type);
      Loaded l = load(write(dir, spec_of(arch, type)));
      ASSERT_TRUE(l.model);
      expect_batch_equals_decode(l, &pool, 5);
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
    expect_alone_equals_in_company(l, &pool, 6);
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

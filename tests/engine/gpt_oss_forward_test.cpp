// ForwardPass on gpt-oss files written by synth (issue #27): sinks, the sliding-window layers, the O / router /
// expert biases, softmax-top-k routing and swiglu_oai run in the prompt path, the decode path and batched
// steps alike, so
//   - a prompt longer than the window evaluated in one batch gives bit for bit the logits of token-by-token
//     decode (F32, Q8_0, and MXFP4 experts beside Q8_0: llama-quantize's MXFP4_MOE), and chunking or a
//     second thread changes nothing;
//   - a sequence's logits are the same alone and in a step with another sequence at other positions;
//   - the sinks and the window are live: changing the sink logits or the window changes the logits.
// Agreement with llama.cpp itself is engine_reference_conformance_test's (gpt-oss-* fixtures).
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


synth::SynthSpec spec_of(const std::string& type) {
  synth::SynthSpec s = synth::tiny_spec("gpt-oss");
  s.n_layer = 3;
  s.n_embd = 256;  // MXFP4 / Q8_0 rows
  s.n_head = 4;
  s.n_head_kv = 2;
  s.head_dim = 64;
  s.n_ff = 256;
  s.n_ff_expert = 256;
  s.n_expert = 8;
  s.n_expert_used = 3;
  s.n_vocab = 320;
  s.sliding_window = 5;
  s.weight_type = type;
  s.seed = 78;
  return s;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

TEST(GptOssForward, BatchEqualsDecodeAndChunkingAndThreadsChangeNothing) {
  testing::TempDir dir;
  ThreadPool pool(2);
  for (const char* type : {"f32", "q8_0", "mxfp4_moe"}) {
    SCOPED_TRACE(type);
    Loaded l = load(write(dir, spec_of(type)));
    ASSERT_TRUE(l.model);
    if (std::string(type) == "mxfp4_moe") {
      EXPECT_EQ(l.model->expert_banks()[0].gate_bank.type, GgmlType::MXFP4);
      EXPECT_EQ(l.model->layers()[0].wq.type, GgmlType::Q8_0);
    }
    expect_batch_equals_decode(l, &pool);  // 13 tokens: past the window of 5
  }
}

TEST(GptOssForward, SequenceAloneEqualsInCompany) {
  testing::TempDir dir;
  ThreadPool pool(2);
  Loaded l = load(write(dir, spec_of("mxfp4_moe")));
  ASSERT_TRUE(l.model);
  expect_alone_equals_in_company(l, &pool, 7);
}

TEST(GptOssForward, SinksAndWindowAreLive) {
  testing::TempDir dir;
  const synth::SynthSpec s = spec_of("q8_0");
  const std::string base = write(dir, s);
  synth::SynthSpec wide = s;
  wide.sliding_window = 64;  // wider than the prompt: every layer sees everything
  const std::string global = write(dir, wide, "-wide");
  // The same file with every sink at -1e4 (no sink at all, in effect).
  const std::string nosink = (dir / "nosink.gguf").string();
  {
    auto f = gguf::GgufFile::open(base);
    ASSERT_TRUE(f.ok());
    gguf::GgufWriter w;
    for (const auto& kv : (*f)->metadata()) w.set(kv.key, kv.value);
    for (const auto& t : (*f)->tensors()) {
      auto bytes = (*f)->tensor_data(t);
      std::vector<uint8_t> data(bytes.begin(), bytes.end());
      if (t.name.ends_with("attn_sinks.weight")) {
        for (size_t i = 0; i < data.size(); i += 4) {
          const float v = -1e4f;
          std::memcpy(data.data() + i, &v, 4);
        }
      }
      std::vector<uint64_t> shape(t.ne.begin(), t.ne.begin() + t.n_dims);
      ASSERT_TRUE(w.add_tensor(t.name, t.type, shape, std::move(data)).ok());
    }
    ASSERT_TRUE(w.write(nosink).ok());
  }
  Loaded a = load(base), b = load(global), c = load(nosink);
  ASSERT_TRUE(a.model && b.model && c.model);
  const auto toks = tokens(12, s.n_vocab);
  const auto la = batch_logits(a, toks, nullptr, 64);
  const auto lb = batch_logits(b, toks, nullptr, 64);
  const auto lc = batch_logits(c, toks, nullptr, 64);
  const size_t V = s.n_vocab;
  // Within the window (the first 5 positions) the window changes nothing; past it, it does.
  const std::vector<float> head_a(la.begin(), la.begin() + 5 * V), head_b(lb.begin(), lb.begin() + 5 * V);
  expect_same_bits(head_a, head_b, "positions inside the window");
  EXPECT_GT(max_abs_diff(la, lb), 1e-3);
  EXPECT_GT(max_abs_diff(la, lc), 1e-3);  // the sinks take part in every position's softmax
}

}  // namespace
}  // namespace car::engine

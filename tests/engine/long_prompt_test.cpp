// Every architecture through the engine with a prompt that fills most of the context: the scheduler makes
// the sequences' KV caches (ForwardPass::create_cache), and the tokens it decodes must be the forward pass's
// on make_cache's cache. The scheduler once built its caches from n_head_kv and head_dim_k itself, which is
// wrong for deepseek2's MLA (one [latent | rope key] head, wider): its rows overran the next layer's past a
// third of the context and the mapping's end at the last layer (car bench -p 20 and up segfaulted; ASan
// caught the write in attention_mla), and no test saw it because every prompt was short. Sliding windows
// (gemma2/3, gpt-oss: window 4 in the tiny specs) and MoE routing are crossed by the same prompt.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "core/engine/engine.h"
#include "core/engine/forward.h"
#include "core/synth/synth_model.h"
#include "core/util/thread_pool.h"
#include "tests/engine/forward_support.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using namespace forward_testing;  // NOLINT(google-build-using-namespace): the shared test helpers

int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

/// log softmax(row)[id], in double.
double logprob(const float* row, int64_t n, int32_t id) {
  const double mx = *std::max_element(row, row + n);
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(row[i]) - mx);
  return static_cast<double>(row[id]) - mx - std::log(sum);
}

class LongPrompt : public ::testing::TestWithParam<const char*> {};

TEST_P(LongPrompt, FillingTheContextThroughTheSchedulerDecodesAsTheForwardPass) {
  testing::TempDir dir;
  ThreadPool pool(2);
  const std::string path = write(dir, synth::tiny_spec(GetParam()));
  Loaded l = load(path);
  ASSERT_TRUE(l.model);
  const int64_t V = l.model->hparams().n_vocab;
  const auto prompt = tokens(29, V);
  // The forward pass alone: greedy over the prompt, then one decoded token.
  ForwardPass fp(l.model, l.experts.get(), &pool, 64);
  KvCache kv = fp.make_cache(64);
  std::vector<float> out(prompt.size() * static_cast<size_t>(V));
  ASSERT_TRUE(fp.eval(prompt, kv, out.data(), true).ok());
  const float* last = out.data() + (prompt.size() - 1) * static_cast<size_t>(V);
  const int32_t t1 = argmax(last, V);
  std::vector<float> next(static_cast<size_t>(V));
  ASSERT_TRUE(fp.eval(std::span<const int32_t>(&t1, 1), kv, next.data(), false).ok());
  const int32_t t2 = argmax(next.data(), V);

  LoadOptions o;
  o.context_length = 32;
  o.parallel = 2;
  o.threads = 2;
  auto m = load_model(path, o);
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(model_context_length(**m), 32);
  GenerateRequest req;
  req.prompt_ids = prompt;
  req.add_bos = false;
  req.max_tokens = 3;
  req.ignore_eos = true;
  req.sampling.temperature = 0;
  req.logprobs = true;
  auto r = generate(**m, req, {}, nullptr);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->tokens.size(), 3u);
  ASSERT_EQ(r->logprobs.size(), 3u);
  EXPECT_EQ(r->tokens[0], t1);
  EXPECT_EQ(r->tokens[1], t2);
  // Greedy ids alone can survive a corrupted cache on a tiny random model; the logprobs cannot.
  EXPECT_NEAR(r->logprobs[0], logprob(last, V, t1), 1e-5);
  EXPECT_NEAR(r->logprobs[1], logprob(next.data(), V, t2), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(EveryArchitecture, LongPrompt,
                         ::testing::Values("llama", "llama-moe", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "gemma2",
                                           "gemma3", "gpt-oss", "deepseek2"),
                         [](const ::testing::TestParamInfo<const char*>& p) {
                           std::string name = p.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

}  // namespace
}  // namespace car::engine

// ForwardPass on small random models the test writes itself (no conformance files needed): against a naive
// double-precision forward over the same (dequantized) weights, and batch/decode/chunking consistency.
#include "core/engine/forward.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "tests/engine/loaded_tiny.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using testing::TinySpec;

using Loaded = testing::LoadedTiny;

Loaded load_tiny(const testing::TempDir& dir, const TinySpec& spec) {
  return testing::load_tiny_model(dir, spec, spec.arch + "-" + std::to_string(spec.seed) + ".gguf");
}

std::vector<int32_t> some_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((1 + i * 37) % vocab));
  return t;
}

std::vector<float> eval_all(const Loaded& l, const std::vector<int32_t>& toks, ThreadPool* pool, int64_t max_batch) {
  ForwardPass fp(l.model, l.experts.get(), pool, max_batch);
  KvCache kv = fp.make_cache(64);
  std::vector<float> logits(toks.size() * static_cast<size_t>(l.model->hparams().n_vocab));
  EXPECT_TRUE(fp.eval(toks, kv, logits.data(), true).ok());
  EXPECT_EQ(kv.n_past(), static_cast<int64_t>(toks.size()));
  return logits;
}

/// The tiny Q8_0 model, dense or with 4 experts (2 used).
TinySpec q8_tiny(bool moe) {
  TinySpec s;
  if (moe) {
    s.n_expert = 4;
    s.n_expert_used = 2;
  }
  s.matrix_type = GgmlType::Q8_0;
  return s;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

void check_against_reference(const TinySpec& spec, double tol) {
  testing::TempDir dir;
  Loaded l = load_tiny(dir, spec);
  ASSERT_TRUE(l.model);
  auto toks = some_tokens(12, spec.n_vocab);
  ThreadPool pool(2);
  auto got = eval_all(l, toks, &pool, 64);
  auto ref = testing::reference_forward(spec, l.weights, toks);
  const double dev = max_abs_diff(got, ref);
  double spread = 0;
  for (double v : ref) spread = std::max(spread, std::fabs(v));
  EXPECT_LT(dev, tol) << spec.arch << " type " << ggml_type_name(spec.matrix_type) << " (max |logit| " << spread << ")";
  EXPECT_GT(spread, 0.5);  // the test is not vacuous
}

TEST(ForwardReference, LlamaDenseF32) { check_against_reference(TinySpec{}, 1e-2); }

TEST(ForwardReference, LlamaTiedF32) {
  TinySpec s;
  s.tied = true;
  check_against_reference(s, 1e-2);
}

TEST(ForwardReference, LlamaMoeF32) {
  TinySpec s;
  s.n_expert = 4;
  s.n_expert_used = 2;
  s.n_ff = 32;
  s.seed = 3;
  check_against_reference(s, 1e-2);
}

TEST(ForwardReference, Qwen3F32) {
  TinySpec s;
  s.arch = "qwen3";
  s.n_head = 8;  // q wider than n_embd
  s.rope_base = 1e6f;
  s.seed = 5;
  check_against_reference(s, 1e-2);
}

TEST(ForwardReference, Qwen3MoeF32) {
  TinySpec s;
  s.arch = "qwen3moe";
  s.n_expert = 8;
  s.n_expert_used = 2;
  s.n_ff = 32;
  s.seed = 7;
  check_against_reference(s, 1e-2);
}

TEST(ForwardReference, LlamaMoeQ8_0) {
  TinySpec s;
  s.n_expert = 4;
  s.n_expert_used = 2;
  s.n_ff = 64;
  s.matrix_type = GgmlType::Q8_0;
  s.embd_type = GgmlType::Q8_0;
  s.seed = 9;
  check_against_reference(s, 6e-2);
}

/// A Qwen3 MoE of Q4_K matrices whose row counts are multiples of 8 (llama.cpp's repacked orders).
TinySpec qwen3moe_q4k() {
  TinySpec s;
  s.arch = "qwen3moe";
  s.n_embd = 256;
  s.n_expert = 4;
  s.n_expert_used = 2;
  s.n_ff = 256;
  s.head_dim = 64;
  s.matrix_type = GgmlType::Q4_K;
  return s;
}

TEST(ForwardReference, Qwen3MoeQ4K) {
  TinySpec s = qwen3moe_q4k();
  s.seed = 11;
  check_against_reference(s, 0.15);
}

TEST(ForwardConsistency, BatchEqualsTokenByToken) {
  for (bool moe : {false, true}) {
    const TinySpec s = q8_tiny(moe);
    testing::TempDir dir;
    Loaded l = load_tiny(dir, s);
    auto toks = some_tokens(10, s.n_vocab);
    auto batch = eval_all(l, toks, nullptr, 64);
    ForwardPass fp(l.model, l.experts.get(), nullptr, 64);
    KvCache kv = fp.make_cache(32);
    std::vector<float> one(static_cast<size_t>(s.n_vocab));
    double dev = 0;
    for (size_t i = 0; i < toks.size(); ++i) {
      EXPECT_TRUE(fp.eval(std::span<const int32_t>(&toks[i], 1), kv, one.data(), false).ok());
      for (int64_t v = 0; v < s.n_vocab; ++v) {
        dev = std::max(dev, std::fabs(double(one[static_cast<size_t>(v)]) - batch[i * static_cast<size_t>(s.n_vocab) + static_cast<size_t>(v)]));
      }
    }
    EXPECT_LT(dev, 1e-4) << (moe ? "moe" : "dense");
  }
}

TEST(ForwardConsistency, ChunkingAndThreadsDoNotChangeLogits) {
  TinySpec s;
  s.n_expert = 4;
  s.n_expert_used = 2;
  testing::TempDir dir;
  Loaded l = load_tiny(dir, s);
  auto toks = some_tokens(13, s.n_vocab);
  auto a = eval_all(l, toks, nullptr, 64);
  ThreadPool pool(2);
  auto b = eval_all(l, toks, &pool, 5);
  double dev = 0;
  for (size_t i = 0; i < a.size(); ++i) dev = std::max(dev, std::fabs(double(a[i]) - b[i]));
  EXPECT_LT(dev, 1e-4);
}

// A batched MoE step runs its experts in fused groups whose rows fit max_batch (forward.cpp run_experts): the
// same 8-token step with room for every expert's rows in one group (max_batch 64) and in groups of at most 8
// rows (16 expert rows in all) gives the same bits.
TEST(ForwardConsistency, ExpertGroupsOfABatchDoNotChangeABit) {
  TinySpec q8;
  q8.n_expert = 4;
  q8.n_expert_used = 2;
  q8.matrix_type = GgmlType::Q8_0;
  for (const TinySpec& s : {qwen3moe_q4k(), q8}) {
    testing::TempDir dir;
    Loaded l = load_tiny(dir, s);
    const auto toks = some_tokens(8, s.n_vocab);
    ThreadPool pool(2);
    const auto one_group = eval_all(l, toks, &pool, 64);
    const auto groups = eval_all(l, toks, &pool, 8);
    ASSERT_EQ(one_group.size(), groups.size());
    EXPECT_EQ(std::memcmp(one_group.data(), groups.data(), one_group.size() * sizeof(float)), 0) << s.arch;
  }
}

// car bench --phases: timing a step's phases counts every step, gives time to each phase the model has (an
// MoE model's expert products, a dense one's FFN) and none to a phase it has not, and changes no bit.
TEST(ForwardPhases, TimingCountsStepsAndChangesNoBit) {
  for (bool moe : {false, true}) {
    const TinySpec s = q8_tiny(moe);
    testing::TempDir dir;
    Loaded l = load_tiny(dir, s);
    const auto toks = some_tokens(6, s.n_vocab);
    ThreadPool pool(2);
    const auto plain = eval_all(l, toks, &pool, 64);
    ForwardPass fp(l.model, l.experts.get(), &pool, 64);
    EXPECT_EQ(fp.phase_times().steps, 0u);
    fp.set_phase_timing(true);
    KvCache kv = fp.make_cache(64);
    const size_t nv = static_cast<size_t>(s.n_vocab);
    std::vector<float> timed(toks.size() * nv);
    // a batch of 4, then one token at a time: both paths of each phase
    ASSERT_TRUE(fp.eval(std::span<const int32_t>(toks.data(), 4), kv, timed.data(), true).ok());
    for (size_t i = 4; i < toks.size(); ++i) {
      ASSERT_TRUE(fp.eval(std::span<const int32_t>(&toks[i], 1), kv, timed.data() + i * nv, false).ok());
    }
    EXPECT_EQ(std::memcmp(plain.data(), timed.data(), plain.size() * sizeof(float)), 0) << moe;
    const StepPhaseTimes t = fp.phase_times();
    EXPECT_EQ(t.steps, 3u) << moe;
    for (StepPhase p : {StepPhase::embed, StepPhase::attn_proj, StepPhase::rope_kv, StepPhase::attention,
                        StepPhase::attn_out, StepPhase::ffn_gate_up, StepPhase::ffn_act, StepPhase::ffn_down,
                        StepPhase::ffn_rest, StepPhase::output}) {
      EXPECT_GT(t.seconds[static_cast<size_t>(p)], 0.0) << step_phase_name(p) << " moe " << moe;
    }
    EXPECT_EQ(t.seconds[static_cast<size_t>(StepPhase::route)] > 0.0, moe);
    // Off: no more steps counted; on again: the totals start over.
    fp.set_phase_timing(false);
    std::vector<float> more(nv);
    ASSERT_TRUE(fp.eval(std::span<const int32_t>(&toks[0], 1), kv, more.data(), false).ok());
    EXPECT_EQ(fp.phase_times().steps, 3u);
    fp.set_phase_timing(true);
    EXPECT_EQ(fp.phase_times().steps, 0u);
    EXPECT_EQ(fp.phase_times().seconds[static_cast<size_t>(StepPhase::attention)], 0.0);
  }
}

TEST(ForwardConsistency, LastRowOnlyEqualsLastOfAllRows) {
  TinySpec s;
  s.arch = "qwen3";
  testing::TempDir dir;
  Loaded l = load_tiny(dir, s);
  auto toks = some_tokens(9, s.n_vocab);
  auto all = eval_all(l, toks, nullptr, 64);
  ForwardPass fp(l.model, nullptr, nullptr, 64);
  KvCache kv = fp.make_cache(16);
  std::vector<float> last(static_cast<size_t>(s.n_vocab));
  EXPECT_TRUE(fp.eval(toks, kv, last.data(), false).ok());
  for (int64_t v = 0; v < s.n_vocab; ++v) EXPECT_NEAR(last[static_cast<size_t>(v)], all[8 * static_cast<size_t>(s.n_vocab) + static_cast<size_t>(v)], 1e-5);
}

// Continuous batching: several sequences advanced together by eval_step - prompts in chunks of random
// multiple-of-4 lengths, decode tokens, sequences joining, skipping steps and finishing at random - give
// every sequence bit for bit the logits eval() gives it alone (one prompt batch, then one token at a time).
// Q4_K matrices with row counts divisible by 8 take llama.cpp's repacked orders, whose gemm / gemv split
// is what could make a row depend on its company.
void check_batched_equals_alone(const TinySpec& s, uint32_t seed, ThreadPool* pool) {
  testing::TempDir dir;
  Loaded l = load_tiny(dir, s);
  const size_t V = static_cast<size_t>(s.n_vocab);
  std::mt19937 rng(seed);
  struct Seq {
    std::vector<int32_t> prompt, gen;
    std::vector<std::vector<float>> want;  // logits after the prompt, then after each generated token
    int64_t done = 0;                      // tokens of prompt + gen evaluated in the batched run
    size_t outputs = 0;
  };
  std::vector<Seq> seqs(5);
  for (auto& q : seqs) {
    const int64_t np = 1 + static_cast<int64_t>(rng() % 30), ng = static_cast<int64_t>(rng() % 6);
    for (int64_t i = 0; i < np; ++i) q.prompt.push_back(static_cast<int32_t>(rng() % V));
    for (int64_t i = 0; i < ng; ++i) q.gen.push_back(static_cast<int32_t>(rng() % V));
    ForwardPass alone(l.model, l.experts.get(), pool, 64);
    KvCache kv = alone.make_cache(64);
    std::vector<float> out(V);
    ASSERT_TRUE(alone.eval(q.prompt, kv, out.data(), false).ok());
    q.want.push_back(out);
    for (int32_t t : q.gen) {
      ASSERT_TRUE(alone.eval(std::span<const int32_t>(&t, 1), kv, out.data(), false).ok());
      q.want.push_back(out);
    }
  }
  ForwardPass fp(l.model, l.experts.get(), pool, 64);
  std::vector<KvCache> caches;
  for (size_t i = 0; i < seqs.size(); ++i) caches.push_back(fp.make_cache(64));
  std::vector<float> logits(seqs.size() * 64 * V);
  for (int step = 0; step < 200; ++step) {
    std::vector<SeqChunk> chunks;
    std::vector<size_t> who;
    std::vector<std::vector<int32_t>> toks(seqs.size());
    int64_t budget = 64;
    for (size_t i = 0; i < seqs.size(); ++i) {
      Seq& q = seqs[i];
      const int64_t np = static_cast<int64_t>(q.prompt.size());
      const int64_t total = np + static_cast<int64_t>(q.gen.size());
      if (q.done >= total || rng() % 3 == 0) continue;
      SeqChunk c;
      c.kv = &caches[i];
      if (q.done < np) {
        int64_t len = std::min<int64_t>(np - q.done, 1 + static_cast<int64_t>(rng() % 16));
        len = std::min(len, budget);
        if (q.done + len < np) len -= len % 4;  // a prompt's chunks but its last: multiples of 4
        if (len <= 0) continue;
        toks[i].assign(q.prompt.begin() + q.done, q.prompt.begin() + q.done + len);
        c.output = q.done + len == np ? SeqChunk::Output::last : SeqChunk::Output::none;
      } else {
        if (budget < 1) continue;
        toks[i] = {q.gen[static_cast<size_t>(q.done - np)]};
        c.output = SeqChunk::Output::last;
      }
      budget -= static_cast<int64_t>(toks[i].size());
      c.tokens = toks[i];
      chunks.push_back(c);
      who.push_back(i);
    }
    if (chunks.empty()) continue;
    ASSERT_TRUE(fp.eval_step(chunks, logits.data()).ok());
    size_t row = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      Seq& q = seqs[who[c]];
      q.done += static_cast<int64_t>(chunks[c].tokens.size());
      if (chunks[c].output == SeqChunk::Output::none) continue;
      ASSERT_LT(q.outputs, q.want.size());
      ASSERT_EQ(0, std::memcmp(logits.data() + row * V, q.want[q.outputs].data(), V * sizeof(float)))
          << "sequence " << who[c] << " output " << q.outputs << " step " << step;
      ++q.outputs;
      ++row;
    }
  }
  for (const Seq& q : seqs) EXPECT_EQ(q.outputs, q.want.size());
}

TEST(ForwardBatching, EverySequenceAsAloneDenseQ4K) {
  TinySpec s;
  s.n_embd = 256;
  s.n_ff = 256;
  s.head_dim = 64;
  s.matrix_type = GgmlType::Q4_K;
  s.embd_type = GgmlType::Q8_0;
  ThreadPool pool(2);
  for (uint32_t seed : {1u, 2u, 3u}) check_batched_equals_alone(s, seed, seed == 2 ? nullptr : &pool);
}

TEST(ForwardBatching, EverySequenceAsAloneMoeQ4K) {
  const TinySpec s = qwen3moe_q4k();
  ThreadPool pool(2);
  for (uint32_t seed : {4u, 5u}) check_batched_equals_alone(s, seed, &pool);
}

TEST(ForwardBatching, EverySequenceAsAloneF32) {
  TinySpec s;
  s.arch = "qwen3";
  for (uint32_t seed : {6u, 7u}) check_batched_equals_alone(s, seed, nullptr);
}

TEST(ResidentExperts, SlicesAreTheBanksRowsAndCountsUses) {
  TinySpec s;
  s.n_expert = 4;
  s.n_expert_used = 2;
  testing::TempDir dir;
  Loaded l = load_tiny(dir, s);
  const auto& bank = l.model->expert_banks()[1];
  auto acquired = l.experts->acquire(1, 3);
  ASSERT_TRUE(acquired.ok());
  const experts::ExpertLease& lease = *acquired;
  EXPECT_EQ(lease.weights().gate.rows, s.n_ff);
  EXPECT_EQ(lease.weights().gate.cols, s.n_embd);
  EXPECT_EQ(lease.weights().down.rows, s.n_embd);
  EXPECT_EQ(lease.weights().gate.data, bank.gate_bank.data + 3 * s.n_ff * bank.gate_bank.row_bytes);
  EXPECT_EQ(l.experts->use_count(1, 3), 1u);
  EXPECT_EQ(l.experts->use_count(1, 2), 0u);
  EXPECT_EQ(l.experts->n_expert(0), 4);
}

}  // namespace
}  // namespace car::engine

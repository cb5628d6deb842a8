// Continuous batching with company that comes and goes (issue #25), dense and MoE, experts resident and
// streamed from a cache too small for them, Q4_K (repacked orders) and IQ4_XS (the IQ panel order).
//
// Company: a subject request and 1, 3 or 7 random companions on one model. Some companions are queued
// before the subject (their prompts are read in chunks beside its own), the others are submitted from the
// subject's token callback at a random token of its decode (they join at the next step); some are cancelled
// at a random token of the subject's (they leave at the next step). Prompts, lengths and sampling (greedy or
// seeded) differ. Every request that was not cancelled gets, bit for bit, the tokens and logprobs it gets
// alone on a resident model; a cancelled one gets a prefix of them. Joining and leaving happen at steps the
// test fixes (the callbacks run between steps), so what is asserted does not depend on timing.
//
// Reads: a batched step leases each distinct expert once, however many of its rows route to it, so a
// streamed source reads a missed expert once per step: N identical rows (same token at the same position in
// N caches) read exactly K experts per MoE layer, at a cap of every expert and at a cap of one (waves).
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>

#include "core/engine/engine.h"
#include "core/engine/forward.h"
#include "core/engine/scheduler.h"
#include "core/experts/streamed_source.h"
#include "core/gguf/gguf_file.h"
#include "core/model/model.h"
#include "tests/engine/random_request.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using testing::TinySpec;

TinySpec dense_spec() {
  TinySpec s;
  s.n_embd = 256;
  s.n_ff = 256;
  s.head_dim = 64;
  s.matrix_type = GgmlType::Q4_K;  // repacked gemm / gemv orders: the one place company could move a number
  s.n_ctx = 256;
  return s;
}

TinySpec moe_spec() {
  TinySpec s = dense_spec();
  s.arch = "qwen3moe";
  s.n_expert = 8;
  s.n_expert_used = 2;
  return s;
}

/// The expert budget (GB) that gives a streamed source of `path` `cap` slots per bank.
double ram_gb_for_cap(const std::string& path, int cap) {
  auto f = gguf::GgufFile::open(path);
  EXPECT_TRUE(f.ok());
  auto m = model::Model::load(*f);
  EXPECT_TRUE(m.ok());
  experts::StreamOptions so;
  so.ram_gb = 1000;
  so.io_threads = 1;
  auto probe = experts::StreamedExpertSource::open(path, (*m)->expert_banks(), so);
  EXPECT_TRUE(probe.ok()) << (probe.ok() ? "" : probe.error().message);
  if (!probe.ok()) return 0;
  const experts::PoolLayout& l = (*probe)->join_layout();
  return (static_cast<double>(cap) * l.banks + 0.5) * static_cast<double>(l.bytes_per_expert) / 1e9;
}

GenerateRequest random_request(std::mt19937& rng, int64_t vocab, int max_prompt, int max_tokens) {
  return testing::random_request(rng, vocab, max_prompt, max_tokens, 0.8f);
}

/// `got` is `want`, or (cancelled) a prefix of it.
void expect_same(const GenerateResult& want, const GenerateResult& got, bool prefix_only, const std::string& who) {
  SCOPED_TRACE(who);
  if (prefix_only) {
    ASSERT_LE(got.tokens.size(), want.tokens.size());
  } else {
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    EXPECT_EQ(got.finish_reason, want.finish_reason);
    EXPECT_EQ(got.text, want.text);
  }
  for (size_t k = 0; k < got.tokens.size(); ++k) EXPECT_EQ(got.tokens[k], want.tokens[k]) << "token " << k;
  ASSERT_LE(got.logprobs.size(), want.logprobs.size());
  for (size_t k = 0; k < got.logprobs.size(); ++k) EXPECT_EQ(got.logprobs[k], want.logprobs[k]) << "logprob " << k;
  ASSERT_LE(got.top_logprobs.size(), want.top_logprobs.size());
  for (size_t k = 0; k < got.top_logprobs.size(); ++k) {
    ASSERT_EQ(got.top_logprobs[k].size(), want.top_logprobs[k].size());
    for (size_t j = 0; j < got.top_logprobs[k].size(); ++j) {
      EXPECT_EQ(got.top_logprobs[k][j].token, want.top_logprobs[k][j].token);
      EXPECT_EQ(got.top_logprobs[k][j].logprob, want.top_logprobs[k][j].logprob);
    }
  }
}

enum class Experts { resident, streamed };

class CompanyTest : public ::testing::Test {
 protected:
  std::string write(const TinySpec& s) {
    const std::string p = (dir_ / ("m" + std::to_string(n_++) + ".gguf")).string();
    testing::write_tiny_model(p, s);
    return p;
  }
  std::shared_ptr<LoadedModel> load(const std::string& path, int parallel, Experts ex, int cap = 0) {
    LoadOptions o;
    o.threads = 2;
    o.context_length = 128;
    o.parallel = parallel;
    o.step_tokens = 16;  // prompts in chunks beside the decode rows
    o.stream_experts = ex == Experts::streamed ? StreamExperts::on : StreamExperts::off;
    if (ex == Experts::streamed) o.expert_ram_gb = ram_gb_for_cap(path, cap);
    auto m = load_model(path, o);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
    return m.ok() ? *m : nullptr;
  }

  /// The subject and `companions` others, alone (resident) and together on `ex` experts at `cap`.
  void check(const TinySpec& spec, Experts ex, int cap, int companions, uint32_t seed) {
    SCOPED_TRACE("companions " + std::to_string(companions) + ", seed " + std::to_string(seed));
    const std::string path = write(spec);
    std::mt19937 rng(seed);
    const int n = companions + 1;  // request 0 is the subject
    std::vector<GenerateRequest> reqs;
    reqs.push_back(random_request(rng, spec.n_vocab, 40, 16));
    reqs[0].max_tokens = 16;  // long enough for companions to join and leave during its decode
    std::vector<int> join_at(static_cast<size_t>(n), -1);    // -1: queued before the subject
    std::vector<int> cancel_at(static_cast<size_t>(n), -1);  // -1: runs to its end
    for (int i = 1; i < n; ++i) {
      reqs.push_back(random_request(rng, spec.n_vocab, 30, 14));
      if (rng() % 2 == 0) join_at[static_cast<size_t>(i)] = static_cast<int>(rng() % 10);
      if (rng() % 3 == 0) cancel_at[static_cast<size_t>(i)] = join_at[static_cast<size_t>(i)] + 1 +
                                                             static_cast<int>(rng() % 5);
    }

    std::vector<GenerateResult> alone;
    for (const auto& r : reqs) {
      auto m = load(path, 1, Experts::resident);
      ASSERT_TRUE(m);
      auto res = generate(*m, r, nullptr, nullptr);
      ASSERT_TRUE(res.ok()) << res.error().message;
      alone.push_back(*res);
    }

    auto m = load(path, 8, ex, cap);
    ASSERT_TRUE(m);
    std::mutex mu;
    std::condition_variable cv;
    int done = 0;
    std::vector<std::optional<Result<GenerateResult>>> out(static_cast<size_t>(n));
    std::deque<std::atomic<bool>> cancel(static_cast<size_t>(n));
    auto submit_one = [&](int i) {
      GenerateCallbacks cb;
      cb.on_done = [&, i](Result<GenerateResult> r) {
        std::lock_guard<std::mutex> lock(mu);
        out[static_cast<size_t>(i)] = std::move(r);
        ++done;
        cv.notify_all();
      };
      if (i == 0) {
        // The subject's k-th token: companions join (submitted now, admitted at the next step) and are
        // cancelled (they leave at the next step).
        cb.on_token = [&](const TokenEvent& e) {
          if (e.token < 0) return;
          const int k = static_cast<int>(++subject_tokens_) - 1;
          for (int j = 1; j < n; ++j) {
            if (join_at[static_cast<size_t>(j)] == k) submit_later_(j);
            if (cancel_at[static_cast<size_t>(j)] == k) cancel[static_cast<size_t>(j)] = true;
          }
        };
      }
      submit(*m, reqs[static_cast<size_t>(i)], std::move(cb), &cancel[static_cast<size_t>(i)]);
    };
    subject_tokens_ = 0;
    submit_later_ = submit_one;
    for (int i = 1; i < n; ++i) {
      if (join_at[static_cast<size_t>(i)] < 0) submit_one(i);
    }
    submit_one(0);
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return done == n; });
    }
    submit_later_ = nullptr;

    for (int i = 0; i < n; ++i) {
      const auto& r = out[static_cast<size_t>(i)];
      ASSERT_TRUE(r.has_value() && r->ok()) << "request " << i;
      const bool cancelled = cancel_at[static_cast<size_t>(i)] >= 0;
      expect_same(alone[static_cast<size_t>(i)], **r, cancelled, "request " + std::to_string(i));
      if (cancelled && (*r)->finish_reason != "cancelled") {
        EXPECT_EQ((*r)->tokens.size(), alone[static_cast<size_t>(i)].tokens.size()) << "request " << i;
      }
    }
    const SchedulerStats st = model_scheduler_stats(*m);
    EXPECT_EQ(st.active, 0);
    EXPECT_EQ(st.queued, 0);
    EXPECT_GT(st.batched_rows, st.steps) << "some steps carried several rows";
    int late = 0, left = 0;
    for (int i = 1; i < n; ++i) {
      late += join_at[static_cast<size_t>(i)] >= 0 ? 1 : 0;
      left += out[static_cast<size_t>(i)]->value().finish_reason == "cancelled" ? 1 : 0;
    }
    if (companions >= 7) {
      EXPECT_GT(late, 0) << "a companion joined during the subject's decode";
      EXPECT_GT(left, 0) << "a companion left early";
    }
    if (ex == Experts::streamed) {
      const auto es = model_expert_stats(*m);
      ASSERT_TRUE(es.has_value());
      EXPECT_EQ(es->mode, "streamed");
      EXPECT_EQ(es->cap, cap);
      EXPECT_GT(es->misses, 0u) << "the cache must be too small for the experts";
    }
  }

  testing::TempDir dir_;
  int n_ = 0;
  std::atomic<int> subject_tokens_{0};
  std::function<void(int)> submit_later_;
};

TEST_F(CompanyTest, DenseOutputIsTheSameAloneAndWithCompanyThatComesAndGoes) {
  for (int companions : {1, 3, 7}) check(dense_spec(), Experts::resident, 0, companions, 10u + companions);
}

TEST_F(CompanyTest, MoeResidentOutputIsTheSameAloneAndWithCompanyThatComesAndGoes) {
  for (int companions : {1, 3, 7}) check(moe_spec(), Experts::resident, 0, companions, 20u + companions);
}

TEST_F(CompanyTest, MoeStreamedOutputIsTheSameAloneAndWithCompanyThatComesAndGoes) {
  // Two of eight experts per bank: most steps of several sequences need more than the cache holds (waves).
  for (int companions : {1, 3, 7}) check(moe_spec(), Experts::streamed, 2, companions, 30u + companions);
}

// IQ4_XS matrices: a prompt's rows take llama.cpp's IQ panel order (prompts of 8 or more tokens), its decode
// rows the dot order, however the step budget and the company cut the prompt into chunks.
TEST_F(CompanyTest, IqPanelOutputIsTheSameAloneAndWithCompany) {
  TinySpec s = dense_spec();
  s.matrix_type = GgmlType::IQ4_XS;
  for (int companions : {1, 7}) check(s, Experts::resident, 0, companions, 50u + companions);
  TinySpec moe = moe_spec();
  moe.matrix_type = GgmlType::IQ4_XS;
  check(moe, Experts::resident, 0, 3, 60u);
}

TEST_F(CompanyTest, MoeStreamedAtOneSlotPerBank) {
  check(moe_spec(), Experts::streamed, 1, 7, 41u);
}

// ---- reads per step ---------------------------------------------------------------------------------------

// N rows routing to the same experts in one step read each of those experts once: the misses of a step of N
// identical rows equal one row's, K per MoE layer, whether the cache holds every expert or one (waves).
TEST_F(CompanyTest, OneStepReadsEachMissedExpertOnceForAllItsRows) {
  const TinySpec spec = moe_spec();
  const std::string path = write(spec);
  auto f = gguf::GgufFile::open(path);
  ASSERT_TRUE(f.ok());
  auto model = model::Model::load(*f);
  ASSERT_TRUE(model.ok());
  const int n_layer = static_cast<int>(spec.n_layer);
  for (int cap : {static_cast<int>(spec.n_expert), 1}) {
    for (int rows : {1, 2, 5, 8}) {
      SCOPED_TRACE("cap " + std::to_string(cap) + ", rows " + std::to_string(rows));
      experts::StreamOptions so;
      so.ram_gb = ram_gb_for_cap(path, cap);
      so.io_threads = 2;
      auto src = experts::StreamedExpertSource::open(path, (*model)->expert_banks(), so);
      ASSERT_TRUE(src.ok()) << src.error().message;
      ASSERT_EQ((*src)->stats().cap, cap);
      ThreadPool pool(2);
      ForwardPass fp(*model, src->get(), &pool, 16);
      fp.set_prefetch(false);  // demand reads only
      std::vector<KvCache> caches;
      for (int i = 0; i < rows; ++i) caches.push_back(fp.make_cache(16));
      const int32_t token[1] = {77};
      std::vector<SeqChunk> chunks;
      for (int i = 0; i < rows; ++i) {
        SeqChunk c;
        c.kv = &caches[static_cast<size_t>(i)];
        c.tokens = token;
        c.output = SeqChunk::Output::last;
        chunks.push_back(c);
      }
      std::vector<float> logits(static_cast<size_t>(rows * spec.n_vocab));
      ASSERT_TRUE(fp.eval_step(chunks, logits.data()).ok());
      const experts::ExpertStats st = (*src)->stats();
      EXPECT_EQ(st.misses, static_cast<uint64_t>(n_layer * spec.n_expert_used));
      EXPECT_EQ(st.hits, 0u);
      uint64_t acquires = 0;
      for (int l = 0; l < n_layer; ++l) {
        for (int e = 0; e < spec.n_expert; ++e) acquires += (*src)->use_count(l, e);
      }
      EXPECT_EQ(acquires, static_cast<uint64_t>(n_layer * spec.n_expert_used)) << "one lease per expert";
      // Every row got the same logits (same token, same position, own cache).
      for (int i = 1; i < rows; ++i) {
        EXPECT_TRUE(std::equal(logits.begin(), logits.begin() + spec.n_vocab,
                               logits.begin() + i * spec.n_vocab));
      }
    }
  }
}

}  // namespace
}  // namespace car::engine

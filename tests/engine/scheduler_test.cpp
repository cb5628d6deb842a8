// The per-model scheduler (core/engine/scheduler.h) on small models the test writes: requests run
// together give each request bit for bit what it gets alone (dense and MoE, greedy and seeded sampling,
// logprobs), whatever joins or leaves and whatever its slot held; the queue is first come, first served;
// cancelling one sequence leaves the others' output unchanged; prefix reuse skips the shared prefix. The KV
// pool (KvPool*): requests that do not fit together run one after another in arrival order with the same
// bits, one larger than the pool is refused, a full queue answers busy, and a reclaimed prefix's pages go
// back to the kernel.
#include "core/engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

#include "core/engine/engine.h"
#include "core/engine/kv_cache.h"
#include "core/util/error_codes.h"
#include "tests/engine/random_request.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using testing::TinySpec;

TinySpec q4k_spec(bool moe) {
  TinySpec s;
  s.n_embd = 256;
  s.n_ff = 256;
  s.head_dim = 64;
  s.matrix_type = GgmlType::Q4_K;  // rows % 8 == 0: llama.cpp's repacked gemm / gemv orders
  s.n_ctx = 256;
  if (moe) {
    s.arch = "qwen3moe";
    s.n_expert = 4;
    s.n_expert_used = 2;
  }
  return s;
}

class SchedulerTest : public ::testing::Test {
 public:
  std::shared_ptr<LoadedModel> load(const TinySpec& s, int parallel, int64_t step_tokens = 0, int max_queued = 0,
                                    int64_t pool_tokens = 0) {
    const std::string p = (dir_ / ("m" + std::to_string(n_++) + ".gguf")).string();
    testing::write_tiny_model(p, s);
    LoadOptions o;
    o.threads = 2;
    o.context_length = 128;
    o.parallel = parallel;
    o.step_tokens = step_tokens;
    o.max_queued = max_queued;
    o.kv_pool_tokens = pool_tokens;
    auto m = load_model(p, o);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
    return m.ok() ? *m : nullptr;
  }

 protected:
  testing::TempDir dir_;
  int n_ = 0;
};

GenerateRequest random_request(std::mt19937& rng, int64_t vocab) {
  return testing::random_request(rng, vocab, 40, 12, 0.9f);
}

void expect_same(const GenerateResult& a, const GenerateResult& b, size_t i) {
  EXPECT_EQ(a.tokens, b.tokens) << "request " << i;
  EXPECT_EQ(a.text, b.text) << "request " << i;
  EXPECT_EQ(a.finish_reason, b.finish_reason) << "request " << i;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << "request " << i;
  for (size_t k = 0; k < a.logprobs.size(); ++k) EXPECT_EQ(a.logprobs[k], b.logprobs[k]) << "request " << i;
  ASSERT_EQ(a.top_logprobs.size(), b.top_logprobs.size());
  for (size_t k = 0; k < a.top_logprobs.size(); ++k) {
    ASSERT_EQ(a.top_logprobs[k].size(), b.top_logprobs[k].size());
    for (size_t j = 0; j < a.top_logprobs[k].size(); ++j) {
      EXPECT_EQ(a.top_logprobs[k][j].token, b.top_logprobs[k][j].token);
      EXPECT_EQ(a.top_logprobs[k][j].logprob, b.top_logprobs[k][j].logprob);
    }
  }
}

// N requests alone (one after another, each on a fresh model so no prefix is shared), then all of them at
// once from N threads with random start delays on a model running `parallel` sequences and a small step
// budget (prompts split in chunks and interleaved with decode rows): every request's result is identical.
void check_company(SchedulerTest& t, const TinySpec& s, int n_requests, int parallel, uint32_t seed,
                   int64_t pool_tokens = 0) {
  std::mt19937 rng(seed);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < n_requests; ++i) reqs.push_back(random_request(rng, s.n_vocab));
  std::vector<GenerateResult> alone;
  for (const auto& r : reqs) {
    auto m = t.load(s, 1, 0);
    auto res = generate(*m, r, nullptr, nullptr);
    ASSERT_TRUE(res.ok()) << res.error().message;
    alone.push_back(*res);
  }
  auto m = t.load(s, parallel, 24, 0, pool_tokens);
  std::vector<GenerateResult> together(reqs.size());
  std::vector<std::thread> threads;
  std::vector<uint32_t> delays;
  for (size_t i = 0; i < reqs.size(); ++i) delays.push_back(rng() % 3000);
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(delays[i]));
      auto res = generate(*m, reqs[i], nullptr, nullptr);
      ASSERT_TRUE(res.ok()) << res.error().message;
      together[i] = *res;
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < reqs.size(); ++i) expect_same(alone[i], together[i], i);
  const SchedulerStats st = model_scheduler_stats(*m);
  EXPECT_EQ(st.active, 0);
  EXPECT_EQ(st.queued, 0);
  uint64_t tokens = 0;
  for (const auto& r : together) tokens += r.tokens.size();
  EXPECT_EQ(st.tokens_generated, tokens);
  EXPECT_GT(st.tokens_per_s, 0);  // generated within the last window
  EXPECT_LE(st.steps, tokens + reqs.size() * 40);
}

TEST_F(SchedulerTest, DenseRequestsGetTheSameOutputAloneAndInCompany) {
  for (int companions : {1, 3, 7}) {
    SCOPED_TRACE(companions);
    check_company(*this, q4k_spec(false), companions + 1, 4, 100u + static_cast<uint32_t>(companions));
  }
}

TEST_F(SchedulerTest, MoeRequestsGetTheSameOutputAloneAndInCompany) {
  check_company(*this, q4k_spec(true), 8, 8, 7u);
}

TEST_F(SchedulerTest, F32RequestsGetTheSameOutputAloneAndInCompany) {
  TinySpec s;
  s.arch = "qwen3";
  s.n_ctx = 256;
  check_company(*this, s, 6, 3, 11u);
}

// A slot's history (a reused prefix of any length) does not change a request's output.
TEST_F(SchedulerTest, ReusedPrefixGivesTheSameOutputAndSkipsItsRows) {
  const TinySpec s = q4k_spec(false);
  std::mt19937 rng(5);
  GenerateRequest a = random_request(rng, s.n_vocab);
  a.prompt_ids.resize(1);
  for (int i = 0; i < 33; ++i) a.prompt_ids.push_back(static_cast<int32_t>(rng() % 300));
  a.sampling.temperature = 0;
  GenerateRequest b = a;
  b.prompt_ids.resize(23);  // shares 23 ids (not a multiple of 4) with a
  for (int i = 0; i < 10; ++i) b.prompt_ids.push_back(static_cast<int32_t>(rng() % 300));
  auto fresh = load(s, 1);
  auto want = generate(*fresh, b, nullptr, nullptr);
  ASSERT_TRUE(want.ok());
  auto m = load(s, 1);
  ASSERT_TRUE(generate(*m, a, nullptr, nullptr).ok());
  const uint64_t rows_before = model_scheduler_stats(*m).batched_rows;
  auto got = generate(*m, b, nullptr, nullptr);
  ASSERT_TRUE(got.ok());
  expect_same(*want, *got, 0);
  // The 23 shared ids were not evaluated again: 10 prompt rows + the decode rows.
  EXPECT_EQ(model_scheduler_stats(*m).batched_rows - rows_before,
            10u + static_cast<uint64_t>(b.max_tokens - 1));
}

// One slot: requests start in the order they arrived, and each waits in the queue (not on a lock); with
// max_queued 4 a fifth waiting request is refused with busy at once.
TEST_F(SchedulerTest, QueueIsFirstComeFirstServed) {
  auto m = load(q4k_spec(false), 1, 0, 4);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> started;
  int done = 0;
  std::atomic<bool> release{false};
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 5; ++i) {
    GenerateRequest r;
    r.prompt_ids = {static_cast<int32_t>(10 + i), 20, 30};
    r.max_tokens = 3;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    reqs.push_back(r);
  }
  for (int i = 0; i < 5; ++i) {
    GenerateCallbacks cb;
    cb.on_token = [&, i](const TokenEvent& e) {
      if (e.token < 0) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (started.empty() || started.back() != i) started.push_back(i);
      }
      // Hold the first request's slot until every other request has been queued.
      if (i == 0) {
        while (!release.load()) std::this_thread::yield();
      }
    };
    cb.on_done = [&](Result<GenerateResult> r) {
      EXPECT_TRUE(r.ok());
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      cv.notify_all();
    };
    submit(*m, reqs[static_cast<size_t>(i)], std::move(cb), nullptr);
    if (i == 0) {
      // Wait until request 0 holds the slot (its first token), then queue the others behind it.
      for (;;) {
        std::lock_guard<std::mutex> lock(mu);
        if (!started.empty()) break;
      }
    }
  }
  EXPECT_EQ(model_scheduler_stats(*m).queued, 4);
  bool refused = false;
  GenerateCallbacks extra;
  extra.on_done = [&](Result<GenerateResult> r) {
    refused = true;
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, "busy");
  };
  submit(*m, reqs[0], std::move(extra), nullptr);
  EXPECT_TRUE(refused);
  release = true;
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == 5; });
  EXPECT_EQ(started, (std::vector<int>{0, 1, 2, 3, 4}));
}

// Cancelling one of several running sequences ends it with "cancelled" and leaves the others' output as
// it is alone.
TEST_F(SchedulerTest, CancellingOneLeavesTheOthersUnchanged) {
  const TinySpec s = q4k_spec(false);
  std::mt19937 rng(9);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest r = random_request(rng, s.n_vocab);
    r.max_tokens = 20;
    reqs.push_back(r);
  }
  std::vector<GenerateResult> alone;
  for (const auto& r : reqs) {
    auto m = load(s, 1);
    alone.push_back(*generate(*m, r, nullptr, nullptr));
  }
  auto m = load(s, 4);
  std::atomic<bool> cancel{false};
  std::vector<Result<GenerateResult>> out(4, make_error("unset", ""));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      int seen = 0;
      auto on_token = [&](const TokenEvent&) {
        if (i == 2 && ++seen == 3) cancel = true;
      };
      out[i] = generate(*m, reqs[i], on_token, i == 2 ? &cancel : nullptr);
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(out[i].ok());
    if (i == 2) {
      EXPECT_EQ(out[i]->finish_reason, "cancelled");
      EXPECT_LT(out[i]->tokens.size(), 20u);
    } else {
      expect_same(alone[i], *out[i], i);
    }
  }
}

TEST_F(SchedulerTest, RefusedRequestsAnswerBeforeSubmitReturns) {
  auto m = load(q4k_spec(false), 2);
  GenerateRequest r;
  r.prompt_ids = {1, 2, 3};
  r.max_tokens = 1000;  // > context 128
  bool called = false;
  GenerateCallbacks cb;
  cb.on_done = [&](Result<GenerateResult> res) {
    called = true;
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.error().code, "context_overflow");
  };
  submit(*m, r, std::move(cb), nullptr);
  EXPECT_TRUE(called);
}

// Ollama's num_predict -1: a request generates until its context is full, whatever max_tokens says.
TEST_F(SchedulerTest, MaxTokensToContextGeneratesUntilTheContextIsFull) {
  auto m = load(q4k_spec(false), 2);
  GenerateRequest r;
  r.prompt_ids = {1, 2, 3, 4, 5};
  r.max_tokens = 4;
  r.max_tokens_to_context = true;
  r.ignore_eos = true;
  r.num_ctx = 40;
  auto res = generate(*m, r, nullptr, nullptr);
  ASSERT_TRUE(res.ok()) << res.error().message;
  EXPECT_EQ(res->tokens.size(), 35u) << "40 positions less the prompt's 5";
  EXPECT_EQ(res->finish_reason, "length");
  // The whole loaded context (128) when num_ctx is not given.
  r.num_ctx = 0;
  auto whole = generate(*m, r, nullptr, nullptr);
  ASSERT_TRUE(whole.ok()) << whole.error().message;
  EXPECT_EQ(whole->tokens.size(), 123u);
  // A prompt that fills the context leaves nothing to generate: context_overflow as before.
  r.num_ctx = 5;
  auto full = generate(*m, r, nullptr, nullptr);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, "context_overflow");
}

// The memory a model with N sequences is charged (estimate) equals what it reports loaded; up to
// kPoolContexts sequences, the default pool is a full context per sequence.
TEST_F(SchedulerTest, MemoryChargesEverySequencesCache) {
  const TinySpec s = q4k_spec(false);
  auto one = load(s, 1);
  auto four = load(s, 4);
  const MemoryBreakdown m1 = model_memory(*one);
  const MemoryBreakdown m4 = model_memory(*four);
  EXPECT_EQ(m4.kv_cache, 4 * m1.kv_cache);
  EXPECT_EQ(m4.logits, 4 * m1.logits);
  LoadOptions o;
  o.context_length = 128;
  o.parallel = 4;
  auto est = estimate_memory((dir_ / "m1.gguf").string(), o);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->total(), m4.total());
}

// With a pool of 64 positions (a request needs up to 52) most of the eight requests wait for room, and every
// one still gets its result alone bit for bit.
TEST_F(SchedulerTest, KvPoolQueueingKeepsTheOutputOfEachRequest) {
  check_company(*this, q4k_spec(false), 8, 4, 21u, 64);
}

GenerateRequest fixed_request(int32_t first, int n_prompt, int max_tokens) {
  GenerateRequest r;
  r.prompt_ids.push_back(first);
  for (int i = 1; i < n_prompt; ++i) r.prompt_ids.push_back(static_cast<int32_t>((first * 31 + i * 7) % 300));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.logprobs = true;
  r.sampling.temperature = 0;
  return r;
}

/// Requests submitted to one model while the first one is held at its first token, and the order of what
/// happened to them: "<i>:first" at a request's first token, "<i>:done" at its end.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> log;
  std::vector<Result<GenerateResult>> out;
  std::atomic<bool> release{false};
  int done = 0;

  GenerateCallbacks callbacks(size_t i, bool hold) {
    if (out.size() <= i) out.resize(i + 1, make_error("unset", ""));
    GenerateCallbacks cb;
    auto seen = std::make_shared<bool>(false);
    cb.on_token = [this, i, hold, seen](const TokenEvent& e) {
      if (e.token < 0 || *seen) return;
      *seen = true;
      {
        std::lock_guard<std::mutex> lock(mu);
        log.push_back(std::to_string(i) + ":first");
        cv.notify_all();
      }
      if (hold) {
        while (!release.load()) std::this_thread::yield();
      }
    };
    cb.on_done = [this, i](Result<GenerateResult> r) {
      std::lock_guard<std::mutex> lock(mu);
      log.push_back(std::to_string(i) + ":done");
      out[i] = std::move(r);
      ++done;
      cv.notify_all();
    };
    return cb;
  }
  void wait_for(const std::string& entry) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return std::find(log.begin(), log.end(), entry) != log.end(); });
  }
  void wait_done(int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done == n; });
  }
  size_t at(const std::string& entry) {
    std::lock_guard<std::mutex> lock(mu);
    return static_cast<size_t>(std::find(log.begin(), log.end(), entry) - log.begin());
  }
};

// Three slots and a pool of 60 positions: A (20 + 30 = 50) runs; B (10 + 30 = 40) does not fit beside it
// and waits; C (3 + 2 = 5) would fit beside A but arrived after B, so it waits too (first come, first
// served). Once A ends, B and C run - B dropping A's idle prefix for room - and each result is what the
// request gets alone.
TEST_F(SchedulerTest, KvPoolRunsWhatDoesNotFitOneAfterAnotherInArrivalOrder) {
  const TinySpec s = q4k_spec(false);
  const std::vector<GenerateRequest> reqs = {fixed_request(11, 20, 30), fixed_request(12, 10, 30),
                                             fixed_request(13, 3, 2)};
  std::vector<GenerateResult> alone;
  for (const auto& r : reqs) {
    auto m = load(s, 1);
    auto res = generate(*m, r, nullptr, nullptr);
    ASSERT_TRUE(res.ok()) << res.error().message;
    alone.push_back(*res);
  }
  auto m = load(s, 3, 0, 0, 60);
  ASSERT_EQ(model_kv_pool_tokens(*m), 60);
  Recorder rec;
  submit(*m, reqs[0], rec.callbacks(0, true), nullptr);
  rec.wait_for("0:first");
  submit(*m, reqs[1], rec.callbacks(1, false), nullptr);
  submit(*m, reqs[2], rec.callbacks(2, false), nullptr);
  SchedulerStats st = model_scheduler_stats(*m);
  EXPECT_EQ(st.active, 1);
  EXPECT_EQ(st.queued, 2);
  EXPECT_EQ(st.kv_tokens_used, 50);
  EXPECT_EQ(st.kv_tokens_capacity, 60);
  rec.release = true;
  rec.wait_done(3);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_TRUE(rec.out[i].ok()) << rec.out[i].error().message;
    expect_same(alone[i], *rec.out[i], i);
    EXPECT_EQ(rec.out[i]->cached_tokens, 0);
  }
  EXPECT_LT(rec.at("0:done"), rec.at("1:first"));
  EXPECT_LT(rec.at("1:first"), rec.at("2:first"));
  EXPECT_LT(rec.at("0:done"), rec.at("2:first")) << "C overtook B";
  st = model_scheduler_stats(*m);
  EXPECT_EQ(st.active, 0);
  EXPECT_EQ(st.queued, 0);
  // Idle: B's prefix (10 + 29 evaluated) and C's (3 + 1); A's was dropped to make room for B.
  EXPECT_EQ(st.kv_tokens_used, 39 + 4);
  EXPECT_LE(st.kv_tokens_used, st.kv_tokens_capacity);
}

// A request that needs more positions than the whole pool could never start: refused at once, although it
// fits the context; one that needs exactly the pool runs.
TEST_F(SchedulerTest, KvPoolRefusesARequestLargerThanThePool) {
  auto m = load(q4k_spec(false), 2, 0, 0, 60);
  bool called = false;
  GenerateCallbacks cb;
  cb.on_done = [&](Result<GenerateResult> res) {
    called = true;
    ASSERT_FALSE(res.ok());
    EXPECT_EQ(res.error().code, errc::kContextOverflow);
    EXPECT_NE(res.error().message.find("needs 70 KV positions, more than the model's whole KV pool (60 positions"),
              std::string::npos)
        << res.error().message;
  };
  submit(*m, fixed_request(5, 10, 60), std::move(cb), nullptr);
  EXPECT_TRUE(called);
  auto fits = generate(*m, fixed_request(5, 10, 50), nullptr, nullptr);
  ASSERT_TRUE(fits.ok()) << fits.error().message;
  EXPECT_EQ(fits->tokens.size(), 50u);
  // Generating "until the context is full" (Ollama's num_predict -1) stops where the pool is full instead.
  GenerateRequest to_context = fixed_request(6, 10, 4);
  to_context.max_tokens_to_context = true;
  auto until = generate(*m, to_context, nullptr, nullptr);
  ASSERT_TRUE(until.ok()) << until.error().message;
  EXPECT_EQ(until->tokens.size(), 50u);
  EXPECT_EQ(until->finish_reason, "length");
  // A prompt that fills the pool leaves nothing to generate.
  to_context = fixed_request(7, 60, 4);
  to_context.max_tokens_to_context = true;
  auto full = generate(*m, to_context, nullptr, nullptr);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.error().code, errc::kContextOverflow);
}

// The pool exhausted and the queue full: the next request gets busy at once; the others still finish.
TEST_F(SchedulerTest, KvPoolExhaustedWithAFullQueueAnswersBusy) {
  auto m = load(q4k_spec(false), 3, 0, 1, 60);
  Recorder rec;
  submit(*m, fixed_request(21, 20, 30), rec.callbacks(0, true), nullptr);
  rec.wait_for("0:first");
  submit(*m, fixed_request(22, 10, 30), rec.callbacks(1, false), nullptr);  // waits for room
  bool refused = false;
  GenerateCallbacks extra;
  extra.on_done = [&](Result<GenerateResult> r) {
    refused = true;
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code, errc::kBusy);
  };
  submit(*m, fixed_request(23, 3, 2), std::move(extra), nullptr);
  EXPECT_TRUE(refused);
  rec.release = true;
  rec.wait_done(2);
  EXPECT_TRUE(rec.out[0].ok());
  EXPECT_TRUE(rec.out[1].ok());
}

// An idle prefix dropped for room gives its pages back: what the kernel reports resident for the model's KV
// mappings (mincore) is exactly the pages of the prefixes kept, before and after.
TEST_F(SchedulerTest, KvPoolGivesAReclaimedPrefixsPagesBack) {
  const TinySpec s = q4k_spec(false);
  auto m = load(s, 2, 0, 0, 100);
  EXPECT_EQ(model_kv_resident_bytes(*m), 0u) << "nothing written, nothing resident";
  // The pages `rows` positions of one sequence hold in a cache of this shape.
  const KvCache shape(s.n_layer, 128, s.n_head_kv, s.head_dim, s.head_dim);
  auto a = generate(*m, fixed_request(1, 40, 20), nullptr, nullptr);  // needs 60; keeps 40 + 19
  ASSERT_TRUE(a.ok());
  SchedulerStats st = model_scheduler_stats(*m);
  EXPECT_EQ(st.kv_tokens_used, 59);
  const uint64_t r1 = model_kv_resident_bytes(*m);
  EXPECT_EQ(r1, shape.resident_bytes(59));
  EXPECT_EQ(st.kv_bytes_resident, r1);

  // B needs 80: beside A's 59 that is more than 100, so A's prefix is dropped.
  auto b = generate(*m, fixed_request(2, 30, 50), nullptr, nullptr);
  ASSERT_TRUE(b.ok());
  st = model_scheduler_stats(*m);
  EXPECT_EQ(st.kv_tokens_used, 79);
  const uint64_t r2 = model_kv_resident_bytes(*m);
  EXPECT_EQ(r2, shape.resident_bytes(79)) << "A's pages are still resident";
  EXPECT_EQ(st.kv_bytes_resident, r2);

  // A's first 20 ids again (needing 21 positions, which fit beside B's prefix): A's prefix is gone, so
  // nothing is reused, and B's prefix is kept for B's follow-up.
  auto again = generate(*m, fixed_request(1, 20, 1), nullptr, nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->cached_tokens, 0);
  auto follow = generate(*m, fixed_request(2, 30, 1), nullptr, nullptr);
  ASSERT_TRUE(follow.ok());
  EXPECT_EQ(follow->cached_tokens, 29);
}

// The pool is charged (estimate and loaded model alike), not parallel x context: the default pool holds
// min(parallel, kPoolContexts) full contexts - or, for short contexts, up to the positions of kPoolContexts
// contexts of the default 4096 (or of the context memory budget, if fewer) - a set pool its positions.
TEST_F(SchedulerTest, MemoryChargesThePoolNotEverySequencesContext) {
  const TinySpec s = q4k_spec(false);
  auto one = load(s, 1);
  auto eight = load(s, 8);
  auto pooled = load(s, 8, 0, 0, 100);
  const uint64_t per_token = static_cast<uint64_t>(s.n_layer * s.n_head_kv * s.head_dim * 2) * 2;
  EXPECT_EQ(model_memory(*one).kv_cache, 128 * per_token);
  // 8 x 128 positions are fewer than 4 default contexts: every sequence gets its whole context.
  EXPECT_EQ(model_memory(*eight).kv_cache, 8 * 128 * per_token);
  EXPECT_EQ(model_kv_pool_tokens(*eight), 8 * 128);
  EXPECT_EQ(model_memory(*pooled).kv_cache, 100 * per_token);
  LoadOptions o;
  o.context_length = 128;
  o.parallel = 8;
  o.kv_pool_tokens = 100;
  auto est = estimate_memory((dir_ / "m2.gguf").string(), o);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->total(), model_memory(*pooled).total());
  // In bytes: the positions they hold, at most parallel full contexts.
  o.kv_pool_tokens = 0;
  o.kv_pool_bytes = 100 * per_token + per_token / 2;
  est = estimate_memory((dir_ / "m2.gguf").string(), o);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->kv_cache, 100 * per_token);
  o.kv_pool_bytes = uint64_t{1} << 40;
  est = estimate_memory((dir_ / "m2.gguf").string(), o);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->kv_cache, 8 * 128 * per_token);
  // Long contexts: the default holds kPoolContexts of them, not every sequence's ...
  o.kv_pool_bytes = 0;
  o.context_length = 4096;
  est = estimate_memory((dir_ / "m2.gguf").string(), o);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->kv_cache, static_cast<uint64_t>(kPoolContexts) * 4096 * per_token);
  // ... and with a context memory budget, as many positions as it holds (past kPoolContexts contexts) ...
  o.context_length = 1024;
  o.context_memory_bytes = 6 * 1024 * per_token;
  est = estimate_memory((dir_ / "m2.gguf").string(), o);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->kv_cache, 6 * 1024 * per_token);
  // ... but never more than kPoolContexts default contexts because the budget is large.
  o.context_length = 4096;
  o.context_memory_bytes = uint64_t{1} << 40;
  est = estimate_memory((dir_ / "m2.gguf").string(), o);
  ASSERT_TRUE(est.ok());
  EXPECT_EQ(est->kv_cache, static_cast<uint64_t>(kPoolContexts) * 4096 * per_token);
}

}  // namespace
}  // namespace car::engine

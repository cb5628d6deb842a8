// load_model / generate on small models the test writes (tests/engine/tiny_model.h): errors, greedy
// determinism, agreement with the forward pass, top_logprobs, stop strings, streaming, cancellation,
// context overflow and KV-prefix reuse.
#include "core/engine/engine.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/engine/forward.h"
#include "core/experts/resident_source.h"
#include "tests/engine/tiny_model.h"
#include "tests/test_support.h"

namespace car::engine {
namespace {

using testing::TinySpec;

class GenerateTest : public ::testing::Test {
 protected:
  std::string write(const TinySpec& s, const std::string& name = "m.gguf") {
    const std::string p = (dir_ / name).string();
    testing::write_tiny_model(p, s);
    return p;
  }
  std::shared_ptr<LoadedModel> load(const std::string& p, int ctx = 64) {
    LoadOptions o;
    o.threads = 2;
    o.context_length = ctx;
    auto m = load_model(p, o);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().message);
    return m.ok() ? *m : nullptr;
  }
  static GenerateRequest greedy(std::vector<int32_t> ids, int n) {
    GenerateRequest r;
    r.prompt_ids = std::move(ids);
    r.max_tokens = n;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  }
  testing::TempDir dir_;
};

TEST_F(GenerateTest, LoadErrorsAreNamed) {
  LoadOptions o;
  auto missing = load_model((dir_ / "nope.gguf").string(), o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, "not_found");

  {
    FILE* f = std::fopen((dir_ / "junk.gguf").c_str(), "wb");
    std::fputs("this is not a gguf file at all", f);
    std::fclose(f);
  }
  auto junk = load_model((dir_ / "junk.gguf").string(), o);
  ASSERT_FALSE(junk.ok());
  EXPECT_EQ(junk.error().code, "load_failed");

  TinySpec s;
  s.skip_tensor = "blk.1.ffn_norm.weight";
  auto no_norm = load_model(write(s, "nonorm.gguf"), o);
  ASSERT_FALSE(no_norm.ok());
  EXPECT_EQ(no_norm.error().code, "load_failed");
  EXPECT_NE(no_norm.error().message.find("blk.1.ffn_norm.weight"), std::string::npos) << no_norm.error().message;

  TinySpec q;
  q.arch = "qwen3";
  q.skip_tensor = "blk.0.attn_k_norm.weight";
  auto no_knorm = load_model(write(q, "noknorm.gguf"), o);
  ASSERT_FALSE(no_knorm.ok());
  EXPECT_NE(no_knorm.error().message.find("attn_k_norm"), std::string::npos);
}

TEST_F(GenerateTest, GreedyIsDeterministicAndMatchesForwardArgmax) {
  TinySpec s;
  s.n_expert = 4;
  s.n_expert_used = 2;
  const std::string p = write(s);
  auto m = load(p);
  ASSERT_TRUE(m);
  const std::vector<int32_t> prompt = {1, 260, 270, 280};
  auto a = generate(*m, greedy(prompt, 8), {}, nullptr);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->tokens.size(), 8u);
  EXPECT_EQ(a->finish_reason, "length");
  EXPECT_EQ(a->prompt_tokens, prompt);
  auto b = generate(*m, greedy(prompt, 8), {}, nullptr);  // reuses the cached prefix
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->tokens, b->tokens);

  // The same sequence by hand: argmax of the last row after each step.
  auto f = gguf::GgufFile::open(p);
  auto mod = model::Model::load(*f);
  experts::ResidentExpertSource src((*mod)->expert_banks());
  ForwardPass fp(*mod, &src, nullptr, 16);
  KvCache kv = fp.make_cache(32);
  std::vector<float> logits(static_cast<size_t>(s.n_vocab));
  EXPECT_TRUE(fp.eval(prompt, kv, logits.data(), false).ok());
  for (int32_t want : a->tokens) {
    const int32_t got = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    EXPECT_EQ(got, want);
    EXPECT_TRUE(fp.eval(std::span<const int32_t>(&got, 1), kv, logits.data(), false).ok());
  }
}

TEST_F(GenerateTest, TopLogprobsAreSortedNormalizedAndLeadWithGreedyToken) {
  auto m = load(write(TinySpec{}));
  ASSERT_TRUE(m);
  auto req = greedy({1, 290, 291}, 5);
  req.top_logprobs = 3;
  auto r = generate(*m, req, {}, nullptr);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->top_logprobs.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_EQ(r->top_logprobs[i].size(), 3u);
    EXPECT_EQ(r->top_logprobs[i][0].token, r->tokens[i]);
    EXPECT_LE(r->top_logprobs[i][0].logprob, 0.0);
    EXPECT_GE(r->top_logprobs[i][0].logprob, r->top_logprobs[i][1].logprob);
    EXPECT_GE(r->top_logprobs[i][1].logprob, r->top_logprobs[i][2].logprob);
  }
}

TEST_F(GenerateTest, LogprobsAreTheChosenIdsOwnBeforeSampling) {
  auto m = load(write(TinySpec{}));
  ASSERT_TRUE(m);
  // Greedy: the chosen id is the most likely, so its logprob is the first top_logprobs entry's.
  auto req = greedy({1, 290, 291}, 5);
  req.top_logprobs = 2;
  std::vector<TokenEvent> events;
  auto r = generate(
      *m, req, [&](const TokenEvent& e) { events.push_back(e); }, nullptr);
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->logprobs.size(), 5u);  // top_logprobs implies logprobs
  ASSERT_GE(events.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(r->logprobs[i], r->top_logprobs[i][0].logprob);
    EXPECT_EQ(events[i].token, r->tokens[i]);
    EXPECT_EQ(events[i].logprob, r->logprobs[i]);
    ASSERT_EQ(events[i].top_logprobs.size(), 2u);
    EXPECT_EQ(events[i].top_logprobs[1].token, r->top_logprobs[i][1].token);
  }
  // Sampled at a high temperature with a strong repetition penalty: the logprob is still the plain
  // full-vocabulary one (penalties and filters do not change it), and never above the most likely id's.
  auto sampled = greedy({1, 290, 291}, 8);
  sampled.sampling.temperature = 5;
  sampled.sampling.top_k = 0;
  sampled.sampling.repeat_penalty = 3;
  sampled.sampling.seed = 9;
  sampled.logprobs = true;
  auto s = generate(*m, sampled, {}, nullptr);
  ASSERT_TRUE(s.ok());
  ASSERT_EQ(s->logprobs.size(), s->tokens.size());
  EXPECT_TRUE(s->top_logprobs.empty());
  auto again = greedy({1, 290, 291}, 8);
  again.top_logprobs = 1;
  again.sampling = sampled.sampling;
  auto a = generate(*m, again, {}, nullptr);  // same seed, same ids, now with the top id per position
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(a->tokens, s->tokens);
  for (size_t i = 0; i < s->tokens.size(); ++i) {
    EXPECT_EQ(a->logprobs[i], s->logprobs[i]);
    EXPECT_LE(s->logprobs[i], a->top_logprobs[i][0].logprob);
    EXPECT_LT(s->logprobs[i], 0.0);
  }
  // Not asked for: nothing computed.
  auto plain = generate(*m, greedy({1, 290, 291}, 3), {}, nullptr);
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->logprobs.empty());
}

TEST_F(GenerateTest, TextPromptStreamingAndStopStrings) {
  auto m = load(write(TinySpec{}));
  ASSERT_TRUE(m);
  GenerateRequest req;
  req.prompt = "ab ba";
  req.max_tokens = 12;
  req.sampling.temperature = 0;
  req.ignore_eos = true;
  std::string streamed;
  int events = 0;
  auto r = generate(*m, req, [&](const TokenEvent& e) { streamed += e.text; ++events; }, nullptr);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->prompt_tokens.front(), 1);  // BOS added
  EXPECT_EQ(streamed, r->text);
  EXPECT_GE(events, static_cast<int>(r->tokens.size()));
  ASSERT_FALSE(r->text.empty());

  // Stop on a piece of the text we just saw: the output ends before it.
  const std::string stop = r->text.substr(r->text.size() / 2, 1);
  req.stop = {stop};
  auto s = generate(*m, req, {}, nullptr);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->finish_reason, "stop");
  EXPECT_EQ(s->text.find(stop), std::string::npos);
  EXPECT_EQ(r->text.rfind(s->text, 0), 0u);  // a prefix of the unstopped text
}

TEST_F(GenerateTest, NumCtxNarrowsTheLoadedContextAndNeverExceedsIt) {
  auto m = load(write(TinySpec{}), 64);
  ASSERT_TRUE(m);
  EXPECT_EQ(model_context_length(*m), 64);
  auto req = greedy({1, 5, 7}, 10);
  req.num_ctx = 12;  // 3 + 10 > 12
  auto over = generate(*m, req, {}, nullptr);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, "context_overflow");
  EXPECT_NE(over.error().message.find("12 tokens"), std::string::npos) << over.error().message;
  req.num_ctx = 13;
  EXPECT_TRUE(generate(*m, req, {}, nullptr).ok());
  req.num_ctx = 65;
  auto wide = generate(*m, req, {}, nullptr);
  ASSERT_FALSE(wide.ok());
  EXPECT_EQ(wide.error().code, "bad_request");
  EXPECT_NE(wide.error().message.find("loaded with (64 tokens)"), std::string::npos) << wide.error().message;
}

TEST_F(GenerateTest, DefaultContextIsTheTrainedOneCappedByMemory) {
  TinySpec spec;
  spec.n_ctx = 1024;
  const std::string path = write(spec);
  LoadOptions o;
  o.threads = 1;
  auto fixed = load_model(path, o);  // no memory figure: min(trained, 4096)
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(model_context_length(**fixed), 1024);
  const uint64_t kv_1024 = model_memory(**fixed).kv_cache;
  o.context_memory_bytes = kv_1024 * 10;  // plenty: the trained context
  auto roomy = load_model(path, o);
  ASSERT_TRUE(roomy.ok());
  EXPECT_EQ(model_context_length(**roomy), 1024);
  o.context_memory_bytes = kv_1024 / 2 + 1;  // half of it fits: 512 tokens (a multiple of 256)
  auto capped = load_model(path, o);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(model_context_length(**capped), 512);
  auto estimate = estimate_memory(path, o);  // the estimate follows the same rule
  ASSERT_TRUE(estimate.ok());
  EXPECT_EQ(estimate->kv_cache, model_memory(**capped).kv_cache);
  o.context_memory_bytes = 1;  // never below 256 tokens
  auto tiny = load_model(path, o);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(model_context_length(**tiny), 256);
  o.context_length = 300;  // an explicit context wins
  auto explicit_ctx = load_model(path, o);
  ASSERT_TRUE(explicit_ctx.ok());
  EXPECT_EQ(model_context_length(**explicit_ctx), 300);
}

TEST_F(GenerateTest, ContextOverflowCancellationAndBadIds) {
  auto m = load(write(TinySpec{}), 16);
  ASSERT_TRUE(m);
  auto over = generate(*m, greedy({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 10), {}, nullptr);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.error().code, "context_overflow");

  std::atomic<bool> cancel{false};
  int seen = 0;
  auto c = generate(*m, greedy({1, 5}, 10), [&](const TokenEvent&) {
    if (++seen == 3) cancel = true;
  }, &cancel);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->finish_reason, "cancelled");
  EXPECT_EQ(c->tokens.size(), 3u);

  auto bad = generate(*m, greedy({1, 100000}, 2), {}, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, "bad_request");
  auto empty = generate(*m, greedy({}, 2), {}, nullptr);  // empty prompt_ids + empty text
  ASSERT_TRUE(empty.ok());  // text "" with BOS gives one token
  EXPECT_EQ(empty->prompt_tokens.size(), 1u);
}

TEST_F(GenerateTest, PrefixReuseDoesNotChangeResults) {
  auto m = load(write(TinySpec{}));
  ASSERT_TRUE(m);
  auto full = generate(*m, greedy({1, 270, 271, 272, 273}, 6), {}, nullptr);
  auto other = generate(*m, greedy({1, 270, 290}, 3), {}, nullptr);  // shares a 2-token prefix
  auto again = generate(*m, greedy({1, 270, 271, 272, 273}, 6), {}, nullptr);
  ASSERT_TRUE(full.ok() && other.ok() && again.ok());
  EXPECT_EQ(full->tokens, again->tokens);
  auto fresh_m = load(write(TinySpec{}, "m2.gguf"));
  auto fresh = generate(*fresh_m, greedy({1, 270, 290}, 3), {}, nullptr);
  EXPECT_EQ(fresh->tokens, other->tokens);
}

TEST_F(GenerateTest, MemoryReportCoversFileAndCache) {
  const std::string p = write(TinySpec{});
  auto m = load(p, 64);
  ASSERT_TRUE(m);
  const uint64_t file_size = std::filesystem::file_size(p);
  const TinySpec s;
  const uint64_t kv = uint64_t(2) * 2 * s.n_layer * s.n_head_kv * s.head_dim * 64;
  EXPECT_GE(model_memory_bytes(*m), file_size + kv);
  EXPECT_FALSE(model_streams_experts(*m));
}

}  // namespace
}  // namespace car::engine

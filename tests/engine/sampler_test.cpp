// Sampler (each transform on hand-made distributions, order of transforms, seeding, frequencies) and
// StopMatcher (stop strings across token boundaries).
#include "core/engine/sampler.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <new>
#include <set>
#include <vector>

// Count every allocation of this test binary, so a test can show sample() allocates nothing when warm.
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

// GCC flags free() of operator new's memory once these are inlined; here both sides are ours and match.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace car::engine {
namespace {

/// Parameters with every filter off, so a test turns on just the one it is about.
SamplingParams plain(float temperature, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  p.repeat_last_n = 64;
  p.seed = seed;
  return p;
}

/// Logits whose softmax is exactly `probs` (up to rounding).
std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

/// Draw `n` tokens with one sampler and count each id.
std::map<int32_t, int> histogram(const SamplingParams& params, const std::vector<float>& logits, int n) {
  Sampler s(params);
  std::map<int32_t, int> counts;
  for (int i = 0; i < n; ++i) ++counts[s.sample(logits, {})];
  return counts;
}

std::set<int32_t> support(const std::map<int32_t, int>& h) {
  std::set<int32_t> ids;
  for (const auto& [id, count] : h) {
    if (count > 0) ids.insert(id);
  }
  return ids;
}

TEST(SamplerGreedy, PicksArgmax) {
  Sampler s(plain(0));
  const std::vector<float> logits{0.1f, -3.0f, 2.5f, 2.4f, 1.0f};
  EXPECT_EQ(s.sample(logits, {}), 2);
}

TEST(SamplerGreedy, TiesGoToLowestId) {
  Sampler s(plain(0));
  const std::vector<float> logits{1.0f, 3.0f, 3.0f, 3.0f};
  EXPECT_EQ(s.sample(logits, {}), 1);
  const std::vector<float> flat(100, 0.5f);
  EXPECT_EQ(s.sample(flat, {}), 0);
}

TEST(SamplerGreedy, NanIsNeverPicked) {
  Sampler s(plain(0));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(s.sample(std::vector<float>{nan, -5.0f, nan, -4.0f}, {}), 3);
}

TEST(SamplerGreedy, IgnoresFiltersAndSeed) {
  SamplingParams p = plain(0, 99);
  p.top_k = 1;
  p.top_p = 0.1f;
  p.min_p = 0.9f;
  Sampler s(p);
  const std::vector<float> logits{0.0f, 1.0f, 0.9f};
  for (int i = 0; i < 10; ++i) EXPECT_EQ(s.sample(logits, {}), 1);
}

TEST(SamplerPenalty, DividesPositiveLogits) {
  SamplingParams p = plain(0);
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  const std::vector<float> logits{2.0f, 1.5f};
  const std::vector<int32_t> history{0};
  EXPECT_EQ(s.sample(logits, history), 1);  // 2.0 / 2 = 1.0 < 1.5
  EXPECT_EQ(s.sample(logits, {}), 0);       // no history, no penalty
}

TEST(SamplerPenalty, MultipliesNegativeLogits) {
  SamplingParams p = plain(0);
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  const std::vector<float> logits{-1.0f, -1.5f};
  const std::vector<int32_t> history{0};
  EXPECT_EQ(s.sample(logits, history), 1);  // -1.0 * 2 = -2.0 < -1.5
}

TEST(SamplerPenalty, OncePerDistinctId) {
  SamplingParams p = plain(0);
  p.repeat_penalty = 1.5f;
  Sampler s(p);
  const std::vector<float> logits{2.0f, 1.2f};
  const std::vector<int32_t> history{0, 0, 0};
  EXPECT_EQ(s.sample(logits, history), 0);  // 2.0 / 1.5 = 1.33 > 1.2; applied three times it would lose
}

TEST(SamplerPenalty, OnlyTheLastNIds) {
  SamplingParams p = plain(0);
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 1;
  const std::vector<float> logits{2.0f, 1.2f, 1.5f};
  const std::vector<int32_t> history{0, 2};
  EXPECT_EQ(Sampler(p).sample(logits, history), 0);  // only id 2 penalized
  p.repeat_last_n = 2;
  EXPECT_EQ(Sampler(p).sample(logits, history), 1);  // 0 -> 1.0, 2 -> 0.75
  p.repeat_last_n = -1;                               // the whole history
  EXPECT_EQ(Sampler(p).sample(logits, history), 1);
  p.repeat_last_n = 0;                                // off
  EXPECT_EQ(Sampler(p).sample(logits, history), 0);
}

TEST(SamplerPenalty, NoStateLeaksBetweenCallsAndBadIdsAreIgnored) {
  SamplingParams p = plain(0);
  p.repeat_penalty = 2.0f;
  Sampler s(p);
  const std::vector<float> logits{2.0f, 1.5f, 1.4f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0, -7, 1000}), 1);
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{1}), 0);
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{2}), 0);
}

TEST(SamplerPenalty, AppliesBeforeRandomSampling) {
  SamplingParams p = plain(1.0f);
  p.repeat_penalty = 100.0f;
  const std::vector<float> logits{50.0f, 50.0f, -20.0f};  // id 0 penalized to 0.5: p ~ e^-49.5
  Sampler s(p);
  const std::vector<int32_t> history{0};
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.sample(logits, history), 1);
}

TEST(SamplerTopK, KeepsTheKLargest) {
  SamplingParams p = plain(1.0f);
  p.top_k = 2;
  const auto h = histogram(p, std::vector<float>{0.0f, 0.5f, 0.1f, 0.4f, 0.2f}, 2000);
  EXPECT_EQ(support(h), (std::set<int32_t>{1, 3}));
}

TEST(SamplerTopK, OneIsGreedy) {
  SamplingParams p = plain(1.5f);
  p.top_k = 1;
  const auto h = histogram(p, std::vector<float>{0.0f, 0.3f, 0.3f, 0.1f}, 500);
  EXPECT_EQ(support(h), (std::set<int32_t>{1}));  // tie broken towards the lower id
}

TEST(SamplerTopP, KeepsSmallestPrefixReachingP) {
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain(1.0f);
  p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.8
  EXPECT_EQ(support(histogram(p, logits, 2000)), (std::set<int32_t>{0, 1}));
  p.top_p = 0.45f;
  EXPECT_EQ(support(histogram(p, logits, 500)), (std::set<int32_t>{0}));
  p.top_p = 0.9f;  // 0.8 < 0.9 <= 0.95
  EXPECT_EQ(support(histogram(p, logits, 4000)), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTopP, LargeVocabularyNeedsNoFullSortButGetsTheSameSet) {
  // 2000 ids: one strong id, then a flat tail; top-p 0.5 must reach ~800 ids into the tail, past the first
  // partial sort.
  std::vector<float> logits(2000, 0.0f);
  logits[1234] = 6.0f;  // p ~ 0.168
  SamplingParams p = plain(1.0f);
  p.top_p = 0.5f;
  const auto h = histogram(p, logits, 300);
  // Prefix: id 1234, then the tail ids in id order until the cumulative reaches 0.5.
  const double z = std::exp(6.0) + 1999.0;
  const int tail = static_cast<int>(std::ceil(0.5 * z - std::exp(6.0)));
  int in_tail = 0;
  for (const auto& [id, count] : h) {
    if (id == 1234) continue;
    const int rank = id < 1234 ? id : id - 1;  // position among the tail (lower id first)
    EXPECT_LT(rank, tail) << "id " << id << " is past the top-p prefix";
    if (rank >= 64) in_tail += count;
  }
  EXPECT_GT(h.at(1234), 60);  // expected ~100 of 300
  EXPECT_GT(in_tail, 100);    // the walk went past the first 64 sorted ids
}

TEST(SamplerMinP, DropsIdsBelowFractionOfBest) {
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain(1.0f);
  p.min_p = 0.25f;  // threshold 0.125
  EXPECT_EQ(support(histogram(p, logits, 4000)), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.65f;  // threshold 0.325
  EXPECT_EQ(support(histogram(p, logits, 500)), (std::set<int32_t>{0}));
  p.min_p = 5.0f;   // asks for more than the best: the best alone
  EXPECT_EQ(support(histogram(p, logits, 200)), (std::set<int32_t>{0}));
}

TEST(SamplerOrder, TopPSeesTheDistributionLeftByTopK) {
  const auto logits = logits_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p = plain(1.0f);
  p.top_p = 0.55f;
  EXPECT_EQ(support(histogram(p, logits, 2000)), (std::set<int32_t>{0, 1}));
  p.top_k = 2;  // renormalized: 0.571, 0.429 -> 0 alone reaches 0.55
  EXPECT_EQ(support(histogram(p, logits, 500)), (std::set<int32_t>{0}));
}

TEST(SamplerOrder, FiltersRunBeforeTemperature) {
  // At temperature 1, min-p 0.2 drops id 3 (0.05 < 0.1). A high temperature flattens the distribution,
  // which would let id 3 through if the filter ran after it.
  const auto logits = logits_of({0.5, 0.3, 0.15, 0.05});
  SamplingParams p = plain(5.0f);
  p.min_p = 0.2f;
  EXPECT_EQ(support(histogram(p, logits, 4000)), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.0f;
  p.top_p = 0.7f;
  EXPECT_EQ(support(histogram(p, logits, 2000)), (std::set<int32_t>{0, 1}));
}

TEST(SamplerSeed, SameSeedSameSequence) {
  const std::vector<float> logits{0.1f, 0.2f, 0.3f, 0.0f, -0.1f, 0.25f, 0.15f, 0.05f};
  SamplingParams p = plain(1.0f, 1234);
  Sampler a(p);
  Sampler b(p);
  std::vector<int32_t> seq_a;
  std::vector<int32_t> seq_b;
  for (int i = 0; i < 300; ++i) {
    seq_a.push_back(a.sample(logits, {}));
    seq_b.push_back(b.sample(logits, {}));
  }
  EXPECT_EQ(seq_a, seq_b);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int32_t> seq_c;
  for (int i = 0; i < 300; ++i) seq_c.push_back(c.sample(logits, {}));
  EXPECT_NE(seq_a, seq_c);
}

TEST(SamplerSeed, DrawsFollowTheStandardGenerator) {
  // The draw is u = (mt19937_64() >> 11) * 2^-53 inverted through the cumulative distribution; with two
  // equally likely ids, id 0 exactly when u < 0.5, i.e. when the generator's top bit is clear.
  const std::vector<float> logits{0.0f, 0.0f};
  Sampler s(plain(1.0f, 42));
  std::mt19937_64 reference(42);
  for (int i = 0; i < 64; ++i) {
    const int32_t expected = (reference() >> 63) == 0 ? 0 : 1;
    EXPECT_EQ(s.sample(logits, {}), expected) << "draw " << i;
  }
}

TEST(SamplerFrequencies, MatchSoftmaxAtTemperature) {
  const std::vector<double> probs{0.5, 0.3, 0.15, 0.05};
  const auto logits = logits_of(probs);
  constexpr int kDraws = 20000;
  for (const float t : {1.0f, 0.5f, 2.0f}) {
    std::vector<double> expected;
    double z = 0;
    for (double q : probs) z += std::pow(q, 1.0 / t);
    for (double q : probs) expected.push_back(std::pow(q, 1.0 / t) / z);
    const auto h = histogram(plain(t, 7), logits, kDraws);
    for (int id = 0; id < 4; ++id) {
      const double freq = h.count(id) != 0 ? static_cast<double>(h.at(id)) / kDraws : 0.0;
      EXPECT_NEAR(freq, expected[static_cast<size_t>(id)], 0.02) << "temperature " << t << " id " << id;
    }
  }
}

TEST(SamplerFrequencies, DegenerateLogitsStillReturnAnId) {
  Sampler s(plain(1.0f));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(s.sample(std::vector<float>{-inf, -inf, -inf}, {}), 0);
  EXPECT_EQ(s.sample(std::vector<float>{0.0f, inf, 1.0f}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-inf, 3.0f, -inf}, {}), 1);
}

TEST(SamplerBuffers, WarmSampleDoesNotAllocate) {
  std::vector<float> logits(8000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(static_cast<double>(i)) * 4.0);
  const std::vector<int32_t> history{5, 17, 99, 5, 7999};
  SamplingParams p = plain(0.8f, 3);
  p.top_k = 40;
  p.top_p = 0.95f;
  p.min_p = 0.05f;
  p.repeat_penalty = 1.1f;
  for (const int top_k : {40, 0}) {  // 0: top-p walks the unsorted vocabulary
    p.top_k = top_k;
    Sampler s(p);
    s.sample(logits, history);  // first call sizes the buffers
    const long before = g_allocations.load();
    for (int i = 0; i < 10; ++i) s.sample(logits, history);
    EXPECT_EQ(g_allocations.load(), before) << "top_k " << top_k;
  }
}

TEST(TopLogprobs, MatchesLogSoftmaxMostLikelyFirst) {
  const std::vector<float> logits{1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  double z = 0;
  for (float l : logits) z += std::exp(static_cast<double>(l));
  const auto top = Sampler::top_logprobs(logits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);  // tie with id 3: lower id first
  EXPECT_EQ(top[1].token, 3);
  EXPECT_EQ(top[2].token, 0);
  for (const auto& t : top) {
    EXPECT_NEAR(t.logprob, static_cast<double>(logits[static_cast<size_t>(t.token)]) - std::log(z), 1e-12);
  }
}

TEST(TopLogprobs, LogprobOfAnyIdIsItsFullVocabularyLogSoftmax) {
  const std::vector<float> logits{1.0f, 3.0f, -2.0f, 3.0f, 0.5f, std::nanf("")};
  double z = 0;
  for (size_t i = 0; i + 1 < logits.size(); ++i) z += std::exp(static_cast<double>(logits[i]));
  for (int32_t id = 0; id < 5; ++id) {
    EXPECT_NEAR(Sampler::logprob_of(logits, id),
                static_cast<double>(logits[static_cast<size_t>(id)]) - std::log(z), 1e-12);
  }
  // The same figure top_logprobs reports for the ids it lists.
  for (const auto& t : Sampler::top_logprobs(logits, 4))
    EXPECT_EQ(Sampler::logprob_of(logits, t.token), t.logprob);
  // NaN (treated as -inf) and ids outside the vocabulary have probability 0.
  EXPECT_EQ(Sampler::logprob_of(logits, 5), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(Sampler::logprob_of(logits, 6), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(Sampler::logprob_of(logits, -1), -std::numeric_limits<double>::infinity());
}

TEST(TopLogprobs, FullVocabularySumsToOneAndKIsClamped) {
  std::vector<float> logits;
  for (int i = 0; i < 1000; ++i) logits.push_back(static_cast<float>(std::sin(i * 0.37) * 10.0));
  const auto all = Sampler::top_logprobs(logits, 5000);
  ASSERT_EQ(all.size(), logits.size());
  double sum = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    sum += std::exp(all[i].logprob);
    if (i > 0) {
      EXPECT_LE(all[i].logprob, all[i - 1].logprob);
    }
  }
  EXPECT_NEAR(sum, 1.0, 1e-9);
  EXPECT_TRUE(Sampler::top_logprobs(logits, 0).empty());
  EXPECT_TRUE(Sampler::top_logprobs(logits, -3).empty());
}

TEST(TopLogprobs, IgnoresSamplingTransforms) {
  // top_logprobs is static: penalties and filters cannot touch it. Large logits stay accurate in double.
  const std::vector<float> logits{1000.0f, 999.0f};
  const auto top = Sampler::top_logprobs(logits, 2);
  EXPECT_NEAR(top[0].logprob, -std::log1p(std::exp(-1.0)), 1e-12);
  EXPECT_NEAR(top[1].logprob, -1.0 - std::log1p(std::exp(-1.0)), 1e-12);
}

/// Feed pieces through a matcher; the concatenated emitted text and whether it stopped.
std::pair<std::string, bool> run_stops(std::vector<std::string> stops, const std::vector<std::string>& pieces) {
  StopMatcher m(std::move(stops));
  std::string out;
  for (const auto& piece : pieces) {
    const auto step = m.push(piece);
    out += step.text;
    if (step.stopped) return {out, true};
  }
  out += m.flush();
  return {out, false};
}

TEST(StopMatcher, HoldsBackAPossibleStartAcrossTokens) {
  StopMatcher m({"</s>"});
  auto step = m.push("Hello <");
  EXPECT_EQ(step.text, "Hello ");
  EXPECT_FALSE(step.stopped);
  step = m.push("/");
  EXPECT_EQ(step.text, "");
  step = m.push("s> trailing");
  EXPECT_EQ(step.text, "");
  EXPECT_TRUE(step.stopped);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more").text, "");  // nothing after a stop
}

TEST(StopMatcher, ReleasesHeldTextWhenItIsNotAStop) {
  StopMatcher m({"</s>"});
  EXPECT_EQ(m.push("a<").text, "a");
  EXPECT_EQ(m.push("/x").text, "</x");
  EXPECT_EQ(m.push("<").text, "");
  EXPECT_EQ(m.flush(), "<");
}

TEST(StopMatcher, StopInsideOnePiece) {
  EXPECT_EQ(run_stops({"STOP"}, {"abcSTOPdef"}), (std::pair<std::string, bool>{"abc", true}));
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  EXPECT_EQ(run_stops({"world", "lo w"}, {"hel", "lo wor", "ld"}), (std::pair<std::string, bool>{"hel", true}));
}

TEST(StopMatcher, OverlappingPrefixes) {
  EXPECT_EQ(run_stops({"aab"}, {"a", "a", "a", "b", "c"}), (std::pair<std::string, bool>{"a", true}));
  EXPECT_EQ(run_stops({"aab"}, {"a", "a", "a", "c"}), (std::pair<std::string, bool>{"aaac", false}));
}

TEST(StopMatcher, NoStopsPassesThroughAndEmptyStopsAreIgnored) {
  EXPECT_EQ(run_stops({}, {"x", "", "yz"}), (std::pair<std::string, bool>{"xyz", false}));
  EXPECT_EQ(run_stops({""}, {"x", "yz"}), (std::pair<std::string, bool>{"xyz", false}));
}

TEST(StopMatcher, MultiByteStopHoldsWholeCharacters) {
  // "é" is two bytes; a stop beginning with it holds back whole characters only.
  StopMatcher m({"\xC3\xA9t\xC3\xA9"});
  EXPECT_EQ(m.push("caf\xC3\xA9").text, "caf");
  EXPECT_EQ(m.push("s").text, "\xC3\xA9s");
}

}  // namespace
}  // namespace car::engine

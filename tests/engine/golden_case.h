// One golden case checked against our forward pass, as the three llama.cpp-golden suites check it (the
// shared conformance manifest, the reference harness's fixtures, the new quant types' models): the case's
// prompt_ids + generated_ids teacher-forced in one batch, each golden top logprob at each generated
// position within `tol` of ours (full-vocabulary log-softmax in double); then free-running greedy decoding
// (prompt batch, one token at a time) reproduces generated_ids up to the first position whose top1_margin
// is below twice `greedy_bound`.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/engine/forward.h"
#include "core/tensor/kernels.h"

namespace car::engine::golden {

inline std::vector<double> log_softmax(const float* logits, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
  double z = 0;
  for (int64_t i = 0; i < n; ++i) z += std::exp(double(logits[i]) - mx);
  const double lz = mx + std::log(z);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = double(logits[i]) - lz;
  return out;
}

inline int32_t argmax(const float* logits, int64_t n) {
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

/// What the cases of one file came to.
struct GoldenDeviation {
  double max_dev = 0;  ///< the largest |logprob - golden|
  int greedy_checked = 0;
  int greedy_total = 0;
};

/// Check case `c` (prompt_ids, generated_ids, top1_margin, top_logprobs) with `fp` over a vocabulary of `V`
/// into `res`; failures name `where`.
inline void check_golden_case(ForwardPass& fp, int64_t V, const nlohmann::json& c, double tol, double greedy_bound,
                              const std::string& where, GoldenDeviation& res) {
  const auto prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
  const auto gen = c.at("generated_ids").get<std::vector<int32_t>>();
  const auto margins = c.at("top1_margin").get<std::vector<double>>();
  const nlohmann::json& tops = c.at("top_logprobs");
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), gen.begin(), gen.end());

  // Teacher-forced, one batch.
  KvCache kv = fp.make_cache(static_cast<int64_t>(all.size()) + 1);
  std::vector<float> logits(all.size() * static_cast<size_t>(V));
  EXPECT_TRUE(fp.eval(all, kv, logits.data(), true).ok());
  for (size_t j = 0; j < gen.size(); ++j) {
    const size_t row = prompt.size() - 1 + j;
    const auto lp = log_softmax(logits.data() + row * static_cast<size_t>(V), V);
    for (const nlohmann::json& t : tops.at(j)) {
      const int32_t id = t.at("id").get<int32_t>();
      const double want = t.at("logprob").get<double>();
      const double got = lp[static_cast<size_t>(id)];
      const double dev = std::fabs(got - want);
      res.max_dev = std::max(res.max_dev, dev);
      EXPECT_LE(dev, tol) << where << " position " << j << " id " << id << ": " << got << " vs " << want;
    }
  }

  // Free-running greedy, up to the first position too close to call.
  size_t limit = gen.size();
  for (size_t j = 0; j < margins.size(); ++j) {
    if (margins[j] < 2 * greedy_bound) {
      limit = j;
      break;
    }
  }
  KvCache kv2 = fp.make_cache(static_cast<int64_t>(all.size()) + 1);
  std::vector<float> last(static_cast<size_t>(V));
  EXPECT_TRUE(fp.eval(prompt, kv2, last.data(), false).ok());
  for (size_t j = 0; j < limit; ++j) {
    const int32_t tok = argmax(last.data(), V);
    EXPECT_EQ(tok, gen[j]) << where << " greedy position " << j;
    if (tok != gen[j]) break;
    ++res.greedy_checked;
    EXPECT_TRUE(fp.eval(std::span<const int32_t>(&tok, 1), kv2, last.data(), false).ok());
  }
  res.greedy_total += static_cast<int>(gen.size());
}

/// Selects the kernels a golden suite tests: CAR_INFERENCE_ISA (scalar | avx2 | avx512) when set, else the
/// best this CPU has, and prints which under `label`. Fails the calling test on a value it cannot parse.
inline void select_isa_under_test(const char* label) {
  tensor::Isa isa = tensor::detect_isa();
  if (const char* env = std::getenv("CAR_INFERENCE_ISA"); env != nullptr && *env != '\0') {
    ASSERT_TRUE(tensor::parse_isa(env, &isa)) << "CAR_INFERENCE_ISA=" << env;
  }
  tensor::set_isa(isa);
  std::printf("%s kernels: %s\n", label, std::string(tensor::isa_name(tensor::current_isa())).c_str());
}

/// A suite's files' deviations: each recorded as the test property max_dev_<file>, the worst printed at the
/// end under the suite's label.
class DeviationLog {
 public:
  explicit DeviationLog(const char* label) : label_(label) {}
  ~DeviationLog() { std::printf("%s worst deviation %.3g\n", label_, worst_); }
  DeviationLog(const DeviationLog&) = delete;
  DeviationLog& operator=(const DeviationLog&) = delete;

  void add(const std::string& file, double max_dev) {
    ::testing::Test::RecordProperty("max_dev_" + file, std::to_string(max_dev));
    worst_ = std::max(worst_, max_dev);
  }

 private:
  const char* label_;
  double worst_ = 0;
};

}  // namespace car::engine::golden

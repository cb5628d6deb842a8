// Sampler and StopMatcher: see sampler.h for the order of transforms and the reproducibility rules.
#include "core/engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/util/result.h"

namespace car::engine {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float clean_logit(float x) { return std::isnan(x) ? kNegInf : x; }

/// Most likely first; equal logits: lower id first. A strict total order, so every sort is deterministic.
template <typename C>
bool more_likely(const C& a, const C& b) {
  if (a.logit != b.logit) return a.logit > b.logit;
  return a.id < b.id;
}

}  // namespace

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

double Sampler::uniform() {
  // 53 random bits scaled into [0, 1): the same on every platform, unlike std::uniform_real_distribution.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
  CAR_CHECK(!logits.empty());
  CAR_CHECK(logits.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()));
  const size_t n = logits.size();
  const bool penalize = params_.repeat_penalty != 1.0f && params_.repeat_penalty > 0.0f &&
                        params_.repeat_last_n != 0 && !history.empty();

  if (params_.temperature <= 0.0f && !penalize) {
    // Greedy without penalties: scan the logits directly, no copy.
    int32_t best = 0;
    float best_logit = clean_logit(logits[0]);
    for (size_t i = 1; i < n; ++i) {
      const float l = clean_logit(logits[i]);
      if (l > best_logit) {
        best_logit = l;
        best = static_cast<int32_t>(i);
      }
    }
    return best;
  }

  candidates_.resize(n);  // capacity is kept between calls: no allocation after the first
  for (size_t i = 0; i < n; ++i) candidates_[i] = Candidate{static_cast<int32_t>(i), clean_logit(logits[i])};
  sorted_ = 0;
  if (penalize) apply_penalties(history);
  if (params_.temperature <= 0.0f) return argmax_candidates();

  keep_top_k();
  keep_top_p();
  keep_min_p();
  const float inv_t = 1.0f / params_.temperature;
  for (auto& c : candidates_) c.logit *= inv_t;
  return draw();
}

void Sampler::apply_penalties(std::span<const int32_t> history) {
  const size_t n = candidates_.size();
  if (penalized_.size() < n) penalized_.resize(n, 0);
  size_t window = history.size();
  if (params_.repeat_last_n > 0) window = std::min(window, static_cast<size_t>(params_.repeat_last_n));
  const auto recent = history.subspan(history.size() - window);
  const float penalty = params_.repeat_penalty;
  for (const int32_t id : recent) {
    if (id < 0 || static_cast<size_t>(id) >= n || penalized_[static_cast<size_t>(id)] != 0) continue;
    penalized_[static_cast<size_t>(id)] = 1;
    float& l = candidates_[static_cast<size_t>(id)].logit;  // candidates_ is in id order here
    l = l > 0.0f ? l / penalty : l * penalty;
  }
  for (const int32_t id : recent) {
    if (id >= 0 && static_cast<size_t>(id) < n) penalized_[static_cast<size_t>(id)] = 0;
  }
}

int32_t Sampler::argmax_candidates() const {
  CAR_CHECK(!candidates_.empty());
  const Candidate* best = &candidates_[0];
  for (const auto& c : candidates_) {
    if (more_likely(c, *best)) best = &c;
  }
  return best->id;
}

void Sampler::sort_prefix(size_t m) {
  m = std::min(m, candidates_.size());
  if (m <= sorted_) return;
  std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<std::ptrdiff_t>(m), candidates_.end(),
                    more_likely<Candidate>);
  sorted_ = m;
}

void Sampler::keep_top_k() {
  if (params_.top_k <= 0 || static_cast<size_t>(params_.top_k) >= candidates_.size()) return;
  const auto k = static_cast<size_t>(params_.top_k);
  sort_prefix(k);
  candidates_.resize(k);
}

void Sampler::keep_top_p() {
  if (params_.top_p >= 1.0f || candidates_.size() <= 1) return;
  // Normalizer of the softmax over every candidate left.
  float max_logit = kNegInf;
  for (const auto& c : candidates_) max_logit = std::max(max_logit, c.logit);
  if (!std::isfinite(max_logit)) return;  // degenerate (all -inf, or +inf present): leave it to draw()
  double sum = 0;
  for (const auto& c : candidates_) sum += std::exp(static_cast<double>(c.logit) - max_logit);
  const double target = std::max(0.0, static_cast<double>(params_.top_p)) * sum;

  // Walk the most likely first, sorting only as far as needed (a large vocabulary rarely needs a full sort).
  double cum = 0;
  size_t i = 0;
  size_t m = std::min<size_t>(candidates_.size(), 64);
  while (true) {
    sort_prefix(m);
    for (; i < sorted_; ++i) {
      cum += std::exp(static_cast<double>(candidates_[i].logit) - max_logit);
      if (cum >= target) {
        candidates_.resize(i + 1);
        return;
      }
    }
    if (sorted_ == candidates_.size()) return;  // rounding kept the cumulative short of p: keep all
    m = sorted_ * 8;
  }
}

void Sampler::keep_min_p() {
  if (params_.min_p <= 0.0f || candidates_.size() <= 1) return;
  float max_logit = kNegInf;
  for (const auto& c : candidates_) max_logit = std::max(max_logit, c.logit);
  if (!std::isfinite(max_logit)) return;
  // p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p); the normalizer cancels.
  const double threshold = static_cast<double>(max_logit) + std::log(static_cast<double>(params_.min_p));
  const size_t before = candidates_.size();
  size_t kept = 0;
  for (size_t i = 0; i < before; ++i) {
    if (static_cast<double>(candidates_[i].logit) >= threshold) candidates_[kept++] = candidates_[i];
  }
  if (kept == 0) {  // min_p > 1 asks for more than the best: keep the best alone
    candidates_[0] = Candidate{argmax_candidates(), max_logit};
    kept = 1;
  }
  candidates_.resize(kept);
  sorted_ = std::min(sorted_, kept);  // the stable compaction keeps a sorted prefix sorted
}

int32_t Sampler::draw() {
  CAR_CHECK(!candidates_.empty());
  float max_logit = kNegInf;
  for (const auto& c : candidates_) max_logit = std::max(max_logit, c.logit);
  if (!std::isfinite(max_logit)) return argmax_candidates();
  weights_.resize(candidates_.size());
  double sum = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    weights_[i] = std::exp(static_cast<double>(candidates_[i].logit) - max_logit);
    sum += weights_[i];
  }
  const double u = uniform() * sum;
  double cum = 0;
  size_t last_positive = 0;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (weights_[i] <= 0) continue;
    cum += weights_[i];
    last_positive = i;
    if (u < cum) return candidates_[i].id;
  }
  return candidates_[last_positive].id;  // u landed in the rounding gap at the top
}

std::vector<TopLogprob> Sampler::top_logprobs(std::span<const float> logits, int k) {
  const size_t n = logits.size();
  if (k <= 0 || n == 0) return {};
  const size_t kk = std::min(n, static_cast<size_t>(k));
  double max_logit = -std::numeric_limits<double>::infinity();
  for (const float l : logits) max_logit = std::max(max_logit, static_cast<double>(clean_logit(l)));

  struct Entry {
    int32_t id;
    float logit;
  };
  std::vector<Entry> entries(n);
  for (size_t i = 0; i < n; ++i) entries[i] = Entry{static_cast<int32_t>(i), clean_logit(logits[i])};
  std::partial_sort(entries.begin(), entries.begin() + static_cast<std::ptrdiff_t>(kk), entries.end(),
                    more_likely<Entry>);

  std::vector<TopLogprob> out;
  out.reserve(kk);
  if (!std::isfinite(max_logit)) {
    // All -inf: no distribution. +inf present: the +inf ids share all the mass.
    size_t n_inf = 0;
    if (max_logit > 0) {
      for (const float l : logits) n_inf += (l == std::numeric_limits<float>::infinity()) ? 1 : 0;
    }
    for (size_t i = 0; i < kk; ++i) {
      const bool top = n_inf > 0 && entries[i].logit == std::numeric_limits<float>::infinity();
      out.push_back(TopLogprob{entries[i].id, top ? -std::log(static_cast<double>(n_inf))
                                                  : -std::numeric_limits<double>::infinity()});
    }
    return out;
  }
  double sum = 0;
  for (const float l : logits) sum += std::exp(static_cast<double>(clean_logit(l)) - max_logit);
  const double log_z = max_logit + std::log(sum);
  for (size_t i = 0; i < kk; ++i) {
    out.push_back(TopLogprob{entries[i].id, static_cast<double>(entries[i].logit) - log_z});
  }
  return out;
}

double Sampler::logprob_of(std::span<const float> logits, int32_t id) {
  constexpr double kNegInfD = -std::numeric_limits<double>::infinity();
  if (id < 0 || static_cast<size_t>(id) >= logits.size()) return kNegInfD;
  double max_logit = kNegInfD;
  for (const float l : logits) max_logit = std::max(max_logit, static_cast<double>(clean_logit(l)));
  const double mine = clean_logit(logits[static_cast<size_t>(id)]);
  if (!std::isfinite(max_logit)) {
    // As top_logprobs: the +inf ids share all the mass; all -inf is no distribution.
    if (max_logit < 0 || mine != std::numeric_limits<double>::infinity()) return kNegInfD;
    size_t n_inf = 0;
    for (const float l : logits) n_inf += (l == std::numeric_limits<float>::infinity()) ? 1 : 0;
    return -std::log(static_cast<double>(n_inf));
  }
  double sum = 0;
  for (const float l : logits) sum += std::exp(static_cast<double>(clean_logit(l)) - max_logit);
  return mine - (max_logit + std::log(sum));
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

StopMatcher::Step StopMatcher::push(std::string_view piece) {
  Step step;
  if (stopped_) return step;
  if (stops_.empty()) {
    step.text.assign(piece);
    return step;
  }
  pending_.append(piece);

  // Earliest occurrence of any stop string. Text emitted earlier cannot hold the start of one (it would
  // have been held back), so searching the pending text is enough.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, pending_.find(s));
  if (first != std::string::npos) {
    step.text = pending_.substr(0, first);
    step.stopped = true;
    stopped_ = true;
    pending_.clear();
    return step;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  const std::string_view text = pending_;
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t longest = std::min(s.size() - 1, text.size());
    for (size_t len = longest; len > hold; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  const size_t emit = pending_.size() - hold;
  step.text = pending_.substr(0, emit);
  pending_.erase(0, emit);
  return step;
}

std::string StopMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace car::engine

// Sampler: turns one position's logits into the next token id, and StopMatcher: finds stop strings in the
// generated text across token boundaries.
//
// The sampler applies llama.cpp's common-sampler transforms, in its order:
//
//   1. repetition penalty  every distinct id among the last `repeat_last_n` ids of the history has its logit
//                          divided by `repeat_penalty` when positive, multiplied when negative (once per id,
//                          however often it occurs)
//   2. top-k               keep the k largest logits (0 = off)
//   3. top-p               keep the smallest most-likely-first prefix whose probability (softmax at
//                          temperature 1 over the candidates left) reaches p (1 = off)
//   4. min-p               keep candidates whose probability is at least min_p times the largest (0 = off)
//   5. temperature         divide the logits left by T
//   6. draw                one uniform draw from a seeded std::mt19937_64 (53 high bits -> [0, 1)), inverted
//                          through the cumulative softmax (in double) of the candidates left, in the order the
//                          filters leave them (most likely first after top-k / top-p, else id order)
//
// Temperature <= 0 is greedy: the argmax of the penalized logits (steps 2-6 skipped). Every ordering breaks
// ties by the lower id, so results depend only on the inputs and the seed - not on the platform's sort or
// <random> distributions (std::mt19937_64 itself is fully specified by the standard).
//
// Each filter keeps at least one candidate. NaN logits are treated as -infinity. The sampler owns its
// candidate buffers and reuses them: after the first call at a given vocabulary size, sample() does not
// allocate.
//
// Thread safety: a Sampler is mutable state (RNG, buffers); use one per generation, on one thread.
// top_logprobs() is a pure function.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace car::engine {

/// The sampler's settings (GenerateRequest::sampling); see the transforms above.
struct SamplingParams {
  float temperature = 0.8f;  ///< 0 = greedy
  int top_k = 40;            ///< 0 = off
  float top_p = 0.95f;       ///< 1 = off
  float min_p = 0.05f;       ///< 0 = off
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  uint64_t seed = 0;
};

/// One of the most likely ids at a position, with its natural-log probability.
struct TopLogprob {
  int32_t token;
  double logprob;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  /// Pick the next id from `logits` (one float per vocabulary id; must not be empty). `history` is the
  /// sequence so far (prompt and generated ids, oldest first); only its last `repeat_last_n` ids matter.
  /// Ids in the history outside [0, logits.size()) are ignored.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

  /// The `k` most likely ids under the full-vocabulary softmax of `logits` (no penalties or filters), with
  /// their natural-log probabilities computed in double, most likely first (ties: lower id first).
  /// k is clamped to [0, logits.size()].
  static std::vector<TopLogprob> top_logprobs(std::span<const float> logits, int k);
  /// The natural-log probability of `id` under the same full-vocabulary softmax of `logits` (no penalties or
  /// filters; what llama.cpp and OpenAI report as a chosen token's logprob). -infinity for an id outside
  /// the vocabulary or of probability 0.
  static double logprob_of(std::span<const float> logits, int32_t id);

  const SamplingParams& params() const { return params_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };

  /// Penalize the candidates' logits (candidates_ must hold the whole vocabulary in id order).
  void apply_penalties(std::span<const int32_t> history);
  int32_t argmax_candidates() const;
  /// Make candidates_[0, m) the m most likely, in order.
  void sort_prefix(size_t m);
  void keep_top_k();
  void keep_top_p();
  void keep_min_p();
  int32_t draw();
  /// Uniform double in [0, 1) from the RNG's 53 high bits.
  double uniform();

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<Candidate> candidates_;  // the candidates left, in id order until a filter sorts them
  size_t sorted_ = 0;                  // candidates_[0, sorted_) are the most likely, in order
  std::vector<uint8_t> penalized_;     // per vocabulary id: already penalized in this call (all 0 between calls)
  std::vector<double> weights_;        // scratch for softmax / cumulative sums, same length as candidates_
};

/// Watches generated text for stop strings that may span token boundaries.
///
/// push() takes each token's text and returns what may be shown now: text that could still be the start
/// of a stop string is held back until the next pieces decide. When a stop string appears, push() returns
/// the text before its first occurrence and `stopped` = true; everything from the stop string on is
/// dropped. At the end of generation without a stop, flush() returns the held-back text.
///
/// With no (non-empty) stop strings it passes text straight through. Not thread-safe; one per generation.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Step {
    std::string text;      ///< text to emit now
    bool stopped = false;  ///< a stop string matched; generation should end
  };

  Step push(std::string_view piece);
  /// The held-back text (call once when generation ends for another reason).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;  // non-empty strings only
  std::string pending_;             // held-back text: a suffix that is a proper prefix of some stop string
  bool stopped_ = false;
};

}  // namespace car::engine

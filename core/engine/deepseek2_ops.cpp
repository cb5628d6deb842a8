#include "core/engine/deepseek2_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/engine/ops.h"
#include "core/util/result.h"

namespace car::engine {
namespace {

/// The index of the largest of x[0, n) not yet taken (ties to the lower index); -1 when all are taken.
int64_t best_untaken(const float* x, int64_t n, const int32_t* taken, int64_t n_taken, int64_t offset = 0) {
  int64_t best = -1;
  for (int64_t e = 0; e < n; ++e) {
    bool used = false;
    for (int64_t t = 0; t < n_taken; ++t) used = used || taken[t] == e + offset;
    if (used) continue;
    if (best < 0 || x[e] > x[best]) best = e;
  }
  return best;
}

}  // namespace

void select_experts_deepseek2(const float* logits, int64_t n_expert, int64_t k, const Deepseek2Routing& r,
                              float* probs, float* selection, int32_t* ids, float* weights) {
  CAR_CHECK(k >= 1 && k <= n_expert);
  std::copy(logits, logits + n_expert, probs);
  if (r.sigmoid) {
    for (int64_t e = 0; e < n_expert; ++e) probs[e] = 1.0f / (1.0f + std::exp(-probs[e]));
  } else {
    softmax(probs, n_expert);
  }
  for (int64_t e = 0; e < n_expert; ++e) selection[e] = r.bias != nullptr ? probs[e] + r.bias[e] : probs[e];

  if (r.n_groups > 1) {
    const int64_t per = n_expert / r.n_groups;
    CAR_CHECK(per >= 2 && r.n_group_used >= 1 && r.n_group_used < r.n_groups && r.n_groups <= 1024);
    // Each group's score: its two largest selection values, summed (ggml_sum_rows: double, then float).
    float scores[1024];
    for (int64_t g = 0; g < r.n_groups; ++g) {
      const float* s = selection + g * per;
      int32_t top[2];
      top[0] = static_cast<int32_t>(best_untaken(s, per, top, 0));
      top[1] = static_cast<int32_t>(best_untaken(s, per, top, 1));
      scores[g] = static_cast<float>(static_cast<double>(s[top[0]]) + static_cast<double>(s[top[1]]));
    }
    int32_t kept[1024];
    for (int64_t j = 0; j < r.n_group_used; ++j)
      kept[j] = static_cast<int32_t>(best_untaken(scores, r.n_groups, kept, j));
    for (int64_t g = 0; g < r.n_groups; ++g) {
      bool keep = false;
      for (int64_t j = 0; j < r.n_group_used; ++j) keep = keep || kept[j] == g;
      if (!keep)
        std::fill(selection + g * per, selection + (g + 1) * per, -std::numeric_limits<float>::infinity());
    }
  }

  for (int64_t j = 0; j < k; ++j) {
    ids[j] = static_cast<int32_t>(best_untaken(selection, n_expert, ids, j));
    weights[j] = probs[ids[j]];
  }
  if (r.norm) {
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(weights[j]);
    const float s = std::max(static_cast<float>(sum), 6.103515625e-5f);
    for (int64_t j = 0; j < k; ++j) weights[j] = weights[j] / s;
  }
  if (r.scale != 0.0f && r.scale != 1.0f) {
    for (int64_t j = 0; j < k; ++j) weights[j] = weights[j] * r.scale;
  }
}

}  // namespace car::engine

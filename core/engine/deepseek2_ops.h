// deepseek2's router (llama.cpp's build_moe_ffn with DeepSeek-V2/V3's options), one row at a time:
//
//   probs      softmax(logits) (expert_gating_func 1) or sigmoid 1 / (1 + expf(-x)) of each logit (2)
//   selection  probs + exp_probs_b when the layer has the bias (V3); unbiased probs otherwise
//   groups     with n_groups > 1: each group of n_expert / n_groups consecutive experts scores the sum of its
//              two best selection values; the n_group_used best groups are kept, the others' selection
//              values become -inf (ggml_argsort_top_k, get_rows, sum_rows, set_rows over a -inf fill)
//   top-k      the k largest selection values, largest first (ties to the lower id)
//   weights    the chosen experts' unbiased probs; divided by their sum (in double, clamped below at 2^-14)
//              when `norm`; then times `scale` unless it is 0 or 1 (ggml_scale)
//
// Pure and reentrant; scratch is caller-provided.
#pragma once

#include <cstdint>

namespace car::engine {

struct Deepseek2Routing {
  bool sigmoid = false;
  const float* bias = nullptr;  ///< exp_probs_b (n_expert), or null
  int64_t n_groups = 0;         ///< > 1: group-limited selection
  int64_t n_group_used = 0;
  bool norm = false;
  float scale = 0.0f;
};

/// probs, selection: n_expert floats of scratch each (probs keeps the unbiased probabilities); ids, weights:
/// k each.
void select_experts_deepseek2(const float* logits, int64_t n_expert, int64_t k, const Deepseek2Routing& r,
                              float* probs, float* selection, int32_t* ids, float* weights);

}  // namespace car::engine

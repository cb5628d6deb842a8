#include "core/engine/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <numbers>

#include "core/tensor/fp16.h"
#include "core/tensor/kernels.h"
#include "core/tensor/online_softmax.h"
#include "core/util/result.h"

namespace car::engine {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) {
    const float normed = x[i] * scale;
    y[i] = normed * w[i];
  }
}

namespace {

// ggml_rope_yarn_corr_dim: the pair index where `n_rot` rotations fit into the original context.
float yarn_corr_dim(int64_t n_dims, int64_t n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2 * static_cast<float>(std::numbers::pi))) /
         (2 * std::log(base));
}

}  // namespace

void rope_cache(const RopeParams& p, int64_t pos, float* cache) {
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_rot));
  const model::RopeYarn& y = p.yarn;
  float mscale = y.attn_factor;
  float corr0 = 0.0f;
  float corr1 = 0.0f;
  if (y.ext_factor != 0.0f) {
    // ggml_rope_yarn_corr_dims, and rope_yarn's magnitude correction (the same for every pair).
    corr0 = std::max(0.0f, std::floor(yarn_corr_dim(p.n_rot, y.n_ctx_orig, y.beta_fast, p.freq_base)));
    corr1 = std::min(static_cast<float>(p.n_rot - 1),
                     std::ceil(yarn_corr_dim(p.n_rot, y.n_ctx_orig, y.beta_slow, p.freq_base)));
    mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  }
  float theta = static_cast<float>(pos);
  for (int64_t i0 = 0; i0 < p.n_rot; i0 += 2) {
    const float ff = p.freq_factors != nullptr ? p.freq_factors[i0 / 2] : 1.0f;
    const float extrap = theta / ff;
    float t = p.freq_scale * extrap;
    if (y.ext_factor != 0.0f) {
      // rope_yarn_ramp(corr0, corr1, i0) * ext_factor: 1 below corr0 (extrapolate), 0 above corr1.
      const float ramp_y = (static_cast<float>(i0 / 2) - corr0) / std::max(0.001f, corr1 - corr0);
      const float ramp_mix = (1.0f - std::min(1.0f, std::max(0.0f, ramp_y))) * y.ext_factor;
      t = t * (1.0f - ramp_mix) + extrap * ramp_mix;
    }
    cache[i0] = std::cos(t) * mscale;
    cache[i0 + 1] = std::sin(t) * mscale;
    theta *= theta_scale;
  }
}

namespace {

/// rope_apply's loop. std::fma is one instruction where the compiler may use FMA, else a call into libm
/// (the baseline build's case: ~2 us per row's query heads, ~0.5 ms of a batched decode step of 8 rows of
/// moe-2b), so the x86 build compiles it twice and picks by the CPU; both round each fma once, so the
/// results are the same bits.
inline void rope_rows(const RopeParams& p, const float* cache, float* x, int64_t n_heads) {
  const int64_t half = p.n_rot / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* xh = x + h * p.head_dim;
    for (int64_t i0 = 0; i0 < p.n_rot; i0 += 2) {
      const float c = cache[i0];
      const float s = cache[i0 + 1];
      const int64_t a = p.type == model::RopeType::norm ? i0 : i0 / 2;
      const int64_t b = p.type == model::RopeType::norm ? i0 + 1 : i0 / 2 + half;
      const float x0 = xh[a];
      const float x1 = xh[b];
      xh[a] = std::fma(x0, c, -(x1 * s));
      xh[b] = std::fma(x0, s, x1 * c);
    }
  }
}

#if defined(__x86_64__) && !defined(__FMA__)
__attribute__((target("fma"))) void rope_rows_fma(const RopeParams& p, const float* cache, float* x,
                                                  int64_t n_heads) {
  rope_rows(p, cache, x, n_heads);
}
#endif

}  // namespace

void rope_apply(const RopeParams& p, const float* cache, float* x, int64_t n_heads) {
#if defined(__x86_64__) && !defined(__FMA__)
  static const bool has_fma = __builtin_cpu_supports("fma");
  if (has_fma) {
    rope_rows_fma(p, cache, x, n_heads);
    return;
  }
#endif
  rope_rows(p, cache, x, n_heads);
}

void softmax(float* x, int64_t n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - mx);
    sum += static_cast<double>(x[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void add_bias(float* x, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + b[i];
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  tensor::swiglu(gate, up, out, n);
}

namespace {

// ggml_gelu_f32 of an fp16 value, rounded to fp16: one entry of ggml's table.
uint16_t gelu_table_entry(uint16_t h) {
  constexpr float kGeluCoefA = 0.044715f;
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  const float f = tensor::fp16_to_fp32(h);
  const float inner = kSqrt2OverPi * f * (1.0f + kGeluCoefA * f * f);
  return tensor::fp32_to_fp16(0.5f * f * (1.0f + std::tanh(inner)));
}

// The whole table (128 KiB), built once on first use and immutable after: a tanhf per FFN element would
// cost a decode step of a small model a good fraction of its time.
const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(size_t{1} << 16);
    for (size_t i = 0; i < t.size(); ++i) t[i] = gelu_table_entry(static_cast<uint16_t>(i));
    return t;
  }();
  return table;
}

}  // namespace

float gelu_ggml(float x) {
  // ggml_vec_geglu_f32 with GGML_GELU_FP16: the table is indexed by x's fp16 bits.
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return tensor::fp16_to_fp32(gelu_table()[tensor::fp32_to_fp16(x)]);
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  const uint16_t* table = gelu_table().data();
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    if (x <= -10.0f) {
      out[i] = 0.0f;
    } else if (x >= 10.0f) {  // x itself (not its fp16 rounding) times up, as ggml
      out[i] = x * up[i];
    } else {
      out[i] = tensor::fp16_to_fp32(table[tensor::fp32_to_fp16(x)]) * up[i];
    }
  }
}

void softcap(float* x, float cap, int64_t n) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) {
    const float t = std::tanh(x[i] * inv);
    x[i] = t * cap;
  }
}

void attend_head_softcap(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                         int64_t dv, float scale, float cap, float* out, uint16_t* q16, uint16_t* acc16) {
  const float scale_c = scale / cap;
  for (int64_t d = 0; d < dk; ++d) q16[d] = tensor::fp32_to_fp16(q[d]);
  std::memset(acc16, 0, static_cast<size_t>(dv) * sizeof(uint16_t));
  float sum = 0.0f;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t ic = 0; ic < n_kv; ++ic) {
    const float s = cap * std::tanh(tensor::dot_f16_ggml(k + ic * dk, q16, dk) * scale_c);
    float ms, vs;
    if (tensor::detail::online_softmax_step(s, mx, ms, vs)) {
      for (int64_t d = 0; d < dv; ++d) acc16[d] = tensor::fp32_to_fp16(tensor::fp16_to_fp32(acc16[d]) * ms);
    }
    const uint16_t* vr = v + ic * dv;
    for (int64_t d = 0; d < dv; ++d) {
      acc16[d] = tensor::fp32_to_fp16(std::fma(tensor::fp16_to_fp32(vr[d]), vs, tensor::fp16_to_fp32(acc16[d])));
    }
    sum = sum * ms + vs;
  }
  const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
  for (int64_t d = 0; d < dv; ++d) out[d] = tensor::fp16_to_fp32(acc16[d]) * inv;
}

void swiglu_oai(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = std::min(gate[i], kSwigluOaiLimit);
    const float y = std::clamp(up[i], -kSwigluOaiLimit, kSwigluOaiLimit);
    const float glu = x / (1.0f + std::exp(kSwigluOaiAlpha * (-x)));
    out[i] = glu * (y + 1.0f);
  }
}

void to_fp16(const float* x, uint16_t* y, int64_t n) {
  // The kernel table's fp16 conversion: the hardware's round to nearest even where the ISA has it, the same
  // bits as tensor::fp32_to_fp16 (SimdActivation.RoundingIsBitIdenticalToScalar).
  tensor::quantize_activation(GgmlType::F16, x, y, n);
}

void select_experts(const float* logits, int64_t n_expert, int64_t k, bool normalize, float* probs, int32_t* ids,
                    float* weights, model::ExpertGating gating) {
  CAR_CHECK(k >= 1 && k <= n_expert);
  std::copy(logits, logits + n_expert, probs);
  const bool topk_softmax = gating == model::ExpertGating::softmax_topk;
  if (!topk_softmax) softmax(probs, n_expert);
  // Partial selection sort: k is small (2..8). Largest first; equal probabilities keep the lower id first.
  for (int64_t j = 0; j < k; ++j) {
    int32_t best = -1;
    for (int32_t e = 0; e < static_cast<int32_t>(n_expert); ++e) {
      bool taken = false;
      for (int64_t t = 0; t < j; ++t) taken = taken || ids[t] == e;
      if (taken) continue;
      if (best < 0 || probs[e] > probs[best]) best = e;
    }
    ids[j] = best;
    weights[j] = probs[best];
  }
  if (topk_softmax) {
    // SOFTMAX_WEIGHT: the chosen logits' softmax (ggml_soft_max over the k weights).
    softmax(weights, k);
    return;
  }
  if (normalize) {
    double sum = 0.0;
    for (int64_t j = 0; j < k; ++j) sum += static_cast<double>(weights[j]);
    const float s = std::max(static_cast<float>(sum), 6.103515625e-5f);
    for (int64_t j = 0; j < k; ++j) weights[j] = weights[j] / s;
  }
}

}  // namespace car::engine

// The forward pass's element-wise and per-head steps, one function each, written to compute what llama.cpp's
// CPU backend computes (same operation order and float/double choices), so logits agree to ~1e-5:
//
//   rms_norm      y = x * (1 / sqrtf(mean(x^2) + eps)) * w     sum of squares in double (ggml_compute_forward_rms_norm)
//   rope          rotate pairs by pos * base^(-2i/n_rot) * freq_scale / freq_factor[i]; theta advanced by repeated
//                 float multiplication as ggml_rope_cache_init does; norm = adjacent pairs, neox = halves;
//                 YaRN (ggml's rope_yarn): the angle mixes freq_scale * theta and theta by a ramp over the pairs
//                 between the correction dims, cos/sin scaled by attn_factor * (1 + 0.1 ln(1/freq_scale))
//   softmax       expf(x - max) summed in double, scaled by 1 / sum in float (ggml_soft_max_f32)
//   swiglu        silu(gate) * up, silu(x) = x / (1 + exp(-x)) with ggml_v_expf's AVX-512 exp (tensor::swiglu)
//   swiglu_oai    x = min(gate, limit), y = clamp(up, -limit, limit), x / (1 + expf(alpha * -x)) * (y + 1)
//                 (ggml_compute_forward_swiglu_oai_f32: gpt-oss's experts, alpha 1.702, limit 7)
//   add_bias      x + b, element by element (ggml_add of a projection's bias)
//   geglu         gelu(gate) * up with ggml's GELU: 0 below -10, the identity above 10, else the tanh
//                 approximation 0.5 x (1 + tanhf(sqrt(2/pi) x (1 + 0.044715 x^2))) evaluated at x rounded to
//                 fp16 and rounded to fp16 itself (ggml's 64K-entry table, GGML_GELU_FP16)
//   softcap       c * tanhf(x * (1 / c)) (llama.cpp's final logit soft-capping: scale, tanh, scale)
//   attention     one query head over fp16 K/V, as ggml_compute_forward_flash_attn_ext_f16_one_chunk: Q rounded
//                 to fp16, s = dot(K, Q) * scale in float (dot in ggml_vec_dot_f16's order, see dot_f16_ggml), online softmax with a running max in float, the V
//                 accumulator kept in fp16 and rounded after every scale / multiply-add, divided by the sum at
//                 the end in float
//   select_experts softmax over the router logits, top-k (largest first, ties to the lower id), the chosen
//                 probabilities optionally divided by their float sum (clamped below at 2^-14, as llama.cpp);
//                 or (softmax_topk gating) the top-k of the raw logits and a softmax over those k
//
// All functions are pure and reentrant; scratch is caller-provided.
#pragma once

#include <cstdint>

#include "core/model/architecture.h"
#include "core/model/hparams.h"
#include "core/tensor/kernels.h"

namespace car::engine {

/// y[i] = x[i] * scale * w[i]; y may alias x.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);

struct RopeParams {
  int64_t n_rot = 0;         ///< rotated dimensions per head (even, <= head_dim); the rest pass through
  int64_t head_dim = 0;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  model::RopeType type = model::RopeType::norm;
  const float* freq_factors = nullptr;  ///< n_rot / 2 divisors of theta, or null
  model::RopeYarn yarn;                 ///< YaRN's terms (ext_factor 0: none)
};

/// cos/sin of every rotated pair at `pos`: cache[2i] = cos, cache[2i+1] = sin (n_rot floats).
void rope_cache(const RopeParams& p, int64_t pos, float* cache);
/// Rotate `n_heads` consecutive heads of `x` (each head_dim floats) in place with a cache from rope_cache().
void rope_apply(const RopeParams& p, const float* cache, float* x, int64_t n_heads);

/// In-place softmax of n values.
void softmax(float* x, int64_t n);

/// x[i] = x[i] + b[i] (a projection's bias, ggml_add).
void add_bias(float* x, const float* b, int64_t n);

/// out[i] = silu(gate[i]) * up[i]; out may alias gate or up.
void swiglu(const float* gate, const float* up, float* out, int64_t n);

/// ggml's GELU of one value (its fp16 table's entry for x, or the limits outside (-10, 10)).
float gelu_ggml(float x);
/// out[i] = gelu_ggml(gate[i]) * up[i]; out may alias gate or up.
void geglu(const float* gate, const float* up, float* out, int64_t n);

/// x[i] = cap * tanh(x[i] / cap) in llama.cpp's steps; cap > 0.
void softcap(float* x, float cap, int64_t n);
/// gpt-oss's clamped SwiGLU (llama.cpp's build_moe_ffn LLM_FFN_SWIGLU_OAI_MOE constants).
inline constexpr float kSwigluOaiAlpha = 1.702f;
inline constexpr float kSwigluOaiLimit = 7.0f;
/// out[i] = swiglu_oai(gate[i], up[i]) with kSwigluOaiAlpha / kSwigluOaiLimit; out may alias gate or up.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n);

/// Attention of one query head (and its scalar oracle, and the Q.K order it uses): core/tensor's kernels,
/// dispatched through the kernel table like the matrix products (kernels.h).
using tensor::attend_head;
using tensor::attend_head_scalar;
using tensor::dot_f16_ggml;

/// attend_head_scalar's arithmetic with ggml's attention logit soft-cap (gemma2): each score is
/// cap * tanhf(dot(K, Q) * (scale / cap)), as ggml_compute_forward_flash_attn_ext divides its scale by the
/// cap and applies tanhf before the online softmax. Scalar only (the kernel table's heads have no cap).
void attend_head_softcap(const float* q, const uint16_t* k, const uint16_t* v, int64_t n_kv, int64_t dk,
                         int64_t dv, float scale, float cap, float* out, uint16_t* q16, uint16_t* acc16);

/// Route one token: probs (n_expert scratch, left holding the softmax, or the logits for softmax_topk),
/// ids[k] and weights[k] out. `normalize` applies to softmax gating only.
void select_experts(const float* logits, int64_t n_expert, int64_t k, bool normalize, float* probs, int32_t* ids,
                    float* weights, model::ExpertGating gating = model::ExpertGating::softmax);

/// Convert n floats to fp16 bit patterns (round to nearest even).
void to_fp16(const float* x, uint16_t* y, int64_t n);

}  // namespace car::engine

// ArchTraits: what distinguishes one supported architecture from another. The forward pass is one shared
// pre-norm transformer (embeddings -> N x [RMSNorm, GQA attention, residual, RMSNorm, SwiGLU FFN or MoE,
// residual] -> RMSNorm -> output projection); everything an architecture changes is a field here, and each
// architecture defines its traits in its own file (llama.cpp, qwen2.cpp, qwen2moe.cpp, qwen3.cpp,
// qwen3moe.cpp, gemma2.cpp, gemma3.cpp, gpt_oss.cpp, deepseek2.cpp).
//
// Optional tensors every architecture takes when the file has them (as llama.cpp's shared graph builders
// do): Q/K/V biases (blk.N.attn_{q,k,v}.bias, added after the projections), the attention output's bias
// (blk.N.attn_output.bias, added after Wo) and output.bias (added to the logits).
//
// Immutable static data; safe to share.
#pragma once

#include <optional>
#include <string_view>

#include "core/model/hparams.h"

namespace car::model {

/// The FFN's gated activation: act(h Wgate) * (h Wup).
enum class FfnAct {
  silu,  ///< SwiGLU: silu(g) = g / (1 + exp(-g))
  gelu,  ///< GEGLU: ggml's GELU (tanh approximation, looked up in its fp16 table; ops.h geglu)
};

/// How the router's logits become the chosen experts and their weights (llama.cpp's
/// llama_expert_gating_func_type).
enum class ExpertGating {
  softmax,       ///< softmax over all experts, the top k of it (renormalized when moe_norm_weights)
  softmax_topk,  ///< the top k of the raw logits, then a softmax over those k (gpt-oss: SOFTMAX_WEIGHT)
  sigmoid,       ///< sigmoid of each logit; selection may add exp_probs_b and be group-limited (deepseek2 V3)
};

/// The routed experts' gated activation of gate g and up u (llama.cpp's llm_ffn_op_type).
enum class ExpertActivation {
  swiglu,      ///< silu(g) * u
  swiglu_oai,  ///< gpt-oss: x = min(g, 7), y = clamp(u, -7, 7), x * sigmoid(1.702 x) * (y + 1)
};

struct ArchTraits {
  std::string_view name;               ///< general.architecture value
  RopeType rope_type = RopeType::norm;
  bool qk_norm = false;                ///< per-head RMSNorm of Q and K before RoPE (attn_{q,k}_norm)
  bool moe_required = false;           ///< every layer must be MoE (qwen3moe)
  bool dense_only = false;             ///< MoE tensors are not allowed (qwen3)
  /// Key holding one expert's FFN width; empty = <arch>.feed_forward_length (llama / Mixtral layout).
  std::string_view expert_ff_key;
  /// Renormalize the chosen experts' softmax weights to sum to 1 (llama.cpp's build_moe_ffn `norm_w`).
  bool moe_norm_weights = true;
  /// The files carry Q/K/V biases (qwen2, qwen2moe): `car gguf synth` writes them. Loading does not depend
  /// on it (biases are taken whenever present).
  bool qkv_bias = false;
  /// Every MoE layer also has a shared expert (ffn_{gate,up,down}_shexp, always run) whose output is scaled
  /// by sigmoid(ffn_gate_inp_shexp . x) and added to the routed experts' sum (qwen2moe). Its width is the
  /// key below, or feed_forward_length when that is absent (llama.cpp's rule).
  bool shared_expert = false;
  std::string_view shared_expert_ff_key;
  /// Gemma: the embedding rows are multiplied by sqrtf(n_embd) (llama.cpp's ggml_scale of the input).
  bool embed_scale = false;
  /// Gemma 2/3: each sub-block's output is RMS-normed again before its residual add
  /// (blk.N.post_attention_norm, blk.N.post_ffw_norm).
  bool post_norms = false;
  FfnAct ffn_act = FfnAct::silu;
  /// Gemma: Q is multiplied by the attention scale (in float, before the kernel rounds it to fp16) and the
  /// kernel's scale is 1, as llama.cpp's ggml_scale of Qcur then build_attn(kq_scale = 1). The scale is
  /// 1/sqrt(key_length), or 1/sqrt(n_embd / n_head) when block_count == query_scale_embd_layers (the size
  /// whose query_pre_attn_scalar is n_embd / n_head: Gemma 3 27B, 62 layers). false: 1/sqrt(key_length)
  /// inside the kernel (llama).
  bool scale_query = false;
  int64_t query_scale_embd_layers = 0;
  /// The norm before the FFN: blk.N.<this>.weight (gpt-oss names it post_attention_norm; same role).
  std::string_view ffn_norm_name = "ffn_norm";
  /// Every layer has blk.N.attn_sinks.weight (n_head logits): each head's softmax denominator gains
  /// exp(sink) with no value (gpt-oss).
  bool attn_sinks = false;
  ExpertGating expert_gating = ExpertGating::softmax;
  ExpertActivation expert_activation = ExpertActivation::swiglu;
  /// The router and every expert bank have biases (ffn_gate_inp.bias, ffn_{gate,up,down}_exps.bias),
  /// required, added after their products; and the attention output's bias is required (gpt-oss).
  bool moe_biases = false;
  /// Sliding-window layers as llama.cpp's set_swa_pattern(swa_pattern) (0 = the architecture has none), the
  /// window from <arch>.attention.sliding_window, else swa_default_window (0 = every layer global).
  int64_t swa_pattern = 0;
  int64_t swa_default_window = 0;
  /// RoPE base (with frequency scale 1) of the sliding-window layers; 0 = the global layers' (gemma3: 10000).
  float swa_rope_freq_base = 0.0f;
  /// Reads <arch>.final_logit_softcapping c, with this default when absent: logits = c * tanh(logits / c)
  /// (Gemma 2: 30, Gemma 3: 0 = none). nullopt: the key is not read.
  std::optional<float> final_logit_softcap;
  /// Reads <arch>.attn_logit_softcapping c, with this default (Gemma 2: 50): each attention score s (after
  /// the scale) becomes c * tanh(s / c), inside the softmax, as ggml's flash attention. nullopt: not read.
  std::optional<float> attn_logit_softcap;
  /// DeepSeek-V2/V3 multi-head latent attention and router (deepseek2.cpp): the attention is
  /// ForwardPass::attention_mla (a compressed latent and one shared RoPE key cached per position), the
  /// deepseek2.* keys of hparams.h's MLA and router fields are read, leading dense layers, plain shared
  /// experts (no gate), exp_probs_b, group-limited top-k, weight normalisation and scale.
  bool mla = false;
};

const ArchTraits& llama_traits();
const ArchTraits& qwen2_traits();
const ArchTraits& qwen2moe_traits();
const ArchTraits& qwen3_traits();
const ArchTraits& qwen3moe_traits();
const ArchTraits& gemma2_traits();
const ArchTraits& gemma3_traits();
const ArchTraits& gpt_oss_traits();
const ArchTraits& deepseek2_traits();

/// Traits for a general.architecture value; null when unsupported.
const ArchTraits* find_arch(std::string_view name);
/// The supported general.architecture values, comma-separated (for messages).
std::string_view supported_archs();

}  // namespace car::model

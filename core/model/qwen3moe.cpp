// qwen3moe: qwen3's attention (NEOX RoPE, per-head q/k RMSNorm) with every FFN a routed MoE block. One
// expert's width is expert_feed_forward_length (feed_forward_length is unused). llama.cpp builds it with
// norm_w = true (the top-k softmax weights renormalized to sum to 1), softmax gating, no shared expert.
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen3moe_traits() {
  static const ArchTraits traits{
      .name = "qwen3moe",
      .rope_type = RopeType::neox,
      .qk_norm = true,
      .moe_required = true,
      .dense_only = false,
      .expert_ff_key = "expert_feed_forward_length",
      .moe_norm_weights = true,
      .qkv_bias = false,
      .shared_expert = false,
      .shared_expert_ff_key = {},
      .embed_scale = false,
      .post_norms = false,
      .ffn_act = FfnAct::silu,
      .scale_query = false,
      .query_scale_embd_layers = 0,
      .ffn_norm_name = "ffn_norm",
      .attn_sinks = false,
      .expert_gating = ExpertGating::softmax,
      .expert_activation = ExpertActivation::swiglu,
      .moe_biases = false,
      .swa_pattern = 0,
      .swa_default_window = 0,
      .swa_rope_freq_base = 0.0f,
      .final_logit_softcap = std::nullopt,
      .attn_logit_softcap = std::nullopt,
  };
  return traits;
}

}  // namespace car::model

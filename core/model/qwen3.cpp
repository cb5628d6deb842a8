// qwen3 (dense): NEOX-style RoPE (halves of each head rotate together) and a per-head RMSNorm of Q and K
// (attn_q_norm / attn_k_norm, head_dim wide) applied before RoPE. Q may be wider than n_embd
// (attention.key_length * head_count).
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen3_traits() {
  static const ArchTraits traits{
      .name = "qwen3",
      .rope_type = RopeType::neox,
      .qk_norm = true,
      .moe_required = false,
      .dense_only = true,
      .expert_ff_key = {},
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

// qwen2moe (Qwen1.5-MoE, Qwen2-MoE): qwen2's attention (Q/K/V biases, NEOX RoPE) with every FFN a routed MoE
// block beside a shared expert. llama.cpp's graph (src/models/qwen2moe.cpp) per layer, h = rms_norm(x) *
// ffn_norm:
//   routed  = sum over the top-k of softmax(ffn_gate_inp h) of p_e * expert_e(h)   norm_w = false: the
//             chosen softmax probabilities are used as they are, not renormalized to sum to 1
//   shared  = (silu(h W_gate_shexp) * (h W_up_shexp)) W_down_shexp                 always run, resident
//   g       = silu(s) / s with s = ffn_gate_inp_shexp . h                          (a sigmoid, computed so)
//   x      += routed + shared * g
// One routed expert's width is expert_feed_forward_length; the shared expert's
// expert_shared_feed_forward_length (feed_forward_length when absent).
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen2moe_traits() {
  static const ArchTraits traits{
      .name = "qwen2moe",
      .rope_type = RopeType::neox,
      .qk_norm = false,
      .moe_required = true,
      .dense_only = false,
      .expert_ff_key = "expert_feed_forward_length",
      .moe_norm_weights = false,
      .qkv_bias = true,
      .shared_expert = true,
      .shared_expert_ff_key = "expert_shared_feed_forward_length",
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

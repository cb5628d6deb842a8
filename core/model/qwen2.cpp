// qwen2 (Qwen2, Qwen2.5, and the DeepSeek-R1 distills built on them): llama's layer with biases on the Q, K
// and V projections (attn_{q,k,v}.bias, added before RoPE), NEOX-style RoPE (halves of each head rotate
// together), no q/k norm, a dense SwiGLU FFN. Small models tie the output projection to token_embd.
// Its tokenizer is byte-level BPE with pre-type `qwen2` (core/tokenizer/pretokenizer.cpp).
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& qwen2_traits() {
  static const ArchTraits traits{
      .name = "qwen2",
      .rope_type = RopeType::neox,
      .qk_norm = false,
      .moe_required = false,
      .dense_only = true,
      .expert_ff_key = {},
      .moe_norm_weights = true,
      .qkv_bias = true,
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

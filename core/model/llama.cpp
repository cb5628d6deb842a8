// llama (Llama 1/2/3, and Mixtral's MoE layout under the same name): adjacent-pair RoPE, no q/k norm.
// MoE layers (when <arch>.expert_count > 0) store the experts as ffn_{gate,up,down}_exps banks with a router
// ffn_gate_inp; an expert's width is feed_forward_length. llama.cpp's build for this architecture passes
// norm_w = true to build_moe_ffn: softmax over all experts, take the top k, divide by their sum.
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& llama_traits() {
  static const ArchTraits traits{
      .name = "llama",
      .rope_type = RopeType::norm,
      .qk_norm = false,
      .moe_required = false,
      .dense_only = false,
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

const ArchTraits* find_arch(std::string_view name) {
  for (const ArchTraits* t :
       {&llama_traits(), &qwen2_traits(), &qwen2moe_traits(), &qwen3_traits(), &qwen3moe_traits(), &gemma2_traits(),
        &gemma3_traits(), &gpt_oss_traits()}) {
    if (t->name == name) return t;
  }
  return nullptr;
}

std::string_view supported_archs() { return "llama, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3, gpt-oss"; }

}  // namespace car::model

// gpt-oss (OpenAI's gpt-oss-20b / -120b; llama.cpp's LLM_ARCH_OPENAI_MOE, src/models/openai-moe.cpp). Every
// layer is attention then a routed MoE, pre-norm, NEOX RoPE with YaRN scaling (the rope.scaling.* keys,
// applied by the shared RoPE; see hparams.h). What differs from the shared transformer:
//   attention  Q/K/V and output biases; one learned sink logit per head (attn_sinks) in the softmax's
//              denominator; even layers attend a sliding window of attention.sliding_window keys (128 in
//              the released files), odd layers everything (llama.cpp's swa pattern 2)
//   ffn norm   named post_attention_norm (it is the norm before the MoE, as ffn_norm elsewhere)
//   router     logits = ffn_gate_inp h + ffn_gate_inp.bias; the top k of the logits, then a softmax over
//              those k (SOFTMAX_WEIGHT gating; no renormalization)
//   experts    gate, up, down each + its expert's bias row; act = swiglu_oai(gate, up):
//              x = min(gate, 7), y = clamp(up, -7, 7), x / (1 + exp(-1.702 x)) * (y + 1)
//              out = sum over the k experts of weight * (down(act) + down bias)
// One expert's width is expert_feed_forward_length. The released files store the experts in MXFP4.
#include "core/model/architecture.h"

namespace car::model {

const ArchTraits& gpt_oss_traits() {
  // Only what differs from ArchTraits' defaults (the llama layout).
  static const ArchTraits traits = [] {
    ArchTraits t;
    t.name = "gpt-oss";
    t.rope_type = RopeType::neox;
    t.moe_required = true;
    t.expert_ff_key = "expert_feed_forward_length";
    t.moe_norm_weights = false;
    t.qkv_bias = true;
    t.ffn_norm_name = "post_attention_norm";
    t.attn_sinks = true;
    t.expert_gating = ExpertGating::softmax_topk;
    t.expert_activation = ExpertActivation::swiglu_oai;
    t.moe_biases = true;
    t.swa_pattern = 2;
    return t;
  }();
  return traits;
}

}  // namespace car::model
